"""What every figure of latent codes shares: a pyplot-free figure, saving it in several formats
at once, and the checks on its inputs.

Figures are made with `matplotlib.figure.Figure` and the Agg canvas directly, never through
pyplot: nothing is registered globally, no display is needed, and a figure is freed once saved.
The pixel size of a PNG is ``figsize * dpi`` exactly (no tight bounding box).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from latentcode.errors import AnalysisError
from latentcode.files import AtomicOutputs

__all__ = ["FORMATS", "MAX_COLUMNS", "new_figure", "one_column", "panel_grid", "save_figure"]

FORMATS = ("png", "svg", "pdf")
# Panels per row of a figure with one panel per layer: a 30-layer model in one row was 11,000 px wide.
MAX_COLUMNS = 6


def panel_grid(n_panels: int, max_columns: int = MAX_COLUMNS) -> tuple[int, int]:
    """``(rows, columns)`` for `n_panels` panels: one row up to `max_columns` panels, else as few
    rows as that allows, the panels spread evenly over them (7 panels: 2 rows of 4, not 6 and 1)."""
    n_panels = max(1, n_panels)
    n_rows = math.ceil(n_panels / max_columns)
    return n_rows, math.ceil(n_panels / n_rows)


def new_figure(figsize: tuple[float, float], dpi: float) -> Figure:
    figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Figure, path_stem: str | Path, formats: Sequence[str], dpi: float) -> list[Path]:
    """Write ``path_stem.<format>`` for each of `formats` (any of `FORMATS`); returns the paths."""
    formats = [formats] if isinstance(formats, str) else list(formats)
    unknown = [fmt for fmt in formats if fmt not in FORMATS]
    if unknown or not formats:
        raise AnalysisError(f"formats {formats}: expected one or more of {FORMATS}")
    stem = Path(path_stem)
    # All formats or none, through temporaries (never through a planted link), one writer of a stem at a time.
    with AtomicOutputs(lock=stem, purpose="writing a figure") as outputs:
        outputs.write_figure(stem, figure, formats, dpi=dpi)
    figure.clear()  # drop the artists now rather than whenever the figure is collected
    return outputs.written


def one_column(values: np.ndarray, label: str) -> np.ndarray:
    """`values` if it is ``[N]``; a label with more columns cannot colour or group examples."""
    if values.ndim != 1:
        raise AnalysisError(
            f"label {label!r} has shape [N, {', '.join(map(str, values.shape[1:]))}]: colour and group by "
            f"one value per example; pick a column, e.g. '{label}[0]'"
        )
    return values

