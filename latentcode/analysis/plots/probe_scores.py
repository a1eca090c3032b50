"""Probe scores per layer: one line per model, site and label, beside its baselines and chance."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D

from latentcode.analysis.captions import site_set, split_descriptions, variant_of, wrap_lines
from latentcode.analysis.plots.figure import new_figure, save_figure
from latentcode.analysis.probes import HEADLINE_METRICS
from latentcode.analysis.probes.table import headline_metric
from latentcode.errors import AnalysisError
from latentcode.store import CodeFile

__all__ = ["CROWDED_BAND", "NEAR_TRIVIAL_GAP", "plot_probe_scores"]

# Scores this close to 1 (every model, every layer) overlap as lines: the gap to each one's strongest
# baseline, drawn in a panel of its own, is what tells the models apart.
CROWDED_BAND = 0.05
# A score less than this above its strongest baseline (or below it) says next to nothing about the codes.
NEAR_TRIVIAL_GAP = 0.02
# The gap panel's marker of each baseline (another one: a diamond).
BASELINE_MARKERS = {"majority": "o", "shuffled_labels": "s", "prevalence_random": "^", "all_present": "v"}


def _caption(rows: pd.DataFrame, fit: str, test: str) -> str:
    """The site sets and variants of the files of a table and what its splits hold, e.g. 'last-self sites (...)
    · fixed_query variant; train: in-distribution functions; ood: unseen combinations'."""
    files = []  # those the table was made from, where they can still be read
    for path in dict.fromkeys(rows["file"].astype(str)) if "file" in rows else ():
        try:
            files.append(CodeFile(path))
        except (OSError, ValueError):  # moved or deleted since: the caption just says less
            pass
    contexts = [site_set(code_file) + (f" · {variant} variant" if (variant := variant_of(code_file)) else "")
                for code_file in files]
    descriptions = split_descriptions(files)
    splits = [f"{split}: {descriptions[split]}" for split in dict.fromkeys([*fit.split("/"), *test.split("/")])
              if split in descriptions]
    return "; ".join(part for part in (" | ".join(dict.fromkeys(contexts)), "; ".join(splits)) if part)


def plot_probe_scores(
    table: pd.DataFrame | str | Path,
    path_stem: str | Path,
    metric: str | None = None,
    formats: Sequence[str] = ("png",),
    figsize: tuple[float, float] = (6.4, 4.4),
    dpi: float = 100,
    models_note: str | None = None,
) -> list[Path]:
    """Score per layer per model from a `decode` / `regress` table (or its CSV / JSON file): one
    solid line per (model, site, label), with its shuffled-label control dashed in the same colour,
    its strongest other baseline dotted where that is neither the control nor chance, and chance
    (the majority baseline: the most frequent value, or the mean for R²) as a grey line. The title
    is short (label, metric, splits); the sites and variant are a caption under the axes. The
    legend has an entry for what is drawn only.

    A score less than `NEAR_TRIVIAL_GAP` above its strongest baseline (or below it) is near-trivial: drawn hollow and
    named in the legend. Where several models all score within `CROWDED_BAND` of 1 (their lines
    overlap at the top), a second panel shows each score's gap to its strongest baseline, and the
    title says so.

    `metric` defaults to the first of `HEADLINE_METRICS` the table has. `models_note` adds a line to
    the title about the models that the codes file cannot say, e.g. "models trained on the
    permuted variant" where their codes were read on another.
    """
    rows, metric = _metric_rows(table, metric)
    keys = ["model", "file", "site", "label"]
    groups = list(rows.groupby(keys, sort=False))
    models_per_name = rows.groupby("model")["file"].nunique()
    gaps = rows["value"].astype(float) - rows["strongest_baseline_value"].astype(float)
    crowded = "r2" not in metric and len(groups) > 1 and rows["value"].astype(float).min() >= 1 - CROWDED_BAND
    figure = new_figure((figsize[0], figsize[1] * 1.5) if crowded else figsize, dpi)
    if crowded:
        axis, gap_axis = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    else:
        axis, gap_axis = figure.subplots(), None
    drawn: set[str] = set()
    baselines: set[str] = set()
    for (model, file, site, label), group in groups:
        name = model if models_per_name[model] == 1 else f"{model} ({Path(file).stem})"
        if rows["site"].nunique() > 1:
            name += f", {site}"
        if rows["label"].nunique() > 1:
            name += f", {label}"
        _draw_model(axis, gap_axis, group.sort_values("layer"), name, drawn, baselines)
    chance = sorted({round(float(value), 3) for value in rows["majority"].dropna()}) if "majority" in rows else []
    for level in chance:
        axis.axhline(level, color="0.45", linewidth=1.2, zorder=1)
    style_handles = _style_handles(drawn, bool(chance), metric)
    axis.legend(handles=[*axis.get_legend_handles_labels()[0], *style_handles], fontsize="small")
    layers = sorted(rows["layer"].unique())
    axis.set_xticks(layers)
    (gap_axis or axis).set_xlabel("layer")
    axis.set_ylabel(metric)
    if gap_axis is not None:
        _style_gap_axis(gap_axis, gaps, metric, baselines)
    if "r2" not in metric:  # every decoding metric lies in [0, 1]
        axis.set_ylim(0, 1.02)
    axis.grid(alpha=0.3)
    labels = ", ".join(dict.fromkeys(rows["label"]))
    splits = rows[["fit_split", "test_split"]].drop_duplicates()
    fit, test = ("/".join(dict.fromkeys(splits[column].astype(str))) for column in ("fit_split", "test_split"))
    crowding = (f"every score is within {CROWDED_BAND} of 1 ({rows['value'].min():.3f}–{rows['value'].max():.3f}): "
                "the lower panel shows each one's gap to its strongest baseline" if crowded else "")
    trivial_note = (f"{int((gaps < NEAR_TRIVIAL_GAP).sum())} of {len(gaps)} scores are near-trivial (hollow)"
                    if "trivial" in drawn else "")
    axis.set_title(wrap_lines([f"decoding {labels}: fit on {fit}, scored on {test}",
                               *([models_note] if models_note else []), crowding, trivial_note], figsize[0],
                              fontsize_points=11),
                   fontsize="medium")
    # The details a title would bury: the sites, the variant and what the splits hold.
    caption = _caption(rows, fit, test)
    if caption:
        figure.supxlabel(wrap_lines([caption], figsize[0], fontsize_points=8), fontsize="x-small", color="0.3")
    return save_figure(figure, path_stem, formats, dpi)


def _metric_rows(table: pd.DataFrame | str | Path, metric: str | None) -> tuple[pd.DataFrame, str]:
    """The rows of `metric` (default: the first headline metric the table has) and the metric."""
    if not isinstance(table, pd.DataFrame):
        path = Path(table)
        table = pd.read_json(path) if path.suffix == ".json" else pd.read_csv(path)
    if metric is None:
        metric = headline_metric(table)
        if metric is None:
            raise AnalysisError(f"the table has no metric of {HEADLINE_METRICS}; pass metric= one of "
                                f"{sorted(table['metric'].unique())}")
    rows = table[table["metric"] == metric]
    if rows.empty:
        raise AnalysisError(f"the table has no rows with metric {metric!r}; it has {sorted(table['metric'].unique())}")
    return rows, metric


def _draw_model(axis, gap_axis, group: pd.DataFrame, name: str, drawn: set[str], baselines: set[str]) -> None:
    """One (model, site, label)'s scores by layer: the line, hollow near-trivial markers, its gaps to
    the strongest baseline (lower panel), its shuffled-label control and other strongest baseline."""
    line, = axis.plot(group["layer"], group["value"], marker="o", label=name, zorder=3)
    gap = group["value"].astype(float) - group["strongest_baseline_value"].astype(float)
    trivial = gap < NEAR_TRIVIAL_GAP
    if trivial.any():  # hollow: the score is (nearly) its baseline's
        axis.plot(group["layer"][trivial], group["value"][trivial], linestyle="", marker="o", markersize=9,
                  markerfacecolor="white", markeredgecolor=line.get_color(), zorder=4)
        drawn.add("trivial")
    if gap_axis is not None:  # the marker says which baseline is the strongest at that layer
        gap_axis.plot(group["layer"], gap, color=line.get_color(), zorder=3)
        for baseline, at in group.groupby(group["strongest_baseline"].astype(str), sort=False):
            gap_axis.plot(at["layer"], gap[at.index], linestyle="", color=line.get_color(), zorder=4,
                          marker=BASELINE_MARKERS.get(baseline, "D"))
            baselines.add(baseline)
    shuffled = group["shuffled_labels"].astype(float)
    if shuffled.notna().any():
        axis.plot(group["layer"], shuffled, linestyle="--", color=line.get_color(), alpha=0.8)
        drawn.add("shuffled")
    # The strongest baseline where it is another one than the control and chance, drawn already.
    other = group["strongest_baseline_value"].astype(float).where(
        ~group["strongest_baseline"].isin(["shuffled_labels", "majority", ""]))
    if other.notna().any():
        axis.plot(group["layer"], other, linestyle=":", color=line.get_color(), alpha=0.8)
        drawn.add("other")


def _style_handles(drawn: set[str], chance: bool, metric: str) -> list[Line2D]:
    """Legend entries for the line styles drawn: control, other baseline, chance, near-trivial."""
    return [
        *([Line2D([], [], color="grey", linestyle="--", label="shuffled-label control")]
          if "shuffled" in drawn else []),
        *([Line2D([], [], color="grey", linestyle=":", label="strongest other baseline")] if "other" in drawn else []),
        *([Line2D([], [], color="0.45", linewidth=1.2,
                  label="chance (the fit split's mean)" if "r2" in metric else "chance (majority)")] if chance else []),
        *([Line2D([], [], color="grey", linestyle="", marker="o", markersize=9, markerfacecolor="white",
                  label=f"near-trivial: < {NEAR_TRIVIAL_GAP} above its strongest baseline")]
          if "trivial" in drawn else []),
    ]


def _style_gap_axis(gap_axis, gaps: pd.Series, metric: str, baselines: set[str]) -> None:
    """The lower panel zoomed to the gaps (0, the baseline itself, drawn only where in range): they are
    what differs."""
    margin = max(0.01, 0.15 * float(gaps.max() - gaps.min()))
    gap_axis.set_ylim(float(gaps.min()) - margin, float(gaps.max()) + margin)
    if gaps.min() - margin <= 0:
        gap_axis.axhline(0, color="0.45", linewidth=1.2, zorder=1)
    gap_axis.set_ylabel(f"{metric} −\nstrongest baseline", fontsize="small")
    gap_axis.grid(alpha=0.3)
    gap_axis.legend(handles=[Line2D([], [], color="grey", linestyle="", marker=BASELINE_MARKERS.get(name, "D"),
                                    label=f"gap to {name.replace('_', ' ')}") for name in sorted(baselines)],
                    fontsize="x-small", title="strongest baseline", title_fontsize="x-small")
