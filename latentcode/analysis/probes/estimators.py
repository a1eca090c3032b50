"""The probes: scikit-learn estimators that choose their regularization by cross-validation.

`LogisticProbe` (class labels ``[N]``), `MultiHotProbe` (0/1 labels ``[N, C]``, one binary probe
per column) and `RidgeProbe` (targets ``[N]`` or ``[N, K]``) are each ``Pipeline(StandardScaler,
estimator)`` with C or alpha chosen on the data they are fitted on, and keep the out-of-fold
predictions at that choice (``validation_predictions_``), to score a probe on its own fitting data.

They pass scikit-learn's `check_estimator` (`MultiHotProbe`: all but the single-output checks, listed in
tests/analysis/test_probe_estimators.py); ``random_state`` seeds the folds; `predict` before `fit` raises
`NotFittedError`; a grid, fold count or labels they cannot fit raise `ProbeError`, a `ValueError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold, cross_val_predict
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from latentcode.analysis.scores import accuracy, f1_or_zero
from latentcode.errors import LatentcodeError

__all__ = ["DEFAULT_ALPHAS", "DEFAULT_CS", "LogisticProbe", "MultiHotProbe", "ProbeError", "RidgeProbe",
           "classes_too_rare"]

DEFAULT_CS = (0.01, 0.1, 1.0, 10.0, 100.0)
DEFAULT_ALPHAS = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
_MAX_ITER = 1000


class ProbeError(LatentcodeError, ValueError):
    """Codes or labels a probe cannot be fitted to or scored on; says which and why."""


def _logistic(C: float = 1.0, warm_start: bool = False) -> LogisticRegression:
    return LogisticRegression(C=C, solver="newton-cg", max_iter=_MAX_ITER, warm_start=warm_start)


def _check_search(estimator: BaseEstimator, grid_name: str, grid: Sequence[float]) -> None:
    """The grid and the number of folds of a probe's cross-validated search, before any fit."""
    name = type(estimator).__name__
    if isinstance(estimator.cv, bool) or not isinstance(estimator.cv, (int, np.integer)) or estimator.cv < 2:
        raise ProbeError(f"{name}(cv={estimator.cv!r}): cross-validation needs an integer number of folds >= 2")
    values = np.asarray(grid, dtype=float) if len(grid) else np.empty(0)
    if values.ndim != 1 or len(values) == 0 or not (np.isfinite(values) & (values > 0)).all():
        raise ProbeError(f"{name}({grid_name}={grid!r}): needs a non-empty list of positive numbers")


def classes_too_rare(y: np.ndarray, cv: int) -> str:
    """The classes of ``y`` ``[N]`` with fewer than `cv` examples, as ``"class 7 has 2, class 3 has
    1"`` ("" if none): stratified `cv`-fold cross-validation needs one of each class in every fold."""
    classes, counts = np.unique(y, return_counts=True)
    return ", ".join(f"class {value} has {count}" for value, count in zip(classes, counts, strict=True) if count < cv)


class LogisticProbe(ClassifierMixin, BaseEstimator):
    """``Pipeline(StandardScaler, LogisticRegression)`` whose C has the best mean `selection_score`
    over stratified `cv`-fold cross-validation on the data it is fitted on (ties: the smaller C),
    refitted on all of it.

    The search is `GridSearchCV`'s done by hand, about twice as fast (benchmarks/bench_probes.py): each
    fold standardizes once and walks the grid with warm starts, keeping the out-of-fold predictions.

    Parameters: ``Cs``, the grid of inverse regularization strengths; ``cv``, the folds;
    ``random_state``, the seed of the folds' shuffle; ``selection_score(y_true, y_pred) -> float``,
    what C maximizes. Every class needs at least ``cv`` examples (one in each fold).

    Attributes after `fit`: ``classes_``; ``n_features_in_``; ``C_``; ``cv_scores_`` (mean
    validation score per C of ``sorted(Cs)``); ``validation_predictions_`` ``[N]`` and
    ``validation_probabilities_`` ``[N, classes]``, each example's prediction by the fold that did
    not train on it; ``pipeline_``.
    """

    def __init__(self, Cs: Sequence[float] = DEFAULT_CS, cv: int = 3, random_state: int | None = 0,
                 selection_score=accuracy):
        self.Cs = Cs
        self.cv = cv
        self.random_state = random_state
        self.selection_score = selection_score

    def fit(self, X: np.ndarray, y: np.ndarray) -> LogisticProbe:
        """Fit to codes ``X`` ``[N, features]`` and class labels ``y`` ``[N]``."""
        _check_search(self, "Cs", self.Cs)
        X, y = validate_data(self, X, y)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ProbeError(f"LogisticProbe needs at least 2 classes in y; got one class ({self.classes_[0]})")
        few = classes_too_rare(y, self.cv)
        if few:
            raise ProbeError(f"too few examples to fit with {self.cv}-fold stratified cross-validation: {few}; "
                             f"every class needs at least {self.cv} examples")
        Cs = sorted(self.Cs)
        scores = np.zeros(len(Cs))
        predictions = np.empty((len(Cs), len(y)), dtype=y.dtype)
        probabilities = np.empty((len(Cs), len(y), len(self.classes_)))
        folds = StratifiedKFold(n_splits=self.cv, shuffle=True, random_state=self.random_state)
        for train, validation in folds.split(X, y):
            scaler = StandardScaler().fit(X[train])
            fold_train, fold_validation = scaler.transform(X[train]), scaler.transform(X[validation])
            logistic = _logistic(warm_start=True)
            for index, C in enumerate(Cs):
                logistic.set_params(C=C).fit(fold_train, y[train])
                # every class is in every training part (>= cv each, stratified): columns are self.classes_
                probabilities[index, validation] = logistic.predict_proba(fold_validation)
                predictions[index, validation] = self.classes_[probabilities[index, validation].argmax(axis=1)]
                scores[index] += self.selection_score(y[validation], predictions[index, validation])
        best = int(np.argmax(scores))
        self.C_ = float(Cs[best])
        self.cv_scores_ = scores / self.cv
        self.validation_predictions_ = predictions[best]
        self.validation_probabilities_ = probabilities[best]
        self.pipeline_ = Pipeline([("standardize", StandardScaler()), ("logistic", _logistic(C=self.C_))])
        self.pipeline_.fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Class labels ``[N]``."""
        check_is_fitted(self)
        return self.pipeline_.predict(validate_data(self, X, reset=False))

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Probabilities ``[N, classes]``, columns in the order of ``classes_``."""
        check_is_fitted(self)
        return self.pipeline_.predict_proba(validate_data(self, X, reset=False))


class MultiHotProbe(ClassifierMixin, BaseEstimator):
    """One binary `LogisticProbe` per column of a 0/1 label ``y`` ``[N, C]`` (C chosen by F1). A
    column with a single value in the fitting data gets no probe and is predicted as that value.

    Parameters as `LogisticProbe`'s. Attributes after `fit`: ``classes_`` (the column indices,
    scikit-learn's convention for a multi-label indicator); ``n_features_in_``; ``probes_`` (a
    `LogisticProbe` or None per column); ``constant_`` (the value of each probe-less column, -1
    elsewhere); ``C_`` ``[C]`` (NaN without a probe); ``validation_predictions_`` and
    ``validation_probabilities_`` ``[N, C]`` (out of fold).
    """

    def __init__(self, Cs: Sequence[float] = DEFAULT_CS, cv: int = 3, random_state: int | None = 0):
        self.Cs = Cs
        self.cv = cv
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False  # each column is a binary label
        tags.classifier_tags.multi_label = True
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        return tags

    def fit(self, X: np.ndarray, y: np.ndarray) -> MultiHotProbe:
        """Fit to codes ``X`` ``[N, features]`` and 0/1 labels ``y`` ``[N, C]``."""
        _check_search(self, "Cs", self.Cs)
        X, y = validate_data(self, X, y, multi_output=True)
        check_classification_targets(y)
        if y.ndim != 2 or not np.isin(y, (0, 1)).all():
            values = np.unique(y)
            raise ProbeError(f"Only binary classification is supported: MultiHotProbe needs 0/1 labels y [N, C], "
                             f"one column per class; got shape {list(y.shape)} with values "
                             f"{values[:5].tolist()}{' ...' * (len(values) > 5)}")
        y = y.astype(np.int64)
        n_columns = y.shape[1]
        self.classes_ = np.arange(n_columns)
        self.probes_: list[LogisticProbe | None] = []
        self.constant_ = np.full(n_columns, -1)
        self.validation_predictions_ = np.empty(y.shape, dtype=np.int64)
        self.validation_probabilities_ = np.empty(y.shape)
        for column in range(n_columns):
            values = np.unique(y[:, column])
            if len(values) == 1:
                self.probes_.append(None)
                self.constant_[column] = values[0]
                self.validation_predictions_[:, column] = values[0]
                self.validation_probabilities_[:, column] = values[0]
                continue
            probe = LogisticProbe(self.Cs, cv=self.cv, random_state=self.random_state, selection_score=f1_or_zero)
            self.probes_.append(probe.fit(X, y[:, column]))
            self.validation_predictions_[:, column] = probe.validation_predictions_
            self.validation_probabilities_[:, column] = probe.validation_probabilities_[:, 1]
        self.C_ = np.array([np.nan if probe is None else probe.C_ for probe in self.probes_])
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """0/1 ``[N, C]``."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False)
        return np.stack([np.full(len(X), constant) if probe is None else probe.predict(X)
                         for probe, constant in zip(self.probes_, self.constant_, strict=True)], axis=1)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Probability of 1 per column ``[N, C]``."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False)
        return np.stack([np.full(len(X), float(constant)) if probe is None else probe.predict_proba(X)[:, 1]
                         for probe, constant in zip(self.probes_, self.constant_, strict=True)], axis=1)


class RidgeProbe(RegressorMixin, BaseEstimator):
    """``Pipeline(StandardScaler, Ridge)`` with one alpha for all outputs, chosen by mean R² over
    `cv`-fold cross-validation (`GridSearchCV`; ties: the first of ``alphas``); targets ``y``
    ``[N]`` or ``[N, K]``. Attributes after `fit`: ``n_features_in_``; ``alpha_``; ``pipeline_``;
    ``validation_predictions_`` (the shape of ``y``), the out-of-fold predictions at that alpha,
    on the same folds (`cross_val_predict`)."""

    def __init__(self, alphas: Sequence[float] = DEFAULT_ALPHAS, cv: int = 3, random_state: int | None = 0):
        self.alphas = alphas
        self.cv = cv
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def fit(self, X: np.ndarray, y: np.ndarray) -> RidgeProbe:
        """Fit to codes ``X`` ``[N, features]`` and targets ``y`` ``[N]`` or ``[N, K]``."""
        _check_search(self, "alphas", self.alphas)
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True)
        if len(y) < self.cv:
            raise ProbeError(f"RidgeProbe(cv={self.cv}) needs at least {self.cv} examples; got n_samples={len(y)}")
        folds = KFold(n_splits=self.cv, shuffle=True, random_state=self.random_state)
        pipeline = Pipeline([("standardize", StandardScaler()), ("ridge", Ridge())])
        search = GridSearchCV(pipeline, {"ridge__alpha": list(self.alphas)}, scoring="r2", n_jobs=1,
                              error_score="raise", cv=folds).fit(X, y)
        self.alpha_ = float(search.best_params_["ridge__alpha"])
        self.pipeline_ = search.best_estimator_
        chosen = Pipeline([("standardize", StandardScaler()), ("ridge", Ridge(alpha=self.alpha_))])
        self.validation_predictions_ = cross_val_predict(chosen, X, y, cv=folds).reshape(y.shape)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted targets ``[N]`` or ``[N, K]``, as ``y`` was."""
        check_is_fitted(self)
        return self.pipeline_.predict(validate_data(self, X, reset=False))
