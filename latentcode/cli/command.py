"""One command of the `latentcode` command line, and the registry that builds the parser from them.

A command is one module of this package that declares `COMMAND = Command(register, check, run, order)`:

- `register(subparsers)` adds the command's parser and returns it; the registry files the command
  under that parser's own name, so a check can never be filed under another name and dropped;
- `check(args)` checks the arguments with the standard library, JSON and h5py only (files exist and
  are what they should be, outputs can be written, labels and splits exist) and may fill in values
  it resolved, e.g. a default label; it raises a `UsageError`. A command whose argument types check
  everything says so, with the reason: `nothing_to_check("...")`;
- `run(args)` imports what it needs (torch, scikit-learn, matplotlib) and calls the public API;
- `order` places the command in `latentcode --help` (the pipeline's order: tasks, train, ..., demo);
- `parameters` maps the Python API's argument names to the command's own where they differ
  (`run_or_model` is RUN_DIR's `run`), so that an error about an argument names its flag.

Adding a command is adding one module here (and its test): `build_parser` finds it.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType

Check = Callable[[argparse.Namespace], None]
Handler = Callable[[argparse.Namespace], int | None]


@dataclass(frozen=True)
class Command:
    register: Callable[[argparse._SubParsersAction], argparse.ArgumentParser]
    check: Check
    run: Handler
    order: int
    parameters: Mapping[str, str] = field(default_factory=dict)


def command_parser(subparsers: argparse._SubParsersAction, name: str, help: str, description: str,
                   epilog: str | Callable[[], str]) -> argparse.ArgumentParser:
    """The parser of the command `name`, its description and epilog (examples) printed as written."""
    return subparsers.add_parser(name, help=help, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def nothing_to_check(reason: str) -> Check:
    """The check of a command whose argument types (argparse) already check every value; `reason` says why."""

    def check(args: argparse.Namespace) -> None:
        pass

    check.__doc__ = f"Nothing to check after parsing: {reason}"
    check.reason = reason  # type: ignore[attr-defined]
    return check


def command_modules() -> list[ModuleType]:
    """The modules of this package that declare a `COMMAND`, in the order of their `order` (`__main__`,
    which runs a command when imported, is not one of them)."""
    package = importlib.import_module(__package__)
    modules = [importlib.import_module(f"{__package__}.{info.name}") for info in pkgutil.iter_modules(package.__path__)
               if info.name != "__main__"]
    return sorted((module for module in modules if isinstance(getattr(module, "COMMAND", None), Command)),
                  key=lambda module: module.COMMAND.order)


class Registry(dict[str, Command]):
    """The commands, each under the name of the parser it registered (`parsers`: those parsers)."""

    def __init__(self) -> None:
        super().__init__()
        self.parsers: dict[str, argparse.ArgumentParser] = {}

    def add(self, subparsers: argparse._SubParsersAction, command: Command) -> argparse.ArgumentParser:
        """Register `command`'s parser with `subparsers` (which refuses a name taken already) and file
        the command under that parser's name."""
        parser = command.register(subparsers)
        names = [name for name, registered in subparsers.choices.items() if registered is parser]
        if len(names) != 1:
            raise TypeError(f"{command.register.__qualname__} returned a parser registered under {names}; "
                            "expected the one parser it added with subparsers.add_parser")
        self[names[0]] = command
        self.parsers[names[0]] = parser
        return parser
