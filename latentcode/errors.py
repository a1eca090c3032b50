"""The one base class of the errors a user can fix.

Every error raised for bad input — a config that does not hold together, a file that is not what
was asked for, a site outside the sequence — derives from `LatentcodeError`. The command line prints
these as one line and exits with status 2; anything else is a bug and keeps its traceback.

An error may say which argument of the Python API it is about (`parameter`, set by `about`): the
message itself is the same string whoever called, and the command line puts the flag the user typed
in front of it (`--split: unknown split 'odd' ...`, `RUN_DIR runs/x is neither ...`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class LatentcodeError(Exception):
    """A mistake the user can fix; the message names the value received and what is expected."""

    parameter: str | None = None  # the argument of the Python API it is about, if one is


class UsageError(LatentcodeError, ValueError):
    """A command or function called with arguments that do not go together, or a value it does not accept."""


class AnalysisError(LatentcodeError, ValueError):
    """Codes or labels that a probe, an embedding, a heatmap or a plot cannot be made from; says why."""


class OutputExistsError(LatentcodeError, FileExistsError):
    """An output that is there already and was not asked to be replaced or added to."""


@contextlib.contextmanager
def about(parameter: str) -> Iterator[None]:
    """A `LatentcodeError` raised inside is about the argument `parameter` (unless it already names one)."""
    try:
        yield
    except LatentcodeError as error:
        if error.parameter is None:
            error.parameter = parameter
        raise
