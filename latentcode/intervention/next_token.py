"""`mean_and_se`: the summary over windows (or examples) of a per-window metric, as intervene, patch
and the patching sweep report it. The metrics themselves are `latentcode.token_windows.window_metrics`."""

from __future__ import annotations

import math

import numpy as np

from latentcode.token_windows import METRICS, window_metrics  # noqa: F401 - where intervene and patch read them


def mean_and_se(values: np.ndarray) -> tuple[float, float]:
    """The mean of `values` and its standard error std / sqrt(n) (NaN for one value)."""
    n = len(values)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
