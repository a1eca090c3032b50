"""SRAVEN counterfactual answers, checked against the true targets and against an independent
implementation of the rules written here from their descriptions."""

import numpy as np
import pytest

from latentcode.tasks import RULES, Batch, SRaven, get_task

PROGRESSION_STEPS = {
    "progression+1": 1,
    "progression+2": 2,
    "progression-1": -1,
    "progression-2": -2,
}


def reference_answer(rule: str, grid, n_values: int):
    """The answer ``rule`` gives on the last row of a single-feature grid (rows of values), or
    None where it cannot be applied. From the rule descriptions, one grid at a time."""
    a, b = int(grid[2][0]), int(grid[2][1])
    if rule == "constant":
        return a
    if rule in PROGRESSION_STEPS:
        return (b + PROGRESSION_STEPS[rule]) % n_values
    if rule == "sum":
        return (a + b) % n_values
    if rule == "difference":
        return (a - b) % n_values
    if rule == "distribute_three":
        missing = ({int(v) for v in grid[0]} | {int(v) for v in grid[1]}) - {a, b}
        return missing.pop() if len(missing) == 1 else None
    raise AssertionError(rule)


def unpermuted_grids(batch, n_features: int) -> np.ndarray:
    """``[n, M, 3, 3]`` per-feature grids: decode the presented panels from the one-hot context
    and ``y``, then put position j of column c back at feature ``p_c[j]``, one cell at a time."""
    n = len(batch)
    presented = np.concatenate([batch.x[:, : 8 * n_features].argmax(-1), batch.y], axis=1)
    presented = presented.reshape(n, 3, 3, n_features)
    permutations = batch.labels["column_permutations"]
    grids = np.empty((n, n_features, 3, 3), dtype=np.int64)
    for example in range(n):
        for row in range(3):
            for column in range(3):
                for position in range(n_features):
                    feature = permutations[example, column, position]
                    grids[example, feature, row, column] = presented[example, row, column, position]
    return grids


def batch_of_grids(grids) -> Batch:
    """An unpermuted batch of ``SRaven(n_features=2)`` whose feature 0 shows the given grids
    ``[n, 3, 3]`` (query cell included) and feature 1 all zeros."""
    grids = np.stack([np.asarray(grids), np.zeros_like(grids)], axis=1)  # [n, M, 3, 3]
    n, n_features, n_values = len(grids), grids.shape[1], 8
    panels = grids.transpose(0, 2, 3, 1).reshape(n, 9, n_features)  # [n, cell, feature]
    x = np.zeros((n, 9 * n_features, n_values), dtype=np.float32)
    for example in range(n):
        for cell in range(8):
            for feature in range(n_features):
                x[example, cell * n_features + feature, panels[example, cell, feature]] = 1.0
    identity = np.broadcast_to(np.arange(n_features), (n, 3, n_features)).copy()
    return Batch(
        x=x,
        y=panels[:, -1].copy(),
        labels={"column_permutations": identity},
        split="train",
        variant="unpermuted",
    )


def test_hand_made_grid():
    # rows 1 2 3 / 3 1 2 / 2 3 ? ; the first two rows' value set is {1, 2, 3}
    batch = batch_of_grids([[[1, 2, 3], [3, 1, 2], [2, 3, 1]]])
    task = SRaven(n_features=2, n_values=8)
    expected = {
        "constant": 2,
        "progression+1": 4,
        "progression+2": 5,
        "progression-1": 2,
        "progression-2": 1,
        "sum": 5,
        "difference": 7,  # 2 - 3 wraps to 7
        "distribute_three": 1,
    }
    for rule, answer in expected.items():
        answers, defined = task.counterfactual_answer(batch, 0, rule)
        assert answers.tolist() == [answer] and defined.tolist() == [True], rule


def test_progressions_wrap_and_distribute_three_is_undefined_without_a_unique_missing_value():
    task = SRaven(n_features=2, n_values=8)
    grids = [
        [[0, 1, 2], [3, 4, 5], [6, 7, 0]],  # six values in the first rows: two missing
        [[1, 2, 3], [3, 1, 2], [2, 2, 3]],  # a repeated cell leaves two values missing
        [[1, 2, 3], [3, 1, 2], [2, 5, 3]],  # 5 is not in the set: two values missing
        [[4, 4, 4], [4, 4, 4], [4, 4, 4]],  # nothing missing
        [[4, 4, 4], [6, 6, 6], [4, 7, 4]],  # the literal rule: 6 is the unique missing value
    ]
    answers, defined = task.counterfactual_answer(batch_of_grids(grids), 0, "distribute_three")
    assert defined.tolist() == [False, False, False, False, True]
    assert answers.tolist() == [-1, -1, -1, -1, 6]
    answers, _ = task.counterfactual_answer(batch_of_grids(grids), 0, "progression+2")
    assert answers.tolist() == [1, 4, 7, 6, 1]  # 7 + 2 wraps to 1
    answers, _ = task.counterfactual_answer(batch_of_grids(grids), 0, "progression-1")
    assert answers.tolist() == [6, 1, 4, 3, 6]


@pytest.mark.parametrize("n_features, n_values", [(4, 8), (3, 3), (2, 16)])
@pytest.mark.parametrize("variant", ["permuted", "unpermuted"])
def test_the_own_rule_gives_the_true_answer(n_features, n_values, variant):
    task = SRaven(n_features=n_features, n_values=n_values)
    batch = task.sample(400, "ood", seed=3, variant=variant)
    rules, targets = batch.labels["rules"], batch.labels["targets"]
    for feature in range(n_features):
        answers, defined = task.counterfactual_answer(batch, feature, rules[:, feature])
        assert defined.all()
        np.testing.assert_array_equal(answers, targets[:, feature])
        for rule in range(len(RULES)):  # one rule for all: right where it is the feature's rule
            governed = rules[:, feature] == rule
            answers, defined = task.counterfactual_answer(batch, feature, rule)
            assert governed.any() and defined[governed].all()
            np.testing.assert_array_equal(answers[governed], targets[governed, feature])
    # by query position: the feature there is p_2[j], its rule query_rule[:, j], its answer y[:, j]
    for position in range(n_features):
        feature = batch.labels["column_permutations"][:, -1, position]
        answers, _ = task.counterfactual_answer(
            batch, feature, batch.labels["query_rule"][:, position]
        )
        np.testing.assert_array_equal(answers, batch.y[:, position])


@pytest.mark.parametrize("n_features, n_values", [(4, 8), (3, 3), (2, 16)])
def test_every_rule_on_every_feature_matches_the_reference(n_features, n_values):
    task = SRaven(n_features=n_features, n_values=n_values)
    batch = task.sample(300, "train", seed=7)
    grids = unpermuted_grids(batch, n_features)
    undefined_seen = 0
    for feature in range(n_features):
        for rule_index, rule in enumerate(RULES):
            answers, defined = task.counterfactual_answer(batch, feature, rule_index)
            for example in range(len(batch)):
                expected = reference_answer(rule, grids[example, feature], n_values)
                assert defined[example] == (expected is not None), (rule, grids[example, feature])
                assert answers[example] == (-1 if expected is None else expected)
                undefined_seen += expected is None
    assert undefined_seen > 0


def test_per_instance_rules_and_features_and_both_variants_agree():
    task = get_task("sraven")
    permuted = task.sample(500, "test", seed=4)
    unpermuted = task.sample(500, "test", seed=4, variant="unpermuted")
    np.testing.assert_array_equal(task.feature_grids(permuted), task.feature_grids(unpermuted))
    rng = np.random.default_rng(0)
    features, rules = rng.integers(4, size=500), rng.integers(8, size=500)
    answers, defined = task.counterfactual_answer(permuted, features, rules)
    for feature in range(4):
        for rule in range(8):
            chosen = (features == feature) & (rules == rule)
            one_rule_answers, one_rule_defined = task.counterfactual_answer(
                unpermuted, feature, rule
            )
            np.testing.assert_array_equal(answers[chosen], one_rule_answers[chosen])
            np.testing.assert_array_equal(defined[chosen], one_rule_defined[chosen])


def test_arguments_are_checked():
    task = get_task("sraven")
    batch = task.sample(5, seed=0)
    with pytest.raises(ValueError, match=r"feature=4 is out of range; expected 0..3"):
        task.counterfactual_answer(batch, 4, 0)
    with pytest.raises(ValueError, match=r"rule=8 is out of range; expected 0..7"):
        task.counterfactual_answer(batch, 0, 8)
    with pytest.raises(ValueError, match=r"unknown rule 'progression\+3'"):
        task.counterfactual_answer(batch, 0, "progression+3")
    with pytest.raises(ValueError, match=r"feature has shape \(3,\); expected \(\) or \(5,\)"):
        task.counterfactual_answer(batch, [0, 1, 2], 0)
    with pytest.raises(ValueError, match=r"batch.x has shape \(5, 36, 8\); expected \(5, 27, 8\)"):
        SRaven(n_features=3).counterfactual_answer(batch, 0, 0)
    fuzzy_batch = get_task("fuzzy_logic").sample(5, seed=0)
    with pytest.raises(ValueError, match=r"batch.x has shape"):
        task.counterfactual_answer(fuzzy_batch, 0, 0)
