"""Cosine similarity of mean codes: the matrix, centred or not, the clustered order, the share of
variance the label explains, constant codes, errors."""

import numpy as np
import pytest

from latentcode.analysis.similarity import (
    between_value_variance_share,
    mean_code_similarity,
    similarity_of_means,
)
from latentcode.store import CodeFile
from tests.analysis.synthetic import write_codes


def _cosine(a, b):
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def planted_codes(means, n_per_value, rng):
    """Codes whose per-value means are exactly `means`: noise with its per-value mean removed."""
    labels = np.repeat(np.arange(len(means)), n_per_value)  # n_per_value: one count, or one per value
    noise = rng.normal(size=(len(labels), means.shape[1]))
    for value in range(len(means)):
        noise[labels == value] -= noise[labels == value].mean(axis=0)
    order = rng.permutation(len(labels))
    return (means[labels] + noise)[order], labels[order]


def test_planted_means_give_the_expected_matrix_and_similar_values_sit_together():
    rng = np.random.default_rng(0)
    base_a, base_b = rng.random(6), rng.random(6)
    # values 0 and 2 are near base_a, 1 and 3 near base_b, 4 in between
    means = np.stack([base_a, base_b, base_a + 0.05 * rng.random(6), base_b + 0.05 * rng.random(6),
                      base_a + base_b])
    codes, labels = planted_codes(means, 30, rng)
    matrix, values, order, counts, mean_codes = similarity_of_means(codes, labels)
    assert sorted(values.tolist()) == [0, 1, 2, 3, 4] and (values == np.arange(5)[order]).all()
    assert (counts == 30).all()
    np.testing.assert_allclose(mean_codes, means[values], atol=1e-12)
    for i, first in enumerate(values):
        for j, second in enumerate(values):
            assert matrix[i, j] == pytest.approx(_cosine(means[first], means[second]), abs=1e-12)
    position = {int(value): index for index, value in enumerate(values)}
    assert abs(position[0] - position[2]) == 1 and abs(position[1] - position[3]) == 1
    np.testing.assert_allclose(np.diag(matrix), 1.0)


def test_multi_hot_labels_average_over_the_examples_with_each_column():
    rng = np.random.default_rng(1)
    codes = rng.random((40, 5))
    multi_hot = (rng.random((40, 4)) < 0.5).astype(np.int8)
    multi_hot[:, 3] = 0  # a column that is never 1 has no mean code and is left out
    matrix, values, _, counts, _ = similarity_of_means(codes, multi_hot)
    assert sorted(values.tolist()) == [0, 1, 2]
    means = {column: codes[multi_hot[:, column] == 1].mean(axis=0) for column in range(3)}
    for i, first in enumerate(values):
        assert counts[i] == multi_hot[:, first].sum()
        for j, second in enumerate(values):
            assert matrix[i, j] == pytest.approx(_cosine(means[first], means[second]))


def test_mean_code_similarity_of_a_file(tmp_path):
    path = write_codes(tmp_path / "codes.h5", n_per_split={"train": 200, "ood": 50}, sites_per_layer=2)
    result = mean_code_similarity(path, "rule", layer=1, split="train")
    code_file = CodeFile(path)
    codes, rule = code_file.layer_codes(1, "train"), code_file.labels("rule", "train")
    assert codes.shape[1] == 48 and result.mean_codes.shape == (8, 48)
    for i, first in enumerate(result.values):
        for j, second in enumerate(result.values):
            expected = _cosine(codes[rule == first].mean(0).astype(float), codes[rule == second].mean(0).astype(float))
            assert result.matrix[i, j] == pytest.approx(expected, abs=1e-6)
    assert (result.label, result.layer, result.site, result.split, result.model_name) == ("rule", 1, "all", "train", "hyla")
    one_site = mean_code_similarity(path, "query_rule[-1]", site="l0_q11_k5")
    assert (one_site.layer, one_site.site, one_site.mean_codes.shape) == (0, "l0_q11_k5", (8, 24))
    assert mean_code_similarity(path, "rule").layer == 1, "default: the last layer"


def test_errors():
    with pytest.raises(ValueError, match=r"the mean code of label value\(s\) \[1\] is zero"):
        similarity_of_means(np.array([[1.0, 0], [1, 1], [0, 0]]), np.array([0, 0, 1]))
    with pytest.raises(ValueError, match=r"100 distinct values; a similarity heatmap takes at most 64"):
        similarity_of_means(np.random.default_rng(0).random((100, 3)), np.arange(100) / 7)
    with pytest.raises(ValueError, match=r"labels of shape \[4, 2, 2\]"):
        similarity_of_means(np.ones((4, 3)), np.zeros((4, 2, 2)))


def test_centred_similarity_subtracts_the_grand_mean_of_the_examples():
    rng = np.random.default_rng(3)
    # A large shared component makes every plain cosine nearly 1; centring removes it.
    shared = np.full(6, 20.0)
    means = shared + rng.normal(size=(4, 6))
    codes, labels = planted_codes(means, [10, 20, 30, 40], rng)
    plain, *_ = similarity_of_means(codes, labels)
    assert plain[~np.eye(4, dtype=bool)].min() > 0.95
    matrix, values, _, _, mean_codes = similarity_of_means(codes, labels, centre=True)
    grand = codes.mean(axis=0)  # over examples: the values weigh by their counts
    for i, first in enumerate(values):
        np.testing.assert_allclose(mean_codes[i], means[first] - grand, atol=1e-9)
        for j, second in enumerate(values):
            assert matrix[i, j] == pytest.approx(_cosine(means[first] - grand, means[second] - grand), abs=1e-9)
    assert matrix[~np.eye(4, dtype=bool)].min() < 0, "centred means point in different directions"


def test_between_value_variance_share_is_eta_squared():
    rng = np.random.default_rng(4)
    codes, labels = rng.normal(size=(60, 3)), rng.integers(0, 4, 60)
    grand = codes.mean(axis=0)
    between = sum((labels == v).sum() * np.sum((codes[labels == v].mean(0) - grand) ** 2) for v in np.unique(labels))
    total = np.sum((codes - grand) ** 2)
    assert between_value_variance_share(codes, labels) == pytest.approx(between / total)
    assert between_value_variance_share(np.repeat(np.eye(3), 5, axis=0), np.repeat([0, 1, 2], 5)) == pytest.approx(1)
    with pytest.raises(ValueError, match="the codes are all the same"):
        between_value_variance_share(np.ones((5, 2)), np.arange(5))


def test_constant_codes_and_the_share_of_a_file(tmp_path):
    path = write_codes(tmp_path / "codes.h5", n_per_split={"train": 200}, constant_layers=(0,), planted=("rule",))
    constant = mean_code_similarity(path, "rule", layer=0)
    assert constant.constant is True and constant.explained_variance is None
    np.testing.assert_allclose(constant.matrix, 1.0)
    centred = mean_code_similarity(path, "rule", layer=0, centre=True)
    assert centred.constant and centred.centred and np.isnan(centred.matrix).all(), "undefined, not an error"
    planted = mean_code_similarity(path, "rule", layer=1)
    code_file = CodeFile(path)
    expected = between_value_variance_share(code_file.layer_codes(1).astype(float), code_file.labels("rule"))
    assert not planted.constant and planted.explained_variance == pytest.approx(expected)
    assert planted.explained_variance > 0.5, "the rule is planted in layer 1 with 8 strong heads"
    low, high = planted.off_diagonal_range()
    off_diagonal = planted.matrix[~np.eye(8, dtype=bool)]
    assert (low, high) == (off_diagonal.min(), off_diagonal.max())
    assert mean_code_similarity(path, "term_present", layer=1).explained_variance is None, "multi-hot: no partition"
