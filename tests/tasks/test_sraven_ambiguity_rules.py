"""SRAVEN ambiguity under both rule definitions (``rules="strict"`` and ``rules="authors"``)
against a brute-force checker written here from the rules' description, not from the package.

The authors' checker (``check_is_ambiguous`` in ``hyla/data/raven.py`` of
smonsays/hypernetwork-attention) differs from the strict one only in distribute_three: the
full rows need only be orderings of one multiset of three values (repeats allowed), the last
row's two cells need only each occur in it (they may be equal), and its answer is the value of
the sorted multiset with the fewest occurrences among those two cells, the first in sorted order.
"""

import itertools
import math

import numpy as np
import pytest

from latentcode.cli import main
from latentcode.tasks import SRaven
from latentcode.tasks.sraven import is_ambiguous
from latentcode.tasks.sraven_counts import estimate_ambiguity

PROGRESSION_STEPS = (1, 2, -1, -2)


def answers_of_every_rule(cells, n_values: int, rules: str) -> set:
    """The answers of every rule that fits one feature's 3x3 cells (the 9th cell not looked at)."""
    row_0, row_1 = [tuple(int(v) for v in row) for row in cells[:2]]
    x, y = int(cells[2][0]), int(cells[2][1])
    full_rows = (row_0, row_1)
    answers = set()
    if all(len(set(row)) == 1 for row in full_rows) and x == y:
        answers.add(x)
    for step in PROGRESSION_STEPS:
        pairs = [(row[0], row[1]) for row in full_rows] + [(row[1], row[2]) for row in full_rows]
        if all((b - a - step) % n_values == 0 for a, b in [*pairs, (x, y)]):
            answers.add((y + step) % n_values)
    if all((a + b) % n_values == c for a, b, c in full_rows):
        answers.add((x + y) % n_values)
    if all((a - b) % n_values == c for a, b, c in full_rows):
        answers.add((x - y) % n_values)
    if rules == "strict":
        values = set(row_0)
        if len(values) == 3 and set(row_1) == values and x != y and {x, y} <= values:
            (missing,) = values - {x, y}
            answers.add(missing)
    else:
        multiset = sorted(row_0)
        if sorted(row_1) == multiset and x in multiset and y in multiset:
            occurrences = [(x == value) + (y == value) for value in multiset]
            answers.add(multiset[occurrences.index(min(occurrences))])
    return answers


def brute_force_is_ambiguous(panels, n_values: int, criterion: str, rules: str) -> bool:
    """Every one of the (M!)^3 column permutations, every feature, every rule.

    Under a permutation triple (p0, p1, p2), feature j is the cells ``panels[row, c, p_c[j]]``.
    """
    n_features = panels.shape[-1]
    answers_of_cells = {}  # the same cells recur under many permutations
    for permutation in itertools.product(itertools.permutations(range(n_features)), repeat=3):
        differs, fitted = [], []
        for feature in range(n_features):
            positions = tuple(permutation[column][feature] for column in range(3))
            if positions not in answers_of_cells:
                cells = [[panels[row, c, positions[c]] for c in range(3)] for row in range(3)]
                answers = answers_of_every_rule(cells, n_values, rules)
                answers_of_cells[positions] = (answers, int(cells[2][2]))
            answers, true_answer = answers_of_cells[positions]
            fitted.append(bool(answers))
            differs.append(bool(answers - {true_answer}))
        if criterion == "all_features" and all(differs):
            return True
        if criterion == "any_feature" and all(fitted) and any(differs):
            return True
    return False


def generated_panels(n: int, n_features: int, n_values: int, seed: int) -> np.ndarray:
    """``[n, 3, 3, M]`` SRAVEN instances as presented (column-permuted), the 9th panel included."""
    batch = SRaven(n_features=n_features, n_values=n_values).sample(n, seed=seed)
    values = np.concatenate([batch.x[:, : 8 * n_features].argmax(-1), batch.y], axis=1)
    return values.reshape(n, 3, 3, n_features)


def multiset_panels(n: int, n_features: int, n_values: int, seed: int) -> np.ndarray:
    """Random panels whose features often fit the authors' distribute_three and not the strict
    one: the second row reorders the first, the last row's two cells are drawn (with repeats)
    from the first row, and K is small so rows repeat values."""
    rng = np.random.default_rng(seed)
    panels = rng.integers(n_values, size=(n, 3, 3, n_features))
    for instance, feature in zip(*np.nonzero(rng.random((n, n_features)) < 0.7), strict=True):
        first_row = panels[instance, 0, :, feature]
        panels[instance, 1, :, feature] = rng.permutation(first_row)
        panels[instance, 2, :2, feature] = rng.choice(first_row, size=2)
    return panels


INSTANCE_SETS = {
    "generated_K3": lambda: (generated_panels(200, 3, 3, seed=1), 3),
    "generated_K4": lambda: (generated_panels(200, 3, 4, seed=2), 4),
    "multisets_K4": lambda: (multiset_panels(200, 3, 4, seed=3), 4),
}


@pytest.mark.parametrize("instances", sorted(INSTANCE_SETS))
def test_both_rule_definitions_match_brute_force_over_all_permutations(instances):
    """M=3: all 216 column permutations of 200 instances, both criteria, both definitions."""
    panels, n_values = INSTANCE_SETS[instances]()
    verdicts = {}
    for rules in ("strict", "authors"):
        for criterion in ("all_features", "any_feature"):
            expected = [
                brute_force_is_ambiguous(grid, n_values, criterion, rules) for grid in panels
            ]
            verdicts[rules, criterion] = np.array(expected)
            np.testing.assert_array_equal(
                is_ambiguous(panels, n_values, criterion, rules), expected
            )
            assert 0 < np.mean(expected) < 1, "a mix of verdicts, or the comparison says little"
    # The instances separate the definitions, so a no-op 'authors' would fail above.
    for criterion in ("all_features", "any_feature"):
        strict, authors = verdicts["strict", criterion], verdicts["authors", criterion]
        assert (strict <= authors).all()
        assert (authors & ~strict).any()


# --- hand-made instances: one feature, K=8 -----------------------------------------------------

REPEATED_VALUES = [[1, 1, 2], [2, 1, 1]]  # one multiset {1, 1, 2}: only the authors' rule fits


@pytest.mark.parametrize(
    "grid, strict_verdict, authors_verdict",
    [
        # last row (1, 1): the value hit least often is 2; a 9th cell of 5 differs from it
        ([*REPEATED_VALUES, [1, 1, 5]], False, True),
        ([*REPEATED_VALUES, [1, 1, 2]], False, False),
        # last row (2, 2): both 1s are missed; the answer is 1
        ([*REPEATED_VALUES, [2, 2, 1]], False, False),
        ([*REPEATED_VALUES, [2, 2, 2]], False, True),
        # a tie: {1, 2, 2} with last row (1, 2) hits each value once; the first sorted, 1, wins
        ([[2, 1, 2], [2, 2, 1], [1, 2, 1]], False, False),
        ([[2, 1, 2], [2, 2, 1], [1, 2, 2]], False, True),
        # three distinct values and equal last cells: strict refuses, the authors' rule answers
        # the first value not hit, 3
        ([[1, 3, 5], [5, 1, 3], [1, 1, 3]], False, False),
        ([[1, 3, 5], [5, 1, 3], [1, 1, 5]], False, True),
        # a cell outside the multiset: neither fits
        ([*REPEATED_VALUES, [1, 3, 0]], False, False),
        # a generator-made distribute_three: both fit with the same answer
        ([[1, 3, 5], [5, 1, 3], [3, 5, 1]], False, False),
        ([[1, 3, 5], [5, 1, 3], [3, 5, 2]], True, True),
    ],
)
def test_hand_made_distribute_three_grids(grid, strict_verdict, authors_verdict):
    panels = np.array(grid)[None, :, :, None]
    for criterion in ("all_features", "any_feature"):
        assert is_ambiguous(panels, 8, criterion, "strict").tolist() == [strict_verdict]
        assert is_ambiguous(panels, 8, criterion, "authors").tolist() == [authors_verdict]
        for rules, verdict in (("strict", strict_verdict), ("authors", authors_verdict)):
            assert brute_force_is_ambiguous(panels[0], 8, criterion, rules) is verdict


def test_estimate_ambiguity_authors_is_at_least_strict_and_strict_is_the_default():
    strict = estimate_ambiguity(4, 4, 256, seed=1, rules="strict")
    authors, standard_error = estimate_ambiguity(4, 4, 256, seed=1, rules="authors")
    assert strict == estimate_ambiguity(4, 4, 256, seed=1)
    assert authors > strict[0]
    assert standard_error == pytest.approx(math.sqrt(authors * (1 - authors) / 256))


def test_unknown_rules_are_refused():
    panels = np.zeros((1, 3, 3, 2), dtype=np.int64)
    with pytest.raises(ValueError, match=r"unknown rules 'paper'; valid rule definitions"):
        is_ambiguous(panels, 8, rules="paper")
    with pytest.raises(ValueError, match=r"unknown rules 'paper'"):
        estimate_ambiguity(4, 8, 16, rules="paper")


def test_cli_rules_option(capsys):
    for rules in ("authors", "strict"):
        argv = ["tasks", "ambiguity", "--features", "3", "--values", "4", "--n", "64"]
        assert main([*argv, "--seed", "2", "--rules", rules]) == 0
        printed = capsys.readouterr().out
        fraction, _ = estimate_ambiguity(3, 4, 64, seed=2, rules=rules)
        assert f"rules={rules}:" in printed
        assert f"ambiguous fraction {fraction:.4f}" in printed
    with pytest.raises(SystemExit):
        main(["tasks", "ambiguity", "--rules", "paper"])
