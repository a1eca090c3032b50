"""Colours of figures: a qualitative palette for categories (a legend, the rare values grouped as
'other'), a sequential scale for continuous values and a diverging one, centred at 0, for signed values."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Normalize

from latentcode.analysis.labels import display_value

__all__ = ["MAX_LEGEND_VALUES", "OTHER_COLOUR", "TOP_VALUES", "category_groups", "colour_scale", "palette"]


def palette(n: int, without_grey: bool = False) -> list:
    """`n` qualitative colours (tab10, or tab20 beyond 10); `without_grey` leaves out the greys
    of those maps (at most 9 colours from tab10, 18 from tab20), for figures where grey means 'other'."""
    colours = colormaps["tab10" if n <= (9 if without_grey else 10) else "tab20"]
    chosen = [colours(i) for i in range(colours.N)]
    if without_grey:
        chosen = [colour for colour in chosen if not np.allclose(colour[:3], colour[0])]
    return [chosen[i % len(chosen)] for i in range(n)]


# Categorical labels with more values than a legend can tell apart show their most frequent values
# in colour (never grey, so that none looks like 'other') and the rest in grey, as one legend entry
# that says how many values and what share of the points it holds.
MAX_LEGEND_VALUES = 20
TOP_VALUES = 9
OTHER_COLOUR = (0.78, 0.78, 0.78, 1.0)


def category_groups(values: np.ndarray, names: Sequence[str] | None) -> tuple[list[tuple[str, np.ndarray, tuple]], str]:
    """``(groups, note)``: a (legend text, member mask, colour) per value, in value order, with
    'other' first (drawn underneath) when there are more than `MAX_LEGEND_VALUES` values; the
    note says so for the title."""
    categories, counts = np.unique(values, return_counts=True)
    if len(categories) <= MAX_LEGEND_VALUES:
        colours = palette(len(categories))
        return [(display_value(category, names), values == category, colour)
                for category, colour in zip(categories, colours, strict=True)], ""
    top = np.sort(categories[np.argsort(-counts, kind="stable")[:TOP_VALUES]])
    rest = ~np.isin(values, top)
    n_rest = len(categories) - len(top)
    groups = [(f"other ({n_rest} values, {rest.mean():.0%} of points)", rest, OTHER_COLOUR)]
    groups += [(display_value(category, names), values == category, colour)
               for category, colour in zip(top, palette(len(top), without_grey=True), strict=True)]
    note = f"the {len(top)} most frequent of {len(categories)} values of {{label}} in colour, the other {n_rest} grey"
    return groups, note


def colour_scale(values: np.ndarray, sequential: str = "viridis", from_zero: bool = False) -> tuple[Normalize, str]:
    """The colour scale of continuous values (codes, a float label): signed values (any below 0)
    symmetric about 0 on the diverging RdBu_r, 0 white; others on the `sequential` map from
    their smallest value (from 0 where `from_zero`, e.g. softmax codes) to their largest."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return Normalize(0.0, 1.0), sequential
    low, high = float(values.min()), float(values.max())
    if low < 0:
        reach = max(abs(low), abs(high))
        return Normalize(-reach, reach), "RdBu_r"
    low = 0.0 if from_zero else low
    return Normalize(low, high if high > low else low + 1.0), sequential
