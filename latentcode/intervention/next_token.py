"""`mean_and_se`: the summary over windows (or pairs) of a per-example effect, as patch and the patching
sweep report it (intervene bootstraps instead: a task metric need not be a mean). The next-token metrics are
`latentcode.token_windows.window_metrics`."""

from __future__ import annotations

import math

import numpy as np


def mean_and_se(values: np.ndarray) -> tuple[float, float]:
    """The mean of `values` and its standard error std / sqrt(n) (NaN for one value)."""
    n = len(values)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
