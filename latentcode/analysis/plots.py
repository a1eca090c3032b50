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

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from latentcode.analysis.embed import DEFAULT_MAX_POINTS, Embedding, embed
from latentcode.analysis.labels import display_value, is_categorical, select_label, value_names
from latentcode.analysis.probes import HEADLINE_METRICS
from latentcode.analysis.similarity import mean_code_similarity
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
        raise ValueError(f"formats {formats}: expected one or more of {FORMATS}")
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        figure.savefig(path, format=fmt, dpi=dpi)
        paths.append(path)
    figure.clear()  # drop the artists now rather than whenever the figure is collected
    return paths


def _open(code_file: CodeFile | str) -> CodeFile:
    return code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)


def _split_text(split: str | None) -> str:
    return "all splits" if split is None else f"split {split}"


def _palette(n: int) -> list:
    colours = colormaps["tab10" if n <= 10 else "tab20"]
    return [colours(i % colours.N) for i in range(n)]


def _one_column(values: np.ndarray, label: str) -> np.ndarray:
    if values.ndim != 1:
        raise ValueError(
            f"label {label!r} has shape [N, {', '.join(map(str, values.shape[1:]))}]: colour and group by "
            f"one value per example; pick a column, e.g. '{label}[0]'"
        )
    return values


# -- embeddings ------------------------------------------------------------------------------------
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
) -> list[Path]:
    """tSNE or UMAP of the codes, one panel per layer, coloured by a label spec.

    The embedding is computed with `latentcode.analysis.embed.embed` (arguments `method` to
    `stratify`) unless one is given. The title says how many of how many examples were used.
    """
    code_file = _open(code_file)
    if embedding is None:
        embedding = embed(code_file, method, split, layers, max_points, seed, stratify)
    values, label = select_label(code_file, color_by, embedding.split)
    values = _one_column(values, label)[embedding.indices]
    method_name = {"tsne": "tSNE", "umap": "UMAP"}.get(embedding.method, embedding.method)
    n_panels = len(embedding.layers)
    figure = _figure(figsize or (3.6 * n_panels + 2.4, 4.4), dpi)
    axes = np.atleast_1d(figure.subplots(1, n_panels, squeeze=False)[0])
    size = float(np.clip(6000 / max(embedding.n_used, 1), 2, 24))
    categorical = is_categorical(values)
    if categorical:
        names = value_names(code_file, label)
        categories = np.unique(values)
        colours = _palette(len(categories))
    else:
        norm = Normalize(float(np.nanmin(values)), float(np.nanmax(values)))
    for axis, layer in zip(axes, embedding.layers, strict=True):
        xy = embedding.coordinates[layer]
        if categorical:
            for category, colour in zip(categories, colours, strict=True):
                chosen = values == category
                axis.scatter(xy[chosen, 0], xy[chosen, 1], s=size, color=colour, linewidths=0, alpha=0.8)
        else:
            mappable = axis.scatter(xy[:, 0], xy[:, 1], c=values, s=size, cmap="viridis", norm=norm, linewidths=0)
        constant = " (codes constant: one point)" if layer in embedding.constant_layers else ""
        axis.set_title(f"layer {layer}{constant}")
        axis.set_xlabel(f"{method_name} 1")
        axis.set_ylabel(f"{method_name} 2")
        axis.set_xticks([])
        axis.set_yticks([])
    if categorical:
        handles = [
            Line2D([], [], marker="o", linestyle="", color=colour, label=display_value(category, names))
            for category, colour in zip(categories, colours, strict=True)
        ]
        figure.legend(handles=handles, title=label, loc="outside right upper", fontsize="small")
    else:
        figure.colorbar(mappable, ax=list(axes), label=label)
    figure.suptitle(
        f"{embedding.model_name}: {method_name} of latent codes, {_split_text(embedding.split)}, "
        f"coloured by {label}\n{embedding.describe()}"
    )
    return _save(figure, path_stem, formats, dpi)


# -- similarity heatmap ----------------------------------------------------------------------------
ANNOTATE_MAX_VALUES = 20


def plot_similarity(
    code_file: CodeFile | str,
    label: str,
    path_stem: str | Path,
    layers: Sequence[int] | None = None,
    split: str | None = None,
    annotate: bool | None = None,
    formats: Sequence[str] = ("png",),
    figsize: tuple[float, float] | None = None,
    dpi: float = 100,
) -> list[Path]:
    """Cosine similarity of the mean latent code of each label value, one heatmap per layer
    (default: every layer), rows and columns in each layer's clustered order.

    annotate: write the value in each cell; by default only up to ANNOTATE_MAX_VALUES label values,
        beyond which the numbers are too small to read (the colour bar still gives them).
    """
    code_file = _open(code_file)
    layers = list(code_file.layers if layers is None else layers)
    results = [mean_code_similarity(code_file, label, layer, split) for layer in layers]
    label = results[0].label
    names = value_names(code_file, label)
    n_values = len(results[0].values)
    if annotate is None:
        annotate = n_values <= ANNOTATE_MAX_VALUES
    side = min(max(3.6, 0.42 * n_values + 2.0), 12.0)
    figure = _figure(figsize or (side * len(layers) + 1.2, side + 0.8), dpi)
    axes = np.atleast_1d(figure.subplots(1, len(layers), squeeze=False)[0])
    low = min(float(result.matrix.min()) for result in results)
    norm = Normalize(min(low, 0.99), 1.0)
    colours = colormaps["viridis"]
    for axis, result in zip(axes, results, strict=True):
        image = axis.imshow(result.matrix, cmap=colours, norm=norm)
        ticks = [display_value(value, names) for value in result.values]
        positions = np.arange(len(ticks))
        axis.set_xticks(positions, ticks, rotation=90, fontsize="small")
        axis.set_yticks(positions, ticks, fontsize="small")
        axis.set_xlabel(label)
        axis.set_ylabel(label)
        axis.set_title(f"layer {result.layer}")
        if annotate:
            font = max(4.0, min(9.0, 80.0 / len(ticks)))
            for (row, column), value in np.ndenumerate(result.matrix):
                # Light text on the dark (low) end of viridis, dark text on the light end.
                text_colour = "white" if norm(value) < 0.6 else "black"
                axis.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=font, color=text_colour)
    figure.colorbar(image, ax=list(axes), label="cosine similarity", shrink=0.8)
    figure.suptitle(
        f"{results[0].model_name}: cosine similarity of the mean latent code per {label}, "
        f"{_split_text(split)} (rows ordered by hierarchical clustering)"
    )
    return _save(figure, path_stem, formats, dpi)


# -- raw code samples ------------------------------------------------------------------------------
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
    `layer` (default: the last), side by side."""
    code_file = _open(code_file)
    layer = code_file.layers[-1] if layer is None else layer
    values, label = select_label(code_file, label, split)
    values = _one_column(values, label)
    if values.dtype.kind not in "iub":
        raise ValueError(f"label {label!r} is not integer-valued; the sample grid needs one panel per value")
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
    figure = _figure(figsize or (3.4 * n_columns + 1.0, 2.2 * n_rows + 1.0), dpi)
    axes = figure.subplots(n_rows, n_columns, squeeze=False).ravel()
    shown = np.concatenate([block for _, _, block in samples])
    norm = Normalize(float(shown.min()), float(shown.max()) if shown.max() > shown.min() else float(shown.min()) + 1)
    for axis, (category, count, block) in zip(axes, samples, strict=False):
        image = axis.imshow(block, cmap="magma", norm=norm, aspect="auto", interpolation="nearest")
        axis.set_title(f"{label} = {display_value(category, names)} (n={count})", fontsize="small")
        axis.set_xlabel("head" if len(sites) == 1 else "site × head")
        axis.set_ylabel("example")
        axis.set_yticks(range(len(block)))
        axis.tick_params(labelsize="x-small")
        for boundary in range(1, len(sites)):
            axis.axvline(boundary * code_file.n_heads - 0.5, color="white", linewidth=1)
    for axis in axes[len(samples):]:
        axis.set_visible(False)
    figure.colorbar(image, ax=list(axes[: len(samples)]), label="latent code (attention score)", shrink=0.8)
    site_names = ", ".join(site.name for site in sites)
    figure.suptitle(
        f"{code_file.model_name}: raw latent codes at layer {layer} ({site_names}), {_split_text(split)}, "
        f"up to {n_samples} random examples per {label}"
        + (f" ({len(categories)} most frequent of {n_values} values)" if n_values > len(categories) else "")
    )
    return _save(figure, path_stem, formats, dpi)


# -- probe scores ----------------------------------------------------------------------------------
def plot_probe_scores(
    table: pd.DataFrame | str | Path,
    path_stem: str | Path,
    metric: str | None = None,
    formats: Sequence[str] = ("png",),
    figsize: tuple[float, float] = (6.4, 4.4),
    dpi: float = 100,
) -> list[Path]:
    """Score per layer per model from a `decode` / `regress` table (or its CSV / JSON file): one
    solid line per (model, site, label), with its shuffled-label control dashed and its
    strongest baseline dotted in the same colour.

    `metric` defaults to the first of `HEADLINE_METRICS` the table has.
    """
    if not isinstance(table, pd.DataFrame):
        path = Path(table)
        table = pd.read_json(path) if path.suffix == ".json" else pd.read_csv(path)
    if metric is None:
        present = [name for name in HEADLINE_METRICS if (table["metric"] == name).any()]
        if not present:
            raise ValueError(f"the table has no metric of {HEADLINE_METRICS}; pass metric= one of "
                             f"{sorted(table['metric'].unique())}")
        metric = present[0]
    rows = table[table["metric"] == metric]
    if rows.empty:
        raise ValueError(f"the table has no rows with metric {metric!r}; it has {sorted(table['metric'].unique())}")
    keys = ["model", "file", "site", "label"]
    groups = list(rows.groupby(keys, sort=False))
    models_per_name = rows.groupby("model")["file"].nunique()
    figure = _figure(figsize, dpi)
    axis = figure.subplots()
    for (model, file, site, label), group in groups:
        group = group.sort_values("layer")
        name = model if models_per_name[model] == 1 else f"{model} ({Path(file).stem})"
        if rows["site"].nunique() > 1:
            name += f", {site}"
        if rows["label"].nunique() > 1:
            name += f", {label}"
        line, = axis.plot(group["layer"], group["value"], marker="o", label=name)
        axis.plot(group["layer"], group["shuffled_labels"], linestyle="--", color=line.get_color(), alpha=0.8)
        axis.plot(group["layer"], group["strongest_baseline_value"], linestyle=":", color=line.get_color(), alpha=0.8)
    style_handles = [
        Line2D([], [], color="grey", linestyle="--", label="shuffled-label control"),
        Line2D([], [], color="grey", linestyle=":", label="strongest baseline"),
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
    axis.set_title(f"decoding {labels} from latent codes: {metric}\nfit on {fit}, scored on {test}", fontsize="medium")
    return _save(figure, path_stem, formats, dpi)
