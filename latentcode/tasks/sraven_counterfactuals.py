"""SRAVEN's counterfactuals: the answer another rule gives on an instance, whether that answer
completes a valid row of the rule, and base/donor pairs for patching experiments (see
``latentcode.tasks.counterfactuals``). `SRaven`'s methods of the same names call these, with the
`SRaven` task as ``task``; the rules are `sraven_rules`'s, so this module does not import the task."""

from __future__ import annotations

import numpy as np

from latentcode.tasks.base import Batch, Task, TaskError
from latentcode.tasks.counterfactuals import (
    CounterfactualPairs,
    check_pair_request,
    choose_donors,
    choose_third,
    donors_at,
    first_kept,
    take,
)
from latentcode.tasks.sraven_rules import DIFFERENCE, DISTRIBUTE_THREE, RULES, STEP, SUM
from latentcode.validation import check_variant


def counterfactual_answer(task: Task, batch: Batch, feature, rule) -> tuple[np.ndarray, np.ndarray]:
    """The answer that ``rule`` gives on the last row of ``feature``, from that row's first
    two cells ``a, b`` and (for distribute_three) the first two rows:

    - ``constant``: ``a``;
    - ``progression±d``: ``(b ± d) mod K``;
    - ``sum``: ``(a + b) mod K``;  ``difference``: ``(a - b) mod K``;
    - ``distribute_three``: the one value of the first two rows' value set that is neither
      ``a`` nor ``b``; undefined where that leaves no value or more than one.

    With the instance's own rule for the feature this is the true answer (``targets``).

    Args:
        batch: a batch of this task, either variant.
        feature: the feature in feature order (not the presented position), an int or int
            ``[n]`` per instance; the feature at query position j is
            ``batch.labels["column_permutations"][:, -1, j]``.
        rule: an index into ``RULES`` or a rule name, or int ``[n]`` per instance.

    Returns:
        ``(answers, defined)``: int64 ``[n]`` in ``0..K-1`` (-1 where undefined) and bool
        ``[n]``, False where the rule cannot be applied.
    """
    grid, rule = _grid_and_rule(task, batch, feature, rule)
    first, second = grid[:, -1, 0], grid[:, -1, 1]
    unwrapped = np.select(
        [rule == RULES.index("constant"), rule == SUM, rule == DIFFERENCE],
        [first, first + second, first - second],
        default=second + STEP[rule],  # the progressions
    )
    answers = unwrapped % task.n_values

    missing_value, unique_missing = _missing_from_value_set(task.n_values, grid)
    is_distribute = rule == DISTRIBUTE_THREE
    answers = np.where(is_distribute, missing_value, answers)
    defined = ~is_distribute | unique_missing
    return np.where(defined, answers, -1).astype(np.int64), defined

def completes_a_valid_row(task: Task, batch: Batch, feature, rule, answer) -> np.ndarray:
    """Whether the last row of ``feature`` completed with ``answer`` is a row that ``rule``
    generates (and, for distribute_three, one of the value set the first two rows share):

    - ``constant``: ``a == b == answer``; ``progression±d``: ``b = a ± d`` and ``answer = b ± d``
      (mod K); ``sum`` / ``difference``: ``answer = a ± b`` (mod K);
    - ``distribute_three``: the first two rows hold exactly three values, and ``a``, ``b``,
      ``answer`` are those three in some order.

    ``feature``, ``rule``: as for ``counterfactual_answer``; ``answer``: int ``[n]``. Returns bool ``[n]``.
    The question "does the model follow rule r' here" is well-posed only where this holds for
    r''s counterfactual answer."""
    grid, rule = _grid_and_rule(task, batch, feature, rule)
    n, K = len(batch), task.n_values
    answer = np.asarray(answer, dtype=np.int64).reshape(n)
    a, b = grid[:, -1, 0], grid[:, -1, 1]
    step = STEP[rule]
    progression = ((b - a - step) % K == 0) & ((answer - b - step) % K == 0)
    valid = np.select([rule == SUM, rule == DIFFERENCE], [(answer - a - b) % K == 0, (answer - a + b) % K == 0],
                      default=progression)
    first_rows = _values_of_first_rows(grid, K)
    row = np.stack([a, b, answer], axis=1)
    distinct = (a != b) & (a != answer) & (b != answer)
    in_set = np.take_along_axis(first_rows, np.clip(row, 0, K - 1), axis=1).all(axis=1) & (row >= 0).all(axis=1)
    distribute = (first_rows.sum(axis=1) == 3) & distinct & in_set
    return np.where(rule == DISTRIBUTE_THREE, distribute, valid)

def counterfactual_pairs(task: Task, n: int, split: str = "ood", *, seed: int = 0, variant: str | None = None,
                         prediction: int = -1, pool: int = 8, well_posed: bool = True):
    """``n`` base instances of ``split`` with a donor per relation (``different``, ``third``,
    ``same``; see ``latentcode.tasks.counterfactuals``), at the query position ``prediction``
    (default the last; its rule is ``query_rule[:, prediction]``).

    The target rule r' of each base is drawn uniformly among the rules whose counterfactual
    answer is defined, differs from the true answer and (``well_posed``) completes a valid row
    of r'. The third donor's rule r'' is neither r nor r', and its own answer on the base is not
    r''s. Donors come from a pool of ``pool * n`` fresh instances of the same split and variant.
    ``counts`` says how many of the candidate bases each condition kept, and, per rule r' and per
    rule pair, how often r' was well-posed.
    """

    prediction = check_pair_request(n, prediction, task.n_predictions, pool)
    variant = check_variant(variant if variant is not None else task.analysis.variant, task, error=TaskError)
    n_candidates = 4 * n
    candidates = task.sample(n_candidates, split, seed=(seed, 1), variant=variant)
    donor_pool = task.sample(pool * n, split, seed=(seed, 2), variant=variant)
    rng = np.random.default_rng([seed, 3])
    feature = candidates.labels["column_permutations"][:, -1, prediction]
    base_rule = candidates.labels["query_rule"][:, prediction]
    truth = candidates.y[:, prediction]
    answers, defined = zip(*(counterfactual_answer(task, candidates, feature, rule) for rule in range(len(RULES))),
                           strict=True)
    answers, defined = np.stack(answers, 1), np.stack(defined, 1)  # [candidates, rules]
    valid_rows = np.stack([completes_a_valid_row(task, candidates, feature, rule, np.maximum(answers[:, rule], 0))
                           for rule in range(len(RULES))], 1) & defined
    distinguishes = defined & (answers != truth[:, None])
    target_ok = distinguishes & (valid_rows if well_posed else True)
    pool_rule = donor_pool.labels["query_rule"][:, prediction]
    kept, target, donor_different, donor_same = choose_donors(rng, base_rule, target_ok.copy(), pool_rule)
    target_answer = answers[np.arange(n_candidates), target]
    third_ok = answers != target_answer[:, None]
    third_ok[np.arange(n_candidates), base_rule] = False
    third_ok[np.arange(n_candidates), target] = False
    has_third, third, donor_third = choose_third(rng, third_ok, pool_rule)
    kept &= has_third
    rows = first_kept(kept, n, f"{split} instances have a well-posed counterfactual rule with donors of every "
                               f"relation at prediction {prediction}; ask for fewer pairs than {n} or set "
                               "well_posed=False")
    not_own = np.ones_like(defined)
    not_own[np.arange(n_candidates), base_rule] = False
    counts = {
        "candidates": n_candidates,
        "with a distinguishing rule r'": int((distinguishes & not_own).any(1).sum()),
        "with a well-posed distinguishing rule r'": int((distinguishes & valid_rows & not_own).any(1).sum()),
        "kept (all donors found)": int(kept.sum()),
        "pairs": n,
        # how often each rule's counterfactual row is valid where it is defined and differs from the truth
        "well-posed fraction per rule r'": {RULES[r]: float(valid_rows[distinguishes[:, r] & not_own[:, r], r].mean())
                                            if (distinguishes[:, r] & not_own[:, r]).any() else float("nan")
                                            for r in range(len(RULES))},
        "pairs per base rule": {RULES[r]: int((base_rule[rows] == r).sum()) for r in range(len(RULES))},
        "pairs per target rule": {RULES[r]: int((target[rows] == r).sum()) for r in range(len(RULES))},
    }
    donors = donors_at(donor_pool, {"different": donor_different[rows], "third": donor_third[rows],
                                    "same": donor_same[rows]})
    return CounterfactualPairs(
        base=take(candidates, rows), donors=donors, prediction=prediction, base_answer=truth[rows],
        counterfactual_answer=target_answer[rows], base_part=base_rule[rows],
        donor_parts={"different": target[rows], "third": third[rows], "same": base_rule[rows]},
        part_names=list(RULES), counts=counts)

def _missing_from_value_set(n_values: int, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For grids ``[n, 3, 3]``: the values of the first two rows that are not among the
    last row's first two cells; ``(value [n], unique [n])``, value meaningful where unique."""
    in_last_row = (grid[:, -1, :-1, None] == np.arange(n_values)).any(axis=1)  # [n, K]
    candidates = _values_of_first_rows(grid, n_values) & ~in_last_row
    return candidates.argmax(axis=1), candidates.sum(axis=1) == 1

def _values_of_first_rows(grid: np.ndarray, n_values: int) -> np.ndarray:
    """Which values ``0..K-1`` the first two rows of grids ``[n, 3, 3]`` hold: bool ``[n, K]``."""
    return (grid[:, :-1, :, None] == np.arange(n_values)).any(axis=(1, 2))

def _grid_and_rule(task: Task, batch: Batch, feature, rule) -> tuple[np.ndarray, np.ndarray]:
    """The grid ``[n, 3, 3]`` of ``feature`` of each instance and ``rule`` (an index, a name, or ``[n]``) as
    int64 ``[n]``, both checked."""
    grids, n = task.feature_grids(batch), len(batch)
    feature = _per_instance_index("feature", feature, n, task.n_features)
    if isinstance(rule, str):
        if rule not in RULES:
            raise TaskError(f"unknown rule {rule!r}; valid rules: {list(RULES)}")
        rule = RULES.index(rule)
    return grids[np.arange(n), feature], _per_instance_index("rule", rule, n, len(RULES))

def _per_instance_index(name: str, index, n: int, count: int) -> np.ndarray:
    """``index`` (an int or ints ``[n]``) as int64 ``[n]``, each in ``0..count-1``."""
    array = np.asarray(index)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise TaskError(f"{name}={index!r} must be an integer or an integer array [n]")
    if array.ndim == 0:
        array = np.full(n, array, dtype=np.int64)
    if array.shape != (n,):
        raise TaskError(f"{name} has shape {array.shape}; expected () or ({n},) [n]")
    outside = (array < 0) | (array >= count)
    if outside.any():
        raise TaskError(f"{name}={array[outside][0]} is out of range; expected 0..{count - 1}")
    return array.astype(np.int64)
