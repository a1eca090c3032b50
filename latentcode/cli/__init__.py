"""The `latentcode` command line: thin wrappers that parse arguments and call the public API.

One module of this package per command, each declaring a `Command` (latentcode/cli/command.py) that
`build_parser` finds. A command first checks its arguments with the plan the Python API makes too
(standard library, JSON and h5py only); only then does it import torch or scikit-learn. So a mistake
is answered at once as one line, `error: ...`, exit status 2, naming the flag, the value received and
what is expected; errors the library raises for what only it can see are printed the same way (set
LATENTCODE_DEBUG=1 for their traceback). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from collections.abc import Sequence

from latentcode import _interrupted_while_starting
from latentcode.cli.arguments import parse_assignments
from latentcode.cli.command import Registry, command_modules
from latentcode.errors import LatentcodeError
from latentcode.switches import check_switches

# `parse_assignments`: scripts that take `--set KEY=VALUE` (analyses/) read it as the commands do.
__all__ = ["main", "parse_assignments"]

# What the user can fix: our own errors, and files that are missing or already there. Anything else is
# a bug and keeps its traceback.
USER_ERRORS = (LatentcodeError, FileExistsError, FileNotFoundError)


class CommandLineParser(argparse.ArgumentParser):
    """argparse with one-line errors, and epilogs built only when help is printed; the top-level
    parser holds the registry of its commands (`commands`)."""

    commands: Registry

    def error(self, message: str):
        # argparse would print the whole usage block first; one line says where to find it.
        self.exit(2, f"error: {one_line(message)} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        if callable(self.epilog):  # e.g. the preset table, which needs the task modules
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> CommandLineParser:
    from latentcode import __version__

    parser = CommandLineParser(
        prog="latentcode",
        description="Mechanistic interpretability of attention latent codes: train softmax, linear "
        "and HYLA transformers on compositional tasks, extract latent codes with hooks into HDF5, "
        "decode them with probes and draw them.",
    )
    parser.add_argument("--version", action="version", version=f"latentcode {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.commands = Registry()
    for module in command_modules():
        parser.commands.add(subparsers, module.COMMAND)
    return parser


def one_line(message: str) -> str:
    """The message on one line: a newline (or carriage return) inside an argument shown as \\n."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def located(error: BaseException, args: argparse.Namespace, parser: argparse.ArgumentParser, command) -> str:
    """The message of `error` (the Python API's, word for word) with the flag of the argument it is about
    (`LatentcodeError.parameter`) in front: `RUN_DIR runs/x is ...`, `--out c.h5 already exists` where it
    starts with the value given (or one of a list's); `--variant permuted: ...` where it starts with the
    argument's name; else `--split: unknown split ...`."""
    message, parameter = str(error), getattr(error, "parameter", None)
    dest = command.parameters.get(parameter, parameter)
    action = next((action for action in parser._actions if parameter and action.dest == dest), None)
    if action is None:
        return message
    flag = action.option_strings[0] if action.option_strings else action.metavar or dest
    value = getattr(args, dest, None)
    values = value if isinstance(value, list) else [value]  # a repeatable flag, or several RUN_DIRs
    if any(value is not None and str(value) and message.startswith(str(value)) for value in values):
        return f"{flag} {message}"
    if message.startswith(f"{parameter} "):
        return flag + message[len(parameter):]
    return f"{flag}: {message}"


def _interrupt_unless_importing(signum: int, frame: object) -> None:
    """Ctrl-C while a command runs: a KeyboardInterrupt, so that the outputs it holds are discarded as it
    unwinds; but inside an import (a command imports torch when it starts its work), an exception raised
    into a C extension's initialisation aborts the process (torch's pybind11: `terminate called`), so
    there it is one line and exit 130 at once, as before the command started."""
    current = frame
    while current is not None:
        if getattr(current, "f_code", None) is not None and current.f_code.co_filename.startswith("<frozen importlib"):
            _interrupted_while_starting(signum, frame)
        current = getattr(current, "f_back", None)
    raise KeyboardInterrupt


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:  # noqa: ARG001 - warnings.formatwarning's signature
    """A warning as the command line prints it: `warning: ...` on one line (a UserWarning, latentcode's
    own: a cache entry not used, a cache not written) or `warning: Category: ...`, instead of Python's
    `file:line: UserWarning: ...` and the source line below it."""
    kind = "" if category is UserWarning else f"{category.__name__}: "
    return f"warning: {kind}{one_line(str(message))}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit status (2: a user error, printed as one line; argparse's
    own errors exit with 2 as well)."""
    parser = build_parser()
    if argv is not None:
        try:  # a command line is text: a path-like argument as its path (codes in memory: one line, no path)
            argv = [argument if isinstance(argument, str) else os.fspath(argument) for argument in argv]
        except USER_ERRORS as error:
            print(f"error: {one_line(str(error))}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    command = parser.commands[args.command]
    as_the_command = signal.getsignal(signal.SIGINT) is _interrupted_while_starting  # set by latentcode/__init__.py
    try:
        try:
            if as_the_command:  # Ctrl-C: a KeyboardInterrupt again, the command's outputs discarded as it unwinds
                signal.signal(signal.SIGINT, _interrupt_unless_importing)
            check_switches()  # LATENTCODE_MKL_ON_AMD=yes and the like: refused before anything runs
            shown, warnings.formatwarning = warnings.formatwarning, _one_line_warning
            try:
                command.check(args)
                status = command.run(args)
            finally:
                warnings.formatwarning = shown
        finally:
            if as_the_command:  # ended: Ctrl-C until the process exits is one line and 130, not a traceback
                signal.signal(signal.SIGINT, _interrupted_while_starting)
    except USER_ERRORS as error:
        if os.environ.get("LATENTCODE_DEBUG"):
            raise
        print(f"error: {one_line(located(error, args, parser.commands.parsers[args.command], command))}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(status or 0)
