"""The rows of one probe site: the probe and its shuffled-label control fitted on the fit split,
scored on the test split (``value``), out of fold on the fit split (``validation``), beside the
label's baselines; per column and their means for a multi-hot label, per output and their mean for
a ridge probe on several outputs.
"""

from __future__ import annotations

import numpy as np

from latentcode.analysis.baselines import BASELINES
from latentcode.analysis.labels import label_spec_name, parse_label_spec
from latentcode.analysis.probes.estimators import LogisticProbe, MultiHotProbe, RidgeProbe
from latentcode.analysis.probes.inputs import ProbeLabels
from latentcode.analysis.scores import (
    BINARY_METRICS,
    CATEGORICAL_METRICS,
    binary_scores,
    categorical_scores,
    r2_per_output,
    why_undefined,
)

__all__ = ["categorical_rows", "join_notes", "multi_hot_rows", "regression_rows"]


def _shuffled(values: np.ndarray, seed: int) -> np.ndarray:
    # Whole rows permuted: every column of a multi-hot label keeps its counts.
    return values[np.random.default_rng(seed).permutation(len(values))]


def join_notes(*notes: str) -> str:
    """The non-empty notes, joined by "; "."""
    return "; ".join(note for note in notes if note)


def categorical_rows(labels: ProbeLabels, codes_fit, codes_test, Cs, cv, seed) -> list[dict]:
    """One row per `CATEGORICAL_METRICS` of a `LogisticProbe` on class labels; codes ``[N_fit, F]``
    and ``[N_test, F]``."""
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


def multi_hot_rows(labels: ProbeLabels, codes_fit, codes_test, Cs, cv, seed, test_split) -> list[dict]:
    """One row per column and `BINARY_METRICS` of a `MultiHotProbe` on 0/1 labels ``[N, C]``, then one
    per metric for the mean over the columns where it is defined."""
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
                note=join_notes(no_probe, why_undefined(metric, truth, test_split) if np.isnan(test[metric]) else ""),
            ))
    def defined_in(values: np.ndarray, metric: str) -> np.ndarray:  # [C]: where the metric is defined
        return values.any(axis=0) if metric == "f1" else (values.min(axis=0) == 0) & (values.max(axis=0) == 1)

    n_columns = labels.fit.shape[1]
    for metric in BINARY_METRICS:
        what = "a 1" if metric == "f1" else "both values"
        rows_of_metric = [row for row in per_column if row["metric"] == metric]
        defined, defined_in_fit = defined_in(labels.test, metric), defined_in(labels.fit, metric)
        note = (f"mean over the {int(defined.sum())} of {n_columns} columns with {what} in split {test_split!r}"
                if defined.any() else f"mean_{metric} undefined: no column has {what} in split {test_split!r}")
        rows.append(dict(
            metric=f"mean_{metric}", value=_mean_over(rows_of_metric, "value", defined),
            validation=_mean_over(rows_of_metric, "validation", defined_in_fit),
            **{field: _mean_over(rows_of_metric, field, defined) for field in BASELINES},
            regularization_param="C", regularization=np.nan, note=note,
        ))
    return rows


def regression_rows(labels: ProbeLabels, codes_fit, codes_test, alphas, cv, seed) -> list[dict]:
    """The R² row of a `RidgeProbe` on targets ``[N, K]``: one for K = 1, else one per output and their
    mean."""
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
                     note=f"mean over the {int(defined.sum())} of {len(defined)} outputs not constant on the test "
                          "split"))
    return rows
