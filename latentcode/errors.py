"""The one base class of the errors a user can fix.

Every error raised for bad input — a config that does not hold together, a file that is not what
was asked for, a site outside the sequence — derives from `LatentcodeError`. The command line prints
these as one line and exits with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class LatentcodeError(Exception):
    """A mistake the user can fix; the message names the value received and what is expected."""


class UsageError(LatentcodeError, ValueError):
    """A command or function called with arguments that do not go together, or a value it does not accept."""


class AnalysisError(LatentcodeError, ValueError):
    """Codes or labels that a probe, an embedding, a heatmap or a plot cannot be made from; says why."""
