"""Cosine similarity between the mean latent codes of the values of a label (the paper's
rule-by-rule heatmap), rows and columns ordered by hierarchical clustering.

For a categorical label the mean is over the examples with each value; for a multi-hot label
(e.g. fuzzy logic's ``term_present``) over the examples where each column is 1, so that a
"value" is a column (a term). The order comes from average-linkage clustering of the mean codes
under the cosine distance, with scipy's optimal leaf ordering, so similar values end up next to
each other.

Centring (``centre=True``) subtracts the grand mean code (the mean over all examples) from every
mean code first. Where the codes share a large common component, the plain cosine of any two
mean codes is close to 1 (the fuzzy-logic demo's lie between 0.88 and 1.00) and measures mostly
that component; the centred cosine measures how the values differ from the average code, on the
full range [-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import leaves_list, linkage

from latentcode.analysis.labels import select_label
from latentcode.errors import AnalysisError
from latentcode.store import CodeFile, Site

__all__ = ["MAX_VALUES", "Similarity", "between_value_variance_share", "mean_code_similarity", "similarity_of_means"]

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
    centred: bool = False
    constant: bool = False  # every code the same: the matrix is all 1 (uncentred) or NaN (centred)
    # For a one-value-per-example label: the share of the codes' variance (around the grand mean)
    # that lies between the value means (eta squared), which says how much a centred heatmap's
    # full [-1, 1] range stands for; None for a multi-hot label or constant codes.
    explained_variance: float | None = None

    def off_diagonal_range(self) -> tuple[float, float]:
        """(min, max) of the similarities between different values; (1, 1) for a single value."""
        if len(self.values) < 2 or self.constant:
            return 1.0, 1.0
        off_diagonal = self.matrix[~np.eye(len(self.values), dtype=bool)]
        return float(off_diagonal.min()), float(off_diagonal.max())


def similarity_of_means(
    codes: np.ndarray, labels: np.ndarray, centre: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The cosine-similarity matrix of the per-value mean codes, in clustered order.

    Args:
        codes: ``[N, D]``.
        labels: ``[N]`` categorical, or ``[N, C]`` multi-hot (0/1).
        centre: subtract the grand mean code (over all N examples) from each mean code first.
            Where every code is the same, the centred matrix is undefined and returned as NaN.

    Returns:
        ``(matrix [V, V], values [V], order [V], counts [V], mean_codes [V, D])``, all in the
        clustered order (see `Similarity`).
    """
    codes, labels = np.asarray(codes, dtype=np.float64), np.asarray(labels)
    if len(codes) != len(labels):
        raise AnalysisError(f"{len(codes)} codes but {len(labels)} labels")
    if labels.ndim == 1:
        values = np.unique(labels)
        if len(values) > MAX_VALUES:
            raise AnalysisError(
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
        raise AnalysisError(
            f"labels of shape {list(labels.shape)}: expected one value per example, or a multi-hot "
            "[N, C] 0/1 array; pick a column with name[i]"
        )
    if len(values) == 0:
        raise AnalysisError("no label values to compare")
    counts = members.sum(axis=1)
    mean_codes = (members.astype(np.float64) @ codes) / counts[:, None]
    if centre:
        if len(codes) and np.ptp(codes, axis=0).max() == 0:
            nan = np.full((len(values), len(values)), np.nan)
            return nan, values, np.arange(len(values)), counts, mean_codes - codes[0]
        mean_codes = mean_codes - codes.mean(axis=0)
    norms = np.linalg.norm(mean_codes, axis=1)
    if (norms == 0).any():
        what = "equals the grand mean code" if centre else "is zero"
        raise AnalysisError(
            f"the mean code of label value(s) {values[norms == 0].tolist()} {what}; cosine similarity "
            "is undefined for it"
        )
    if len(values) > 2:
        tree = linkage(mean_codes, method="average", metric="cosine", optimal_ordering=True)
        order = leaves_list(tree)
    else:
        order = np.arange(len(values))
    mean_codes = mean_codes[order]
    unit = mean_codes / np.linalg.norm(mean_codes, axis=1, keepdims=True)
    return np.clip(unit @ unit.T, -1.0, 1.0), values[order], order, counts[order], mean_codes


def mean_code_similarity(
    code_file: CodeFile | str,
    label: str,
    layer: int | None = None,
    split: str | None = None,
    site: Site | str | None = None,
    centre: bool = False,
) -> Similarity:
    """`similarity_of_means` of the codes of one layer (all its sites concatenated; default the
    last layer) or of one site, against a label spec, on one split (None: every example);
    `centre` subtracts the grand mean code of the split first."""
    code_file = code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)
    labels, label = select_label(code_file, label, split)
    if site is not None:
        site = Site.from_name(site) if isinstance(site, str) else site
        codes, layer, site_name = code_file.codes(site, split), site.layer, site.name
    else:
        layer = code_file.layers[-1] if layer is None else layer
        codes, site_name = code_file.layer_codes(layer, split), "all"
    not_finite = ~np.isfinite(codes).all(axis=1)
    if not_finite.any():
        raise AnalysisError(f"{code_file.path}: the codes of layer {layer} (site {site_name}) contain NaN or inf in "
                            f"{int(not_finite.sum())} of {len(codes)} examples of split {split or 'all'}; mean codes "
                            "and their cosines need finite codes")
    matrix, values, order, counts, mean_codes = similarity_of_means(codes, labels, centre)
    constant = bool(len(codes) and np.ptp(codes, axis=0).max() == 0)
    explained = None if constant or labels.ndim != 1 else between_value_variance_share(codes, labels)
    return Similarity(
        matrix=matrix, values=values, order=order, counts=counts, mean_codes=mean_codes, label=label,
        layer=layer, site=site_name, split=split, model_name=code_file.model_name, centred=centre,
        constant=constant, explained_variance=explained,
    )


def between_value_variance_share(codes: np.ndarray, labels: np.ndarray) -> float:
    """Eta squared: sum over values of n_v * |mean_v - grand mean|^2, divided by the sum over
    examples of |code - grand mean|^2. 0: the value means coincide; 1: every code is its value's mean.

    Args:
        codes: ``[N, D]``.
        labels: ``[N]``, one value per example.
    """
    codes = np.asarray(codes, dtype=np.float64)
    deviations = codes - codes.mean(axis=0)
    total = float((deviations**2).sum())
    if total == 0:
        raise AnalysisError("the codes are all the same; the share of their variance is undefined")
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    sums = np.zeros((len(counts), codes.shape[1]))
    np.add.at(sums, inverse, deviations)
    return float(((sums**2).sum(axis=1) / counts).sum() / total)
