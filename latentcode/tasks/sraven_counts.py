"""How many SRAVEN tasks and instances there are, and how many instances are ambiguous (a Monte
Carlo estimate): the counts behind the paper's task description and its Table A2."""

from __future__ import annotations

import math

import numpy as np

from latentcode.tasks.ambiguity import check_ambiguity_feasible, check_criterion, check_rules, is_ambiguous
from latentcode.tasks.base import check_integer
from latentcode.tasks.sraven_rules import (
    GRID_SIZE,
    RULES,
    check_n_values,
    permute_columns,
    rule_multisets,
    sample_panels,
)

__all__ = ["count_instances", "count_tasks", "estimate_ambiguity", "grids_per_rule"]

AMBIGUITY_STREAM = 3  # the Monte Carlo draw's stream: default_rng([seed, AMBIGUITY_STREAM])


def count_tasks(n_features: int, n_rules: int = len(RULES)) -> int:
    """The paper's number of possible SRAVEN tasks on the 3x3 grid:
    ``C(R + M - 1, M) * ((M!)**2 - M)`` (rule multisets times column-permutation patterns); M >= 2
    (the formula is zero for M=1)."""
    n_features = check_integer("n_features", n_features, minimum=2)
    n_rules = check_integer("n_rules", n_rules, minimum=1)
    return math.comb(n_rules + n_features - 1, n_features) * (math.factorial(n_features) ** 2 - n_features)


def grids_per_rule(n_values: int) -> dict[str, int]:
    """How many distinct single-feature 3x3 grids each rule can generate (rows independent):
    K**3 for constant and each progression (a start per row), K**6 for sum and difference (two
    free cells per row), C(K, 3) * 6**3 for distribute_three (a set of three, an ordering per
    row)."""
    n_values = check_n_values(n_values)
    grids = dict.fromkeys(RULES, n_values**3)  # constant and the progressions: a start per row
    grids["sum"] = grids["difference"] = n_values**6
    grids["distribute_three"] = math.comb(n_values, 3) * 6**3
    return grids


def count_instances(n_features: int, n_values: int) -> int:
    """The number of distinct labelled problem instances the generator can produce.

    A labelled instance is a rule for each feature (in feature order: any of the ``R**M``
    tuples, as every ordering of every multiset occurs), the values of each feature's grid under
    its rule, and the three column permutations::

        (sum over rules of grids_per_rule(K)) ** M * (M!) ** 3

    This counts generator outcomes: two of them can present the same tokens (an ambiguous
    instance, or features that happen to coincide), so it bounds the number of distinct token
    sequences from above. For M=4, K=8 it is about 1.2e27.
    """
    n_features = check_integer("n_features", n_features, minimum=1)
    grids_per_feature = sum(grids_per_rule(n_values).values())
    return grids_per_feature**n_features * math.factorial(n_features) ** GRID_SIZE


def estimate_ambiguity(n_features: int, n_values: int, n_instances: int, seed: int = 0, criterion: str = "all_features",
                       rules: str = "strict") -> tuple[float, float]:
    """Monte Carlo estimate of the fraction of ambiguous SRAVEN instances.

    Draws ``n_instances`` permuted instances with rule multisets uniform over all of them
    (ignoring the split) from ``np.random.default_rng([seed, AMBIGUITY_STREAM])`` and checks each
    exhaustively with :func:`is_ambiguous` under ``criterion`` and ``rules``
    (``latentcode.tasks.ambiguity``; ``"all_features", "authors"`` is the paper's Table A2).

    Returns:
        ``(fraction, standard_error)``, the standard error being ``sqrt(f (1 - f) / n)``.
    """
    n_features = check_integer("n_features", n_features, minimum=1)
    n_values = check_n_values(n_values)
    n_instances = check_integer("n_instances", n_instances, minimum=1)
    seed = check_integer("seed", seed, minimum=0)
    check_criterion(criterion)
    check_rules(rules)
    check_ambiguity_feasible(n_instances, n_features)

    rng = np.random.default_rng([seed, AMBIGUITY_STREAM])
    multisets = rule_multisets(n_features)
    chosen = multisets[rng.integers(len(multisets), size=n_instances)]
    _, panels, column_permutations = sample_panels(chosen, n_values, rng)
    ambiguous = is_ambiguous(permute_columns(panels, column_permutations), n_values, criterion, rules)
    fraction = float(ambiguous.mean())
    return fraction, math.sqrt(fraction * (1.0 - fraction) / n_instances)
