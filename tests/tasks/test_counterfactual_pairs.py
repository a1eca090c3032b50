"""Base/donor pairs for patching (issue 22): each relation's donors have the sub-task it promises,
the counterfactual answer is what the donor's sub-task gives on the base, and for SRAVEN a
well-posed answer completes a row the rule could have generated."""

import numpy as np
import pytest

from latentcode.tasks import get_task
from latentcode.tasks.base import Batch, TaskError
from latentcode.tasks.sraven import RULES


@pytest.fixture(scope="module")
def sraven():
    return get_task("sraven", n_features=4, n_values=8, frac_ood=0.25, seed=0)


def test_every_generated_row_is_valid_for_its_own_rule(sraven):
    batch = sraven.sample(2000, "train", seed=5, variant="unpermuted")
    for feature in range(4):
        rule = batch.labels["rules"][:, feature]
        answer = batch.labels["targets"][:, feature]
        assert sraven.completes_a_valid_row(batch, feature, rule, answer).all()


def grid_batch(sraven, last_row, first_rows):
    """One unpermuted instance whose feature 3 has the given rows (other features all 0)."""
    grid = np.zeros((3, 3, 4), dtype=np.int64)
    grid[:2, :, 3] = first_rows
    grid[2, :, 3] = last_row
    x = np.zeros((1, 36, 8), dtype=np.float32)
    x[0, np.arange(32), grid.reshape(-1)[:32]] = 1
    labels = {"column_permutations": np.broadcast_to(np.arange(4), (1, 3, 4)).copy()}
    return Batch(x=x, y=grid[2, 2][None], labels=labels, split="ood", variant="unpermuted")


@pytest.mark.parametrize("rule, last_row, valid", [
    ("constant", (5, 5, 5), True), ("constant", (5, 6, 6), False),
    ("progression+1", (2, 3, 4), True), ("progression+1", (2, 4, 5), False), ("progression-2", (1, 7, 5), True),
    ("sum", (3, 6, 1), True), ("difference", (3, 6, 5), True), ("sum", (3, 6, 2), False),
    ("distribute_three", (4, 2, 1), True), ("distribute_three", (4, 2, 3), False), ("distribute_three", (4, 4, 2), False),
])
def test_valid_rows_by_hand(sraven, rule, last_row, valid):
    batch = grid_batch(sraven, last_row, first_rows=[[1, 2, 4], [2, 4, 1]])
    assert sraven.completes_a_valid_row(batch, 3, RULES.index(rule), np.array([last_row[2]]))[0] == valid


def test_sraven_pairs_keep_their_promises(sraven):
    pairs = sraven.counterfactual_pairs(300, "ood", seed=1)
    assert len(pairs) == 300 and pairs.counts["pairs"] == 300
    rule = pairs.base.labels["query_rule"][:, -1]
    feature = pairs.base.labels["column_permutations"][:, -1, -1]
    assert (rule == pairs.base_part).all()
    assert (pairs.donors["same"].labels["query_rule"][:, -1] == rule).all()
    different = pairs.donors["different"].labels["query_rule"][:, -1]
    third = pairs.donors["third"].labels["query_rule"][:, -1]
    assert (different != rule).all() and (third != rule).all() and (third != different).all()
    answer, defined = sraven.counterfactual_answer(pairs.base, feature, different)
    assert defined.all() and (answer == pairs.counterfactual_answer).all()
    assert (pairs.counterfactual_answer != pairs.base_answer).all()
    assert sraven.completes_a_valid_row(pairs.base, feature, different, answer).all()
    third_answer, _ = sraven.counterfactual_answer(pairs.base, feature, third)
    assert (third_answer != pairs.counterfactual_answer).all()
    # the fraction of well-posed counterfactual rows is reported per rule; sum and difference always are
    assert pairs.counts["well-posed fraction per rule r'"]["sum"] == 1.0
    assert pairs.counts["well-posed fraction per rule r'"]["constant"] < 0.2
    fit, held_out = pairs.split(0.5)
    assert len(fit) + len(held_out) == 300


def test_fuzzy_logic_pairs_keep_their_promises():
    task = get_task("fuzzy_logic")
    pairs = task.counterfactual_pairs(200, "ood", seed=0)
    base_task = pairs.base.labels["task_index"]
    assert (pairs.donors["same"].labels["task_index"] == base_task).all()
    different = pairs.donors["different"].labels["task_index"]
    third = pairs.donors["third"].labels["task_index"]
    assert (different != base_task).all() and (third != different).all() and (third != base_task).all()
    expected = task.counterfactual_target(pairs.base, task.all_combinations[different])
    np.testing.assert_allclose(pairs.counterfactual_answer, expected)
    assert (np.abs(pairs.counterfactual_answer - pairs.base_answer) > 0.1).all()


def test_bad_requests_are_refused(sraven):
    with pytest.raises(TaskError, match="prediction=4 is outside"):
        sraven.counterfactual_pairs(10, prediction=4)
    with pytest.raises(TaskError, match="n=0 must be at least 1"):
        sraven.counterfactual_pairs(0)
    with pytest.raises(TaskError, match="pool=0 must be at least 1"):
        sraven.counterfactual_pairs(10, pool=0)
    with pytest.raises(TaskError, match=r"n=2.0 must be an integer"):
        sraven.counterfactual_pairs(2.0)
