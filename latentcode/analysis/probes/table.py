"""The probe table: its columns, the strongest baseline of each row, the layer chosen in each file
(on the fit split), the rows and lines that summarize it, and its CSV and JSON files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from latentcode.analysis.baselines import BASELINES
from latentcode.files import AtomicOutputs

__all__ = ["COLUMNS", "HEADLINE_METRICS", "assemble_table", "headline_lines", "headline_metric", "headline_rows",
           "summary_rows", "write_table"]

# The metric that picks the layer and heads a summary: the first of these a table has.
HEADLINE_METRICS = ("accuracy", "mean_balanced_accuracy", "mean_r2", "r2")
# What a one-line summary shows beside its headline metric, at the selected layer.
_COMPANION_METRICS = {"mean_balanced_accuracy": ("mean_auroc", "mean_f1"), "accuracy": ("balanced_accuracy",)}
COLUMNS = (
    "model", "file", "layer", "site", "label", "metric", "value", "validation", "selected",
    *BASELINES, "strongest_baseline", "strongest_baseline_value", "beats_baselines",
    "n_fit", "n_test", "regularization_param", "regularization", "fit_split", "test_split", "seed", "note",
)


def assemble_table(rows: list[dict]) -> pd.DataFrame:
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
    metric = headline_metric(table)
    for _, rows_of_file in table.groupby("file", sort=False):
        candidates = rows_of_file[rows_of_file["metric"] == metric]
        if candidates["validation"].isna().all():
            continue
        best = candidates.loc[candidates["validation"].idxmax()]  # idxmax: the first (earliest layer) of ties
        chosen = rows_of_file.index[(rows_of_file["layer"] == best["layer"]) & (rows_of_file["site"] == best["site"])]
        table.loc[chosen, "selected"] = True
    return table


def headline_metric(table: pd.DataFrame) -> str | None:
    return next((metric for metric in HEADLINE_METRICS if (table["metric"] == metric).any()), None)


def headline_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The selected layer's row of the headline metric (the first of `HEADLINE_METRICS` the
    table has), one per file: the number to report, chosen without looking at the test split."""
    metric = headline_metric(table)
    return table[(table["metric"] == metric) & table["selected"].astype(bool)]


def summary_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the probes' own label, every metric: without the per-column rows of a
    multi-hot label or the per-output rows of a ridge probe on several outputs."""
    headline = table[table["metric"] == headline_metric(table)]
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
    # Both or neither, through temporaries (a full disk leaves no truncated CSV beside an old JSON).
    with AtomicOutputs(lock=stem, purpose="writing a probe table") as outputs:
        outputs.write_table(stem, table)
    return [stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".json")]
