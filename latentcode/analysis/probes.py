"""Linear probes on latent codes: decode a label from the codes of each layer, with chance levels.

The paper fits a logistic regression on the latent codes of in-distribution tasks and scores it on
tasks of unseen composition. `decode` does that per layer (all sites of a layer concatenated, or
each site alone), for one codes file or several models side by side; `regress` is the ridge
counterpart for continuous or multi-hot labels (R²). Every probe is a scikit-learn
``Pipeline(StandardScaler, estimator)`` whose regularization is chosen by a grid search with
k-fold cross-validation (stratified for classification) on the fitting split only, every fold
standardized with its own training part; the test split is touched once, to score. Fitting is
single-threaded (``n_jobs=1``, one BLAS thread): at these sizes threads only add overhead.

Chance levels, beside every score:

- ``chance``: the shuffled-label control. The fitting labels are permuted (rows, with the seed:
  ``np.random.default_rng(seed).permutation``), a probe is fitted to them exactly as the real one
  (same pipeline, same grid, same folds) and scored on the true test labels.
- ``chance_majority``: a constant predictor, scored on the test split: the most frequent class of
  the fitting split (ties: the smallest class) for classification, the fitting split's mean for
  regression (R² <= 0).

Labels whose values are missing from one of the splits:

- categorical: test classes that never occur in the fitting split cannot be predicted; they count
  as errors in accuracy and enter macro-F1 (over the classes present in the test labels or the
  predictions) with F1 0. The ``note`` column names them.
- multi-hot: a column that never (or always) takes the value 1 in the fitting split gets no probe;
  it is predicted as that constant (so its F1 is 0 where the test split has positives), and the
  ``note`` column says so. Per-column F1 is NaN where neither the test labels nor the
  predictions have a positive. ``mean_f1`` averages the columns that have at least one positive
  in the test split (for fuzzy logic: the terms of the test functions); ``chance`` and
  ``chance_majority`` of ``mean_f1`` average the same columns.

The result is a tidy ``pandas.DataFrame`` with the columns of `COLUMNS`; `write_table` writes it as
CSV and JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import f1_score
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from latentcode.analysis.labels import label_spec_name, parse_label_spec, select_label
from latentcode.store import CodeFile

__all__ = ["COLUMNS", "DEFAULT_ALPHAS", "DEFAULT_CS", "decode", "regress", "write_table"]

DEFAULT_CS = (0.01, 0.1, 1.0, 10.0, 100.0)
DEFAULT_ALPHAS = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)
COLUMNS = (
    "model", "file", "layer", "site", "label", "metric", "value", "chance", "chance_majority",
    "n_fit", "n_test", "regularization_param", "regularization", "fit_split", "test_split", "seed",
    "note",
)
_MAX_ITER = 1000


def _accuracy(labels, predicted) -> float:
    return float(np.mean(labels == predicted))


def _f1_or_zero(labels, predicted) -> float:
    """F1 of the positive class (0 where undefined), to choose C for the binary probes: the number
    ``f1_score(labels, predicted, zero_division=0)`` gives, several times faster."""
    predicted, labels = np.asarray(predicted).astype(bool), np.asarray(labels).astype(bool)
    true_positives = np.count_nonzero(predicted & labels)
    denominator = np.count_nonzero(predicted) + np.count_nonzero(labels)
    return 2.0 * true_positives / denominator if denominator else 0.0


# -- inputs ----------------------------------------------------------------------------------------
def _as_code_files(code_files) -> list[CodeFile]:
    if isinstance(code_files, (str, Path, CodeFile)):
        code_files = [code_files]
    files = [item if isinstance(item, CodeFile) else CodeFile(item) for item in code_files]
    if not files:
        raise ValueError("no codes files given")
    return files


def _site_groups(code_file: CodeFile, layer: int, per_site: bool):
    """``(site column value, sites, description)`` for each probe of a layer."""
    sites = code_file.sites_of_layer(layer)
    if per_site:
        return [(site.name, [site], f"site {site.name}") for site in sites]
    names = ", ".join(site.name for site in sites)
    return [("all", sites, f"site all ({len(sites)} site{'s' * (len(sites) > 1)}: {names})")]


def _read_codes(code_file: CodeFile, sites, split: str, layer: int, where: str) -> np.ndarray:
    codes = np.concatenate([code_file.codes(site, split) for site in sites], axis=1).astype(np.float64)
    bad = ~np.isfinite(codes)
    if bad.any():
        raise ValueError(
            f"the codes of layer {layer} at {where} in split {split!r} of {code_file.path} contain NaN "
            f"or inf in {int(bad.any(axis=1).sum())} of {len(codes)} examples; probes need finite codes"
        )
    return codes


def _check_not_constant(codes: np.ndarray, code_file: CodeFile, layer: int, where: str, split: str) -> None:
    if len(codes) and np.ptp(codes, axis=0).max() == 0:
        raise ValueError(
            f"the codes of layer {layer} at {where} are constant in split {split!r} of {code_file.path} "
            f"(each of the {codes.shape[1]} code entries takes a single value over all {len(codes)} "
            "examples): there is nothing to decode from"
        )


def _check_sizes(n_fit: int, n_test: int, cv: int, code_file: CodeFile, fit_split: str, test_split: str) -> None:
    if cv < 2:
        raise ValueError(f"cv={cv}: cross-validation needs at least 2 folds")
    if n_fit < cv:
        raise ValueError(
            f"split {fit_split!r} of {code_file.path} has {n_fit} examples; fitting with {cv}-fold "
            f"cross-validation needs at least {cv}"
        )
    if n_test == 0:
        raise ValueError(f"split {test_split!r} of {code_file.path} has no examples to score on")


def _as_class_labels(values: np.ndarray, name: str, what: str) -> np.ndarray:
    if values.dtype.kind == "b":
        return values.astype(np.int64)
    if values.dtype.kind == "f":
        if not (np.isfinite(values).all() and np.all(values == np.round(values))):
            raise ValueError(
                f"label {name!r} holds continuous values; {what} needs classes (integers). "
                "Use regress() for continuous labels"
            )
        return values.astype(np.int64)
    return values


def _check_class_counts(labels: np.ndarray, cv: int, name: str, split: str, code_file: CodeFile, column: str = "") -> None:
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise ValueError(
            f"label {name!r}{column} has a single class ({classes[0] if len(classes) else 'none'}) in split "
            f"{split!r} of {code_file.path}: a classifier needs at least 2"
        )
    few = counts < cv
    if few.any():
        listed = ", ".join(f"class {c} has {n}" for c, n in zip(classes[few], counts[few], strict=True))
        raise ValueError(
            f"split {split!r} of {code_file.path} has too few examples of label {name!r}{column} to fit "
            f"with {cv}-fold cross-validation: {listed}; every class needs at least {cv} examples "
            "(use a larger split or a smaller cv)"
        )


def _is_multi_hot(values: np.ndarray) -> bool:
    return values.ndim == 2 and values.dtype.kind in "biuf" and bool(np.isin(values, (0, 1)).all())


def _shuffled(values: np.ndarray, seed: int) -> np.ndarray:
    return values[np.random.default_rng(seed).permutation(len(values))]


# -- estimators ------------------------------------------------------------------------------------
def _logistic(C: float = 1.0, warm_start: bool = False) -> LogisticRegression:
    return LogisticRegression(C=C, solver="newton-cg", max_iter=_MAX_ITER, warm_start=warm_start)


def _fit_logistic(codes, labels, Cs, cv, seed, score) -> tuple[Pipeline, float, np.ndarray]:
    """A ``Pipeline(StandardScaler, LogisticRegression)`` probe whose C has the best mean
    `score(truth, predicted)` over stratified `cv`-fold cross-validation on (codes, labels) (ties:
    the smaller C), refitted on all of them; returns ``(probe, C, mean validation score per C of
    sorted(Cs))``.

    This is the grid search ``GridSearchCV(probe, {"C": Cs})`` performs, done by hand for speed:
    each fold standardizes once (with its own training part) rather than once per C, and walks the
    grid from strong to weak regularization, each fit starting from the previous solution (warm
    start), so the same solutions take fewer iterations.
    """
    Cs = sorted(Cs)
    scores = np.zeros(len(Cs))
    for train, validation in StratifiedKFold(n_splits=cv, shuffle=True, random_state=seed).split(codes, labels):
        scaler = StandardScaler().fit(codes[train])
        fold_train, fold_validation = scaler.transform(codes[train]), scaler.transform(codes[validation])
        logistic = _logistic(warm_start=True)
        for index, C in enumerate(Cs):
            logistic.set_params(C=C).fit(fold_train, labels[train])
            scores[index] += score(labels[validation], logistic.predict(fold_validation))
    best = Cs[int(np.argmax(scores))]
    probe = Pipeline([("standardize", StandardScaler()), ("logistic", _logistic(C=best))])
    return probe.fit(codes, labels), float(best), scores / cv


def _fit_ridge(codes, targets, alphas, cv, seed) -> GridSearchCV:
    pipeline = Pipeline([("standardize", StandardScaler()), ("ridge", Ridge())])
    search = GridSearchCV(
        pipeline, {"ridge__alpha": list(alphas)}, scoring="r2", n_jobs=1, error_score="raise",
        cv=KFold(n_splits=cv, shuffle=True, random_state=seed),
    )
    return search.fit(codes, targets)


def _majority(labels: np.ndarray):
    classes, counts = np.unique(labels, return_counts=True)
    return classes[np.argmax(counts)]  # argmax takes the first: ties go to the smallest class


def _macro_f1(truth, predicted) -> float:
    return float(f1_score(truth, predicted, average="macro", zero_division=0.0))


def _binary_f1(truth, predicted) -> float:
    # NaN where neither truth nor prediction has a positive: F1 is undefined there.
    return float(f1_score(truth, predicted, zero_division=np.nan))


def _r2_per_output(truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    total = ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)
    residual = ((truth - predicted) ** 2).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, 1.0 - residual / np.where(total > 0, total, 1.0), np.nan)


# -- the probes ------------------------------------------------------------------------------------
def _decode_categorical(codes_fit, codes_test, y_fit, y_test, Cs, cv, seed, row):
    probe, C, _ = _fit_logistic(codes_fit, y_fit, Cs, cv, seed, _accuracy)
    control, _, _ = _fit_logistic(codes_fit, _shuffled(y_fit, seed), Cs, cv, seed, _accuracy)
    predicted, predicted_control = probe.predict(codes_test), control.predict(codes_test)
    majority = np.full_like(y_test, _majority(y_fit))
    unseen = np.setdiff1d(np.unique(y_test), np.unique(y_fit))
    note = (
        f"test classes {unseen.tolist()} never occur in the fit split: the probe cannot predict them"
        if len(unseen) else ""
    )
    return [
        row(metric=metric, value=score(y_test, predicted), chance=score(y_test, predicted_control),
            chance_majority=score(y_test, majority), regularization_param="C", regularization=C, note=note)
        for metric, score in (("accuracy", _accuracy), ("macro_f1", _macro_f1))
    ]


def _decode_multi_hot(codes_fit, codes_test, y_fit, y_test, Cs, cv, seed, row, base_name, base_index):
    y_fit_control = _shuffled(y_fit, seed)  # whole rows permuted: every column keeps its counts
    scores = np.full((3, y_fit.shape[1]), np.nan)  # value, chance, chance_majority per column
    rows = []
    for column in range(y_fit.shape[1]):
        fit_column, test_column = y_fit[:, column], y_test[:, column]
        seen = np.unique(fit_column)
        if len(seen) == 1:
            constant = np.full_like(test_column, seen[0])
            scores[:, column] = _binary_f1(test_column, constant)
            C, note = np.nan, (
                f"value {1 - seen[0]} never occurs in the fit split: no probe, predicted {seen[0]} throughout"
            )
        else:
            probe, C, _ = _fit_logistic(codes_fit, fit_column, Cs, cv, seed, _f1_or_zero)
            control, _, _ = _fit_logistic(codes_fit, y_fit_control[:, column], Cs, cv, seed, _f1_or_zero)
            majority = np.full_like(test_column, _majority(fit_column))
            scores[:, column] = [
                _binary_f1(test_column, probe.predict(codes_test)),
                _binary_f1(test_column, control.predict(codes_test)),
                _binary_f1(test_column, majority),
            ]
            note = ""
        rows.append(row(
            label=label_spec_name(base_name, (*base_index, column)), metric="f1", value=scores[0, column],
            chance=scores[1, column], chance_majority=scores[2, column], regularization_param="C",
            regularization=C, note=note,
        ))
    with_positives = y_test.sum(axis=0) > 0
    means = scores[:, with_positives].mean(axis=1) if with_positives.any() else np.full(3, np.nan)
    rows.append(row(
        metric="mean_f1", value=means[0], chance=means[1], chance_majority=means[2],
        regularization_param="C", regularization=np.nan,
        note=f"mean over the {int(with_positives.sum())} of {len(with_positives)} columns with a positive "
             "in the test split",
    ))
    return rows


def _check_fit_columns(y_fit: np.ndarray, cv: int, name: str, split: str, code_file: CodeFile) -> None:
    for column in range(y_fit.shape[1]):
        counts = np.bincount(y_fit[:, column].astype(np.int64), minlength=2)
        if counts.min() > 0:  # a column constant in the fit split is handled, not refused
            _check_class_counts(y_fit[:, column], cv, name, split, code_file, column=f" (column {column})")


def _iterate(code_files, label, fit_split, test_split, layers, per_site, cv, seed, prepare, probe):
    """Shared loop of `decode` and `regress`: files x layers x site groups -> table.

    ``prepare(y_fit, y_test, name, code_file)`` checks and converts a file's labels;
    ``probe(codes_fit, codes_test, y_fit, y_test, name, row)`` fits and scores, returning rows
    made with ``row(**fields)`` (which fills in the columns common to the probe).
    """
    rows = []
    # The probes are small (thousands x tens): BLAS / OpenMP threads only add overhead, which
    # grows severalfold on a busy machine. One thread for the duration, restored after.
    with threadpool_limits(limits=1):
        for code_file in _as_code_files(code_files):
            y_fit, name = select_label(code_file, label, fit_split)
            y_test, _ = select_label(code_file, label, test_split)
            _check_sizes(len(y_fit), len(y_test), cv, code_file, fit_split, test_split)
            y_fit, y_test = prepare(y_fit, y_test, name, code_file)
            groups, constant_groups = 0, []
            for layer in code_file.layers if layers is None else layers:
                for site, sites, where in _site_groups(code_file, layer, per_site):
                    codes_fit = _read_codes(code_file, sites, fit_split, layer, where)
                    codes_test = _read_codes(code_file, sites, test_split, layer, where)
                    groups += 1
                    # Constant codes carry no information: the probe can only learn the class
                    # prior. That is a finding for one layer (e.g. HYLA's first layer on a fixed
                    # query), so it is noted; a file whose codes are constant everywhere is refused.
                    is_constant = len(codes_fit) and np.ptp(codes_fit, axis=0).max() == 0
                    if is_constant:
                        constant_groups.append(codes_fit)
                    common = dict(
                        model=code_file.model_name, file=str(code_file.path), layer=int(layer), site=site,
                        label=name, n_fit=len(codes_fit), n_test=len(codes_test), fit_split=fit_split,
                        test_split=test_split, seed=seed, note="",
                    )

                    if is_constant:
                        common["note"] = (f"codes constant in split {fit_split!r}: the probe can only learn "
                                          "the class prior")

                    def row(_common=common, **fields):
                        notes = [note for note in (_common["note"], fields.get("note")) if note]
                        return {**_common, **fields, "note": "; ".join(notes)}

                    rows += probe(codes_fit, codes_test, y_fit, y_test, name, row)
            if groups and len(constant_groups) == groups:
                layer = (code_file.layers if layers is None else list(layers))[0]
                _check_not_constant(constant_groups[0], code_file, layer, _site_groups(code_file, layer, per_site)[0][2],
                                    fit_split)
    return pd.DataFrame(rows, columns=list(COLUMNS))


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
) -> pd.DataFrame:
    """Logistic-regression decoding of a label from the latent codes, per layer.

    Args:
        code_files: one codes file (path or `CodeFile`) or several (models side by side).
        label: a label spec (see `latentcode.analysis.labels`): a categorical ``[N]`` label (e.g.
            ``rule``, ``query_rule[-1]``) gets one multinomial probe, metrics ``accuracy`` and
            ``macro_f1``; a multi-hot ``[N, C]`` 0/1 label (e.g. ``term_present``) one binary
            probe per column, metric ``f1`` per column (label ``term_present[j]``) and
            ``mean_f1`` (label ``term_present``).
        fit_split, test_split: the split the probes are fitted on, and the one they are scored on.
        layers: the layers to probe (default: all).
        per_site: one probe per site (site column: the site's name) instead of one per layer on
            the codes of all its sites concatenated (site column: ``"all"``).
        seed: seeds the cross-validation folds and the label permutation of the control.
        cv: folds of the cross-validation that picks C on the fitting split.
        Cs: the grid of inverse regularization strengths C.

    Returns:
        A tidy table, one row per (file, layer, site, label, metric); columns `COLUMNS`.
    """

    def prepare(y_fit, y_test, name, code_file):
        if _is_multi_hot(y_fit):
            y_fit, y_test = y_fit.astype(np.int64), y_test.astype(np.int64)
            _check_fit_columns(y_fit, cv, name, fit_split, code_file)
            return y_fit, y_test
        if y_fit.ndim != 1:
            raise ValueError(
                f"label {name!r} has shape [N, {', '.join(map(str, y_fit.shape[1:]))}] and is not multi-hot "
                f"(0/1): decode one column, e.g. '{name}[-1]', or use regress() for several outputs"
            )
        y_fit = _as_class_labels(y_fit, name, "decode()")
        y_test = _as_class_labels(y_test, name, "decode()")
        _check_class_counts(y_fit, cv, name, fit_split, code_file)
        return y_fit, y_test

    def probe(codes_fit, codes_test, y_fit, y_test, name, row):
        if y_fit.ndim == 2:
            base_name, base_index = parse_label_spec(name)
            return _decode_multi_hot(codes_fit, codes_test, y_fit, y_test, Cs, cv, seed, row, base_name, base_index)
        return _decode_categorical(codes_fit, codes_test, y_fit, y_test, Cs, cv, seed, row)

    return _iterate(code_files, label, fit_split, test_split, layers, per_site, cv, seed, prepare, probe)


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
) -> pd.DataFrame:
    """Ridge regression from the latent codes to a continuous or multi-hot label, per layer; R².

    Trailing dimensions of the label are flattened (``negation_bits`` ``[N, K, L]`` -> ``K*L``
    outputs, one shared alpha chosen by cross-validated mean R² on the fitting split). A label with
    one output gives one row per probe, metric ``r2``; a label with several gives a row per output
    (label ``negation_bits[k,l]``, metric ``r2``, NaN where the output is constant on the test
    split) and their mean (label ``negation_bits``, metric ``mean_r2``, over the outputs with a
    defined R²). Arguments as in `decode`; ``alphas`` is the ridge penalty grid.
    """

    output_shape: list[tuple[int, ...]] = [()]  # of the current file's label, before flattening

    def prepare(y_fit, y_test, name, code_file):
        if y_fit.dtype.kind not in "biuf":
            raise ValueError(f"label {name!r} has dtype {y_fit.dtype}; regress() needs numbers")
        output_shape[0] = y_fit.shape[1:]
        return (y_fit.reshape(len(y_fit), -1).astype(np.float64),
                y_test.reshape(len(y_test), -1).astype(np.float64))

    def probe(codes_fit, codes_test, y_fit, y_test, name, row):
        probe_ = _fit_ridge(codes_fit, y_fit, alphas, cv, seed)
        control = _fit_ridge(codes_fit, _shuffled(y_fit, seed), alphas, cv, seed)
        constant = np.broadcast_to(y_fit.mean(axis=0), y_test.shape)
        scores = np.stack([
            _r2_per_output(y_test, probe_.predict(codes_test).reshape(y_test.shape)),
            _r2_per_output(y_test, control.predict(codes_test).reshape(y_test.shape)),
            _r2_per_output(y_test, constant),
        ])
        alpha = float(probe_.best_params_["ridge__alpha"])
        common = dict(regularization_param="alpha", regularization=alpha)
        if y_fit.shape[1] == 1:
            return [row(metric="r2", value=scores[0, 0], chance=scores[1, 0], chance_majority=scores[2, 0], **common)]
        base_name, base_index = parse_label_spec(name)
        rows = [
            row(label=label_spec_name(base_name, (*base_index, *index)), metric="r2", value=scores[0, i],
                chance=scores[1, i], chance_majority=scores[2, i], **common)
            for i, index in enumerate(np.ndindex(*output_shape[0]))
        ]
        defined = ~np.isnan(scores[0])
        means = scores[:, defined].mean(axis=1) if defined.any() else np.full(3, np.nan)
        rows.append(row(
            metric="mean_r2", value=means[0], chance=means[1], chance_majority=means[2],
            note=f"mean over the {int(defined.sum())} of {len(defined)} outputs not constant on the test split",
            **common,
        ))
        return rows

    return _iterate(code_files, label, fit_split, test_split, layers, per_site, cv, seed, prepare, probe)


def write_table(table: pd.DataFrame, path_stem: str | Path) -> list[Path]:
    """Write a probe table as ``<stem>.csv`` and ``<stem>.json`` (a list of records); returns the paths."""
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".json")
    table.to_csv(csv_path, index=False)
    table.to_json(json_path, orient="records", indent=1)
    return [csv_path, json_path]
