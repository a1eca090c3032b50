"""Fuzzy-logic counterfactual targets (checked against a one-example-at-a-time Zadeh evaluation
written here) and the tasks one term swap away (checked against a brute-force search)."""

import numpy as np
import pytest

from latentcode.tasks import FuzzyLogic, get_task


def reference_value(query_input, terms, n_variables: int) -> float:
    """max over terms of min over variables of the literal: u, or 1 - u where negated."""
    term_values = []
    for term in terms:
        literals = []
        for variable in range(n_variables):
            negated = (int(term) >> (n_variables - 1 - variable)) & 1
            u = float(query_input[variable])
            literals.append(1.0 - u if negated else u)
        term_values.append(min(literals))
    return max(term_values)


@pytest.mark.parametrize("variant", FuzzyLogic.variants)
def test_own_terms_give_the_target(variant):
    task = get_task("fuzzy_logic")
    for split in task.splits:
        batch = task.sample(200, split, seed=1, variant=variant)
        target = task.counterfactual_target(batch, batch.labels["terms"])
        assert target.dtype == np.float32 and target.shape == (200,)
        np.testing.assert_array_equal(target, batch.y[:, 0])


@pytest.mark.parametrize("n_variables, n_terms", [(4, 2), (3, 3), (5, 2)])
def test_other_terms_match_the_reference(n_variables, n_terms):
    task = FuzzyLogic(n_variables=n_variables, n_terms=n_terms, seq_len=8, frac_unseen_terms=0.4)
    batch = task.sample(100, "train", seed=2)
    rng = np.random.default_rng(0)
    query_inputs = batch.x[:, -1, :n_variables]
    for k in (1, n_terms, n_terms + 1):
        per_instance = rng.integers(2**n_variables, size=(100, k))
        target = task.counterfactual_target(batch, per_instance)
        expected = [
            reference_value(query_inputs[i], per_instance[i], n_variables) for i in range(100)
        ]
        np.testing.assert_allclose(target, expected, rtol=0, atol=1e-6)
        shared = per_instance[0]
        target = task.counterfactual_target(batch, shared)
        expected = [reference_value(query_inputs[i], shared, n_variables) for i in range(100)]
        np.testing.assert_allclose(target, expected, rtol=0, atol=1e-6)
    # another task's terms really change the answer
    other = (batch.labels["task_index"] + 1) % len(task.all_combinations)
    changed = task.counterfactual_target(batch, task.all_combinations[other]) != batch.y[:, 0]
    assert changed.mean() > 0.5


def test_fixed_query_gives_one_value_per_term_set():
    task = get_task("fuzzy_logic")
    batch = task.sample(50, "ood", seed=3, variant="fixed_query")
    target = task.counterfactual_target(batch, [0, 15])
    assert (target == reference_value(task.fixed_query, [0, 15], 4)).all()


@pytest.mark.parametrize("n_variables, n_terms", [(4, 2), (3, 3)])
def test_tasks_differing_by_one_term_match_a_brute_force_search(n_variables, n_terms):
    task = FuzzyLogic(n_variables=n_variables, n_terms=n_terms, frac_unseen_terms=0.4)
    all_tasks = [tuple(row) for row in task.all_combinations.tolist()]
    for terms in all_tasks[:: max(1, len(all_tasks) // 20)]:
        expected = [
            index
            for index, other in enumerate(all_tasks)
            if len(set(terms) & set(other)) == n_terms - 1
        ]
        shuffled = list(reversed(terms))
        neighbours = task.tasks_differing_by_one_term(shuffled)
        assert neighbours.tolist() == expected
        # every neighbour swaps one of K terms for one of the 2**L - K others
        assert len(expected) == n_terms * (2**n_variables - n_terms)
        for split in task.splits:
            in_split = set(task._split_pools[split].tolist())
            within = task.tasks_differing_by_one_term(terms, split=split)
            assert within.tolist() == [index for index in expected if index in in_split]


def test_one_term_neighbours_in_training_exist_for_ood_tasks():
    """What the term-swap experiment relies on: an ood task is one swap from training tasks."""
    task = get_task("fuzzy_logic")
    for terms in task.combinations("ood"):
        neighbours = task.tasks_differing_by_one_term(terms, split="train")
        assert len(neighbours) > 0
        for index in neighbours:
            assert len(np.intersect1d(terms, task.all_combinations[index])) == 1


def test_arguments_are_checked():
    task = get_task("fuzzy_logic")
    batch = task.sample(4, seed=0)
    with pytest.raises(ValueError, match=r"term 16 is out of range; expected 0..15"):
        task.counterfactual_target(batch, [1, 16])
    with pytest.raises(ValueError, match=r"terms has shape \(3, 2\); expected \[k\] or \[4, k\]"):
        task.counterfactual_target(batch, [[0, 1]] * 3)
    with pytest.raises(ValueError, match=r"terms has shape \(0,\)"):
        task.counterfactual_target(batch, np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match=r"must be integer term indices"):
        task.counterfactual_target(batch, [0.5, 1.0])
    with pytest.raises(ValueError, match=r"batch.x has shape \(4, 32, 5\); expected \(4, 16, 5\)"):
        FuzzyLogic(seq_len=16).counterfactual_target(batch, [0, 1])
    with pytest.raises(ValueError, match=r"terms=\[3, 3\] must be 2 distinct term indices"):
        task.tasks_differing_by_one_term([3, 3])
    with pytest.raises(ValueError, match=r"terms=\[1, 2, 3\] must be 2 distinct"):
        task.tasks_differing_by_one_term([1, 2, 3])
    with pytest.raises(ValueError, match=r"unknown split 'validation'"):
        task.tasks_differing_by_one_term([1, 2], split="validation")
