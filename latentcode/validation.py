"""The checks of values a user passes, written once: the command line and the Python API call the
same function, so both refuse a value with the same message.

- `check_split`, `check_variant`: a split or a variant of a task (a `Task`, or its class);
- `check_integer`: an integer in a range (`describe_integer_range` says the range in words, as the
  command line's argument types print it).

Standard library only (no numpy, no torch): the command line calls these before it imports anything
heavy. Each check returns the value or raises `UsageError` (or the `error` class its caller names: a
task raises its `TaskError`) saying what was wrong, the value received and what is expected. `flag`
names the value as the user wrote it, e.g. `--split`; the message then starts with it.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from latentcode.errors import LatentcodeError, UsageError

SEED_LIMIT = 2**32  # numpy's and torch's seeds are 32-bit: a larger one is refused, not a traceback


def _where(flag: str | None) -> str:
    return f"{flag}: " if flag else ""


def check_split(split: str, task: Any, flag: str | None = None, *,
                error: type[LatentcodeError] = UsageError) -> str:
    """`split`, if `task` (a Task or a Task class: its `name` and `splits`) has it."""
    if split not in task.splits:
        raise error(f"{_where(flag)}unknown split {split!r} for task {task.name!r}; valid splits: {list(task.splits)}")
    return split


def check_variant(variant: str, task: Any, flag: str | None = None, *,
                  error: type[LatentcodeError] = UsageError) -> str:
    """`variant`, if `task` (a Task or a Task class: its `name` and `variants`) has it."""
    if variant not in task.variants:
        raise error(f"{_where(flag)}unknown variant {variant!r} for task {task.name!r}; "
                    f"valid variants: {list(task.variants)}")
    return variant


def check_integer(name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *,
                  error: type[LatentcodeError] = UsageError) -> int:
    """`value` as an int (a bool is no integer here), if `minimum <= value <= maximum` (either bound
    may be None)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name}={value!r} must be an integer")
    value = int(value)
    if minimum is not None and value < minimum:
        raise error(f"{name}={value} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise error(f"{name}={value} must be at most {maximum}")
    return value


def describe_integer_range(minimum: int, maximum: int | None = None) -> str:
    """The integers `check_integer(..., minimum, maximum)` accepts, in words: 'a positive integer',
    'a non-negative integer below 4294967296', 'an integer of at least 3'."""
    expected = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer of at least {minimum}")
    return expected if maximum is None else f"{expected} below {maximum + 1}"


def machine_memory() -> int | None:
    """The machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def describe_bytes(n_bytes: float) -> str:
    """`n_bytes` in GiB, or TiB from 1 TiB: "7.3 GiB", "16.0 TiB"."""
    return f"{n_bytes / 2**30:,.1f} GiB" if n_bytes < 2**40 else f"{n_bytes / 2**40:,.1f} TiB"
