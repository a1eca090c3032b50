"""Baselines: what predictors that never look at the codes score on the same test split.

A probe score means something only beside these. Each is fitted on the fit split's labels alone
and scored on the test split's labels, with the metrics of `latentcode.analysis.scores`:

- ``majority``: the fit split's most frequent value, predicted throughout. Categorical: the
  majority class (ties: the smallest). One column of a multi-hot label: 1 where the column's fit
  prevalence is at least 0.5, else 0 (its probability of 1, for AUROC: that prevalence). Ridge
  targets: the fit split's mean.
- ``prevalence_random``: each value drawn at random with its fit-split prevalence, independently
  of everything; its expected score in closed form. With fit shares ``p`` and test shares ``q``
  of each class: accuracy ``sum(p * q)``, balanced accuracy the mean of ``p`` over the test
  classes, F1 of a class ``2 p q / (p + q)`` (from the expected counts: exact in the limit of
  many examples). For a 0/1 column balanced accuracy and AUROC are 0.5 exactly.
- ``all_present``: every column of a multi-hot label predicted 1 (probability 1). Its F1 is
  ``2 q / (1 + q)`` for a test prevalence ``q``: 0.29 at q = 1/6 (fuzzy logic's OOD split, where
  a function has 2 of 12 seen terms), above what a weak probe reaches; so F1 alone is no evidence
  of decoding.

The fourth, ``shuffled_labels`` (a probe fitted on permuted fit labels), needs the codes
and is fitted in `latentcode.analysis.probes`.
"""

from __future__ import annotations

import numpy as np

from latentcode.analysis.scores import binary_scores, categorical_scores, r2_per_output

__all__ = ["BASELINES", "binary_baselines", "categorical_baselines", "most_frequent", "regression_baselines"]

# The order in which a table lists them and breaks ties between equally strong ones: a baseline
# that needs no fit is named before the shuffled-label probe that scores as well.
BASELINES = ("majority", "prevalence_random", "all_present", "shuffled_labels")


def most_frequent(labels: np.ndarray):
    """The most frequent value of `labels` ``[N]``; ties go to the smallest."""
    values, counts = np.unique(labels, return_counts=True)
    return values[np.argmax(counts)]  # argmax takes the first of equal counts


def _shares(labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    return np.array([np.mean(labels == value) for value in classes])


def categorical_baselines(fit_labels: np.ndarray, test_labels: np.ndarray) -> dict[str, dict[str, float]]:
    """``{baseline: {metric: score}}`` of ``majority`` and ``prevalence_random`` for class labels
    ``[N_fit]`` and ``[N_test]``, with the metrics of `scores.categorical_scores`."""
    majority = np.full_like(test_labels, most_frequent(fit_labels))
    # Random predictions at fit prevalence predict every fit class, so macro-F1 averages over the
    # classes of either split (as it would over those of the truth or the predictions).
    classes = np.union1d(np.unique(fit_labels), np.unique(test_labels))
    fit_share, test_share = _shares(fit_labels, classes), _shares(test_labels, classes)
    f1_per_class = 2 * fit_share * test_share / (fit_share + test_share)
    return {
        "majority": categorical_scores(test_labels, majority),
        "prevalence_random": {
            "accuracy": float(np.sum(fit_share * test_share)),
            "balanced_accuracy": float(np.mean(fit_share[test_share > 0])),
            "macro_f1": float(np.mean(f1_per_class)),
        },
    }


def binary_baselines(fit_column: np.ndarray, test_column: np.ndarray) -> dict[str, dict[str, float]]:
    """``{baseline: {metric: score}}`` of ``majority``, ``prevalence_random`` and ``all_present``
    for one 0/1 column of a multi-hot label (``[N_fit]``, ``[N_test]``), with the metrics of
    `scores.binary_scores` (NaN where undefined)."""
    fit_prevalence = float(np.mean(fit_column))
    test_prevalence = float(np.mean(test_column))
    n_test = len(test_column)
    both_values = 0 < test_prevalence < 1
    total = fit_prevalence + test_prevalence
    return {
        "majority": binary_scores(test_column, np.full(n_test, fit_prevalence >= 0.5),
                                  np.full(n_test, fit_prevalence)),
        "prevalence_random": {
            "f1": 2 * fit_prevalence * test_prevalence / total if total > 0 else np.nan,
            "balanced_accuracy": 0.5 if both_values else np.nan,
            "auroc": 0.5 if both_values else np.nan,
        },
        "all_present": binary_scores(test_column, np.ones(n_test, bool), np.ones(n_test)),
    }


def regression_baselines(fit_targets: np.ndarray, test_targets: np.ndarray) -> dict[str, np.ndarray]:
    """``{"majority": R² per output [K]}``: the fit split's mean ``[N_fit, K]`` predicted for the
    test targets ``[N_test, K]`` (R² <= 0; NaN where a test output is constant)."""
    constant = np.broadcast_to(fit_targets.mean(axis=0), test_targets.shape)
    return {"majority": r2_per_output(test_targets, constant)}
