"""Colours of figures: a qualitative palette for categories (a legend), and the scale of signed
and non-negative codes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Normalize

from latentcode.analysis.labels import display_value, is_categorical

__all__ = ["MAX_LEGEND_VALUES", "OTHER_COLOUR", "TOP_VALUES", "category_groups", "code_scale",
           "is_categorical_label", "palette"]


def palette(n: int) -> list:
    colours = colormaps["tab10" if n <= 10 else "tab20"]
    return [colours(i % colours.N) for i in range(n)]


# Categorical labels with more values than a legend can tell apart show their most frequent values
# in colour and the rest in grey.
MAX_LEGEND_VALUES = 20
TOP_VALUES = 10
OTHER_COLOUR = (0.78, 0.78, 0.78, 1.0)


def is_categorical_label(values: np.ndarray) -> bool:
    """Integer (or bool) labels are categories, however many values they take (a task index, a
    rule); float labels are continuous unless they hold a few integer values."""
    return values.dtype.kind in "biu" or is_categorical(values)


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
    groups = [(f"other ({n_rest} values)", rest, OTHER_COLOUR)]
    groups += [(display_value(category, names), values == category, colour)
               for category, colour in zip(top, palette(len(top)), strict=True)]
    note = f"the {len(top)} most frequent of {len(categories)} values of {{label}} in colour, the other {n_rest} grey"
    return groups, note



def code_scale(codes: np.ndarray) -> tuple[Normalize, str]:
    """Signed codes (HYLA, linear attention): symmetric about 0 on a diverging map, white at 0;
    non-negative codes (softmax): from 0 to the largest on a sequential map."""
    if codes.min() < 0:
        reach = float(np.abs(codes).max())
        return Normalize(-reach, reach), "RdBu_r"
    return Normalize(0.0, float(codes.max()) or 1.0), "magma"
