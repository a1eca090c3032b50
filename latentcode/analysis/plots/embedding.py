"""tSNE / UMAP figures of latent codes: one panel per layer, coloured by a label."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D

from latentcode.analysis.captions import codes_context, wrap_lines
from latentcode.analysis.embed import DEFAULT_MAX_POINTS, METHOD_NAMES, Embedding, embed
from latentcode.analysis.labels import is_categorical, select_label, value_names
from latentcode.analysis.picture_plan import plan_picture
from latentcode.analysis.plots.colours import OTHER_COLOUR, category_groups, colour_scale
from latentcode.analysis.plots.figure import new_figure, one_column, panel_grid, save_figure
from latentcode.store import CodeFile

__all__ = ["plot_embedding"]


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
    progress: bool = True,
) -> list[Path]:
    """tSNE or UMAP of the codes, one panel per layer (at most `figure.MAX_COLUMNS` a row), coloured by a
    label spec.

    The embedding is computed with `latentcode.analysis.embed.embed` (arguments `method` to
    `stratify`, and `progress`: how far it is, on stderr; False: nothing)
    unless one is given. Categorical labels (integers) get a qualitative palette and a legend
    (beyond `MAX_LEGEND_VALUES` values, the `TOP_VALUES` most frequent in colour and the rest
    grey, one legend entry 'other' with their number and share of the points); continuous labels
    a colour bar, on a diverging scale centred at 0 (white) where they are signed.
    Layers whose codes are all equal get a sentence, not an empty panel. The title names the
    model, the sites, the variant and the split, and how many of how many examples were used.
    """
    plan = plan_picture(code_file, color_by, path_stem, kind="umap" if method == "umap" else "tsne",
                        split=split if embedding is None else embedding.split, formats=formats, overwrite=True)
    code_file, color_by = plan.code_files[0], plan.label  # checked as `latentcode plot` checks them
    # The label first: a spec it cannot colour by (a column out of range, a multi-column label) is
    # refused before minutes of embedding, not after.
    values, label = select_label(code_file, color_by, split if embedding is None else embedding.split)
    values = one_column(values, label)
    if embedding is None:
        embedding = embed(code_file, method, split, layers, max_points, seed, stratify, progress=progress)
    values = values[embedding.indices]
    method_name = METHOD_NAMES.get(embedding.method, embedding.method)
    drawn = [layer for layer in embedding.layers if layer not in embedding.constant_layers]
    n_rows, n_columns = panel_grid(len(drawn))
    # Integer (or bool) labels are categories however many values they take (a task index, a rule);
    # float labels are continuous unless they hold a few integer values.
    categorical = values.dtype.kind in "biu" or is_categorical(values)
    width = figsize[0] if figsize else max(7.0, 3.6 * n_columns + (2.6 if categorical else 1.4))
    figure = new_figure(figsize or (width, 3.6 * n_rows + 1.3), dpi)
    grid = figure.subplots(n_rows, n_columns, squeeze=False)
    axes = grid.ravel()
    for axis in axes[max(1, len(drawn)):]:
        axis.set_visible(False)
    size = float(np.clip(6000 / max(embedding.n_used, 1), 2, 24))
    note = ""
    if categorical:
        groups, note = category_groups(values, value_names(code_file, label))
        note = note.format(label=label)
    else:
        norm, colours = colour_scale(values)  # signed values diverging about 0, white there
    for axis, layer in zip(axes, drawn, strict=False):
        xy = embedding.coordinates[layer]
        if categorical:
            for _, members, colour in groups:
                axis.scatter(xy[members, 0], xy[members, 1], s=size, color=colour, linewidths=0, alpha=0.85)
        else:
            mappable = axis.scatter(xy[:, 0], xy[:, 1], c=values, s=size, cmap=colours, norm=norm, linewidths=0)
        axis.set(title=f"layer {layer}", xlabel=f"{method_name} 1", ylabel=f"{method_name} 2", xticks=[], yticks=[])
    constant = _constant_sentence(embedding.constant_layers, "embed")
    if not drawn:  # every layer constant: the sentence is the figure
        axes[0].set_axis_off()
        axes[0].text(0.5, 0.5, "\n".join(textwrap.wrap(constant, 40)), ha="center", va="center",
                     transform=axes[0].transAxes)
    elif categorical:
        handles = [Line2D([], [], marker="o", linestyle="", color=colour, label=text) for text, _, colour in groups]
        if groups[0][2] == OTHER_COLOUR:  # 'other' last in the legend, first underneath the points
            handles = handles[1:] + handles[:1]
        # Right of the top row's last panel, so that constrained layout keeps it clear of the title.
        grid[0, -1].legend(handles=handles, title=label, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                                    borderaxespad=0, fontsize="small")
    else:
        figure.colorbar(mappable, ax=list(axes[:len(drawn)]),
                        label=f"{label} (signed: 0 is white)" if colours == "RdBu_r" else label)
    figure.suptitle(wrap_lines([
        f"{embedding.model_name}: {method_name} of latent codes, coloured by {label}",
        codes_context(code_file, embedding.split),
        embedding.describe() + (f"; {note}" if note else ""),
        constant if drawn else "",
    ], width, fontsize_points=10), fontsize="medium")
    return save_figure(figure, path_stem, formats, dpi)


