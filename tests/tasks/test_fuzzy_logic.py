"""Fuzzy logic: term encoding, Zadeh semantics, splits, leakage, variants, metrics, validation."""

import itertools
import math

import numpy as np
import pytest

from latentcode.tasks import FuzzyLogic, get_task
from latentcode.tasks.fuzzy_logic import evaluate_disjunction, negation_bits_of_terms


def round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def literal(value: float, negated: int) -> float:
    return 1.0 - value if negated else value


def zadeh_reference(inputs, terms, n_variables):
    """OR (max) over terms of AND (min) over literals, one example at a time."""
    values = []
    for term in terms:
        bits = [(term >> (n_variables - 1 - variable)) & 1 for variable in range(n_variables)]
        values.append(min(literal(float(u), bit) for u, bit in zip(inputs, bits, strict=True)))
    return max(values)


def boolean_reference(inputs, terms, n_variables):
    """Boolean disjunction: a term holds when its negated variables are 0 and the others 1."""
    return any(
        all(
            inputs[variable] == (0 if (term >> (n_variables - 1 - variable)) & 1 else 1)
            for variable in range(n_variables)
        )
        for term in terms
    )


def test_term_index_to_negation_bits():
    np.testing.assert_array_equal(negation_bits_of_terms(0b1010, 4), [1, 0, 1, 0])
    np.testing.assert_array_equal(negation_bits_of_terms(0b0001, 4), [0, 0, 0, 1])
    np.testing.assert_array_equal(
        negation_bits_of_terms(np.array([[0, 15]]), 4), [[[0, 0, 0, 0], [1, 1, 1, 1]]]
    )


@pytest.mark.parametrize("n_variables, n_terms", [(3, 1), (3, 2), (4, 2), (4, 3)])
def test_zadeh_on_binary_inputs_is_the_boolean_function(n_variables, n_terms):
    binary_inputs = np.array(
        list(itertools.product([0.0, 1.0], repeat=n_variables)), dtype=np.float32
    )
    for terms in itertools.combinations(range(2**n_variables), n_terms):
        values = evaluate_disjunction(
            binary_inputs, negation_bits_of_terms(np.array(terms), n_variables)
        )
        expected = [
            float(boolean_reference(inputs, terms, n_variables)) for inputs in binary_inputs
        ]
        np.testing.assert_array_equal(values, expected)


def test_zadeh_on_continuous_inputs_matches_min_max_reference():
    rng = np.random.default_rng(0)
    inputs = rng.random((50, 4))
    for terms in [(0, 5), (3, 12), (7, 8), (15, 1)]:
        values = evaluate_disjunction(inputs, negation_bits_of_terms(np.array(terms), 4))
        expected = [zadeh_reference(example, terms, 4) for example in inputs]
        np.testing.assert_allclose(values, expected, rtol=0, atol=1e-12)


def test_sequences_follow_their_labels():
    task = get_task("fuzzy_logic", seq_len=16)
    batch = task.sample(20, "train", seed=4)
    inputs, context_targets = batch.x[..., :-1], batch.x[:, :-1, -1]
    assert ((inputs >= 0) & (inputs < 1)).all()
    assert (batch.x[:, -1, -1] == 0).all()
    np.testing.assert_array_equal(batch.y[:, 0], batch.labels["target"])
    for example in range(len(batch)):
        terms = batch.labels["terms"][example].tolist()
        for position in range(task.seq_len):
            expected = zadeh_reference(inputs[example, position], terms, 4)
            actual = (
                context_targets[example, position]
                if position < task.seq_len - 1
                else batch.y[example, 0]
            )
            assert actual == pytest.approx(expected, abs=1e-6)
    np.testing.assert_array_equal(
        batch.labels["negation_bits"], negation_bits_of_terms(batch.labels["terms"], 4)
    )
    term_present = np.zeros((20, 16), dtype=np.int8)
    for example, terms in enumerate(batch.labels["terms"]):
        term_present[example, terms] = 1
    np.testing.assert_array_equal(batch.labels["term_present"], term_present)
    assert (np.diff(batch.labels["terms"], axis=1) > 0).all()


def test_canonical_combination_list_and_task_index():
    task = get_task("fuzzy_logic")
    np.testing.assert_array_equal(task.all_combinations, list(itertools.combinations(range(16), 2)))
    batch = task.sample(100, "ood", seed=0)
    np.testing.assert_array_equal(
        task.all_combinations[batch.labels["task_index"]], batch.labels["terms"]
    )


@pytest.mark.parametrize("frac_test", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_sizes_and_structure(frac_test, seed):
    task = FuzzyLogic(frac_test=frac_test, seed=seed)
    n_unseen = round_half_up(0.25 * 16)
    n_seen_combinations = math.comb(16 - n_unseen, 2)
    n_ood = round_half_up(frac_test * n_seen_combinations)
    train, ood, unseen = (
        set(map(tuple, task.combinations(split))) for split in ("train", "ood", "unseen_terms")
    )
    assert len(unseen) == math.comb(n_unseen, 2)
    assert len(ood) == n_ood
    assert len(train) == n_seen_combinations - n_ood
    np.testing.assert_array_equal(task.combinations("test"), task.combinations("train"))
    assert not train & ood and not train & unseen and not ood & unseen
    unseen_terms = set(task.unseen_terms.tolist())
    assert len(unseen_terms) == n_unseen
    assert all(set(combination) <= unseen_terms for combination in unseen)
    assert all(not set(combination) & unseen_terms for combination in train | ood)
    # compositional OOD: every term of a held-out combination occurs in some training combination
    terms_in_training = set().union(*train)
    assert set().union(*ood) <= terms_in_training
    assert terms_in_training == set(range(16)) - unseen_terms


def test_held_out_combinations_never_reach_training_batches():
    task = get_task("fuzzy_logic", frac_test=0.5)
    train = set(map(tuple, task.combinations("train")))
    held_out = set(map(tuple, task.combinations("ood"))) | set(
        map(tuple, task.combinations("unseen_terms"))
    )
    seen = set()
    for step in range(200):
        for split in ("train", "test"):
            terms = task.sample(256, split, seed=(0, step)).labels["terms"]
            drawn = {tuple(sorted(row)) for row in terms.tolist()}
            assert not drawn & held_out
            seen |= drawn
    assert seen == train  # and every training combination does occur
    for split in ("ood", "unseen_terms"):
        drawn = {tuple(row) for row in task.sample(2048, split, seed=1).labels["terms"].tolist()}
        assert drawn == set(map(tuple, task.combinations(split)))


def test_fixed_variants_share_their_fixed_inputs():
    task = get_task("fuzzy_logic", seq_len=16)
    for split in task.splits:
        context = task.sample(50, split, seed=3, variant="fixed_context").x[..., :-1]
        assert (context[:, :-1] == task.fixed_context).all()
        assert len(np.unique(context[:, -1], axis=0)) == 50  # fresh queries
        query = task.sample(50, split, seed=3, variant="fixed_query").x[..., :-1]
        assert (query[:, -1] == task.fixed_query).all()
        assert len(np.unique(query[:, 0], axis=0)) == 50  # fresh contexts
    assert task.fixed_context.shape == (15, 4) and task.fixed_query.shape == (4,)
    other = get_task("fuzzy_logic", seq_len=16, seed=1)
    assert not np.array_equal(task.fixed_context, other.fixed_context)


def test_variants_of_one_seed_share_tasks_and_fresh_inputs():
    task = get_task("fuzzy_logic")
    uniform = task.sample(30, "ood", seed=9)
    fixed_context = task.sample(30, "ood", seed=9, variant="fixed_context")
    fixed_query = task.sample(30, "ood", seed=9, variant="fixed_query")
    np.testing.assert_array_equal(uniform.labels["terms"], fixed_context.labels["terms"])
    np.testing.assert_array_equal(uniform.labels["terms"], fixed_query.labels["terms"])
    np.testing.assert_array_equal(uniform.x[:, -1, :-1], fixed_context.x[:, -1, :-1])
    np.testing.assert_array_equal(uniform.x[:, :-1], fixed_query.x[:, :-1])


def test_evaluate_mse_and_per_sequence_r2():
    task = get_task("fuzzy_logic", seq_len=8)
    batch = task.sample(64, seed=0)
    perfect = task.evaluate(batch.y[:, :, None], batch)
    assert perfect == {"mse": 0.0, "r2": 1.0}

    sequence_targets = np.concatenate([batch.x[:, :-1, -1], batch.y], axis=1).astype(np.float64)
    guess = sequence_targets.mean(axis=1)
    metrics = task.evaluate(guess[:, None, None], batch)
    r2 = []
    for example in range(64):
        targets = sequence_targets[example]
        variance = sum((t - targets.mean()) ** 2 for t in targets) / len(targets)
        r2.append(1 - (guess[example] - targets[-1]) ** 2 / variance)
    assert metrics["r2"] == pytest.approx(np.mean(r2))
    assert metrics["mse"] == pytest.approx(np.mean((guess - sequence_targets[:, -1]) ** 2))


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"frac_unseen_terms": 0.05},
            r"frac_unseen_terms=0.05 holds out 1 of the 16 terms.*unseen_terms split would be",
        ),
        ({"frac_unseen_terms": 0.95}, r"leaves 1 seen terms"),
        ({"frac_test": 0.001}, r"frac_test=0.001 holds out 0 of the 66.*ood split would be empty"),
        ({"frac_test": 0.99}, r"frac_test=0.99: holding out 65 of 66 combinations.*12 seen terms"),
        ({"frac_test": 0.0}, r"frac_test=0.0 must be strictly between 0 and 1"),
        ({"frac_test": 1}, r"frac_test=1.0 must be strictly between 0 and 1"),
        ({"n_variables": 13}, r"n_variables=13 must be at most 12"),
        ({"n_variables": 2, "n_terms": 5}, r"n_terms=5 must be at most 4"),
        ({"seq_len": 1}, r"seq_len=1 must be at least 2"),
        ({"seed": -1}, r"seed=-1 must be at least 0"),
        ({"n_terms": 2.0}, r"n_terms=2.0 must be an integer"),
    ],
)
def test_invalid_parameters_are_refused_clearly(params, message):
    with pytest.raises(ValueError, match=message):
        get_task("fuzzy_logic", **params)
