"""Baselines and scores against hand computations on small label sets, and against sampling."""

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

from latentcode.analysis.baselines import binary_baselines, categorical_baselines, most_frequent
from latentcode.analysis.scores import auroc, binary_scores, categorical_scores, why_undefined

FIT = np.array([0, 0, 0, 1, 1, 2])  # shares 1/2, 1/3, 1/6
TEST = np.array([0, 1, 1, 2, 2, 2])  # shares 1/6, 1/3, 1/2


def test_categorical_baselines_by_hand():
    baselines = categorical_baselines(FIT, TEST)
    # majority class 0: right once in six; recall 1 on class 0 and 0 on the others; class 0 has
    # precision 1/6 and recall 1, so F1 2/7, and the two others F1 0
    assert baselines["majority"] == pytest.approx({"accuracy": 1 / 6, "balanced_accuracy": 1 / 3,
                                                   "macro_f1": (2 / 7) / 3})
    # classes drawn with shares p = (1/2, 1/3, 1/6) against test shares q = (1/6, 1/3, 1/2):
    # accuracy sum(p q) = 1/12 + 1/9 + 1/12; recall of class c is p_c; F1 of c is 2 p q / (p + q)
    assert baselines["prevalence_random"] == pytest.approx({
        "accuracy": 1 / 12 + 1 / 9 + 1 / 12,
        "balanced_accuracy": (1 / 2 + 1 / 3 + 1 / 6) / 3,
        "macro_f1": (1 / 4 + 1 / 3 + 1 / 4) / 3,
    })


def test_prevalence_random_is_the_mean_score_of_random_predictions():
    rng = np.random.default_rng(0)
    fit, test = rng.choice(4, 400, p=[0.5, 0.3, 0.15, 0.05]), rng.choice(4, 3000, p=[0.1, 0.2, 0.3, 0.4])
    draws = [rng.choice(4, len(test), p=np.bincount(fit, minlength=4) / len(fit)) for _ in range(200)]
    sampled = {
        "accuracy": np.mean([np.mean(test == draw) for draw in draws]),
        "balanced_accuracy": np.mean([balanced_accuracy_score(test, draw) for draw in draws]),
        "macro_f1": np.mean([f1_score(test, draw, average="macro") for draw in draws]),
    }
    expected = categorical_baselines(fit, test)["prevalence_random"]
    for metric, value in sampled.items():
        assert expected[metric] == pytest.approx(value, abs=0.003), metric


def test_majority_breaks_ties_towards_the_smallest_class():
    assert most_frequent(np.array([3, 1, 3, 1, 2])) == 1


# fit prevalences 0.5, 0.25, 0.75; test prevalences 0.4, 0.2, 0.8
FIT_MULTI_HOT = np.array([[1, 0, 1], [0, 0, 1], [1, 0, 0], [0, 1, 1]])
TEST_MULTI_HOT = np.array([[1, 0, 0], [0, 0, 1], [0, 1, 1], [0, 0, 1], [1, 0, 1]])


def test_multi_hot_baselines_by_hand():
    columns = [binary_baselines(FIT_MULTI_HOT[:, j], TEST_MULTI_HOT[:, j]) for j in range(3)]
    # all present: column 0 has 2 true positives and 3 false positives, F1 = 4 / (4 + 3);
    # column 1: 1 and 4, F1 = 2 / 6; column 2: 4 and 1, F1 = 8 / 9
    assert [c["all_present"]["f1"] for c in columns] == pytest.approx([4 / 7, 1 / 3, 8 / 9])
    # majority: present where the fit prevalence is >= 0.5 (columns 0 and 2), absent in column 1
    assert [c["majority"]["f1"] for c in columns] == pytest.approx([4 / 7, 0.0, 8 / 9])
    # prevalence-matched random: 2 p q / (p + q)
    assert [c["prevalence_random"]["f1"] for c in columns] == pytest.approx([0.4 / 0.9, 0.1 / 0.45, 1.2 / 1.55])
    for column in columns:  # none of them looks at the codes: chance is 0.5, not zero
        for baseline in ("all_present", "majority", "prevalence_random"):
            assert column[baseline]["balanced_accuracy"] == 0.5 and column[baseline]["auroc"] == 0.5


def test_mean_f1_of_all_present_beats_zero_by_construction():
    # each column present in one example of six: F1 of 'all present' is 2 (1/6) / (1 + 1/6) = 2/7
    test = np.repeat(np.eye(6, dtype=int), 2, axis=0)
    fit = np.repeat(np.eye(6, dtype=int), 3, axis=0)
    all_present = [binary_baselines(fit[:, j], test[:, j])["all_present"]["f1"] for j in range(6)]
    majority = [binary_baselines(fit[:, j], test[:, j])["majority"]["f1"] for j in range(6)]
    assert np.mean(all_present) == pytest.approx(2 / 7) and np.mean(majority) == 0.0


def test_binary_scores_and_where_they_are_undefined():
    truth = np.array([0, 1, 1, 0, 1])
    predicted = np.array([0, 1, 0, 1, 1])
    probability = np.array([0.1, 0.8, 0.4, 0.6, 0.9])
    scores = binary_scores(truth, predicted, probability)
    assert scores["f1"] == pytest.approx(f1_score(truth, predicted))
    assert scores["balanced_accuracy"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert scores["auroc"] == pytest.approx(roc_auc_score(truth, probability))

    zeros = np.zeros(4, int)
    undefined = binary_scores(zeros, zeros, np.full(4, 0.2))
    assert all(np.isnan(value) for value in undefined.values())
    assert binary_scores(zeros, np.array([0, 1, 0, 0]), np.full(4, 0.2))["f1"] == 0.0  # a false positive
    assert why_undefined("auroc", zeros, "ood") == "auroc undefined: the column is 0 throughout split 'ood' " \
                                                   "(it needs both values)"
    assert why_undefined("f1", zeros, "ood") == "f1 undefined: no 1 in split 'ood' and none predicted"


def test_categorical_scores_by_hand():
    truth, predicted = np.array([0, 0, 0, 1, 2, 2]), np.array([0, 0, 1, 1, 2, 0])
    scores = categorical_scores(truth, predicted)
    assert scores["accuracy"] == pytest.approx(4 / 6)
    assert scores["balanced_accuracy"] == pytest.approx((2 / 3 + 1 + 1 / 2) / 3)
    # F1: class 0 precision 2/3 recall 2/3; class 1 precision 1/2 recall 1; class 2 precision 1 recall 1/2
    assert scores["macro_f1"] == pytest.approx((2 / 3 + 2 / 3 + 2 / 3) / 3)


def test_auroc_is_scikit_learns_with_ties():
    rng = np.random.default_rng(3)
    truth = rng.integers(0, 2, 500)
    probability = np.round(rng.random(500) + 0.3 * truth, 1)  # many ties
    assert auroc(truth, probability) == pytest.approx(roc_auc_score(truth, probability))
    assert auroc(truth, np.full(500, 0.3)) == 0.5
