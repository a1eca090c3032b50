"""Topographic similarity: are tasks composed alike given alike latent codes?

For T tasks with mean latent codes ``c_t`` (one layer) and composition vectors ``v_t`` (what the
task is made of: counts of each rule in a SRAVEN rule multiset, a multi-hot of a fuzzy-logic term
set), topographic similarity is the Spearman correlation, over the ``T (T - 1) / 2`` task pairs,
between

    composition distance  ||v_s - v_t||_1      and      code distance  d(c_s, c_t)

with ``d`` the cosine distance ``1 - cos(c_s, c_t)`` or the euclidean distance. The L1 distance
is the Hamming distance of multi-hot sets, and twice the number of parts one multiset must swap to
become the other for count vectors; Spearman's rho is blind to that factor.

The pairs are not independent, so the p-value comes from a permutation (Mantel) test: the task
identities of the codes are permuted (rows and columns of the code-distance matrix together) and
rho recomputed, ``n_permutations`` times from a seeded generator;
``p = (1 + #{null rho at least as extreme}) / (1 + n_permutations)``.

Numpy and scipy only; names no task: the caller brings codes and compositions, e.g. from
``mean_codes_by_task`` and ``composition_counts``, per layer, split and model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.distance import pdist, squareform
from scipy.stats import rankdata

from latentcode.errors import LatentcodeError

__all__ = ["ALTERNATIVES", "CODE_METRICS", "Topography", "TopographyError", "composition_counts", "mean_codes_by_task",
           "topographic_similarity"]

CODE_METRICS = ("cosine", "euclidean")
ALTERNATIVES = ("greater", "less", "two-sided")
# Null correlations are computed this many permutations at a time, bounding the memory of the
# gathered [permutations, pairs] block (about 20 MB for 330 tasks).
_PERMUTATIONS_PER_CHUNK = 50


class TopographyError(LatentcodeError, ValueError):
    """Codes or compositions that cannot be compared (shapes, too few tasks, bad settings)."""


@dataclass(frozen=True)
class Topography:
    """Spearman's ``rho`` between pairwise composition and code distances, and its permutation
    p-value.

    ``null_rhos`` ``[n_permutations]`` are the correlations with permuted task identities;
    ``rho`` and ``p_value`` are NaN when the code distances are all equal (codes that do not
    distinguish the tasks).
    """

    rho: float
    p_value: float
    n_tasks: int
    n_permutations: int
    code_metric: str
    alternative: str
    seed: int
    null_rhos: np.ndarray


def topographic_similarity(
    mean_codes: np.ndarray,
    compositions: np.ndarray,
    *,
    code_metric: str = "cosine",
    n_permutations: int = 1000,
    seed: int = 0,
    alternative: str = "greater",
) -> Topography:
    """Spearman correlation of composition and code distances over task pairs, with a
    permutation-test p-value (see the module docstring).

    Args:
        mean_codes: ``[n_tasks, dim]``, one (mean) latent code per task.
        compositions: ``[n_tasks, n_parts]``, counts or multi-hot of each task's parts, rows in
            the order of ``mean_codes``.
        code_metric: ``"cosine"`` (distance ``1 - cos``) or ``"euclidean"``.
        n_permutations: permutations of the task identities for the null distribution.
        seed: seeds the permutations.
        alternative: ``"greater"`` (tasks composed alike have closer codes: the expected
            direction), ``"less"`` or ``"two-sided"``.
    """
    mean_codes = np.asarray(mean_codes, dtype=np.float64)
    compositions = np.asarray(compositions, dtype=np.float64)
    _check_arguments(mean_codes, compositions, code_metric, n_permutations, seed, alternative)
    n_tasks = len(mean_codes)

    composition_ranks = rankdata(pdist(compositions, metric="cityblock"))
    if np.ptp(composition_ranks) == 0:
        raise TopographyError("every pair of tasks has the same composition distance, so rho is undefined; "
                              "expected compositions that differ by varying amounts")
    code_distances = pdist(mean_codes, metric=code_metric)
    if np.ptp(code_distances) == 0:
        nan = float("nan")
        return Topography(nan, nan, n_tasks, n_permutations, code_metric, alternative, seed,
                          np.full(n_permutations, nan))

    # Spearman's rho is Pearson's r of the (average) ranks. Permuting task identities only
    # rearranges the code-distance entries among the pairs, so the code ranks are computed once
    # and gathered under each permutation; their mean and spread never change.
    code_ranks = rankdata(code_distances)  # condensed, pdist's pair order
    centered_composition = composition_ranks - composition_ranks.mean()
    centered_code = code_ranks - code_ranks.mean()
    scale = np.linalg.norm(centered_composition) * np.linalg.norm(centered_code)
    rho = float(centered_composition @ centered_code / scale)

    code_rank_matrix = squareform(code_ranks)  # [task, task], the diagonal unused
    first, second = np.triu_indices(n_tasks, k=1)  # pdist's pair order
    rng = np.random.default_rng(seed)
    null_rhos = np.empty(n_permutations)
    for start in range(0, n_permutations, _PERMUTATIONS_PER_CHUNK):
        count = min(_PERMUTATIONS_PER_CHUNK, n_permutations - start)
        permutations = np.argsort(rng.random((count, n_tasks)), axis=1)  # [count, task]
        permuted_ranks = code_rank_matrix[permutations[:, first], permutations[:, second]]
        # sum(centered_composition) = 0, so the constant mean of the ranks drops out
        null_rhos[start : start + count] = permuted_ranks @ centered_composition / scale

    # A tolerance so that a permutation giving back rho (the identity, a symmetry) counts.
    tolerance = 1e-12
    if alternative == "greater":
        extreme = null_rhos >= rho - tolerance
    elif alternative == "less":
        extreme = null_rhos <= rho + tolerance
    else:
        extreme = np.abs(null_rhos) >= abs(rho) - tolerance
    p_value = (1 + int(extreme.sum())) / (1 + n_permutations)
    return Topography(rho, p_value, n_tasks, n_permutations, code_metric, alternative, seed, null_rhos)


def mean_codes_by_task(codes: np.ndarray, task_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean code of each task's examples.

    Args:
        codes: ``[n_examples, dim]``.
        task_index: int ``[n_examples]``, the task of each example.

    Returns:
        ``(tasks [n_tasks], mean_codes [n_tasks, dim])``, tasks sorted, each with an example.
    """
    codes, task_index = np.asarray(codes, dtype=np.float64), np.asarray(task_index)
    if codes.ndim != 2 or task_index.shape != (len(codes),):
        raise TopographyError(f"codes {codes.shape} and task_index {task_index.shape} do not match; expected "
                              "[n_examples, dim] and [n_examples]")
    if not np.issubdtype(task_index.dtype, np.integer):
        raise TopographyError(f"task_index has dtype {task_index.dtype}; expected integers")
    tasks, example_task = np.unique(task_index, return_inverse=True)
    sums = np.zeros((len(tasks), codes.shape[1]))
    np.add.at(sums, example_task, codes)
    return tasks, sums / np.bincount(example_task)[:, None]


def composition_counts(combinations: np.ndarray, n_parts: int) -> np.ndarray:
    """How often each part occurs in each combination: int64 ``[n_combinations, n_parts]``.

    ``combinations`` ``[n_combinations, k]`` lists part indices in ``0..n_parts-1`` (a task's
    rules, or its terms); for a set this is its multi-hot vector.
    """
    combinations = np.asarray(combinations)
    if combinations.ndim != 2 or not np.issubdtype(combinations.dtype, np.integer):
        raise TopographyError(f"combinations has shape {combinations.shape} and dtype {combinations.dtype}; "
                              "expected integer part indices [n_combinations, k]")
    if combinations.size and (combinations.min() < 0 or combinations.max() >= n_parts):
        raise TopographyError(f"combinations hold parts {combinations.min()}..{combinations.max()}; expected "
                              f"0..{n_parts - 1} (n_parts={n_parts})")
    counts = np.zeros((len(combinations), n_parts), dtype=np.int64)
    rows = np.repeat(np.arange(len(combinations)), combinations.shape[1])
    np.add.at(counts, (rows, combinations.ravel()), 1)
    return counts


def _check_arguments(mean_codes, compositions, code_metric, n_permutations, seed, alternative):
    if mean_codes.ndim != 2 or compositions.ndim != 2 or len(mean_codes) != len(compositions):
        raise TopographyError(f"mean_codes {mean_codes.shape} and compositions {compositions.shape} do not match; "
                              "expected [n_tasks, dim] and [n_tasks, n_parts]")
    if len(mean_codes) < 3:
        raise TopographyError(f"{len(mean_codes)} tasks give too few pairs for a rank correlation; expected at least 3")
    if not (np.isfinite(mean_codes).all() and np.isfinite(compositions).all()):
        raise TopographyError("mean_codes or compositions hold NaN or infinite values")
    if code_metric not in CODE_METRICS:
        raise TopographyError(f"code_metric={code_metric!r}; expected one of {list(CODE_METRICS)}")
    if code_metric == "cosine":
        zero = np.flatnonzero(~np.any(mean_codes, axis=1))
        if len(zero):
            raise TopographyError(f"the mean code of task row {zero[0]} is zero, which has no cosine distance; "
                                  "use code_metric='euclidean'")
    if alternative not in ALTERNATIVES:
        raise TopographyError(f"alternative={alternative!r}; expected one of {list(ALTERNATIVES)}")
    for name, value, minimum in (("n_permutations", n_permutations, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise TopographyError(f"{name}={value!r}; expected an integer of at least {minimum}")
