"""A grid of raw latent codes: one panel per label value, examples by heads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from latentcode.analysis.captions import codes_context, wrap_lines
from latentcode.analysis.labels import display_value, select_label, value_names
from latentcode.analysis.plots.colours import colour_scale
from latentcode.analysis.plots.figure import new_figure, one_column, open_codes, save_figure
from latentcode.errors import AnalysisError
from latentcode.store import CodeFile

__all__ = ["plot_code_samples"]


def plot_code_samples(
    code_file: CodeFile | str,
    label: str,
    path_stem: str | Path,
    layer: int | None = None,
    split: str | None = None,
    n_samples: int = 8,
    seed: int = 0,
    max_values: int = 12,
    formats: Sequence[str] = ("png",),
    figsize: tuple[float, float] | None = None,
    dpi: float = 100,
) -> list[Path]:
    """A grid of raw latent codes: one panel per value of an integer label (the `max_values` most
    frequent, if there are more), showing up to `n_samples` random examples (rows, drawn with
    `seed`) by heads (columns), on one shared colour scale. The codes are those of all sites of
    `layer` (default: the last), side by side. Signed codes (HYLA, linear attention) are drawn
    on a diverging scale with 0 white; non-negative ones (softmax) on a sequential scale from 0."""
    code_file = open_codes(code_file)
    layer = code_file.layers[-1] if layer is None else layer
    values, label = select_label(code_file, label, split)
    values = one_column(values, label)
    if values.dtype.kind not in "iub":
        raise AnalysisError(f"label {label!r} is not integer-valued; the sample grid needs one panel per value")
    codes = code_file.layer_codes(layer, split)
    sites = code_file.sites_of_layer(layer)
    names = value_names(code_file, label)
    rng = np.random.default_rng(seed)
    categories, counts = np.unique(values, return_counts=True)
    n_values = len(categories)
    if n_values > max_values:  # the most frequent values, in their natural order
        categories = np.sort(categories[np.argsort(-counts, kind="stable")[:max_values]])
    samples = []
    for category in categories:
        members = np.flatnonzero(values == category)
        chosen = np.sort(rng.choice(members, size=min(n_samples, len(members)), replace=False))
        samples.append((category, len(members), codes[chosen]))
    n_columns = min(4, len(categories))
    n_rows = -(-len(categories) // n_columns)
    width = 3.4 * n_columns + 1.0
    figure = new_figure(figsize or (width, 2.2 * n_rows + 1.3), dpi)
    axes = figure.subplots(n_rows, n_columns, squeeze=False).ravel()
    shown = np.concatenate([block for _, _, block in samples])
    norm, colours = colour_scale(shown, "magma", from_zero=True)
    signed = colours == "RdBu_r"
    separator = "black" if signed else "white"
    for axis, (category, count, block) in zip(axes, samples, strict=False):
        image = axis.imshow(block, cmap=colours, norm=norm, aspect="auto", interpolation="nearest")
        # wrapped to the panel: a fuzzy-logic task's name is its whole function
        axis.set_title(wrap_lines([f"{label} = {display_value(category, names)} (n={count})"], 3.2,
                                  fontsize_points=9), fontsize="small")
        axis.set_xlabel("head" if len(sites) == 1 else "site × head")
        axis.set_ylabel("example")
        axis.set_yticks(range(len(block)))
        axis.tick_params(labelsize="x-small")
        for boundary in range(1, len(sites)):
            axis.axvline(boundary * code_file.n_heads - 0.5, color=separator, linewidth=1)
    for axis in axes[len(samples):]:
        axis.set_visible(False)
    scale = "signed: 0 is white" if signed else "non-negative"
    figure.colorbar(image, ax=list(axes[: len(samples)]), label=f"latent code ({scale})", shrink=0.8)
    constant = np.ptp(codes, axis=0).max() == 0 if len(codes) else False
    figure.suptitle(wrap_lines([
        f"{code_file.model_name}: raw latent codes at layer {layer}, up to {n_samples} random examples per {label}"
        + (f" ({len(categories)} most frequent of {n_values} values)" if n_values > len(categories) else ""),
        codes_context(code_file, split, layer),
        f"layer {layer}'s codes are the same for every example" if constant else "",
    ], width, fontsize_points=10), fontsize="medium")
    return save_figure(figure, path_stem, formats, dpi)


