"""The scores of a probe (and of its baselines): what each metric means and where it is undefined.

Categorical labels ``[N]`` (`categorical_scores`):

- ``accuracy``: share of examples predicted right;
- ``balanced_accuracy``: the mean, over the classes of the true labels, of the share of each
  class predicted right (recall); a constant prediction scores 1 / (number of classes);
- ``macro_f1``: the mean F1 over the classes of the true labels or the predictions (F1 0 for a
  class never predicted right).

One column of a multi-hot label, 0/1 ``[N]`` (`binary_scores`), each NaN where undefined:

- ``f1``: F1 of the value 1; undefined where neither the truth nor the prediction has a 1;
- ``balanced_accuracy``: the mean of the true-positive and true-negative rates; undefined where
  the truth has a single value (one of the two rates has no examples). Any prediction that
  ignores the codes scores 0.5 on average;
- ``auroc``: area under the ROC curve of the predicted probability of 1; undefined where the truth
  has a single value. A constant or random probability scores 0.5.

`why_undefined` says in words why a binary score is NaN.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import f1_score

__all__ = ["BINARY_METRICS", "CATEGORICAL_METRICS", "auroc", "binary_scores", "categorical_scores", "r2_per_output",
           "why_undefined"]

CATEGORICAL_METRICS = ("accuracy", "balanced_accuracy", "macro_f1")
BINARY_METRICS = ("f1", "balanced_accuracy", "auroc")


def accuracy(truth: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(truth == predicted))


def balanced_accuracy(truth: np.ndarray, predicted: np.ndarray) -> float:
    """Mean recall over the classes of `truth` (scikit-learn's definition, without its warning)."""
    classes = np.unique(truth)
    return float(np.mean([np.mean(predicted[truth == value] == value) for value in classes]))


def categorical_scores(truth: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """`CATEGORICAL_METRICS` of class predictions ``[N]`` against the true classes ``[N]``."""
    return {
        "accuracy": accuracy(truth, predicted),
        "balanced_accuracy": balanced_accuracy(truth, predicted),
        "macro_f1": float(f1_score(truth, predicted, average="macro", zero_division=0.0)),
    }


def f1_or_zero(truth: np.ndarray, predicted: np.ndarray) -> float:
    """F1 of the value 1, 0 where undefined: ``f1_score(truth, predicted, zero_division=0)``,
    several times faster (it picks the regularization of the binary probes, so runs often)."""
    truth, predicted = np.asarray(truth).astype(bool), np.asarray(predicted).astype(bool)
    denominator = np.count_nonzero(predicted) + np.count_nonzero(truth)
    return 2.0 * np.count_nonzero(predicted & truth) / denominator if denominator else 0.0


def binary_scores(truth: np.ndarray, predicted: np.ndarray, probability: np.ndarray) -> dict[str, float]:
    """`BINARY_METRICS` of 0/1 predictions ``[N]`` and probabilities of 1 ``[N]`` against 0/1 truth
    ``[N]``; NaN where undefined (see the module docstring and `why_undefined`)."""
    truth, predicted = np.asarray(truth).astype(bool), np.asarray(predicted).astype(bool)
    both_values = 0 < np.count_nonzero(truth) < len(truth)
    any_positive = truth.any() or predicted.any()
    return {
        "f1": f1_or_zero(truth, predicted) if any_positive else np.nan,
        "balanced_accuracy": (
            float((np.mean(predicted[truth]) + np.mean(~predicted[~truth])) / 2) if both_values else np.nan
        ),
        "auroc": auroc(truth, probability) if both_values else np.nan,
    }


def auroc(truth: np.ndarray, probability: np.ndarray) -> float:
    """Area under the ROC curve (``roc_auc_score``) as the Mann-Whitney statistic: the chance that
    a random 1 gets a higher probability than a random 0, ties counting half. Several times faster
    than scikit-learn's, which matters at three predictors per column per layer."""
    truth = np.asarray(truth).astype(bool)
    ranks = rankdata(probability)  # ties get their mean rank
    n_positive = np.count_nonzero(truth)
    n_negative = len(truth) - n_positive
    return float((ranks[truth].sum() - n_positive * (n_positive + 1) / 2) / (n_positive * n_negative))


def why_undefined(metric: str, truth: np.ndarray, split: str) -> str:
    """Why `binary_scores` gave NaN for `metric` on the 0/1 column `truth` of `split`, in words."""
    if metric == "f1":
        return f"f1 undefined: no 1 in split {split!r} and none predicted"
    value = int(np.asarray(truth).flat[0]) if len(truth) else "empty"
    return f"{metric} undefined: the column is {value} throughout split {split!r} (it needs both values)"


def r2_per_output(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Coefficient of determination of each output ``[N, K] -> [K]``; NaN where the truth is constant."""
    total = ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)
    residual = ((truth - predicted) ** 2).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, 1.0 - residual / np.where(total > 0, total, 1.0), np.nan)
