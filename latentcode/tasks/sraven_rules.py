"""SRAVEN's rules and how they fill a grid (read by `sraven` and `sraven_counts`).

A feature's 3x3 grid follows one of the 8 ``RULES`` (indices in that order), row by row, each row
sampled independently (values in ``0..K-1``):

- ``constant``: one value repeated;
- ``progression+1``, ``progression+2``, ``progression-1``, ``progression-2``: a uniform start,
  then that step (mod K);
- ``sum``: a, b uniform, third = (a + b) mod K;  ``difference``: third = (a - b) mod K;
- ``distribute_three``: three distinct values, shared by the grid's rows; each row is an
  independent random ordering of them.
"""

from __future__ import annotations

import numpy as np

from latentcode.tasks.base import TaskError, check_integer
from latentcode.tasks.combinations import enumerate_combinations

__all__ = [
    "DIFFERENCE",
    "DISTRIBUTE_THREE",
    "GRID_SIZE",
    "RULES",
    "STEP",
    "STEPLESS_RULES",
    "SUM",
    "check_n_values",
    "permute_columns",
    "random_permutations",
    "rule_multisets",
    "sample_feature_grids",
    "sample_panels",
]

RULES = ("constant", "progression+1", "progression+2", "progression-1", "progression-2", "sum", "difference",
         "distribute_three")
GRID_SIZE = 3
SUM = RULES.index("sum")
DIFFERENCE = RULES.index("difference")
DISTRIBUTE_THREE = RULES.index("distribute_three")
# The constant rule is a progression with step 0; sum, difference and distribute_three take no step.
STEP = np.array([0, 1, 2, -1, -2, 0, 0, 0], dtype=np.int64)
STEP.flags.writeable = False
STEPLESS_RULES = (SUM, DIFFERENCE, DISTRIBUTE_THREE)
_ORDERINGS_OF_THREE = np.array([[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]], dtype=np.int64)


def check_n_values(n_values) -> int:
    """K as an int, refusing K < 3 (distribute_three needs three distinct values)."""
    n_values = check_integer("n_values", n_values)
    if n_values < 3:
        raise TaskError(f"n_values={n_values} is too small: distribute_three needs at least 3 distinct values")
    return n_values


def rule_multisets(n_features: int) -> np.ndarray:
    """Every multiset of ``n_features`` rules, ``[count, M]`` int64 sorted rows in canonical order (a SRAVEN task)."""
    return enumerate_combinations(len(RULES), n_features, with_replacement=True,
                                  what=f"multisets of {n_features} rules")


def _distinct_triples(rng: np.random.Generator, n: int, n_values: int) -> np.ndarray:
    """``[n, 3]`` uniformly random ordered triples of distinct values in ``0..K-1``."""
    first = rng.integers(n_values, size=n)
    second = rng.integers(n_values - 1, size=n)
    third = rng.integers(n_values - 2, size=n)
    second += second >= first  # skip the first value
    low, high = np.minimum(first, second), np.maximum(first, second)
    third += third >= low  # skip both, the lower one first
    third += third >= high
    return np.stack([first, second, third], axis=-1)


def sample_feature_grids(rules: np.ndarray, n_values: int, rng: np.random.Generator) -> np.ndarray:
    """Values of each feature's 3x3 grid under its rule: int64 ``[n, M, 3, 3]`` (instance, feature, row,
    column) from rule indices ``rules`` ``[n, M]`` into ``RULES`` and K ``n_values``."""
    rules = np.asarray(rules)
    row_start = rng.integers(n_values, size=(*rules.shape, GRID_SIZE))  # [n, M, row]
    row_second = rng.integers(n_values, size=(*rules.shape, GRID_SIZE))  # used by sum, difference
    step = STEP[rules][..., None]
    is_arithmetic = ((rules == SUM) | (rules == DIFFERENCE))[..., None]
    sign = np.where(rules == DIFFERENCE, -1, 1)[..., None]
    middle = np.where(is_arithmetic, row_second, row_start + step)
    last = np.where(is_arithmetic, row_start + sign * row_second, row_start + 2 * step)
    grids = np.stack([row_start, middle, last], axis=-1) % n_values

    distribute = rules == DISTRIBUTE_THREE
    n_distribute = int(distribute.sum())
    if n_distribute:
        values = _distinct_triples(rng, n_distribute, n_values)  # [m, 3]
        orderings = _ORDERINGS_OF_THREE[rng.integers(6, size=(n_distribute, GRID_SIZE))]
        grids[distribute] = np.take_along_axis(values[:, None, :], orderings, axis=-1)
    return grids


def permute_columns(panels: np.ndarray, column_permutations: np.ndarray) -> np.ndarray:
    """Apply each column's permutation to its panels: ``out[:, r, c, j] = panels[:, r, c, p_c[j]]``.

    Args:
        panels: ``[n, 3, 3, M]`` (instance, row, column, feature).
        column_permutations: ``[n, 3, M]``, ``p_c`` for each column c.
    """
    return np.take_along_axis(panels, column_permutations[:, None, :, :], axis=-1)


def random_permutations(rng: np.random.Generator, shape: tuple[int, ...], n_items: int) -> np.ndarray:
    """``[*shape, n_items]`` int64, independent uniformly random permutations."""
    return np.argsort(rng.random((*shape, n_items)), axis=-1)


def sample_panels(multisets: np.ndarray, n_values: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rules in feature order ``[n, M]``, panels ``[n, 3, 3, M]`` and column permutations
    ``[n, 3, M]`` for instances of the given rule multisets ``[n, M]``: the rules of each multiset
    in a random feature order, a grid per feature, a random permutation per column."""
    n, n_features = multisets.shape
    feature_order = random_permutations(rng, (n,), n_features)
    rules = np.take_along_axis(multisets, feature_order, axis=1)
    panels = sample_feature_grids(rules, n_values, rng).transpose(0, 2, 3, 1)
    column_permutations = random_permutations(rng, (n, GRID_SIZE), n_features)
    return rules, panels, column_permutations
