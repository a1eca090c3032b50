"""What the probes are fitted to: for each file the label on both splits, checked, with its
baselines (`ProbeLabels`), and for each layer (or site) the codes of both splits (`probe_codes`).

A label is refused, with the file, split and label named, where no probe could be fitted: too few
examples for the folds, a single class, too few examples of a class, continuous values to decode,
codes that are not finite, or codes constant at every site probed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from latentcode.analysis.baselines import binary_baselines, categorical_baselines, regression_baselines
from latentcode.analysis.labels import select_label
from latentcode.analysis.probes.estimators import ProbeError, classes_too_rare
from latentcode.store import CodeFile

__all__ = ["ProbeLabels", "ProbeSite", "decoding_labels", "probe_codes", "probe_sites", "regression_labels"]


@dataclass
class ProbeLabels:
    """The label of one file on both splits, checked and converted, with its baselines."""

    code_file: CodeFile
    name: str
    fit: np.ndarray
    test: np.ndarray
    baselines: dict | list
    note: str = ""
    output_shape: tuple[int, ...] = ()  # of a label to regress on, before flattening


@dataclass(frozen=True)
class ProbeSite:
    """One probe: a layer of a file, all its sites (``site`` "all") or one."""

    labels: ProbeLabels
    layer: int
    site: str
    sites: tuple
    where: str


def probe_sites(labelled_files: Sequence[ProbeLabels], layers, per_site: bool) -> list[ProbeSite]:
    probe_sites = []
    for labels in labelled_files:
        code_file = labels.code_file
        for layer in code_file.layers if layers is None else layers:
            sites = code_file.sites_of_layer(layer)
            if per_site:
                probe_sites += [ProbeSite(labels, int(layer), site.name, (site,), f"site {site.name}")
                                for site in sites]
            else:
                names = ", ".join(site.name for site in sites)
                where = f"site all ({len(sites)} site{'s' * (len(sites) > 1)}: {names})"
                probe_sites.append(ProbeSite(labels, int(layer), "all", tuple(sites), where))
    return probe_sites


def _read_codes(probe_site: ProbeSite, split: str) -> np.ndarray:
    code_file = probe_site.labels.code_file
    codes = np.concatenate([code_file.codes(site, split) for site in probe_site.sites], axis=1).astype(np.float64)
    bad = ~np.isfinite(codes)
    if bad.any():
        raise ProbeError(
            f"the codes of layer {probe_site.layer} at {probe_site.where} in split {split!r} of {code_file.path} "
            f"contain NaN or inf in {int(bad.any(axis=1).sum())} of {len(codes)} examples; probes need finite codes"
        )
    return codes


def probe_codes(probe_sites: Sequence[ProbeSite], fit_split: str, test_split: str, progress: bool, description: str
           ) -> Iterator[tuple[ProbeSite, np.ndarray, np.ndarray, str]]:
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


def _check_sizes(labels: ProbeLabels, cv: int, fit_split: str, test_split: str) -> None:
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
    classes = np.unique(labels)
    if len(classes) < 2:
        raise ProbeError(
            f"label {name!r}{column} has a single class ({classes[0] if len(classes) else 'none'}) in split "
            f"{split!r} of {code_file.path}: a classifier needs at least 2"
        )
    listed = classes_too_rare(labels, cv)
    if listed:
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


def decoding_labels(code_file: CodeFile, label: str, fit_split: str, test_split: str, cv: int) -> ProbeLabels:
    """The label of a file to decode, checked: class labels ``[N]`` or 0/1 labels ``[N, C]``."""
    y_fit, name = select_label(code_file, label, fit_split)
    y_test, _ = select_label(code_file, label, test_split)
    labels = ProbeLabels(code_file, name, y_fit, y_test, baselines={})
    _check_sizes(labels, cv, fit_split, test_split)
    if y_fit.ndim == 2 and y_fit.dtype.kind in "biuf" and np.isin(y_fit, (0, 1)).all():  # multi-hot
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


def regression_labels(code_file: CodeFile, label: str, fit_split: str, test_split: str, cv: int) -> ProbeLabels:
    """The label of a file to regress on, trailing dimensions flattened: ``[N, K]`` floats."""
    y_fit, name = select_label(code_file, label, fit_split)
    y_test, _ = select_label(code_file, label, test_split)
    if y_fit.dtype.kind not in "biuf":
        raise ProbeError(f"label {name!r} has dtype {y_fit.dtype}; regress() needs numbers")
    labels = ProbeLabels(code_file, name, y_fit.reshape(len(y_fit), -1).astype(np.float64),
                     y_test.reshape(len(y_test), -1).astype(np.float64), baselines={},
                     output_shape=y_fit.shape[1:])
    _check_sizes(labels, cv, fit_split, test_split)
    labels.baselines = regression_baselines(labels.fit, labels.test)
    return labels
