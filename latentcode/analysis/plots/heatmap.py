"""Heatmaps of the cosine similarity of mean latent codes per label value, all panels of a figure
on one colour scale and in one row order."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Colormap, Normalize

from latentcode.analysis.captions import codes_context, wrap_lines
from latentcode.analysis.labels import display_value, value_names
from latentcode.analysis.picture_plan import plan_picture
from latentcode.analysis.plots.figure import new_figure, panel_grid, save_figure
from latentcode.analysis.similarity import mean_code_similarity
from latentcode.store import CodeFile

__all__ = ["plot_similarity"]

ANNOTATE_MAX_VALUES = 20
# Centre the codes (by default) where most panels' plain cosines lie within this of 1: there they
# mostly measure the code all values share ...
CENTRE_BELOW_SPREAD = 0.2
# ... and where the label explains at least this share of the code variance in most panels: below it,
# centring magnifies differences between value means that are a sliver of the variance.
CENTRE_ABOVE_SHARE = 0.01
# Below this share of the code variance explained by the label, a panel is marked weak (its title says
# so, its frame is dashed): 0.2% must not read as structure. Its colours stay those of the colour bar.
WEAK_SHARE = 0.1


def _should_centre(panels: Sequence) -> tuple[bool, str]:
    spreads = [1.0 - panel.off_diagonal_range()[0] for panel in panels if not panel.constant]
    if not spreads:
        return False, ""
    median = float(np.median(spreads))
    if median >= CENTRE_BELOW_SPREAD:
        return False, ""
    shares = [panel.explained_variance for panel in panels if panel.explained_variance is not None]
    if shares and float(np.median(shares)) < CENTRE_ABOVE_SHARE:
        return False, (f"not centred: the label explains under {CENTRE_ABOVE_SHARE:.0%} of the code variance in most "
                       f"panels (median {float(np.median(shares)):.2%}), so centring would magnify noise")
    lowest = 1.0 - max(spreads)
    return True, (f"centred because the plain cosine similarities of most panels lie within {CENTRE_BELOW_SPREAD} "
                  f"of 1 (median spread {median:.3f}, lowest value {lowest:.2f}); centre=False draws them")


def _is_weak(panel) -> bool:
    """Whether the label explains under `WEAK_SHARE` of the code variance (False where the share is
    unknown, e.g. a multi-hot label)."""
    return panel.explained_variance is not None and panel.explained_variance < WEAK_SHARE


def _in_order(panel, values: np.ndarray):
    """`panel` with its rows and columns in the order of `values` (values it lacks are skipped; its
    values not in `values` follow in its own order), so that every panel of a figure reads alike."""
    position = {value: index for index, value in enumerate(panel.values.tolist())}
    order = [position[value] for value in values.tolist() if value in position]
    order += [index for index in range(len(panel.values)) if index not in set(order)]
    order = np.asarray(order, dtype=int)
    return dataclasses.replace(panel, matrix=panel.matrix[np.ix_(order, order)], values=panel.values[order],
                               order=panel.order[order], counts=panel.counts[order], mean_codes=panel.mean_codes[order])


def _similarity_scale(panels: Sequence, centre: bool) -> tuple[Normalize, Colormap]:
    """One colour scale for every panel of a figure: -1 to 1 on a diverging map (white at 0) for
    centred or partly negative similarities, else the lowest value of any panel to 1 on viridis."""
    low = min((float(panel.matrix.min()) for panel in panels if not panel.constant), default=1.0)
    if centre or low < 0:
        return Normalize(-1.0, 1.0), colormaps["RdBu_r"]
    return Normalize(min(low, 0.99), 1.0), colormaps["viridis"]


def plot_similarity(
    code_files: CodeFile | str | Path | Sequence[CodeFile | str | Path],
    label: str,
    path_stem: str | Path,
    layers: Sequence[int] | None = None,
    split: str | None = None,
    annotate: bool | None = None,
    centre: bool | None = None,
    formats: Sequence[str] = ("png",),
    figsize: tuple[float, float] | None = None,
    dpi: float = 100,
) -> list[Path]:
    """Cosine similarity of the mean latent code of each label value: one heatmap per layer
    (default: every layer) and per codes file (a model's panels on rows of at most
    `figure.MAX_COLUMNS`; each model starts a row), all on one colour scale, rows
    and columns of every panel in one order (the clustered order of the first model's last layer),
    so that panels compare cell by cell. Each title gives the share of the code variance the label
    explains; a panel under `WEAK_SHARE` is marked weak (title and dashed frame), its colours still
    those of the bar: a label that explains 0.2% of the variance never looks like structure.

    centre: subtract the grand mean code before comparing (see `latentcode.analysis.similarity`),
        drawn on a diverging scale from -1 to 1; by default (None) centred where the plain
        cosines of most panels lie within `CENTRE_BELOW_SPREAD` of 1 and the label explains at
        least `CENTRE_ABOVE_SHARE` of the variance, and the title says so.
    annotate: write the value in each cell; by default only up to ANNOTATE_MAX_VALUES label values,
        beyond which the numbers are too small to read (the colour bar still gives them).

    Layers whose codes are all equal get a sentence instead of a uniform square.
    """
    plan = plan_picture(code_files, label, path_stem, kind="similarity", split=split, formats=formats, overwrite=True)
    files, label = list(plan.code_files), plan.label  # checked as `latentcode heatmap` checks them
    layers_of = [list(code_file.layers if layers is None else layers) for code_file in files]

    def similarities(centred: bool) -> list[list]:  # [file][layer]
        return [[mean_code_similarity(code_file, label, layer, split, centre=centred) for layer in file_layers]
                for code_file, file_layers in zip(files, layers_of, strict=True)]

    rows, reason = similarities(False), ""
    if centre is None:
        centre, reason = _should_centre([panel for row in rows for panel in row])
    if centre:
        rows = similarities(True)
    # One order for every panel: the clustered order of the first model's last drawn layer.
    reference = next((panel for panel in reversed(rows[0]) if not panel.constant), None)
    if reference is not None:
        rows = [[panel if panel.constant else _in_order(panel, reference.values) for panel in row] for row in rows]
    panels = [panel for row in rows for panel in row]
    label = panels[0].label
    names = value_names(files[0], label)
    n_values = max(len(panel.values) for panel in panels)
    if annotate is None:
        annotate = n_values <= ANNOTATE_MAX_VALUES
    # Inches per panel: room for the tick names, at most 7 (a comparison has several rows), and beside
    # it for long tick names (a fuzzy-logic task is its function), so that the squares keep their
    # size; names of up to 18 characters fit in the panel's own margin.
    longest = max((len(display_value(value, names)) for panel in panels for value in panel.values), default=0)
    side = min(max(3.6, 0.42 * n_values + 2.0), 7.0) + min(2.5, max(0.0, 0.055 * (longest - 18)))
    # Each file's layers on rows of at most MAX_COLUMNS panels; a new file starts a new row.
    n_columns = panel_grid(max(len(row) for row in rows))[1]
    lines = [(row[start:start + n_columns], code_file) for row, code_file in zip(rows, files, strict=True)
             for start in range(0, max(1, len(row)), n_columns)]
    width = side * n_columns + 1.4
    figure = new_figure(figsize or (width, side * len(lines) + 1.3), dpi)
    axes = figure.subplots(len(lines), n_columns, squeeze=False)
    norm, colours = _similarity_scale(panels, centre)
    image = None
    for row_axes, (row, code_file) in zip(axes, lines, strict=True):
        for axis, panel in zip(row_axes, row, strict=False):
            title = f"layer {panel.layer}" if len(files) == 1 else f"{code_file.model_name}, layer {panel.layer}"
            if panel.constant:
                axis.set_axis_off()
                axis.text(0.5, 0.5, "\n".join(textwrap.wrap(
                    f"{title}: the codes are the same for every example, so every mean code is too; "
                    "nothing to compare", 32)), ha="center", va="center", transform=axis.transAxes)
                continue
            image = _draw_panel(axis, panel, title, label, names, square=side - 0.07 * longest - 0.75,
                                colours=colours, norm=norm, annotate=annotate)
        for axis in row_axes[len(row):]:
            axis.set_visible(False)
    if image is not None:
        what = "centred cosine similarity" if centre else "cosine similarity"
        figure.colorbar(image, ax=axes.ravel().tolist(), label=what, shrink=0.8)
    weak = [panel for panel in panels if not panel.constant and _is_weak(panel)]
    models = ", ".join(code_file.model_name for code_file in files)
    contexts = list(dict.fromkeys(codes_context(code_file, split) for code_file in files))
    measure = "centred cosine similarity (grand mean code subtracted)" if centre else "cosine similarity"
    where = "" if reference is None or len(panels) == 1 else (
        f" of {reference.model_name or files[0].model_name}, layer {reference.layer}, in every panel")
    figure.suptitle(wrap_lines([
        f"{models}: {measure} of the mean latent code per {label}",
        *contexts,
        f"rows and columns in the hierarchical-clustering order{where}; one colour scale for all panels",
        reason,
        f"weak (dashed frame): {label} explains under {WEAK_SHARE:.0%} of the code variance, so the "
        "differences drawn are a sliver of it; colours are those of the bar" if weak else "",
    ], width, fontsize_points=10), fontsize="medium")
    return save_figure(figure, path_stem, formats, dpi)


def _draw_panel(axis, panel, title: str, label: str, names, *, square: float, colours, norm, annotate: bool):
    """One layer's heatmap of `panel` on `axis` (title wrapped to the `square`'s inches, weak panels
    framed dashed, values written in the cells where `annotate`); its image, for the colour bar."""
    if panel.explained_variance is not None:
        share = panel.explained_variance
        title += f" ({label} explains {share:.{1 if share < 0.1 else 0}%} of code variance)"
        if _is_weak(panel):
            title = "weak: " + title
    # Wrapped to the square, not the panel: a title wider than its axes runs into the next panel
    # or the colour bar (the panel's side also holds the tick names, about 0.07 inch a character).
    axis.set_title("\n".join(textwrap.wrap(title, max(16, int(square * 72 / 5.5)))), fontsize="medium")
    image = axis.imshow(panel.matrix, cmap=colours, norm=norm)
    if _is_weak(panel):  # a dashed grey frame: the differences drawn are a sliver of the variance
        for spine in axis.spines.values():
            spine.set(linestyle=(0, (4, 3)), edgecolor="0.45", linewidth=1.6)
    ticks = [display_value(value, names) for value in panel.values]
    positions = np.arange(len(ticks))
    axis.set_xticks(positions, ticks, rotation=90, fontsize="small" if len(ticks) <= 30 else "x-small")
    axis.set_yticks(positions, ticks, fontsize="small" if len(ticks) <= 30 else "x-small")
    axis.set(xlabel=label, ylabel=label)
    if annotate:
        font = max(4.0, min(9.0, 80.0 / len(ticks)))
        for (row_index, column), value in np.ndenumerate(panel.matrix):
            shade = norm(value)
            # Light text on the dark ends of the map, dark text in between.
            dark = shade < 0.6 if colours.name == "viridis" else abs(shade - 0.5) > 0.3
            axis.text(column, row_index, f"{value:.2f}", ha="center", va="center", fontsize=font,
                      color="white" if dark else "black")
    return image
