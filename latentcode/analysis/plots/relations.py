"""Figures of the key-query relations of a language model's codes: per layer the code
space (PCA) coloured by relation; a layer x head map of how strongly each head's code separates each
relation; the induction attribution map and attribution against exact ablation."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.decomposition import PCA

from latentcode.analysis.plots.colours import palette
from latentcode.analysis.plots.figure import new_figure, save_figure
from latentcode.analysis.scores import auroc
from latentcode.analysis.token_relations import RELATIONS

__all__ = ["SEPARATED", "head_separation", "plot_attribution", "plot_head_separation", "plot_relation_pca"]


def plot_relation_pca(codes: np.ndarray, relation: np.ndarray, title: str, path_stem: str | Path,
                      formats: Sequence[str] = ("png",), dpi: float = 110, seed: int = 0) -> list[Path]:
    """One panel per layer: the codes ``[N, layer, head]`` projected on their first two principal
    components (of that layer), each pair coloured by its relation ``[N]``."""
    n_layers = codes.shape[1]
    columns = 6
    rows = -(-n_layers // columns)
    figure = new_figure((2.3 * columns, 2.1 * rows + 0.6), dpi)
    colours = palette(len(RELATIONS))
    order = np.random.default_rng(seed).permutation(len(relation))  # no relation drawn on top of all others
    axes = figure.subplots(rows, columns, squeeze=False)
    for layer, axis in enumerate(axes.flat):
        if layer >= n_layers:
            axis.set_axis_off()
            continue
        points = PCA(n_components=2, random_state=seed).fit_transform(codes[:, layer].astype(np.float64))
        axis.scatter(points[order, 0], points[order, 1], s=4, linewidths=0,
                     c=[colours[index] for index in relation[order]])
        axis.set_title(f"layer {layer}", fontsize=8)
        axis.set(xticks=[], yticks=[])
    axes.flat[0].set_xlabel("PC 1", fontsize=7)
    axes.flat[0].set_ylabel("PC 2", fontsize=7)
    handles = [axes.flat[0].scatter([], [], s=20, color=colours[index], label=name)
               for index, name in enumerate(RELATIONS)]
    figure.legend(handles=handles, loc="outside lower center", ncols=len(RELATIONS), fontsize=9)
    figure.suptitle(_wrapped(title, figure), fontsize=10)
    return save_figure(figure, path_stem, formats, dpi)


def _wrapped(title: str, figure) -> str:
    """The title in lines that fit the figure's width (about 11 characters an inch at 10 points)."""
    return "\n".join(textwrap.wrap(title, width=int(figure.get_figwidth() * 11)))


SEPARATED = RELATIONS[:-1]  # each told from "other", the pairs of no known relation


def head_separation(codes: np.ndarray, relation: np.ndarray) -> np.ndarray:
    """``[relation, layer, head]`` for the relations of `SEPARATED`: the AUROC of each head's code
    as a score telling the pairs of that relation from the ``other`` pairs (0.5: no separation; 1:
    every pair of the relation has a larger code than every ``other`` pair; 0: smaller). Against
    ``other`` rather than all the rest, so that the large sink codes do not push every other
    relation below 0.5. NaN where a relation or ``other`` has no pair."""
    n_layers, n_heads = codes.shape[1:]
    separation = np.full((len(SEPARATED), n_layers, n_heads), np.nan)
    other = relation == RELATIONS.index("other")
    for index in range(len(SEPARATED)):
        rows = (relation == index) | other
        truth = relation[rows] == index
        if truth.any() and other.any():
            for layer in range(n_layers):
                for head in range(n_heads):
                    separation[index, layer, head] = auroc(truth, codes[rows, layer, head])
    return separation


def plot_head_separation(separation: np.ndarray, title: str, path_stem: str | Path,
                         formats: Sequence[str] = ("png",), dpi: float = 110) -> list[Path]:
    """One panel per relation, layers down and heads across, on one diverging colour scale from 0
    to 1 centred at 0.5 (`head_separation`)."""
    n_relations, n_layers, n_heads = separation.shape
    figure = new_figure((1.6 * n_relations + 1.2, 0.17 * n_layers + 1.3), dpi)
    axes = figure.subplots(1, n_relations, squeeze=False, sharey=True)[0]
    for index, axis in enumerate(axes):
        image = axis.imshow(separation[index], cmap="RdBu_r", vmin=0.0, vmax=1.0, aspect="auto",
                            interpolation="nearest")
        axis.set_title(f"{SEPARATED[index]} vs other", fontsize=9)
        axis.set_xticks(range(n_heads))
        axis.set_xticklabels(range(n_heads), fontsize=6)
        axis.set_xlabel("head", fontsize=8)
    axes[0].set_ylabel("layer", fontsize=8)
    axes[0].set_yticks(range(0, n_layers, 2))
    axes[0].tick_params(axis="y", labelsize=6)
    figure.colorbar(image, ax=list(axes), label="AUROC of the head's code, relation vs other", shrink=0.9)
    figure.suptitle(_wrapped(title, figure), fontsize=10)
    return save_figure(figure, path_stem, formats, dpi)


def plot_attribution(attribution: np.ndarray, exact: dict[tuple[int, int], tuple[float, float]], title: str,
                     path_stem: str | Path, formats: Sequence[str] = ("png",), dpi: float = 110) -> list[Path]:
    """Left: the estimated loss change ``[layer, head]`` of zeroing each head's codes at the
    induction pairs (diverging scale centred at 0). Right: estimate against the exact change
    ``{(layer, head): (mean, s.e.)}`` for the heads measured exactly, with the line y = x."""
    figure = new_figure((9.0, 5.2), dpi)
    left, right = figure.subplots(1, 2, width_ratios=(1, 1.3))
    bound = float(np.nanmax(np.abs(attribution))) or 1.0
    image = left.imshow(attribution, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto", interpolation="nearest")
    left.set(xlabel="head", ylabel="layer", xticks=range(attribution.shape[1]))
    figure.colorbar(image, ax=left, label="estimated loss change (nats)")
    left.set_title("attribution: zero codes at induction pairs", fontsize=9)
    heads = sorted(exact)
    estimate = np.array([attribution[head] for head in heads])
    mean = np.array([exact[head][0] for head in heads])
    error = np.array([exact[head][1] for head in heads])
    right.errorbar(estimate, mean, yerr=error, fmt="o", markersize=3, capsize=2)
    for head, x, y in zip(heads, estimate, mean, strict=True):
        if max(abs(x), abs(y)) < 0.02 * max(np.abs(estimate).max(), np.abs(mean).max()):
            continue  # heads with no effect sit on top of each other at 0: the caption names them
        right.annotate(f"{head[0]}.{head[1]}", (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
    low, high = min(estimate.min(), mean.min()), max(estimate.max(), mean.max())
    right.plot([low, high], [low, high], color="grey", linewidth=0.8, linestyle="--", label="y = x")
    right.set(xlabel="attribution estimate (nats)", ylabel="exact loss change, mean ± s.e. over sequences (nats)")
    right.set_title("exact ablation of single heads (layer.head)", fontsize=9)
    right.legend(fontsize=8)
    figure.suptitle(_wrapped(title, figure), fontsize=10)
    return save_figure(figure, path_stem, formats, dpi)
