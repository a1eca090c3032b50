"""Figures of latent codes: embeddings, similarity heatmaps, raw code samples, probe scores.

Every function takes an output path stem (``figures/hyla_tsne`` -> ``figures/hyla_tsne.png``)
and ``formats`` (any of `FORMATS`), and returns the paths it wrote. Figures are titled with the
model, layer, split and label, and have labelled axes. Integer labels with at most
`latentcode.analysis.labels.MAX_CATEGORIES` values are drawn as categories (a palette and a
legend), others with a colour bar; SRAVEN rule labels are named by their rules.

Figures are made with `matplotlib.figure.Figure` and the Agg canvas directly, never through
pyplot: nothing is registered globally, no display is needed, and a figure is freed once saved.
The pixel size of a PNG is ``figsize * dpi`` exactly (no tight bounding box).
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from latentcode.analysis.captions import codes_context, site_set, variant_of, wrap_lines
from latentcode.analysis.embed import DEFAULT_MAX_POINTS, Embedding, embed
from latentcode.analysis.labels import display_value, is_categorical, select_label, value_names
from latentcode.analysis.probes import HEADLINE_METRICS
from latentcode.analysis.similarity import mean_code_similarity
from latentcode.errors import AnalysisError
from latentcode.files import AtomicOutputs
from latentcode.store import CodeFile

__all__ = ["FORMATS", "plot_code_samples", "plot_embedding", "plot_probe_scores", "plot_similarity"]

FORMATS = ("png", "svg", "pdf")


# -- shared helpers --------------------------------------------------------------------------------
def _figure(figsize: tuple[float, float], dpi: float) -> Figure:
    figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path_stem: str | Path, formats: Sequence[str], dpi: float) -> list[Path]:
    formats = [formats] if isinstance(formats, str) else list(formats)
    unknown = [fmt for fmt in formats if fmt not in FORMATS]
    if unknown or not formats:
        raise AnalysisError(f"formats {formats}: expected one or more of {FORMATS}")
    stem = Path(path_stem)
    # All formats or none, through temporaries (never through a planted link), one writer of a stem at a time.
    with AtomicOutputs(lock=stem, purpose="writing a figure") as outputs:
        for fmt in formats:
            figure.savefig(outputs.temporary(stem.with_name(f"{stem.name}.{fmt}")), format=fmt, dpi=dpi)
    figure.clear()  # drop the artists now rather than whenever the figure is collected
    return outputs.written


def _open(code_file: CodeFile | str) -> CodeFile:
    return code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)


def _palette(n: int) -> list:
    colours = colormaps["tab10" if n <= 10 else "tab20"]
    return [colours(i % colours.N) for i in range(n)]


def _one_column(values: np.ndarray, label: str) -> np.ndarray:
    if values.ndim != 1:
        raise AnalysisError(
            f"label {label!r} has shape [N, {', '.join(map(str, values.shape[1:]))}]: colour and group by "
            f"one value per example; pick a column, e.g. '{label}[0]'"
        )
    return values


# -- embeddings ------------------------------------------------------------------------------------
# Categorical labels with more values than a legend can tell apart show their most frequent values
# in colour and the rest in grey.
MAX_LEGEND_VALUES = 20
TOP_VALUES = 10
OTHER_COLOUR = (0.78, 0.78, 0.78, 1.0)


def _is_categorical_label(values: np.ndarray) -> bool:
    """Integer (or bool) labels are categories, however many values they take (a task index, a
    rule); float labels are continuous unless they hold a few integer values."""
    return values.dtype.kind in "biu" or is_categorical(values)


def _category_groups(values: np.ndarray, names: Sequence[str] | None) -> tuple[list[tuple[str, np.ndarray, tuple]], str]:
    """``(groups, note)``: a (legend text, member mask, colour) per value, in value order, with
    'other' first (drawn underneath) when there are more than `MAX_LEGEND_VALUES` values; the
    note says so for the title."""
    categories, counts = np.unique(values, return_counts=True)
    if len(categories) <= MAX_LEGEND_VALUES:
        colours = _palette(len(categories))
        return [(display_value(category, names), values == category, colour)
                for category, colour in zip(categories, colours, strict=True)], ""
    top = np.sort(categories[np.argsort(-counts, kind="stable")[:TOP_VALUES]])
    rest = ~np.isin(values, top)
    n_rest = len(categories) - len(top)
    groups = [(f"other ({n_rest} values)", rest, OTHER_COLOUR)]
    groups += [(display_value(category, names), values == category, colour)
               for category, colour in zip(top, _palette(len(top)), strict=True)]
    note = f"the {len(top)} most frequent of {len(categories)} values of {{label}} in colour, the other {n_rest} grey"
    return groups, note


def _constant_sentence(layers: Sequence[int], what: str) -> str:
    if not layers:
        return ""
    names = ", ".join(map(str, layers))
    layer_text = f"layer {names} is" if len(layers) == 1 else f"layers {names} are"
    return (f"{layer_text[0].upper()}{layer_text[1:]} not drawn: {'its' if len(layers) == 1 else 'their'} codes "
            f"are the same for every example, so there is nothing to {what}")


def plot_embedding(
    code_file: CodeFile | str,
    color_by: str,
    path_stem: str | Path,
    method: str = "tsne",
    split: str | None = None,
    layers: Sequence[int] | None = None,
    max_points: int | None = DEFAULT_MAX_POINTS,
    seed: int = 0,
    stratify: str | None = None,
    embedding: Embedding | None = None,
    formats: Sequence[str] = ("png",),
    figsize: tuple[float, float] | None = None,
    dpi: float = 100,
    progress: bool | None = None,
) -> list[Path]:
    """tSNE or UMAP of the codes, one panel per layer, coloured by a label spec.

    The embedding is computed with `latentcode.analysis.embed.embed` (arguments `method` to
    `stratify`, and `progress`: a bar over the layers, by default where stderr is a terminal)
    unless one is given. Categorical labels
    (integers) get a qualitative palette and a legend (beyond `MAX_LEGEND_VALUES` values, the
    `TOP_VALUES` most frequent in colour and the rest grey); continuous labels a colour bar.
    Layers whose codes are all equal get a sentence, not an empty panel. The title names the
    model, the sites, the variant and the split, and how many of how many examples were used.
    """
    code_file = _open(code_file)
    if embedding is None:
        embedding = embed(code_file, method, split, layers, max_points, seed, stratify, progress=progress)
    values, label = select_label(code_file, color_by, embedding.split)
    values = _one_column(values, label)[embedding.indices]
    method_name = {"tsne": "tSNE", "umap": "UMAP"}.get(embedding.method, embedding.method)
    drawn = [layer for layer in embedding.layers if layer not in embedding.constant_layers]
    n_panels = max(1, len(drawn))
    categorical = _is_categorical_label(values)
    width = figsize[0] if figsize else max(7.0, 3.6 * n_panels + (2.6 if categorical else 1.4))
    figure = _figure(figsize or (width, 4.9), dpi)
    axes = np.atleast_1d(figure.subplots(1, n_panels, squeeze=False)[0])
    size = float(np.clip(6000 / max(embedding.n_used, 1), 2, 24))
    note = ""
    if categorical:
        groups, note = _category_groups(values, value_names(code_file, label))
        note = note.format(label=label)
    else:
        norm = Normalize(float(np.nanmin(values)), float(np.nanmax(values)))
    for axis, layer in zip(axes, drawn, strict=False):
        xy = embedding.coordinates[layer]
        if categorical:
            for _, members, colour in groups:
                axis.scatter(xy[members, 0], xy[members, 1], s=size, color=colour, linewidths=0, alpha=0.85)
        else:
            mappable = axis.scatter(xy[:, 0], xy[:, 1], c=values, s=size, cmap="viridis", norm=norm, linewidths=0)
        axis.set_title(f"layer {layer}")
        axis.set_xlabel(f"{method_name} 1")
        axis.set_ylabel(f"{method_name} 2")
        axis.set_xticks([])
        axis.set_yticks([])
    constant = _constant_sentence(embedding.constant_layers, "embed")
    if not drawn:  # every layer constant: the sentence is the figure
        axes[0].set_axis_off()
        axes[0].text(0.5, 0.5, "\n".join(textwrap.wrap(constant, 40)), ha="center", va="center",
                     transform=axes[0].transAxes)
    elif categorical:
        handles = [Line2D([], [], marker="o", linestyle="", color=colour, label=text) for text, _, colour in groups]
        if groups[0][2] == OTHER_COLOUR:  # 'other' last in the legend, first underneath the points
            handles = handles[1:] + handles[:1]
        # On the last panel, so that constrained layout keeps it clear of the title.
        axes[len(drawn) - 1].legend(handles=handles, title=label, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                                    borderaxespad=0, fontsize="small")
    else:
        figure.colorbar(mappable, ax=list(axes), label=label)
    figure.suptitle(wrap_lines([
        f"{embedding.model_name}: {method_name} of latent codes, coloured by {label}",
        codes_context(code_file, embedding.split),
        embedding.describe() + (f"; {note}" if note else ""),
        constant if drawn else "",
    ], width, fontsize_points=10), fontsize="medium")
    return _save(figure, path_stem, formats, dpi)


# -- similarity heatmap ----------------------------------------------------------------------------
ANNOTATE_MAX_VALUES = 20
# Centre the codes (by default) where most panels' plain cosines lie within this of 1: there they
# mostly measure the code all values share ...
CENTRE_BELOW_SPREAD = 0.2
# ... and where the label explains at least this share of the code variance in most panels: below it,
# centring magnifies differences between value means that are a sliver of the variance.
CENTRE_ABOVE_SHARE = 0.01
# A panel's colours are at full strength where the label explains this share of the code variance or
# more, and faded towards white in proportion below it: 0.2% is drawn almost white, never saturated.
FULL_COLOUR_SHARE = 0.1


def _as_list(code_files) -> list[CodeFile]:
    if isinstance(code_files, (CodeFile, str, Path)):
        code_files = [code_files]
    return [_open(code_file) for code_file in code_files]


def _heatmap_side(n_values: int) -> float:
    """Inches per panel: room for the tick names, at most 7 (a comparison has several rows)."""
    return min(max(3.6, 0.42 * n_values + 2.0), 7.0)


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


def _colour_strength(panel) -> float:
    """1 where the label explains `FULL_COLOUR_SHARE` of the code variance or more, proportionally
    less below (1 where the share is unknown, e.g. a multi-hot label)."""
    if panel.explained_variance is None:
        return 1.0
    return float(np.clip(panel.explained_variance / FULL_COLOUR_SHARE, 0.0, 1.0))


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
    (default: every layer) and per codes file (a row per model), all on one colour scale, rows
    and columns of every panel in one order (the clustered order of the first model's last layer),
    so that panels compare cell by cell. A panel's colours fade towards white in proportion to the
    share of the code variance the label explains, full at `FULL_COLOUR_SHARE` (its title gives
    the share): a label that explains 0.2% of the variance never looks like structure.

    centre: subtract the grand mean code before comparing (see `latentcode.analysis.similarity`),
        drawn on a diverging scale from -1 to 1; by default (None) centred where the plain
        cosines of most panels lie within `CENTRE_BELOW_SPREAD` of 1 and the label explains at
        least `CENTRE_ABOVE_SHARE` of the variance, and the title says so.
    annotate: write the value in each cell; by default only up to ANNOTATE_MAX_VALUES label values,
        beyond which the numbers are too small to read (the colour bar still gives them).

    Layers whose codes are all equal get a sentence instead of a uniform square.
    """
    files = _as_list(code_files)
    layers_of = [list(code_file.layers if layers is None else layers) for code_file in files]
    plain = [[mean_code_similarity(code_file, label, layer, split) for layer in file_layers]
             for code_file, file_layers in zip(files, layers_of, strict=True)]
    reason = ""
    if centre is None:
        centre, reason = _should_centre([panel for row in plain for panel in row])
    rows = plain if not centre else [
        [mean_code_similarity(code_file, label, layer, split, centre=True) for layer in file_layers]
        for code_file, file_layers in zip(files, layers_of, strict=True)
    ]
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
    # Room beside each panel for long tick names (a fuzzy-logic task is its function), so that the
    # squares keep their size; names of up to 18 characters fit in the panel's own margin.
    longest = max((len(display_value(value, names)) for panel in panels for value in panel.values), default=0)
    side = _heatmap_side(n_values) + min(2.5, max(0.0, 0.055 * (longest - 18)))
    n_columns = max(len(row) for row in rows)
    width = side * n_columns + 1.4
    figure = _figure(figsize or (width, side * len(rows) + 1.3), dpi)
    axes = figure.subplots(len(rows), n_columns, squeeze=False)
    norm, colours = _similarity_scale(panels, centre)
    image = None
    for row_axes, row, code_file in zip(axes, rows, files, strict=True):
        for axis, panel in zip(row_axes, row, strict=False):
            title = f"layer {panel.layer}" if len(files) == 1 else f"{code_file.model_name}, layer {panel.layer}"
            if panel.constant:
                axis.set_axis_off()
                axis.text(0.5, 0.5, "\n".join(textwrap.wrap(
                    f"{title}: the codes are the same for every example, so every mean code is too; "
                    "nothing to compare", 32)), ha="center", va="center", transform=axis.transAxes)
                continue
            if panel.explained_variance is not None:
                share = panel.explained_variance
                title += f" ({label} explains {share:.1%} of code variance)" if share < 0.1 else \
                    f" ({label} explains {share:.0%} of code variance)"
            axis.set_title("\n".join(textwrap.wrap(title, int(side * 72 / 6.6))))
            # faded towards white (the figure's background) where the label explains little variance
            strength = _colour_strength(panel)
            image = axis.imshow(panel.matrix, cmap=colours, norm=norm, alpha=strength)
            ticks = [display_value(value, names) for value in panel.values]
            positions = np.arange(len(ticks))
            axis.set_xticks(positions, ticks, rotation=90, fontsize="small" if len(ticks) <= 30 else "x-small")
            axis.set_yticks(positions, ticks, fontsize="small" if len(ticks) <= 30 else "x-small")
            axis.set_xlabel(label)
            axis.set_ylabel(label)
            if annotate:
                font = max(4.0, min(9.0, 80.0 / len(ticks)))
                for (row_index, column), value in np.ndenumerate(panel.matrix):
                    shade = norm(value)
                    # Light text on the dark ends of the map, dark text in between (and on faded colours).
                    dark = strength > 0.5 and (shade < 0.6 if colours.name == "viridis" else abs(shade - 0.5) > 0.3)
                    axis.text(column, row_index, f"{value:.2f}", ha="center", va="center", fontsize=font,
                              color="white" if dark else "black")
        for axis in row_axes[len(row):]:
            axis.set_visible(False)
    if image is not None:
        what = "centred cosine similarity" if centre else "cosine similarity"
        bar = figure.colorbar(image, ax=axes.ravel().tolist(), label=what, shrink=0.8)
        bar.solids.set_alpha(1)  # the scale at full strength, whatever the last panel's
    faded = [panel for panel in panels if not panel.constant and _colour_strength(panel) < 1]
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
        f"colours faded in proportion to the share of code variance {label} explains, full at "
        f"{FULL_COLOUR_SHARE:.0%} or more" if faded else "",
    ], width, fontsize_points=10), fontsize="medium")
    return _save(figure, path_stem, formats, dpi)


# -- raw code samples ------------------------------------------------------------------------------
def _code_scale(codes: np.ndarray) -> tuple[Normalize, str]:
    """Signed codes (HYLA, linear attention): symmetric about 0 on a diverging map, white at 0;
    non-negative codes (softmax): from 0 to the largest on a sequential map."""
    if codes.min() < 0:
        reach = float(np.abs(codes).max())
        return Normalize(-reach, reach), "RdBu_r"
    return Normalize(0.0, float(codes.max()) or 1.0), "magma"


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
    code_file = _open(code_file)
    layer = code_file.layers[-1] if layer is None else layer
    values, label = select_label(code_file, label, split)
    values = _one_column(values, label)
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
    figure = _figure(figsize or (width, 2.2 * n_rows + 1.3), dpi)
    axes = figure.subplots(n_rows, n_columns, squeeze=False).ravel()
    shown = np.concatenate([block for _, _, block in samples])
    norm, colours = _code_scale(shown)
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
    return _save(figure, path_stem, formats, dpi)


def _files_of_table(rows: pd.DataFrame) -> list[CodeFile]:
    """The codes files a probe table was made from, where they can still be read."""
    files = []
    for path in dict.fromkeys(rows["file"].astype(str)) if "file" in rows else ():
        try:
            files.append(CodeFile(path))
        except (OSError, ValueError):  # moved or deleted since: the title just says less
            pass
    return files


def _table_context(rows: pd.DataFrame) -> str:
    """The site sets and variants of the files of a table, e.g. 'last-self sites (...) · fixed_query variant'."""
    contexts = []
    for code_file in _files_of_table(rows):
        variant = variant_of(code_file)
        contexts.append(site_set(code_file) + (f" · {variant} variant" if variant else ""))
    return " | ".join(dict.fromkeys(contexts))


def _described_splits(rows: pd.DataFrame, splits: str) -> str:
    """``"ood"`` -> ``"ood (held-out rule multisets)"`` where the table's files describe the split."""
    descriptions = {}
    for code_file in _files_of_table(rows):
        descriptions = {**code_file.split_descriptions, **descriptions}
    return "/".join(f"{split} ({descriptions[split]})" if split in descriptions else split
                    for split in splits.split("/"))


def _split_caption(rows: pd.DataFrame, fit: str, test: str) -> str:
    """``"train: in-distribution functions; ood: unseen combinations"`` where the files describe them."""
    described = [_described_splits(rows, split) for split in dict.fromkeys([*fit.split("/"), *test.split("/")])]
    return "; ".join(text.replace(" (", ": ", 1)[:-1] for text in described if text.endswith(")"))


# -- probe scores ----------------------------------------------------------------------------------
def plot_probe_scores(
    table: pd.DataFrame | str | Path,
    path_stem: str | Path,
    metric: str | None = None,
    formats: Sequence[str] = ("png",),
    figsize: tuple[float, float] = (6.4, 4.4),
    dpi: float = 100,
    models_note: str | None = None,
) -> list[Path]:
    """Score per layer per model from a `decode` / `regress` table (or its CSV / JSON file): one
    solid line per (model, site, label), with its shuffled-label control dashed in the same colour,
    its strongest other baseline dotted where that is neither the control nor chance, and chance
    (the majority baseline: the most frequent value, or the mean for R²) as a grey line. The title
    is short (label, metric, splits); the sites and variant are a caption under the axes. The
    legend has an entry for what is drawn only.

    `metric` defaults to the first of `HEADLINE_METRICS` the table has. `models_note` adds a line to
    the title about the models that the codes file cannot say, e.g. "models trained on the
    permuted variant" where their codes were read on another.
    """
    if not isinstance(table, pd.DataFrame):
        path = Path(table)
        table = pd.read_json(path) if path.suffix == ".json" else pd.read_csv(path)
    if metric is None:
        present = [name for name in HEADLINE_METRICS if (table["metric"] == name).any()]
        if not present:
            raise AnalysisError(f"the table has no metric of {HEADLINE_METRICS}; pass metric= one of "
                             f"{sorted(table['metric'].unique())}")
        metric = present[0]
    rows = table[table["metric"] == metric]
    if rows.empty:
        raise AnalysisError(f"the table has no rows with metric {metric!r}; it has {sorted(table['metric'].unique())}")
    keys = ["model", "file", "site", "label"]
    groups = list(rows.groupby(keys, sort=False))
    models_per_name = rows.groupby("model")["file"].nunique()
    figure = _figure(figsize, dpi)
    axis = figure.subplots()
    drawn: set[str] = set()
    for (model, file, site, label), group in groups:
        group = group.sort_values("layer")
        name = model if models_per_name[model] == 1 else f"{model} ({Path(file).stem})"
        if rows["site"].nunique() > 1:
            name += f", {site}"
        if rows["label"].nunique() > 1:
            name += f", {label}"
        line, = axis.plot(group["layer"], group["value"], marker="o", label=name, zorder=3)
        shuffled = group["shuffled_labels"].astype(float)
        if shuffled.notna().any():
            axis.plot(group["layer"], shuffled, linestyle="--", color=line.get_color(), alpha=0.8)
            drawn.add("shuffled")
        # The strongest baseline where it is another one than the control and chance, drawn already.
        other = group["strongest_baseline_value"].astype(float).where(
            ~group["strongest_baseline"].isin(["shuffled_labels", "majority", ""]))
        if other.notna().any():
            axis.plot(group["layer"], other, linestyle=":", color=line.get_color(), alpha=0.8)
            drawn.add("other")
    chance = sorted({round(float(value), 3) for value in rows["majority"].dropna()}) if "majority" in rows else []
    for level in chance:
        axis.axhline(level, color="0.45", linewidth=1.2, zorder=1)
    style_handles = [
        *([Line2D([], [], color="grey", linestyle="--", label="shuffled-label control")] if "shuffled" in drawn else []),
        *([Line2D([], [], color="grey", linestyle=":", label="strongest other baseline")] if "other" in drawn else []),
        *([Line2D([], [], color="0.45", linewidth=1.2,
                  label="chance (the fit split's mean)" if "r2" in metric else "chance (majority)")] if chance else []),
    ]
    axis.legend(handles=[*axis.get_legend_handles_labels()[0], *style_handles], fontsize="small")
    layers = sorted(rows["layer"].unique())
    axis.set_xticks(layers)
    axis.set_xlabel("layer")
    axis.set_ylabel(metric)
    if "r2" not in metric:  # every decoding metric lies in [0, 1]
        axis.set_ylim(0, 1.02)
    axis.grid(alpha=0.3)
    labels = ", ".join(dict.fromkeys(rows["label"]))
    splits = rows[["fit_split", "test_split"]].drop_duplicates()
    fit, test = ("/".join(dict.fromkeys(splits[column].astype(str))) for column in ("fit_split", "test_split"))
    axis.set_title(wrap_lines([f"decoding {labels}: fit on {fit}, scored on {test}",
                               *([models_note] if models_note else [])], figsize[0], fontsize_points=10),
                   fontsize="medium")
    # The details a title would bury: the sites, the variant and what the splits hold.
    caption = "; ".join(part for part in (_table_context(rows), _split_caption(rows, fit, test)) if part)
    if caption:
        figure.supxlabel(wrap_lines([caption], figsize[0], fontsize_points=8), fontsize="x-small", color="0.3")
    return _save(figure, path_stem, formats, dpi)
