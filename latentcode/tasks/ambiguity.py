"""Is a SRAVEN instance ambiguous? An exhaustive, vectorized check over column permutations.

An instance is *ambiguous* when an assignment of rules and column permutations other than the
one that generated it fits all 8 context panels but prescribes a different 9th panel. Which
assignments count (``criterion``) and when a rule fits a feature's cells (``rules``) are
independent choices:

``criterion``: ``all_features`` (default), the authors' public estimator (``check_is_ambiguous`` in
``hyla/data/raven.py`` of smonsays/hypernetwork-attention): some column permutation (of the
``(M!)**3``) under which, for *every* feature, some rule fits its 8 context cells and predicts an
answer other than the true one. ``any_feature``, the paper's wording: some column permutation and
fitting rules, one per feature, whose 9th panel differs from the true one in at least one feature.
``all_features`` implies ``any_feature``.

``rules``: a rule *fits* a feature's 3x3 grid when it holds on both full rows and on the last row's
two cells; its *answer* is the 9th cell it prescribes (the true 9th cell is not looked at).
constant: every row constant; progression: one step s in {+1, +2, -1, -2} (mod K) for every
within-row step (the four progression rules as one family); sum / difference: third = first ± second
(mod K) in both full rows. distribute_three is where the two definitions differ:

- ``strict`` (default): only what the generator can produce: both full rows are orderings of one set
  of 3 distinct values and the last row's two cells are two different members; answer: the missing one.
- ``authors``: the authors' checker (``is_distribute_three``): both full rows are orderings of one
  *multiset* of 3 values and each of the last row's cells occurs in it; answer: the multiset's value
  that occurs least often among those two cells, the first such in sorted order.

Where ``strict`` fits, ``authors`` fits with the same answer, so ``authors`` is never less ambiguous;
its extra fits (multisets with a repeat) make the difference at small K. The paper's Table A2 is
``criterion="all_features", rules="authors"``; both estimates are in analyses/RESULTS.md (Table A2).

Relabelling features changes neither criterion, so the permutations ``(p0, p1, p2)`` and
``(id, p1 p0^-1, p2 p0^-1)`` agree: the check fixes the first column and enumerates the ``(M!)**2``
others. The rules are fitted once to each of the ``M**3`` *strands* (position a of the first
column's panels, b of the second's, c of the third's); a permutation pair picks M strands
``(f, p1[f], p2[f])`` and the criteria reduce to ``all``/``any`` over a gathered
``[instances, permutation pairs, M]`` table, chunked over instances to bound memory.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from latentcode.tasks.base import TaskError, check_integer

CRITERIA = ("all_features", "any_feature")
# When a rule fits a feature's cells: only as the generator makes it, or as the authors' checker.
RULE_DEFINITIONS = ("strict", "authors")
RULE_FAMILIES = ("constant", "progression", "sum", "difference", "distribute_three")

# An exhaustive check gathers n * (M!)**2 * M table entries. On one core 10**9 of them take a few
# seconds for M <= 5 (about 14,000 instances allowed) and about 30 s for M=6 (about 300).
MAX_PERMUTATION_CHECKS = 10**9
# Entries per chunk of the gathered tables: bounds the memory of one chunk to tens of MB.
_CHUNK_ENTRIES = 2**23


def check_rules(rules: str) -> str:
    """Refuse a rule definition other than those of ``RULE_DEFINITIONS``."""
    if rules not in RULE_DEFINITIONS:
        raise TaskError(f"unknown rules {rules!r}; valid rule definitions: {list(RULE_DEFINITIONS)}")
    return rules


def check_criterion(criterion: str) -> str:
    """Refuse a criterion other than those of ``CRITERIA``."""
    if criterion not in CRITERIA:
        raise TaskError(f"unknown criterion {criterion!r}; valid criteria: {list(CRITERIA)}")
    return criterion


def fit_rules(grids: np.ndarray, n_values: int, rules: str = "strict") -> tuple[np.ndarray, np.ndarray]:
    """Which rule families fit each grid's 8 context cells, and what each then predicts.

    Args:
        grids: integer ``[..., 3, 3]`` (row, column) single-feature grids; the answer cell is ignored.
        n_values: K, the number of values.
        rules: ``"strict"`` or ``"authors"``, the definition of distribute_three.

    Returns:
        ``fits`` bool ``[..., 5]`` and ``answers`` int ``[..., 5]``, in the order of
        ``RULE_FAMILIES``. An answer is meaningless where its rule does not fit.
    """
    grids = np.asarray(grids)
    full_rows = grids[..., :2, :]  # [..., 2, 3]
    first, second = grids[..., 2, 0], grids[..., 2, 1]  # the last row's two cells

    constant = (full_rows == full_rows[..., :1]).all(axis=(-1, -2)) & (first == second)

    within_row_steps = (full_rows[..., 1:] - full_rows[..., :-1]) % n_values  # [..., 2, 2]
    step = (second - first) % n_values
    allowed_steps = np.array(sorted({1, 2, n_values - 1, n_values - 2}))
    progression = (within_row_steps == step[..., None, None]).all(axis=(-1, -2)) & np.isin(step, allowed_steps)

    sum_rule = ((full_rows[..., 0] + full_rows[..., 1]) % n_values == full_rows[..., 2]).all(-1)
    difference = ((full_rows[..., 0] - full_rows[..., 1]) % n_values == full_rows[..., 2]).all(-1)

    distribute_three, distribute_three_answer = _fit_distribute_three(full_rows, first, second, check_rules(rules))

    fits = np.stack([constant, progression, sum_rule, difference, distribute_three], axis=-1)
    answers = np.stack([first, (second + step) % n_values, (first + second) % n_values,
                        (first - second) % n_values, distribute_three_answer], axis=-1)
    return fits, answers


def _fit_distribute_three(full_rows: np.ndarray, first: np.ndarray, second: np.ndarray,
                          rules: str) -> tuple[np.ndarray, np.ndarray]:
    """distribute_three's fit and answer ``[...]`` from the full rows ``[..., 2, 3]`` and the
    last row's two cells ``[...]``, under either definition."""
    sorted_rows = np.sort(full_rows, axis=-1)
    value_multiset = sorted_rows[..., 0, :]  # [..., 3], sorted
    same_multiset = (sorted_rows[..., 1, :] == value_multiset).all(-1)
    last_cells = np.stack([first, second], axis=-1)  # [..., 2]
    matches = last_cells[..., :, None] == value_multiset[..., None, :]  # [..., cell, value]
    members = matches.any(-1).all(-1)
    if rules == "strict":
        three_distinct = (np.diff(value_multiset, axis=-1) > 0).all(-1)  # sorted, so strictly increasing
        fits = three_distinct & same_multiset & members & (first != second)
        return fits, value_multiset.sum(-1) - first - second
    # The authors' answer: the multiset's value the last row's cells hit least often, the first
    # in sorted order on a tie (argmin returns the first minimum).
    least_used = matches.sum(-2).argmin(-1)  # [...]
    answer = np.take_along_axis(value_multiset, least_used[..., None], axis=-1)[..., 0]
    return same_multiset & members, answer


def strand_grids(panels: np.ndarray) -> np.ndarray:
    """Every candidate feature of each instance: ``[n, M, M, M, 3, 3]``.

    ``strands[i, a, b, c, row]`` is ``(panels[i, row, 0, a], panels[i, row, 1, b],
    panels[i, row, 2, c])``: position a of the first column's panels, b of the second's, c of the
    third's.
    """
    n, _, _, n_features = panels.shape
    shape = (n, n_features, n_features, n_features, 3)
    by_position = np.moveaxis(panels, -1, 1)  # [n, M, row, column]
    column_0 = by_position[:, :, None, None, :, 0]
    column_1 = by_position[:, None, :, None, :, 1]
    column_2 = by_position[:, None, None, :, :, 2]
    return np.stack([np.broadcast_to(column, shape) for column in (column_0, column_1, column_2)], axis=-1)


def _permutation_pair_strands(n_features: int) -> np.ndarray:
    """``[(M!)**2, M]`` flat strand indices ``f*M*M + p1[f]*M + p2[f]`` for every pair (p1, p2)."""
    permutations = np.array(list(itertools.permutations(range(n_features))), dtype=np.int64)
    features = np.arange(n_features)
    second = permutations[:, None, :]
    third = permutations[None, :, :]
    flat = features * n_features**2 + second * n_features + third  # [M!, M!, M]
    return flat.reshape(-1, n_features)


def check_ambiguity_feasible(n_instances: int, n_features: int) -> None:
    """Raise a ValueError when an exhaustive check of ``n_instances`` would be infeasible."""
    if n_features > 20:  # (21!)^2 alone is 2.6e39: computed exactly, a large M takes minutes to print
        log10_checks = math.log10(n_instances) + 2 * math.lgamma(n_features + 1) / math.log(10) + math.log10(n_features)
        checks = f"about 10^{log10_checks:,.0f}"
    else:
        count = n_instances * math.factorial(n_features) ** 2 * n_features
        if count <= MAX_PERMUTATION_CHECKS:
            return
        checks = f"{count:,}"
    raise TaskError(f"an exhaustive ambiguity check of {n_instances} instances with n_features={n_features} enumerates "
                    f"{n_instances} x ({n_features}!)^2 column permutation pairs x {n_features} features = {checks} "
                    f"checks, more than the limit of {MAX_PERMUTATION_CHECKS:,} (the first column's permutation is "
                    "fixed without loss of generality); check fewer instances or use fewer features")


def is_ambiguous(panels: np.ndarray, n_values: int, criterion: str = "all_features",
                 rules: str = "strict") -> np.ndarray:
    """Exhaustively check each instance for a different answer (see the module docstring).

    Args:
        panels: integer ``[n, 3, 3, M]`` grids of panels (row, column, position in the panel),
            as presented or unpermuted: the verdict does not depend on column permutations.
        n_values: K; every value must lie in ``0..K-1``.
        criterion: ``"all_features"`` (the authors' estimator) or ``"any_feature"`` (the paper's wording).
        rules: ``"strict"`` (only fits the generator can produce) or ``"authors"`` (the authors' checker).

    Returns:
        bool ``[n]``.
    """
    check_criterion(criterion)
    check_rules(rules)
    n_values = check_integer("n_values", n_values, minimum=3)
    panels = np.asarray(panels)
    if panels.ndim != 4 or panels.shape[1:3] != (3, 3) or not np.issubdtype(panels.dtype, np.integer):
        raise TaskError(f"panels must be an integer array [n, 3, 3, M]; got dtype {panels.dtype} and "
                        f"shape {panels.shape}")
    if panels.size and (panels.min() < 0 or panels.max() >= n_values):
        raise TaskError(f"panel values range over [{panels.min()}, {panels.max()}], outside 0..{n_values - 1} "
                        f"for n_values={n_values}")
    n, n_features = len(panels), panels.shape[-1]
    check_ambiguity_feasible(n, n_features)
    pair_strands = _permutation_pair_strands(n_features)  # [P, M]
    entries_per_instance = max(pair_strands.size, n_features**3 * 9 * 5)
    chunk = max(1, _CHUNK_ENTRIES // entries_per_instance)

    verdict = np.empty(n, dtype=bool)
    for start in range(0, n, chunk):
        strands = strand_grids(panels[start : start + chunk].astype(np.int64))
        fits, answers = fit_rules(strands, n_values, rules)
        true_answer = strands[..., 2, 2]
        differs = (fits & (answers != true_answer[..., None])).any(-1)
        differs = differs.reshape(len(strands), -1)[:, pair_strands]  # [c, P, M]
        if criterion == "all_features":
            ambiguous = differs.all(-1).any(-1)
        else:
            fitted = fits.any(-1).reshape(len(strands), -1)[:, pair_strands]
            ambiguous = (fitted.all(-1) & differs.any(-1)).any(-1)
        verdict[start : start + chunk] = ambiguous
    return verdict
