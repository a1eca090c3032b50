"""Topographic similarity: rho against scipy's Spearman on distances computed here, the
permutation null against an exhaustive enumeration, and planted versus shuffled structure."""

import collections
import itertools
import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from latentcode.analysis.topography import (
    TopographyError,
    composition_counts,
    mean_codes_by_task,
    topographic_similarity,
)


def multiset_counts(n_parts: int, size: int) -> np.ndarray:
    """Count vectors of every multiset of ``size`` parts, written with a Counter."""
    rows = []
    for multiset in itertools.combinations_with_replacement(range(n_parts), size):
        counter = collections.Counter(multiset)
        rows.append([counter[part] for part in range(n_parts)])
    return np.array(rows)


def pair_distances(vectors, metric: str) -> list[float]:
    """Distances of every pair (s < t), one pair at a time."""
    distances = []
    for s, t in itertools.combinations(range(len(vectors)), 2):
        a, b = np.asarray(vectors[s], float), np.asarray(vectors[t], float)
        if metric == "l1":
            distances.append(sum(abs(x - y) for x, y in zip(a, b, strict=True)))
        elif metric == "euclidean":
            distances.append(math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True))))
        elif metric == "cosine":
            distances.append(1.0 - float(a @ b) / (math.sqrt(a @ a) * math.sqrt(b @ b)))
    return distances


def planted_codes(compositions, noise: float, seed: int) -> np.ndarray:
    """Codes that are a noisy linear function of the compositions (plus an offset so that the
    cosine distance sees them too)."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(compositions.shape[1], 16))
    return 3.0 + compositions @ weights + noise * rng.normal(size=(len(compositions), 16))


@pytest.mark.parametrize("code_metric", ["cosine", "euclidean"])
def test_rho_is_spearman_of_the_pairwise_distances(code_metric):
    compositions = multiset_counts(5, 3)  # 35 tasks
    codes = planted_codes(compositions, noise=2.0, seed=1)
    result = topographic_similarity(codes, compositions, code_metric=code_metric, n_permutations=10)
    expected = spearmanr(pair_distances(compositions, "l1"), pair_distances(codes, code_metric))
    assert result.rho == pytest.approx(expected.statistic, abs=1e-12)
    assert result.n_tasks == 35 and result.code_metric == code_metric


def test_planted_structure_is_found_for_multisets_and_sets():
    compositions = multiset_counts(6, 3)  # 56 rule-like multisets
    result = topographic_similarity(planted_codes(compositions, 1.0, seed=2), compositions)
    assert result.rho > 0.5 and result.p_value < 0.01
    assert result.p_value == pytest.approx(1 / 1001)  # no permutation came close
    term_sets = composition_counts(np.array(list(itertools.combinations(range(8), 2))), 8)
    assert set(np.unique(term_sets)) == {0, 1}
    result = topographic_similarity(planted_codes(term_sets, 0.3, seed=3), term_sets)
    assert result.rho > 0.5 and result.p_value < 0.01


def test_shuffled_codes_give_no_structure_and_roughly_uniform_p_values():
    compositions = multiset_counts(5, 3)
    codes = planted_codes(compositions, 1.0, seed=4)
    shuffled = codes[np.random.default_rng(5).permutation(len(codes))]
    assert topographic_similarity(shuffled, compositions, seed=0).p_value > 0.05
    p_values = []
    for repeat in range(40):
        shuffled = codes[np.random.default_rng(100 + repeat).permutation(len(codes))]
        p_values.append(
            topographic_similarity(shuffled, compositions, n_permutations=99, seed=repeat).p_value
        )
    p_values = np.array(p_values)
    assert 0.3 < p_values.mean() < 0.7
    assert (p_values < 0.05).mean() < 0.2


def test_null_distribution_is_that_of_all_task_permutations():
    """With 4 tasks the null can be enumerated: each of the 24 relabellings equally likely."""
    compositions = np.array([[3, 0, 0], [2, 1, 0], [1, 1, 1], [0, 1, 2]])
    codes = np.array([[1.0, 0.2], [0.9, 0.5], [0.4, 0.8], [0.1, 1.0]])
    composition_distances = pair_distances(compositions, "l1")
    exact = collections.Counter()
    for permutation in itertools.permutations(range(4)):
        rho = spearmanr(composition_distances, pair_distances(codes[list(permutation)], "cosine"))
        exact[round(float(rho.statistic), 9)] += 1
    result = topographic_similarity(codes, compositions, n_permutations=24_000, seed=0)
    observed = collections.Counter(np.round(result.null_rhos, 9).tolist())
    assert set(observed) == set(exact)
    for value, count in exact.items():
        assert observed[value] / 24_000 == pytest.approx(count / 24, abs=0.015)
    as_extreme = sum(
        count for value, count in exact.items() if value >= round(result.rho, 9) - 1e-9
    )
    assert result.p_value == pytest.approx(as_extreme / 24, abs=0.015)


def test_seeds_and_alternatives():
    compositions = multiset_counts(4, 3)
    codes = planted_codes(compositions, 1.0, seed=6)
    first = topographic_similarity(codes, compositions, n_permutations=200, seed=7)
    again = topographic_similarity(codes, compositions, n_permutations=200, seed=7)
    other = topographic_similarity(codes, compositions, n_permutations=200, seed=8)
    np.testing.assert_array_equal(first.null_rhos, again.null_rhos)
    assert not np.array_equal(first.null_rhos, other.null_rhos)
    assert first.rho == other.rho
    kwargs = {"code_metric": "euclidean", "n_permutations": 200}
    two_sided = topographic_similarity(codes, compositions, alternative="two-sided", **kwargs)
    assert two_sided.p_value < 0.01
    less = topographic_similarity(codes, compositions, alternative="less", **kwargs)
    assert less.p_value > 0.99


def test_codes_that_do_not_tell_tasks_apart_give_nan():
    compositions = multiset_counts(4, 2)
    result = topographic_similarity(np.ones((len(compositions), 3)), compositions, n_permutations=5)
    assert math.isnan(result.rho) and math.isnan(result.p_value)


def test_mean_codes_by_task_and_composition_counts():
    rng = np.random.default_rng(0)
    codes, task_index = rng.normal(size=(200, 5)), rng.choice([3, 7, 11, 20], size=200)
    tasks, means = mean_codes_by_task(codes, task_index)
    assert tasks.tolist() == [3, 7, 11, 20]
    for task, mean in zip(tasks, means, strict=True):
        np.testing.assert_allclose(mean, codes[task_index == task].mean(axis=0))
    combinations = np.array(list(itertools.combinations_with_replacement(range(5), 3)))
    np.testing.assert_array_equal(composition_counts(combinations, 5), multiset_counts(5, 3))


def test_bad_arguments_are_refused():
    compositions = multiset_counts(3, 2)
    codes = planted_codes(compositions, 1.0, seed=0)
    with pytest.raises(TopographyError, match=r"mean_codes \(5, 16\) and compositions \(6, 3\)"):
        topographic_similarity(codes[:5], compositions)
    with pytest.raises(TopographyError, match=r"2 tasks give too few pairs"):
        topographic_similarity(codes[:2], compositions[:2])
    with pytest.raises(TopographyError, match=r"code_metric='manhattan'; expected one of"):
        topographic_similarity(codes, compositions, code_metric="manhattan")
    with pytest.raises(TopographyError, match=r"alternative='both'"):
        topographic_similarity(codes, compositions, alternative="both")
    with pytest.raises(
        TopographyError, match=r"n_permutations=0; expected an integer of at least 1"
    ):
        topographic_similarity(codes, compositions, n_permutations=0)
    zero_row = codes.copy()
    zero_row[2] = 0.0
    with pytest.raises(TopographyError, match=r"mean code of task row 2 is zero"):
        topographic_similarity(zero_row, compositions)
    with pytest.raises(TopographyError, match=r"same composition distance"):
        topographic_similarity(codes[:3], np.eye(3))
    with pytest.raises(TopographyError, match=r"expected 0..4 \(n_parts=5\)"):
        composition_counts([[0, 5]], 5)
    assert issubclass(TopographyError, ValueError)
