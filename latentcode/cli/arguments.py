"""Argument types and parsers that several commands share (standard library only).

The integer types check with `latentcode.validation.check_integer`, the rule the Python API uses,
and say the range in argparse's words: `argument --n: expected a positive integer, got '0'`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence

from latentcode.errors import UsageError
from latentcode.validation import DTYPES, SEED_LIMIT, check_integer, describe_integer_range


def integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (and at most `maximum`)."""
    expected = describe_integer_range(minimum, maximum)

    def parse(text: str) -> int:
        try:
            return check_integer("value", int(text), minimum, maximum)
        except ValueError:  # int() of a non-integer, or a UsageError: out of the range
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None

    return parse


def number(kind: str = "finite") -> Callable[[str], float]:
    """An argparse type: a finite number (nan and inf would make every result NaN, silently), and
    positive or non-negative where `kind` says so ("positive", "non-negative"; "finite": any)."""
    expected = f"a {kind} number"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (kind != "finite" and value < 0) or (kind == "positive" and value == 0):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def one_of(values: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(values)}, got {text!r}")
        return text

    return parse


POSITIVE_INTEGER, NON_NEGATIVE_INTEGER = integer(1), integer(0)
SEED = integer(0, SEED_LIMIT - 1)
POSITIVE_NUMBER, NON_NEGATIVE_NUMBER, FINITE_NUMBER = number("positive"), number("non-negative"), number()
FIGURE_FORMATS = ("png", "svg", "pdf")


def add_instance_arguments(parser: argparse.ArgumentParser, n: int, language: str, sites: str = "site selector",
                           batch_size: int | None = 256, batch_help: str = "default 256") -> None:
    """The flags of commands that run a model on task instances (extract, intervene): the model (RUN_DIR;
    `language` says what a pretrained causal LM is read on), the split, the instances (default `n`), the
    sites, the task's variant, the batch size (default `batch_size`; None: the command decides, as
    `batch_help` says), the sample seed, the task config of a saved model directory, the placement
    (`add_placement_arguments`) and --quiet."""
    parser.add_argument("run", metavar="RUN_DIR", help="a run directory (or a saved model directory with --task), or a "
                        "pretrained causal LM: a Hugging Face directory, a .gguf file or smollm2 (windows of the "
                        f"language corpus, --task seq_len=T, default 512; {language})")
    parser.add_argument("--split", help="task split (default: the task's held-out split, ood; validation for "
                        "language)")
    parser.add_argument("--n", type=POSITIVE_INTEGER, default=n, help=f"instances (default {n})")
    parser.add_argument("--sites", default="last-self", help=f"{sites} (default last-self)")
    parser.add_argument("--variant", help="task variant (default: the selector's, else the task's default)")
    parser.add_argument("--batch-size", type=POSITIVE_INTEGER, default=batch_size,
                        help=f"instances per forward pass ({batch_help})")
    parser.add_argument("--seed", type=SEED, help="sample seed (default: the split's evaluation seed)")
    parser.add_argument("--task", metavar="KEY=VALUE", action="append",
                        help="task config for a model directory, e.g. --task name=sraven --task n_features=4")
    add_placement_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress (default: the work, then a bar on a "
                        "terminal, a line every few seconds in a log)")


def add_placement_arguments(parser: argparse.ArgumentParser, device: str = "cpu", dtype: str = "float32; codes are "
                            "recorded in float32 whatever it") -> None:
    """--device and --dtype of every command that runs a model (extract, intervene, patch, qk, train),
    checked by `latentcode.validation.check_placement` (a dtype outside DTYPES: argparse's one line);
    `device` and `dtype` say their defaults in the help."""
    parser.add_argument("--device", default=None, help=f"where the model runs: cpu, cuda, cuda:N, mps (default "
                        f"{device})")
    parser.add_argument("--dtype", choices=DTYPES, default=None, help=f"what the model computes in (default {dtype})")


def add_max_rows_argument(parser: argparse.ArgumentParser) -> None:
    """--max-rows: the examples of each split an analysis reads (bounded memory, however long the file)."""
    from latentcode.store.reader import DEFAULT_MAX_ROWS

    parser.add_argument("--max-rows", type=integer(1), default=DEFAULT_MAX_ROWS, metavar="N",
                        help=f"read at most N examples of each split, drawn at random with the seed (default "
                        f"{DEFAULT_MAX_ROWS:,}; memory grows with N, not with the file); a note says when it applies")


def formats(args: argparse.Namespace) -> tuple[str, ...]:
    """The figure formats of --format (repeatable), default png."""
    return tuple(args.format or ["png"])


def progress_bars(args: argparse.Namespace) -> bool:
    """Progress bars unless --quiet, and only where stderr is a terminal: piped into a file or a log,
    a bar is a stream of carriage returns and escape codes (training prints plain lines there instead)."""
    return not args.quiet and sys.stderr.isatty()


def parse_value(text: str):
    """A command-line value: JSON (numbers, true/false/null, lists) where it parses, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: Sequence[str] | None, what: str) -> dict:
    """KEY=VALUE items (`what` names their flag) as a dict; dashes in keys become underscores."""
    values = {}
    for item in items or []:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise UsageError(f"{what} expects KEY=VALUE, got {item!r}")
        values[key.strip().replace("-", "_")] = parse_value(value)
    return values
