"""The transplant pairs of the code-reuse score: an unseen composition as base, a training composition
one term away as donor, a third training composition as baseline."""

from __future__ import annotations

import numpy as np
import pytest

from latentcode.tasks import get_task
from latentcode.tasks.base import TaskError


@pytest.fixture(scope="module")
def task():
    return get_task("fuzzy_logic", frac_test=0.7)


def test_pairs_join_an_unseen_composition_to_a_training_one_a_term_away(task):
    pairs = task.transplant_pairs(64, seed=3)
    assert len(pairs) == 64 and pairs.base.split == "ood"
    assert all(batch.split == "train" for batch in pairs.donors.values())
    train_tasks = set(task._split_pools["train"].tolist())
    for row in range(len(pairs)):
        base_terms = set(task.all_combinations[pairs.base_part[row]].tolist())
        donor_terms = set(task.all_combinations[pairs.donor_parts["different"][row]].tolist())
        assert pairs.base_part[row] not in train_tasks
        assert pairs.donor_parts["different"][row] in train_tasks
        assert len(base_terms & donor_terms) == task.n_terms - 1  # one term swapped
        assert pairs.donors["different"].labels["task_index"][row] == pairs.donor_parts["different"][row]
        assert pairs.donors["third"].labels["task_index"][row] == pairs.donor_parts["third"][row]
        assert pairs.donor_parts["third"][row] not in (pairs.donor_parts["different"][row], pairs.base_part[row])
    # The counterfactual answer is the donor composition's function at the base's own query.
    expected = task.counterfactual_target(pairs.base, task.all_combinations[pairs.donor_parts["different"]])
    np.testing.assert_allclose(pairs.counterfactual_answer, expected)
    np.testing.assert_allclose(pairs.base_answer, pairs.base.y[:, 0])
    assert (np.abs(pairs.counterfactual_answer - pairs.base_answer) > 0.1).all()
    third = task.counterfactual_target(pairs.base, task.all_combinations[pairs.donor_parts["third"]])
    assert (np.abs(third - pairs.counterfactual_answer) > 0.1).all()
    assert (np.abs(third - pairs.base_answer) > 0.1).all()


def test_pairs_are_a_function_of_the_seed(task):
    first, again = task.transplant_pairs(16, seed=5), task.transplant_pairs(16, seed=5)
    np.testing.assert_array_equal(first.base.x, again.base.x)
    np.testing.assert_array_equal(first.donors["different"].x, again.donors["different"].x)


def test_a_task_without_term_sets_is_refused():
    with pytest.raises(TaskError, match="sets of constituents; task 'sraven' is not one"):
        get_task("sraven", n_features=2).transplant_pairs(8)


def test_too_many_pairs_asked_is_one_line(task):
    with pytest.raises(TaskError, match="ask for fewer pairs"):
        task.transplant_pairs(64, variant="fixed_query")
