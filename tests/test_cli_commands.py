"""The command registry (latentcode/cli/command.py): each command is one module of latentcode/cli/
declaring a `Command`, filed under the name of the parser it registers, with a check that runs
before its handler; adding a command is adding a module."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import latentcode.cli
from latentcode.cli import build_parser, main
from latentcode.cli.command import Command, Registry, nothing_to_check

CLI_DIRECTORY = Path(latentcode.cli.__file__).parent


def modules_declaring_a_command() -> set[str]:
    """Read from the source, not through the registry: the modules with a top-level `COMMAND = Command(...)`."""
    declaring = set()
    for path in CLI_DIRECTORY.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and [getattr(target, "id", None) for target in node.targets] == ["COMMAND"]
                    and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "Command"):
                declaring.add(path.stem)
    return declaring


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_parsers_commands_are_the_modules_that_declare_one():
    parser = build_parser()
    assert set(subcommands(parser)) == modules_declaring_a_command() == set(parser.commands)
    assert {"tasks", "train", "sweep", "extract", "intervene", "patch", "probe", "plot", "heatmap", "samples", "view", "report",
            "demo"} <= set(parser.commands)


def test_every_command_has_a_check_and_a_handler_and_says_why_when_there_is_nothing_to_check():
    for name, command in build_parser().commands.items():
        assert isinstance(command, Command) and callable(command.check) and callable(command.run), name
        reason = getattr(command.check, "reason", None)
        assert reason is None or len(reason) > 20, f"{name}: nothing to check, without a reason"


def test_each_command_is_filed_under_the_name_of_the_parser_it_registers():
    parser = build_parser()
    for name, registered in subcommands(parser).items():
        fresh = argparse.ArgumentParser().add_subparsers()
        parser.commands[name].register(fresh)
        assert list(fresh.choices) == [name] and registered.prog.endswith(f" {name}")


def test_the_registry_takes_the_key_from_the_parser_not_from_the_function():
    def register_frobnicate(subparsers):
        return subparsers.add_parser("frobnicate")

    registry, subparsers = Registry(), argparse.ArgumentParser().add_subparsers()
    command = Command(register_frobnicate, nothing_to_check("a test command with no arguments at all"),
                      lambda args: 0, order=0)
    registry.add(subparsers, command)
    assert dict(registry) == {"frobnicate": command}
    with pytest.raises(argparse.ArgumentError, match="conflicting subparser: frobnicate"):
        registry.add(subparsers, command)  # two commands under one name


def test_a_register_function_must_return_the_parser_it_added():
    def returns_another_parser(subparsers):
        subparsers.add_parser("added")
        return argparse.ArgumentParser()

    with pytest.raises(TypeError, match=r"registered under \[\]"):
        Registry().add(argparse.ArgumentParser().add_subparsers(), Command(returns_another_parser, print, print, 0))


def test_main_checks_before_it_runs(monkeypatch, capsys):
    """The check runs first; a user error it raises stops the command before its handler."""
    from latentcode.cli import tasks
    from latentcode.errors import UsageError

    calls = []

    def refuse(args):
        calls.append("check")
        raise UsageError("refused by the check")

    monkeypatch.setattr(tasks, "COMMAND", Command(tasks.register, refuse, lambda args: calls.append("run"), 10))
    assert main(["tasks", "count"]) == 2
    assert calls == ["check"] and capsys.readouterr().err == "error: refused by the check\n"


def test_python_dash_m_runs_the_command_line():
    done = subprocess.run([sys.executable, "-m", "latentcode.cli", "tasks", "count", "--features", "2", "--values", "3"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("SRAVEN M=2 K=3: "), done.stderr
