"""Shared parts of `analyses/qk_findings.py` (issue 48): the equal-norm controls of a path patch, the
query x key panels of the mean terms (top components and `other`), their heatmaps on one colour
scale, and means with standard errors."""

from __future__ import annotations

import numpy as np
import torch

NOT_IN_THE_STREAM = ("bias", "position")  # `position` of a relative bias has no vector; `bias` is constant


def parse_head(name: str) -> tuple[int, int] | None:
    """`L5.H3` -> (5, 3); anything else (embed, L5.mlp, bias) -> None."""
    if name.startswith("L") and ".H" in name:
        layer, head = name[1:].split(".H")
        return int(layer), int(head)
    return None


def equal_norm_controls(reading, top: str, rng: np.random.Generator) -> dict[str, tuple[str, torch.Tensor]]:
    """Two vector fields `[pos, d_model]` with the norm of component `top` at every position:
    "random direction, equal norm" (a Gaussian direction drawn per position, rescaled) and "random
    component, equal norm" (another component drawn at random, rescaled per position: another head of
    `top`'s layer when `top` is a head, else any other component of the stream), each with its label."""
    removed = reading.component(top)
    norms = removed.norm(dim=-1, keepdim=True)
    direction = torch.as_tensor(rng.standard_normal(tuple(removed.shape)), dtype=removed.dtype)
    controls = {"random direction, equal norm": ("random direction",
                                                  direction / direction.norm(dim=-1, keepdim=True) * norms)}
    names = reading.component_names()
    source = parse_head(top)
    if source is not None:
        candidates = [name for name in names if name != top and parse_head(name) is not None
                      and parse_head(name)[0] == source[0]]
    else:
        candidates = [name for name in names if name != top and name not in NOT_IN_THE_STREAM]
    for index in rng.permutation(len(candidates)):  # the first drawn that writes anything
        vectors = reading.component(candidates[index])
        if float(vectors.norm()) > 0:
            scale = norms / vectors.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            controls["random component, equal norm"] = (candidates[index], vectors * scale)
            break
    return controls


def mean_se(values) -> tuple[float, float, int]:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    n = len(values)
    se = float(values.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    return float(values.mean()) if n else float("nan"), se, n


def listed(names, unit: str) -> str:
    """The distinct components removed over the `unit`s (sequences, instances), or how many when they are many."""
    distinct = sorted(set(names))
    return " ".join(distinct) if len(distinct) <= 3 else f"{len(distinct)} different (drawn per {unit})"


def top_indices(matrix: np.ndarray, names: list[str], top: int) -> tuple[list[int], list[int]]:
    """The `top` query-side (rows) and key-side (columns) components of `matrix` by |marginal|."""
    rows = np.argsort(-np.abs(matrix.sum(1)))[:top].tolist()
    columns = np.argsort(-np.abs(matrix.sum(0)))[:top].tolist()
    return rows, columns


def grouped(matrix: np.ndarray, names: list[str], rows: list[int], columns: list[int]):
    """(row names, column names, matrix) of the chosen rows and columns and `other`, the rest summed."""
    rest_rows = [i for i in range(len(names)) if i not in rows]
    rest_columns = [j for j in range(len(names)) if j not in columns]
    out = np.zeros((len(rows) + 1, len(columns) + 1))
    for a, i in enumerate([*rows, rest_rows]):
        for b, j in enumerate([*columns, rest_columns]):
            out[a, b] = matrix[np.ix_(np.atleast_1d(i), np.atleast_1d(j))].sum()
    return [names[i] for i in rows] + ["other"], [names[j] for j in columns] + ["other"], out


def heatmaps(panels: list[tuple[str, list[str], list[str], np.ndarray]], title: str, n_columns: int,
             colour_label: str = "mean term T_ij (score units)"):
    """One figure of query x key panels (title, row names, column names, matrix) on one signed colour
    scale, white at 0, symmetric about 0; constrained layout, so titles and labels do not overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rows = int(np.ceil(len(panels) / n_columns))
    limit = max(float(np.abs(matrix).max()) for *_, matrix in panels) or 1.0
    figure, axes = plt.subplots(n_rows, n_columns, figsize=(3.6 * n_columns + 1.2, 3.7 * n_rows + 0.6),
                                layout="constrained", squeeze=False)
    image = None
    for axis, (name, rows, columns, matrix) in zip(axes.flat, panels, strict=False):
        image = axis.imshow(matrix, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        axis.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
        axis.set_yticks(range(len(rows)), rows, fontsize=7)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("key-side component", fontsize=8)
        axis.set_ylabel("query-side component", fontsize=8)
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    colorbar = figure.colorbar(image, ax=axes, shrink=0.8)
    colorbar.set_label(colour_label, fontsize=8)
    figure.suptitle(title, fontsize=10)
    return figure
