"""`decode` and `regress`: probes per layer (or site) of one codes file or several, as one table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
from threadpoolctl import threadpool_limits

from latentcode.analysis.probe_plan import plan_probe
from latentcode.analysis.probes.estimators import DEFAULT_ALPHAS, DEFAULT_CS
from latentcode.analysis.probes.inputs import decoding_labels, probe_codes, probe_sites, regression_labels
from latentcode.analysis.probes.rows import categorical_rows, join_notes, multi_hot_rows, regression_rows
from latentcode.analysis.probes.table import assemble_table
from latentcode.store import CodeFile

__all__ = ["decode", "regress"]


def _probe_table(kind: str, code_files, label, fit_split, test_split, layers, per_site, seed, cv, grid, progress):
    """Files x layers x sites -> table: the loop `decode` (kind "decode") and `regress` share, after
    the checks `latentcode probe` makes too (`plan_probe`)."""
    plan = plan_probe(code_files, label, fit_split, test_split, cv=cv, seed=seed)
    label = plan.label  # the files opened and checked by the plan
    read_labels = decoding_labels if kind == "decode" else regression_labels
    labelled_files = [read_labels(code_file, label, fit_split, test_split, cv) for code_file in plan.code_files]
    sites = probe_sites(labelled_files, layers, per_site)
    rows = []
    # The probes are small (thousands x tens): BLAS / OpenMP threads only add overhead, which
    # grows severalfold on a busy machine. One thread for the duration, restored after.
    with threadpool_limits(limits=1):
        for probe_site, codes_fit, codes_test, note in probe_codes(sites, fit_split, test_split, progress,
                                                                   f"{kind} {label}"):
            labels = probe_site.labels
            if kind == "regress":
                probe_rows = regression_rows(labels, codes_fit, codes_test, grid, cv, seed)
            elif labels.fit.ndim == 2:
                probe_rows = multi_hot_rows(labels, codes_fit, codes_test, grid, cv, seed, test_split)
            else:
                probe_rows = categorical_rows(labels, codes_fit, codes_test, grid, cv, seed)
            common = dict(model=labels.code_file.model_name, file=str(labels.code_file.path), layer=probe_site.layer,
                          site=probe_site.site, label=labels.name, n_fit=len(codes_fit), n_test=len(codes_test),
                          fit_split=fit_split, test_split=test_split, seed=seed)
            rows += [{**common, **row, "note": join_notes(note, row.get("note", ""))} for row in probe_rows]
    return assemble_table(rows)


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
            label (e.g. ``term_present``) one binary probe per column (metrics: docs/how-to/probe.md).
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
