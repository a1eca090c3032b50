"""SRAVEN ambiguity: rule fitting, both criteria against brute force, hand-made grids."""

import itertools
import math

import numpy as np
import pytest

from latentcode.tasks import RULES, SRaven
from latentcode.tasks.ambiguity import RULE_FAMILIES, fit_rules
from latentcode.tasks.sraven import is_ambiguous
from latentcode.tasks.sraven_counts import estimate_ambiguity

STEPS = {"progression+1": 1, "progression+2": 2, "progression-1": -1, "progression-2": -2}


def row_follows(rule: str, row, n_values: int) -> bool:
    a, b, c = row
    if rule == "constant":
        return a == b == c
    if rule in STEPS:
        return b == (a + STEPS[rule]) % n_values and c == (b + STEPS[rule]) % n_values
    if rule == "sum":
        return c == (a + b) % n_values
    if rule == "difference":
        return c == (a - b) % n_values
    raise AssertionError(rule)


def reference_answers(cells, n_values: int) -> set:
    """Every answer some rule of RULES predicts for a feature's 3x3 cells (the last ignored):
    the completions v of the last row such that the rule holds on all three rows."""
    rows = [tuple(int(value) for value in row) for row in cells]
    answers = set()
    for rule in RULES:
        for v in range(n_values):
            grid = [rows[0], rows[1], (rows[2][0], rows[2][1], v)]
            if rule == "distribute_three":
                follows = len(set(grid[0])) == 3 and all(sorted(r) == sorted(grid[0]) for r in grid)
            else:
                follows = all(row_follows(rule, r, n_values) for r in grid)
            if follows:
                answers.add(v)
    return answers


def reference_is_ambiguous(panels, n_values: int, criterion: str) -> bool:
    """Brute force over all (M!)^3 column permutations, straight from the definitions."""
    n_features = panels.shape[-1]
    strand_answers = {}
    for strand in itertools.product(range(n_features), repeat=3):
        cells = [[panels[row, column, strand[column]] for column in range(3)] for row in range(3)]
        strand_answers[strand] = (reference_answers(cells, n_values), int(cells[2][2]))
    for permutation in itertools.product(itertools.permutations(range(n_features)), repeat=3):
        features = [
            strand_answers[tuple(permutation[c][f] for c in range(3))] for f in range(n_features)
        ]
        differs = [bool(answers - {true}) for answers, true in features]
        if criterion == "all_features" and all(differs):
            return True
        if criterion == "any_feature" and all(answers for answers, _ in features) and any(differs):
            return True
    return False


def presented_panels(batch, n_features: int) -> np.ndarray:
    values = np.concatenate([batch.x[:, : 8 * n_features].argmax(-1), batch.y], axis=1)
    return values.reshape(len(batch), 3, 3, n_features)


def panels_from_feature_grids(*grids) -> np.ndarray:
    """``[1, 3, 3, M]`` from M single-feature 3x3 grids."""
    return np.stack([np.array(grid) for grid in grids], axis=-1)[None]


# --- fitting one feature's cells --------------------------------------------------------------

FITTING_CASES = [
    # cells, K, {family: answer} that fit
    ([[4, 4, 4], [1, 1, 1], [6, 6, 0]], 8, {"constant": 6}),
    ([[1, 2, 3], [7, 0, 1], [5, 6, 0]], 8, {"progression": 7}),
    ([[1, 7, 5], [0, 6, 4], [3, 1, 0]], 8, {"progression": 7}),  # step -2
    ([[2, 3, 5], [6, 7, 5], [4, 4, 0]], 8, {"sum": 0}),
    ([[5, 3, 2], [1, 4, 5], [4, 6, 0]], 8, {"difference": 6}),
    ([[1, 5, 2], [2, 1, 5], [5, 2, 0]], 8, {"distribute_three": 1}),
    # a + 0 = a - 0: sum and difference both fit and disagree on the answer
    ([[3, 0, 3], [5, 0, 5], [2, 6, 0]], 16, {"sum": 8, "difference": 12}),
    # all zeros: constant, sum, difference
    ([[0, 0, 0], [0, 0, 0], [0, 0, 9]], 16, {"constant": 0, "sum": 0, "difference": 0}),
    # distribute_three needs three distinct values and two different cells in the last row
    ([[1, 1, 2], [2, 1, 1], [1, 2, 0]], 8, {}),
    ([[1, 5, 2], [2, 1, 5], [5, 5, 0]], 8, {}),
    ([[1, 5, 2], [2, 1, 5], [5, 3, 0]], 8, {}),
    # a progression with a step outside {+-1, +-2}
    ([[0, 3, 6], [1, 4, 7], [2, 5, 0]], 16, {}),
]


@pytest.mark.parametrize("cells, n_values, expected", FITTING_CASES)
def test_fit_rules_on_hand_made_cells(cells, n_values, expected):
    fits, answers = fit_rules(np.array(cells), n_values)
    fitted = {
        family: int(answers[index]) for index, family in enumerate(RULE_FAMILIES) if fits[index]
    }
    assert fitted == expected
    assert set(fitted.values()) == reference_answers(cells, n_values)


# --- hand-made instances ----------------------------------------------------------------------

SUM_OR_DIFFERENCE = [[3, 0, 3], [5, 0, 5], [2, 6, 8]]  # K=16: sum says 8 (true), difference 12
PROGRESSION = [[10, 11, 12], [13, 14, 15], [7, 8, 9]]  # only progression+1 fits


def test_hand_made_single_feature_instances():
    ambiguous = panels_from_feature_grids(SUM_OR_DIFFERENCE)
    unambiguous = panels_from_feature_grids(PROGRESSION)
    for criterion in ("all_features", "any_feature"):
        assert is_ambiguous(ambiguous, 16, criterion).tolist() == [True]
        assert is_ambiguous(unambiguous, 16, criterion).tolist() == [False]


def test_hand_made_instance_separating_the_criteria():
    """Feature 0 has two answers, feature 1 only one: a different panel exists (any_feature),
    but no permutation gives every feature a different answer (all_features)."""
    panels = panels_from_feature_grids(SUM_OR_DIFFERENCE, PROGRESSION)
    assert is_ambiguous(panels, 16, "any_feature").tolist() == [True]
    assert is_ambiguous(panels, 16, "all_features").tolist() == [False]
    for criterion, expected in (("any_feature", True), ("all_features", False)):
        assert reference_is_ambiguous(panels[0], 16, criterion) is expected


def test_hand_made_instance_ambiguous_under_both_criteria():
    constant_or_sum = [
        [0, 0, 0],
        [0, 0, 0],
        [1, 1, 1],
    ]  # K=16: constant says 1, sum 2, difference 0
    panels = panels_from_feature_grids(SUM_OR_DIFFERENCE, constant_or_sum)
    for criterion in ("all_features", "any_feature"):
        assert is_ambiguous(panels, 16, criterion).tolist() == [True]


# --- against the brute-force reference --------------------------------------------------------


@pytest.mark.parametrize(
    "n_features, n_values, n", [(2, 3, 150), (2, 5, 150), (3, 3, 100), (3, 4, 60)]
)
def test_matches_brute_force_over_all_permutations(n_features, n_values, n):
    task = SRaven(n_features=n_features, n_values=n_values)
    panels = presented_panels(task.sample(n, seed=n_values), n_features)
    for criterion in ("all_features", "any_feature"):
        expected = [reference_is_ambiguous(grid, n_values, criterion) for grid in panels]
        np.testing.assert_array_equal(is_ambiguous(panels, n_values, criterion), expected)
        if n_values == 3:  # a mix of verdicts, or the comparison says little
            assert 0 < np.mean(expected) < 1


def test_matches_brute_force_on_arbitrary_grids():
    """Random values, not generated by any rule: many accidental fits in odd places."""
    rng = np.random.default_rng(0)
    for n_features, n_values in ((2, 3), (3, 3), (3, 4)):
        panels = rng.integers(n_values, size=(60, 3, 3, n_features))
        # make some rows constant so that more rules fit somewhere
        panels[::2, :, 1] = panels[::2, :, 0]
        for criterion in ("all_features", "any_feature"):
            expected = [reference_is_ambiguous(grid, n_values, criterion) for grid in panels]
            np.testing.assert_array_equal(is_ambiguous(panels, n_values, criterion), expected)


def test_all_features_implies_any_feature_and_permutations_do_not_matter():
    task = SRaven(n_features=4, n_values=4)
    permuted = presented_panels(task.sample(1000, seed=0), 4)
    unpermuted = presented_panels(task.sample(1000, seed=0, variant="unpermuted"), 4)
    all_features = is_ambiguous(permuted, 4, "all_features")
    any_feature = is_ambiguous(permuted, 4, "any_feature")
    assert (all_features <= any_feature).all()
    assert 0 < all_features.mean() < any_feature.mean() < 1
    np.testing.assert_array_equal(all_features, is_ambiguous(unpermuted, 4, "all_features"))
    np.testing.assert_array_equal(any_feature, is_ambiguous(unpermuted, 4, "any_feature"))


def test_estimate_ambiguity_is_seeded_and_reports_standard_error():
    fraction, standard_error = estimate_ambiguity(4, 4, 512, seed=1)
    assert (fraction, standard_error) == estimate_ambiguity(4, 4, 512, seed=1)
    assert standard_error == pytest.approx(math.sqrt(fraction * (1 - fraction) / 512))
    any_fraction, _ = estimate_ambiguity(4, 4, 512, seed=1, criterion="any_feature")
    assert 0 < fraction < any_fraction < 1


def test_refuses_infeasible_and_malformed_checks():
    with pytest.raises(
        ValueError, match=r"n_features=8 enumerates 1 x \(8!\)\^2.*limit of 1,000,000,000"
    ):
        is_ambiguous(np.zeros((1, 3, 3, 8), dtype=np.int64), 8)
    with pytest.raises(ValueError, match=r"4096 instances with n_features=6"):
        estimate_ambiguity(6, 8, 4096)
    with pytest.raises(ValueError, match=r"unknown criterion 'some_feature'"):
        is_ambiguous(np.zeros((1, 3, 3, 2), dtype=np.int64), 8, "some_feature")
    with pytest.raises(ValueError, match=r"panels must be an integer array \[n, 3, 3, M\]"):
        is_ambiguous(np.zeros((1, 9, 2), dtype=np.int64), 8)
    with pytest.raises(ValueError, match=r"outside 0..7"):
        is_ambiguous(np.full((1, 3, 3, 2), 8), 8)
    with pytest.raises(ValueError, match=r"n_values=2 is too small"):
        estimate_ambiguity(4, 2, 16)
