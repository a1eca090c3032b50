"""Cosine similarity between the mean latent codes of the values of a label (the paper's
rule-by-rule heatmap), rows and columns ordered by hierarchical clustering.

For a categorical label the mean is over the examples with each value; for a multi-hot label
(e.g. fuzzy logic's ``term_present``) over the examples where each column is 1, so that a
"value" is a column (a term). The order comes from average-linkage clustering of the mean codes
under the cosine distance, with scipy's optimal leaf ordering, so similar values end up next to
each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import leaves_list, linkage

from latentcode.analysis.labels import select_label
from latentcode.store import CodeFile, Site

__all__ = ["MAX_VALUES", "Similarity", "mean_code_similarity", "similarity_of_means"]

# A heatmap of more values than this is unreadable, and a label with more is likely continuous.
MAX_VALUES = 64


@dataclass
class Similarity:
    """``matrix[i, j]``: the cosine similarity of the mean codes of ``values[i]`` and ``values[j]``.

    ``values`` are in clustered order; ``order`` is the permutation of the sorted distinct values
    (or of the columns, for a multi-hot label) that gives it: ``values == sorted_values[order]``.
    ``counts[i]`` examples went into the mean ``mean_codes[i]`` (``[V, D]``).
    """

    matrix: np.ndarray
    values: np.ndarray
    order: np.ndarray
    counts: np.ndarray
    mean_codes: np.ndarray
    label: str = ""
    layer: int | None = None
    site: str = "all"
    split: str | None = None
    model_name: str = ""


def _cosine(vectors: np.ndarray) -> np.ndarray:
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.clip(unit @ unit.T, -1.0, 1.0)


def similarity_of_means(codes: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The cosine-similarity matrix of the per-value mean codes, in clustered order.

    Args:
        codes: ``[N, D]``.
        labels: ``[N]`` categorical, or ``[N, C]`` multi-hot (0/1).

    Returns:
        ``(matrix [V, V], values [V], order [V], counts [V], mean_codes [V, D])``, all in the
        clustered order (see `Similarity`).
    """
    codes, labels = np.asarray(codes, dtype=np.float64), np.asarray(labels)
    if len(codes) != len(labels):
        raise ValueError(f"{len(codes)} codes but {len(labels)} labels")
    if labels.ndim == 1:
        values = np.unique(labels)
        if len(values) > MAX_VALUES:
            raise ValueError(
                f"the label has {len(values)} distinct values; a similarity heatmap takes at most "
                f"{MAX_VALUES} (is it continuous?)"
            )
        members = labels[None, :] == values[:, None]  # [V, N]
    elif labels.ndim == 2 and np.isin(labels, (0, 1)).all():
        members = labels.T.astype(bool)
        values = np.arange(labels.shape[1])
        present = members.any(axis=1)  # a column with no 1 has no mean code
        members, values = members[present], values[present]
    else:
        raise ValueError(
            f"labels of shape {list(labels.shape)}: expected one value per example, or a multi-hot "
            "[N, C] 0/1 array; pick a column with name[i]"
        )
    if len(values) == 0:
        raise ValueError("no label values to compare")
    counts = members.sum(axis=1)
    mean_codes = (members.astype(np.float64) @ codes) / counts[:, None]
    norms = np.linalg.norm(mean_codes, axis=1)
    if (norms == 0).any():
        raise ValueError(
            f"the mean code of label value(s) {values[norms == 0].tolist()} is zero; cosine similarity "
            "is undefined for it"
        )
    if len(values) > 2:
        tree = linkage(mean_codes, method="average", metric="cosine", optimal_ordering=True)
        order = leaves_list(tree)
    else:
        order = np.arange(len(values))
    mean_codes = mean_codes[order]
    return _cosine(mean_codes), values[order], order, counts[order], mean_codes


def mean_code_similarity(
    code_file: CodeFile | str,
    label: str,
    layer: int | None = None,
    split: str | None = None,
    site: Site | str | None = None,
) -> Similarity:
    """`similarity_of_means` of the codes of one layer (all its sites concatenated; default the
    last layer) or of one site, against a label spec, on one split (None: every example)."""
    code_file = code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)
    labels, label = select_label(code_file, label, split)
    if site is not None:
        site = Site.from_name(site) if isinstance(site, str) else site
        codes, layer, site_name = code_file.codes(site, split), site.layer, site.name
    else:
        layer = code_file.layers[-1] if layer is None else layer
        codes, site_name = code_file.layer_codes(layer, split), "all"
    matrix, values, order, counts, mean_codes = similarity_of_means(codes, labels)
    return Similarity(
        matrix=matrix, values=values, order=order, counts=counts, mean_codes=mean_codes, label=label,
        layer=layer, site=site_name, split=split, model_name=code_file.model_name,
    )
