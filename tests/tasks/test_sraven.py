"""SRAVEN generation: rules (checked independently), permutations, tokens, splits, counts."""

import itertools
import math

import numpy as np
import pytest

from latentcode.tasks import RULES, SRaven, get_task
from latentcode.tasks.sraven_counts import count_instances, count_tasks, grids_per_rule

PROGRESSION_STEPS = {
    "progression+1": 1,
    "progression+2": 2,
    "progression-1": -1,
    "progression-2": -2,
}


def grid_follows(rule: str, grid, n_values: int) -> bool:
    """Does a 3x3 single-feature grid (rows of values) follow ``rule``? Written from the rule
    definitions, independently of the generator."""
    rows = [list(row) for row in grid]
    if rule == "distribute_three":
        value_set = set(rows[0])
        return len(value_set) == 3 and all(sorted(row) == sorted(value_set) for row in rows)
    for a, b, c in rows:
        if rule == "constant":
            ok = a == b == c
        elif rule in PROGRESSION_STEPS:
            step = PROGRESSION_STEPS[rule]
            ok = b == (a + step) % n_values and c == (b + step) % n_values
        elif rule == "sum":
            ok = c == (a + b) % n_values
        elif rule == "difference":
            ok = c == (a - b) % n_values
        else:
            raise AssertionError(rule)
        if not ok:
            return False
    return True


def presented_panels(batch, n_features: int, n_values: int) -> np.ndarray:
    """Decode the 9 presented panels ``[n, 3, 3, M]`` from the one-hot context and the targets."""
    context = batch.x[:, : 8 * n_features]
    assert set(np.unique(context)) <= {0.0, 1.0} and (context.sum(-1) == 1).all()
    values = np.concatenate([context.argmax(-1), batch.y], axis=1)
    return values.reshape(len(batch), 3, 3, n_features)


def test_rule_names_and_order():
    assert RULES == (
        "constant",
        "progression+1",
        "progression+2",
        "progression-1",
        "progression-2",
        "sum",
        "difference",
        "distribute_three",
    )


def test_one_hot_tokens_and_zero_query():
    task = get_task("sraven")
    batch = task.sample(64, seed=0)
    assert batch.x.shape == (64, 36, 8)
    context, query = batch.x[:, :32], batch.x[:, 32:]
    assert set(np.unique(context)) == {0.0, 1.0}
    assert (context.sum(-1) == 1).all()
    assert (query == 0).all()
    assert batch.y.dtype == np.int64 and ((batch.y >= 0) & (batch.y < 8)).all()


@pytest.mark.parametrize("n_features, n_values", [(4, 8), (3, 3), (2, 16)])
def test_every_generated_grid_follows_its_rule(n_features, n_values):
    task = SRaven(n_features=n_features, n_values=n_values)
    for split in task.splits:
        batch = task.sample(300, split, seed=11, variant="unpermuted")
        panels = presented_panels(batch, n_features, n_values)
        for example in range(len(batch)):
            for feature, rule in enumerate(batch.labels["rules"][example]):
                grid = panels[example, :, :, feature]
                assert grid_follows(RULES[rule], grid, n_values), (RULES[rule], grid)
        np.testing.assert_array_equal(panels[:, 2, 2], batch.labels["targets"])


def test_every_rule_is_generated():
    batch = get_task("sraven").sample(2000, seed=0)
    assert set(np.unique(batch.labels["rules"])) == set(range(8))


def test_permutation_convention_query_rule_and_targets():
    """Undo the labelled permutations by hand: position j of column c shows feature p_c[j]."""
    task = get_task("sraven", n_features=4, n_values=8)
    batch = task.sample(300, "ood", seed=5)
    panels = presented_panels(batch, 4, 8)
    permutations = batch.labels["column_permutations"]
    rules, targets = batch.labels["rules"], batch.labels["targets"]
    for example in range(len(batch)):
        unpermuted = np.empty((3, 3, 4), dtype=np.int64)
        for column in range(3):
            assert sorted(permutations[example, column]) == [0, 1, 2, 3]
            for position in range(4):
                feature = permutations[example, column, position]
                unpermuted[:, column, feature] = panels[example, :, column, position]
        for feature in range(4):
            assert grid_follows(RULES[rules[example, feature]], unpermuted[:, :, feature], 8)
        for position in range(4):
            # the query position's feature, found from the query column, obeys query_rule
            feature = permutations[example, 2, position]
            assert batch.y[example, position] == targets[example, feature]
            grid = unpermuted[:, :, feature]
            assert grid_follows(RULES[batch.labels["query_rule"][example, position]], grid, 8)
            assert batch.labels["query_rule"][example, position] == rules[example, feature]


def test_permutations_are_random_and_absent_when_unpermuted():
    task = get_task("sraven")
    permuted = task.sample(500, seed=1)
    unpermuted = task.sample(500, seed=1, variant="unpermuted")
    identity = np.broadcast_to(np.arange(4), (500, 3, 4))
    np.testing.assert_array_equal(unpermuted.labels["column_permutations"], identity)
    np.testing.assert_array_equal(unpermuted.labels["query_rule"], unpermuted.labels["rules"])
    np.testing.assert_array_equal(unpermuted.y, unpermuted.labels["targets"])
    assert len(np.unique(permuted.labels["column_permutations"].reshape(-1, 4), axis=0)) == 24
    # the two variants of one seed are the same instances
    for name in ("rules", "targets", "task_index"):
        np.testing.assert_array_equal(permuted.labels[name], unpermuted.labels[name])


def test_rules_of_a_multiset_come_in_random_feature_order():
    task = get_task("sraven")
    batch = task.sample(1000, seed=2, variant="unpermuted")
    rules = batch.labels["rules"]
    np.testing.assert_array_equal(
        np.sort(rules, axis=1), task.all_combinations[batch.labels["task_index"]]
    )
    assert (np.diff(rules, axis=1) < 0).any(axis=1).mean() > 0.5
    for feature in range(4):
        assert set(np.unique(rules[:, feature])) == set(range(8))


@pytest.mark.parametrize("frac_ood", [0.1, 0.25, 0.5])
@pytest.mark.parametrize("seed", [0, 3])
def test_split_sizes_and_rule_coverage(frac_ood, seed):
    task = SRaven(frac_ood=frac_ood, seed=seed)
    np.testing.assert_array_equal(
        task.all_combinations, list(itertools.combinations_with_replacement(range(8), 4))
    )
    train = set(map(tuple, task.combinations("train")))
    ood = set(map(tuple, task.combinations("ood")))
    assert len(ood) == math.floor(frac_ood * 330 + 0.5)
    assert len(train) == 330 - len(ood) and not train & ood
    np.testing.assert_array_equal(task.combinations("test"), task.combinations("train"))
    assert set().union(*train) == set(range(8))


def test_held_out_multisets_never_reach_training_batches():
    task = get_task("sraven")
    train = set(map(tuple, task.combinations("train")))
    ood = set(map(tuple, task.combinations("ood")))
    seen = set()
    for step in range(100):
        for split in ("train", "test"):
            rules = task.sample(512, split, seed=(0, step)).labels["rules"]
            multisets = {tuple(sorted(row)) for row in rules.tolist()}  # any ordering counts
            assert not multisets & ood
            seen |= multisets
    assert seen == train
    ood_rules = task.sample(4096, "ood", seed=0).labels["rules"]
    assert {tuple(sorted(row)) for row in ood_rules.tolist()} == ood


def test_evaluate_accuracy_and_feature_accuracy():
    task = get_task("sraven")
    batch = task.sample(100, seed=0)
    logits = np.eye(8)[batch.y] * 5.0  # [n, M, K], right everywhere
    perfect = task.evaluate(logits, batch)
    assert perfect["accuracy"] == 1.0 and perfect["feature_accuracy"] == 1.0
    wrong = logits.copy()
    wrong[:50, 1] = np.roll(wrong[:50, 1], 1, axis=-1)  # position 1 wrong in half the instances
    metrics = task.evaluate(wrong, batch)
    assert metrics["accuracy"] == 0.5
    assert metrics["feature_accuracy"] == pytest.approx(1 - 50 / 400)
    assert metrics["feature_accuracy_1"] == 0.5
    assert metrics["feature_accuracy_0"] == metrics["feature_accuracy_3"] == 1.0


def test_count_tasks_formula():
    assert count_tasks(4) == 330 * (24**2 - 4) == 188_760
    assert count_tasks(2) == math.comb(9, 2) * (2**2 - 2)
    assert count_tasks(3, n_rules=5) == math.comb(7, 3) * (36 - 3)
    with pytest.raises(ValueError, match=r"n_features=1 must be at least 2"):
        count_tasks(1)


def test_grids_per_rule_by_exhaustive_enumeration():
    """Count every 3x3 grid over K=3 and K=4 values that follows each rule, independently."""
    for n_values in (3, 4):
        rows = list(itertools.product(range(n_values), repeat=3))
        counts = dict.fromkeys(RULES, 0)
        for rule in RULES:
            if rule == "distribute_three":
                continue
            follows = [row for row in rows if grid_follows(rule, [row], n_values)]
            counts[rule] = len(follows) ** 3  # rows are independent
        distinct_rows = [row for row in rows if len(set(row)) == 3]
        counts["distribute_three"] = sum(
            1
            for grid in itertools.product(distinct_rows, repeat=3)
            if grid_follows("distribute_three", grid, n_values)
        )
        assert grids_per_rule(n_values) == counts


def test_count_instances():
    per_feature = sum(grids_per_rule(8).values())
    assert per_feature == 5 * 8**3 + 2 * 8**6 + math.comb(8, 3) * 216
    assert count_instances(4, 8) == per_feature**4 * 24**3
    assert count_instances(1, 3) == sum(grids_per_rule(3).values())


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"n_values": 2},
            r"n_values=2 is too small: distribute_three needs at least 3 distinct values",
        ),
        (
            {"frac_ood": 0.001},
            r"frac_ood=0.001 holds out 0 of the 330 rule multisets.*ood split would be empty",
        ),
        (
            {"frac_ood": 0.99},
            r"frac_ood=0.99: holding out 327 of 330.*8 rules to occur in training",
        ),
        ({"n_features": 1, "frac_ood": 0.2}, r"holding out 2 of 8 combinations.*8 rules"),
        ({"frac_ood": 1.0}, r"frac_ood=1.0 must be strictly between 0 and 1"),
        ({"n_features": 0}, r"n_features=0 must be at least 1"),
        ({"n_features": 30}, r"multisets of 30 rules, more than"),
    ],
)
def test_invalid_parameters_are_refused_clearly(params, message):
    with pytest.raises(ValueError, match=message):
        get_task("sraven", **params)
