"""Linear probes on latent codes: decode a label from the codes of each layer, beside baselines.

The paper fits a logistic regression on the latent codes of in-distribution tasks and scores it on
tasks of unseen composition. `decode` does that per layer (all sites of a layer concatenated, or
each site alone), for one codes file or several models side by side; `regress` is the ridge
counterpart for continuous labels (R²).

Fitting. Every probe is a scikit-learn ``Pipeline(StandardScaler, estimator)`` (`LogisticProbe`,
`MultiHotProbe`, `RidgeProbe`) whose regularization is chosen by k-fold cross-validation
(stratified for classification) on the fitting split only, each fold standardized with its own
training part: C by accuracy for a categorical label, by F1 for each column of a multi-hot one;
alpha by R². Fitting is single-threaded (one BLAS thread): at these sizes threads only add overhead.

Choosing the layer, never on the test split. ``validation`` is the score, on the fitting split,
of the probe's out-of-fold predictions at the chosen regularization (every example predicted by
the fold that did not train on it). In each file one layer (with ``per_site``: one layer and site)
is ``selected``: the best ``validation`` of the table's headline metric (the first of
`HEADLINE_METRICS` it has; ties: the earlier layer). ``value`` is the test score, kept for every
layer for plots; the result to report is the ``value`` of the selected layer (`headline_rows`).

Metrics (`latentcode.analysis.scores`): categorical labels ``[N]`` get one multinomial probe,
metrics ``accuracy``, ``balanced_accuracy``, ``macro_f1``; multi-hot 0/1 labels ``[N, C]`` one
binary probe per column, metrics ``f1``, ``balanced_accuracy`` and ``auroc`` per column (label
``term_present[j]``) and their means ``mean_f1``, ``mean_balanced_accuracy``, ``mean_auroc``
(label ``term_present``); F1 alone can sit near zero for every baseline, so it is never the
headline. Ridge: ``r2`` per output, ``mean_r2``.

Baselines beside every score, on the same test split (`latentcode.analysis.baselines`):
``shuffled_labels`` (the fitting labels permuted by whole rows with
``np.random.default_rng(seed).permutation``, a probe fitted to them exactly as the real one, scored
on the true test labels), ``majority``, ``prevalence_random`` and, for multi-hot labels,
``all_present`` (NaN where a baseline does not apply). ``strongest_baseline`` names the highest
of them, ``strongest_baseline_value`` is its score and ``beats_baselines`` says whether ``value``
is above it (NA where either is undefined).

Undefined scores are NaN and the ``note`` column says why. Labels whose values are missing from
one split:

- categorical: test classes that never occur in the fitting split cannot be predicted; they count
  as errors and the note names them.
- multi-hot: a column that never (or always) takes the value 1 in the fitting split gets no probe;
  it is predicted as that constant, and the note says so. A column with a single value in the test
  split has no balanced accuracy or AUROC (and no F1 where it is all 0 and none is predicted).
  A mean averages the columns where its metric is defined on the test split (the note says how
  many), and its baselines average the same columns; its ``validation`` averages the columns where
  the metric is defined on the fitting split.

The result is a tidy ``pandas.DataFrame`` with the columns of `COLUMNS`; `write_table` writes it as
CSV and JSON.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold, cross_val_predict
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data
from threadpoolctl import threadpool_limits

from latentcode.analysis.baselines import (
    BASELINES,
    binary_baselines,
    categorical_baselines,
    regression_baselines,
)
from latentcode.analysis.labels import label_spec_name, parse_label_spec, select_label
from latentcode.analysis.scores import (
    BINARY_METRICS,
    CATEGORICAL_METRICS,
    accuracy,
    binary_scores,
    categorical_scores,
    f1_or_zero,
    r2_per_output,
    why_undefined,
)
from latentcode.errors import LatentcodeError
from latentcode.files import AtomicOutputs
from latentcode.store import CodeFile

__all__ = [
    "COLUMNS",
    "DEFAULT_ALPHAS",
    "DEFAULT_CS",
    "HEADLINE_METRICS",
    "LogisticProbe",
    "MultiHotProbe",
    "ProbeError",
    "RidgeProbe",
    "decode",
    "headline_lines",
    "headline_rows",
    "regress",
    "summary_rows",
    "write_table",
]

DEFAULT_CS = (0.01, 0.1, 1.0, 10.0, 100.0)
DEFAULT_ALPHAS = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
# The metric that picks the layer and heads a summary: the first of these a table has.
HEADLINE_METRICS = ("accuracy", "mean_balanced_accuracy", "mean_r2", "r2")
# What a one-line summary shows beside its headline metric, at the selected layer.
_COMPANION_METRICS = {"mean_balanced_accuracy": ("mean_auroc", "mean_f1"), "accuracy": ("balanced_accuracy",)}
COLUMNS = (
    "model", "file", "layer", "site", "label", "metric", "value", "validation", "selected",
    *BASELINES, "strongest_baseline", "strongest_baseline_value", "beats_baselines",
    "n_fit", "n_test", "regularization_param", "regularization", "fit_split", "test_split", "seed", "note",
)
_MAX_ITER = 1000


class ProbeError(LatentcodeError, ValueError):
    """Codes or labels a probe cannot be fitted to or scored on; says which and why."""


# -- estimators ------------------------------------------------------------------------------------
# Scikit-learn estimators (`sklearn.utils.estimator_checks.check_estimator` passes for each, see
# tests/analysis/test_probes.py): `fit(X, y)` validates its input and sets ``n_features_in_``;
# `predict` before `fit` raises `NotFittedError`; ``random_state`` seeds the folds.
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


class LogisticProbe(ClassifierMixin, BaseEstimator):
    """``Pipeline(StandardScaler, LogisticRegression)`` whose C has the best mean `selection_score`
    over stratified `cv`-fold cross-validation on the data it is fitted on (ties: the smaller C),
    refitted on all of it.

    The grid search is `GridSearchCV`'s, done by hand for speed (benchmarks/bench_probes.py: about
    twice as fast): each fold standardizes once (with its own training part) rather than once per
    C, and walks the grid from strong to weak regularization, each fit starting from the previous
    solution (warm start). It also keeps the out-of-fold predictions at the chosen C, to score the
    probe on its own fitting data, which `GridSearchCV` would need a second cross-validation for.

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
        self.classes_, counts = np.unique(y, return_counts=True)
        if len(self.classes_) < 2:
            raise ProbeError(f"LogisticProbe needs at least 2 classes in y; got one class ({self.classes_[0]})")
        if counts.min() < self.cv:
            few = ", ".join(f"class {value} has {count}"
                            for value, count in zip(self.classes_, counts, strict=True) if count < self.cv)
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
                # Every class occurs in every training part (>= cv examples each, stratified),
                # so the columns of predict_proba are self.classes_.
                probabilities[index, validation] = logistic.predict_proba(fold_validation)
                # the most probable class is what predict() returns, without a second pass
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


def _shuffled(values: np.ndarray, seed: int) -> np.ndarray:
    # Whole rows permuted: every column of a multi-hot label keeps its counts.
    return values[np.random.default_rng(seed).permutation(len(values))]


# -- inputs ----------------------------------------------------------------------------------------
def _as_code_files(code_files) -> list[CodeFile]:
    if isinstance(code_files, (str, Path, CodeFile)):
        code_files = [code_files]
    files = [item if isinstance(item, CodeFile) else CodeFile(item) for item in code_files]
    if not files:
        raise ProbeError("no codes files given")
    return files


@dataclass
class _Labels:
    """The label of one file on both splits, checked and converted, with its baselines."""

    code_file: CodeFile
    name: str
    fit: np.ndarray
    test: np.ndarray
    baselines: dict | list
    note: str = ""
    output_shape: tuple[int, ...] = ()  # of a label to regress on, before flattening


@dataclass(frozen=True)
class _ProbeSite:
    """One probe: a layer of a file, all its sites (``site`` "all") or one."""

    labels: _Labels
    layer: int
    site: str
    sites: tuple
    where: str


def _probe_sites(labelled_files: Sequence[_Labels], layers, per_site: bool) -> list[_ProbeSite]:
    probe_sites = []
    for labels in labelled_files:
        code_file = labels.code_file
        for layer in code_file.layers if layers is None else layers:
            sites = code_file.sites_of_layer(layer)
            if per_site:
                probe_sites += [_ProbeSite(labels, int(layer), site.name, (site,), f"site {site.name}")
                                for site in sites]
            else:
                names = ", ".join(site.name for site in sites)
                where = f"site all ({len(sites)} site{'s' * (len(sites) > 1)}: {names})"
                probe_sites.append(_ProbeSite(labels, int(layer), "all", tuple(sites), where))
    return probe_sites


def _read_codes(probe_site: _ProbeSite, split: str) -> np.ndarray:
    code_file = probe_site.labels.code_file
    codes = np.concatenate([code_file.codes(site, split) for site in probe_site.sites], axis=1).astype(np.float64)
    bad = ~np.isfinite(codes)
    if bad.any():
        raise ProbeError(
            f"the codes of layer {probe_site.layer} at {probe_site.where} in split {split!r} of {code_file.path} "
            f"contain NaN or inf in {int(bad.any(axis=1).sum())} of {len(codes)} examples; probes need finite codes"
        )
    return codes


def _codes(probe_sites: Sequence[_ProbeSite], fit_split: str, test_split: str, progress: bool, description: str
           ) -> Iterator[tuple[_ProbeSite, np.ndarray, np.ndarray, str]]:
    """``(probe site, fit codes, test codes, note)`` for each probe site, under a progress bar.

    Constant codes carry no information: the probe can only learn the class prior. That is a
    finding for one layer (e.g. HYLA's first layer on a fixed query), so it is noted; a file whose
    codes are constant at every probed site is refused.
    """
    from tqdm.auto import tqdm

    sites_of_file = Counter(id(probe_site.labels) for probe_site in probe_sites)
    constant_sites_of_file: Counter = Counter()
    with tqdm(probe_sites, desc=description, unit="probe", disable=not progress, leave=False) as bar:
        for probe_site in bar:
            code_file = probe_site.labels.code_file
            bar.set_postfix_str(f"{code_file.model_name} layer {probe_site.layer} site {probe_site.site}")
            codes_fit, codes_test = _read_codes(probe_site, fit_split), _read_codes(probe_site, test_split)
            if len(codes_fit) and np.ptp(codes_fit, axis=0).max() == 0:
                constant_sites_of_file[id(probe_site.labels)] += 1
                if constant_sites_of_file[id(probe_site.labels)] == sites_of_file[id(probe_site.labels)]:
                    raise ProbeError(
                        f"the codes of layer {probe_site.layer} at {probe_site.where} are constant in split "
                        f"{fit_split!r} of {code_file.path} (each of the {codes_fit.shape[1]} code entries takes a "
                        f"single value over all {len(codes_fit)} examples), as at every site probed: there is "
                        "nothing to decode from"
                    )
                yield probe_site, codes_fit, codes_test, (
                    f"codes constant in split {fit_split!r}: the probe can only learn the class prior")
            else:
                yield probe_site, codes_fit, codes_test, ""


def _check_sizes(labels: _Labels, cv: int, fit_split: str, test_split: str) -> None:
    path = labels.code_file.path
    if cv < 2:
        raise ProbeError(f"cv={cv}: cross-validation needs at least 2 folds")
    if len(labels.fit) < cv:
        raise ProbeError(f"split {fit_split!r} of {path} has {len(labels.fit)} examples; fitting with {cv}-fold "
                         f"cross-validation needs at least {cv}")
    if len(labels.test) == 0:
        raise ProbeError(f"split {test_split!r} of {path} has no examples to score on")


def _check_class_counts(labels: np.ndarray, cv: int, name: str, split: str, code_file: CodeFile,
                        column: str = "") -> None:
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise ProbeError(
            f"label {name!r}{column} has a single class ({classes[0] if len(classes) else 'none'}) in split "
            f"{split!r} of {code_file.path}: a classifier needs at least 2"
        )
    few = counts < cv
    if few.any():
        listed = ", ".join(f"class {c} has {n}" for c, n in zip(classes[few], counts[few], strict=True))
        raise ProbeError(
            f"split {split!r} of {code_file.path} has too few examples of label {name!r}{column} to fit "
            f"with {cv}-fold cross-validation: {listed}; every class needs at least {cv} examples "
            "(use a larger split or a smaller cv)"
        )


def _as_class_labels(values: np.ndarray, name: str) -> np.ndarray:
    if values.dtype.kind == "b":
        return values.astype(np.int64)
    if values.dtype.kind == "f":
        if not (np.isfinite(values).all() and np.all(values == np.round(values))):
            raise ProbeError(f"label {name!r} holds continuous values; decode() needs classes (integers). "
                             "Use regress() for continuous labels")
        return values.astype(np.int64)
    return values


def _is_multi_hot(values: np.ndarray) -> bool:
    return values.ndim == 2 and values.dtype.kind in "biuf" and bool(np.isin(values, (0, 1)).all())


def _decoding_labels(code_file: CodeFile, label: str, fit_split: str, test_split: str, cv: int) -> _Labels:
    """The label of a file to decode, checked: class labels ``[N]`` or 0/1 labels ``[N, C]``."""
    y_fit, name = select_label(code_file, label, fit_split)
    y_test, _ = select_label(code_file, label, test_split)
    labels = _Labels(code_file, name, y_fit, y_test, baselines={})
    _check_sizes(labels, cv, fit_split, test_split)
    if _is_multi_hot(y_fit):
        labels.fit, labels.test = y_fit.astype(np.int64), y_test.astype(np.int64)
        for column in range(y_fit.shape[1]):
            if 0 < labels.fit[:, column].sum() < len(labels.fit):  # a constant column is handled, not refused
                _check_class_counts(labels.fit[:, column], cv, name, fit_split, code_file, column=f" (column {column})")
        labels.baselines = [binary_baselines(labels.fit[:, column], labels.test[:, column])
                            for column in range(y_fit.shape[1])]
        return labels
    if y_fit.ndim != 1:
        raise ProbeError(
            f"label {name!r} has shape [N, {', '.join(map(str, y_fit.shape[1:]))}] and is not multi-hot "
            f"(0/1): decode one column, e.g. '{name}[-1]', or use regress() for several outputs"
        )
    labels.fit, labels.test = _as_class_labels(y_fit, name), _as_class_labels(y_test, name)
    _check_class_counts(labels.fit, cv, name, fit_split, code_file)
    labels.baselines = categorical_baselines(labels.fit, labels.test)
    unseen = np.setdiff1d(np.unique(labels.test), np.unique(labels.fit))
    if len(unseen):
        labels.note = f"test classes {unseen.tolist()} never occur in the fit split: the probe cannot predict them"
    return labels


def _regression_labels(code_file: CodeFile, label: str, fit_split: str, test_split: str, cv: int) -> _Labels:
    """The label of a file to regress on, trailing dimensions flattened: ``[N, K]`` floats."""
    y_fit, name = select_label(code_file, label, fit_split)
    y_test, _ = select_label(code_file, label, test_split)
    if y_fit.dtype.kind not in "biuf":
        raise ProbeError(f"label {name!r} has dtype {y_fit.dtype}; regress() needs numbers")
    labels = _Labels(code_file, name, y_fit.reshape(len(y_fit), -1).astype(np.float64),
                     y_test.reshape(len(y_test), -1).astype(np.float64), baselines={},
                     output_shape=y_fit.shape[1:])
    _check_sizes(labels, cv, fit_split, test_split)
    labels.baselines = regression_baselines(labels.fit, labels.test)
    return labels


# -- rows of the table -----------------------------------------------------------------------------
def _join(*notes: str) -> str:
    return "; ".join(note for note in notes if note)


def _decode_categorical(labels: _Labels, codes_fit, codes_test, Cs, cv, seed) -> list[dict]:
    probe = LogisticProbe(Cs, cv=cv, random_state=seed).fit(codes_fit, labels.fit)
    control = LogisticProbe(Cs, cv=cv, random_state=seed).fit(codes_fit, _shuffled(labels.fit, seed))
    test = categorical_scores(labels.test, probe.predict(codes_test))
    validation = categorical_scores(labels.fit, probe.validation_predictions_)
    shuffled = categorical_scores(labels.test, control.predict(codes_test))
    return [
        dict(metric=metric, value=test[metric], validation=validation[metric], shuffled_labels=shuffled[metric],
             **{name: scores[metric] for name, scores in labels.baselines.items()},
             regularization_param="C", regularization=probe.C_, note=labels.note)
        for metric in CATEGORICAL_METRICS
    ]


def _mean_over(rows_per_column: list[dict], field: str, columns: np.ndarray) -> float:
    """The mean of `field` over the rows of the columns where `columns` [C] is True (NaN if none)."""
    values = [rows_per_column[column][field] for column in np.flatnonzero(columns)]
    return float(np.mean(values)) if values else np.nan


def _decode_multi_hot(labels: _Labels, codes_fit, codes_test, Cs, cv, seed, test_split) -> list[dict]:
    probe = MultiHotProbe(Cs, cv=cv, random_state=seed).fit(codes_fit, labels.fit)
    control = MultiHotProbe(Cs, cv=cv, random_state=seed).fit(codes_fit, _shuffled(labels.fit, seed))
    predicted, probability = probe.predict(codes_test), probe.predict_proba(codes_test)
    control_predicted, control_probability = control.predict(codes_test), control.predict_proba(codes_test)
    base_name, base_index = parse_label_spec(labels.name)
    rows, per_column = [], []
    for column, baselines in enumerate(labels.baselines):
        truth = labels.test[:, column]
        test = binary_scores(truth, predicted[:, column], probability[:, column])
        validation = binary_scores(labels.fit[:, column], probe.validation_predictions_[:, column],
                                   probe.validation_probabilities_[:, column])
        shuffled = binary_scores(truth, control_predicted[:, column], control_probability[:, column])
        constant = probe.constant_[column]
        no_probe = (f"no probe: value {1 - constant} never occurs in the fit split, predicted {constant} throughout"
                    if constant >= 0 else "")
        for metric in BINARY_METRICS:
            row = dict(metric=metric, value=test[metric], validation=validation[metric],
                       shuffled_labels=shuffled[metric], **{name: scores[metric] for name, scores in baselines.items()})
            per_column.append(row)
            rows.append(dict(
                row, label=label_spec_name(base_name, (*base_index, column)), regularization_param="C",
                regularization=probe.C_[column],
                note=_join(no_probe, why_undefined(metric, truth, test_split) if np.isnan(test[metric]) else ""),
            ))
    fit_has = {"f1": labels.fit.any(axis=0), "both": (labels.fit.min(axis=0) == 0) & (labels.fit.max(axis=0) == 1)}
    test_has = {"f1": labels.test.any(axis=0), "both": (labels.test.min(axis=0) == 0) & (labels.test.max(axis=0) == 1)}
    n_columns = labels.fit.shape[1]
    for metric in BINARY_METRICS:
        kind = "f1" if metric == "f1" else "both"
        what = "a 1" if kind == "f1" else "both values"
        rows_of_metric = [row for row in per_column if row["metric"] == metric]
        defined, defined_in_fit = test_has[kind], fit_has[kind]
        note = (f"mean over the {int(defined.sum())} of {n_columns} columns with {what} in split {test_split!r}"
                if defined.any() else f"mean_{metric} undefined: no column has {what} in split {test_split!r}")
        rows.append(dict(
            metric=f"mean_{metric}", value=_mean_over(rows_of_metric, "value", defined),
            validation=_mean_over(rows_of_metric, "validation", defined_in_fit),
            **{field: _mean_over(rows_of_metric, field, defined) for field in BASELINES},
            regularization_param="C", regularization=np.nan, note=note,
        ))
    return rows


def _regress(labels: _Labels, codes_fit, codes_test, alphas, cv, seed) -> list[dict]:
    probe = RidgeProbe(alphas, cv=cv, random_state=seed).fit(codes_fit, labels.fit)
    control = RidgeProbe(alphas, cv=cv, random_state=seed).fit(codes_fit, _shuffled(labels.fit, seed))
    scores = {
        "value": r2_per_output(labels.test, probe.predict(codes_test).reshape(labels.test.shape)),
        "validation": r2_per_output(labels.fit, probe.validation_predictions_),
        "shuffled_labels": r2_per_output(labels.test, control.predict(codes_test).reshape(labels.test.shape)),
        "majority": labels.baselines["majority"],
    }
    common = dict(regularization_param="alpha", regularization=probe.alpha_)
    if labels.fit.shape[1] == 1:
        return [dict(metric="r2", **{field: values[0] for field, values in scores.items()}, **common)]
    base_name, base_index = parse_label_spec(labels.name)
    rows = [
        dict(label=label_spec_name(base_name, (*base_index, *index)), metric="r2",
             **{field: values[i] for field, values in scores.items()}, **common,
             note="" if np.isfinite(scores["value"][i]) else "r2 undefined: the output is constant in the test split")
        for i, index in enumerate(np.ndindex(*labels.output_shape))
    ]
    defined = np.isfinite(scores["value"])
    means = {field: float(np.mean(values[defined])) if defined.any() else np.nan for field, values in scores.items()}
    means["validation"] = float(np.nanmean(scores["validation"])) if np.isfinite(scores["validation"]).any() else np.nan
    rows.append(dict(metric="mean_r2", **means, **common,
                     note=f"mean over the {int(defined.sum())} of {len(defined)} outputs not constant on the test split"))
    return rows


# -- the table -------------------------------------------------------------------------------------
def _table(rows: list[dict]) -> pd.DataFrame:
    """Rows -> `COLUMNS`, with the strongest baseline of each row and the selected layer of each file."""
    table = pd.DataFrame(rows).reindex(columns=list(COLUMNS))
    baselines = table[list(BASELINES)].astype(float)
    has_baseline = baselines.notna().any(axis=1)
    table["strongest_baseline"] = baselines[has_baseline].idxmax(axis=1).reindex(table.index).fillna("")
    table["strongest_baseline_value"] = baselines.max(axis=1)
    comparable = table["value"].notna() & table["strongest_baseline_value"].notna()
    beats = pd.Series(pd.NA, index=table.index, dtype="boolean")
    beats[comparable] = table.loc[comparable, "value"] > table.loc[comparable, "strongest_baseline_value"]
    table["beats_baselines"] = beats
    table["selected"] = False
    metric = _headline_metric(table)
    for _, rows_of_file in table.groupby("file", sort=False):
        candidates = rows_of_file[rows_of_file["metric"] == metric]
        if candidates["validation"].isna().all():
            continue
        best = candidates.loc[candidates["validation"].idxmax()]  # idxmax: the first (earliest layer) of ties
        chosen = rows_of_file.index[(rows_of_file["layer"] == best["layer"]) & (rows_of_file["site"] == best["site"])]
        table.loc[chosen, "selected"] = True
    return table


def _headline_metric(table: pd.DataFrame) -> str | None:
    return next((metric for metric in HEADLINE_METRICS if (table["metric"] == metric).any()), None)


def _probe_table(kind: str, code_files, label, fit_split, test_split, layers, per_site, seed, cv, grid, progress):
    """Files x layers x sites -> table: the loop `decode` (kind "decode") and `regress` share."""
    files = _as_code_files(code_files)
    read_labels = _decoding_labels if kind == "decode" else _regression_labels
    labelled_files = [read_labels(code_file, label, fit_split, test_split, cv) for code_file in files]
    probe_sites = _probe_sites(labelled_files, layers, per_site)
    rows = []
    # The probes are small (thousands x tens): BLAS / OpenMP threads only add overhead, which
    # grows severalfold on a busy machine. One thread for the duration, restored after.
    with threadpool_limits(limits=1):
        for probe_site, codes_fit, codes_test, note in _codes(probe_sites, fit_split, test_split, progress,
                                                               f"{kind} {label}"):
            labels = probe_site.labels
            if kind == "regress":
                probe_rows = _regress(labels, codes_fit, codes_test, grid, cv, seed)
            elif labels.fit.ndim == 2:
                probe_rows = _decode_multi_hot(labels, codes_fit, codes_test, grid, cv, seed, test_split)
            else:
                probe_rows = _decode_categorical(labels, codes_fit, codes_test, grid, cv, seed)
            common = dict(model=labels.code_file.model_name, file=str(labels.code_file.path), layer=probe_site.layer,
                          site=probe_site.site, label=labels.name, n_fit=len(codes_fit), n_test=len(codes_test),
                          fit_split=fit_split, test_split=test_split, seed=seed)
            rows += [{**common, **row, "note": _join(note, row.get("note", ""))} for row in probe_rows]
    return _table(rows)


def decode(
    code_files: str | Path | CodeFile | Iterable[str | Path | CodeFile],
    label: str,
    fit_split: str = "train",
    test_split: str = "ood",
    layers: Sequence[int] | None = None,
    per_site: bool = False,
    seed: int = 0,
    cv: int = 3,
    Cs: Sequence[float] = DEFAULT_CS,
    progress: bool = True,
) -> pd.DataFrame:
    """Logistic-regression decoding of a label from the latent codes, per layer, beside baselines.

    Args:
        code_files: one codes file (path or `CodeFile`) or several (models side by side).
        label: a label spec (see `latentcode.analysis.labels`): a categorical ``[N]`` label (e.g.
            ``rule``, ``query_rule[-1]``) gets one multinomial probe; a multi-hot ``[N, C]`` 0/1
            label (e.g. ``term_present``) one binary probe per column (metrics: module docstring).
        fit_split, test_split: the split the probes are fitted (and their layer chosen) on, and
            the one they are scored on.
        layers: the layers to probe (default: all).
        per_site: one probe per site (site column: the site's name) instead of one per layer on
            the codes of all its sites concatenated (site column: ``"all"``).
        seed: seeds the cross-validation folds and the label permutation of the control.
        cv: folds of the cross-validation that picks C on the fitting split.
        Cs: the grid of inverse regularization strengths C.
        progress: a progress bar over the probes (tqdm, on stderr).

    Returns:
        A tidy table, one row per (file, layer, site, label, metric); columns `COLUMNS`.
    """
    return _probe_table("decode", code_files, label, fit_split, test_split, layers, per_site, seed, cv, Cs, progress)


def regress(
    code_files: str | Path | CodeFile | Iterable[str | Path | CodeFile],
    label: str,
    fit_split: str = "train",
    test_split: str = "ood",
    layers: Sequence[int] | None = None,
    per_site: bool = False,
    seed: int = 0,
    cv: int = 3,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    progress: bool = True,
) -> pd.DataFrame:
    """Ridge regression from the latent codes to a continuous or multi-hot label, per layer; R².

    Trailing dimensions of the label are flattened (``negation_bits`` ``[N, K, L]`` -> ``K*L``
    outputs, one shared alpha chosen by cross-validated mean R² on the fitting split). A label with
    one output gives one row per probe, metric ``r2``; a label with several gives a row per output
    (label ``negation_bits[k,l]``, metric ``r2``, NaN where the output is constant on the test
    split) and their mean (label ``negation_bits``, metric ``mean_r2``, over the outputs with a
    defined R²). Baselines: ``shuffled_labels`` and ``majority`` (the fit split's mean, R² <= 0).
    Arguments as in `decode`; ``alphas`` is the ridge penalty grid.
    """
    return _probe_table("regress", code_files, label, fit_split, test_split, layers, per_site, seed, cv, alphas,
                        progress)


# -- summaries -------------------------------------------------------------------------------------
def headline_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The selected layer's row of the headline metric (the first of `HEADLINE_METRICS` the
    table has), one per file: the number to report, chosen without looking at the test split."""
    metric = _headline_metric(table)
    return table[(table["metric"] == metric) & table["selected"].astype(bool)]


def summary_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the probes' own label, every metric: without the per-column rows of a
    multi-hot label or the per-output rows of a ridge probe on several outputs."""
    headline = table[table["metric"] == _headline_metric(table)]
    return table[table["label"].isin(set(headline["label"]))]


def headline_lines(table: pd.DataFrame) -> list[str]:
    """One line per file: the selected layer, its headline metric (and, for a multi-hot label, mean
    AUROC and mean F1), each beside its strongest baseline and whether the probe beats it."""
    lines = []
    for _, best in headline_rows(table).iterrows():
        same_probe = table[(table["file"] == best["file"]) & (table["layer"] == best["layer"])
                           & (table["site"] == best["site"]) & (table["label"] == best["label"])]
        parts = []
        for metric in (best["metric"], *_COMPANION_METRICS.get(best["metric"], ())):
            rows = same_probe[same_probe["metric"] == metric]
            if len(rows):
                parts.append(_versus_baseline(rows.iloc[0]))
        site = "" if best["site"] == "all" else f" site {best['site']}"
        lines.append(f"{best['model']:12s} decoding {best['label']} ({best['fit_split']} -> {best['test_split']}), "
                     f"layer {int(best['layer'])}{site} chosen on {best['fit_split']}: " + "; ".join(parts))
    return lines


def _versus_baseline(row: pd.Series) -> str:
    text = f"{row['metric']} {row['value']:.3f}"
    if not row["strongest_baseline"]:
        return text
    if pd.isna(row["beats_baselines"]):
        verdict = "vs"
    else:
        verdict = "beats" if row["beats_baselines"] else "not above"
    return f"{text} {verdict} {row['strongest_baseline']} {row['strongest_baseline_value']:.3f}"


def write_table(table: pd.DataFrame, path_stem: str | Path) -> list[Path]:
    """Write a probe table as ``<stem>.csv`` and ``<stem>.json`` (a list of records); returns the paths."""
    stem = Path(path_stem)
    csv_path, json_path = stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".json")
    # Both or neither, through temporaries (a full disk leaves no truncated CSV beside an old JSON).
    with AtomicOutputs(lock=stem, purpose="writing a probe table") as outputs:
        table.to_csv(outputs.temporary(csv_path), index=False)
        table.to_json(outputs.temporary(json_path), orient="records", indent=1)
    return [csv_path, json_path]
