"""One self-contained HTML page per study: training curves, metrics per split, probe tables, plots.

    latentcode report runs/sraven-softmax runs/sraven-linear runs/sraven-hyla --out report.html

For each run directory it reads `config.json`, `metrics.jsonl` and `summary.json` (plain JSON: no
torch needed), and for each codes file (given, or found as `RUN_DIR/codes/*.h5`) it decodes the
task's sub-task label from the latent codes (fit on `fit_split`, scored on `test_split`), and
draws the tSNE of the codes and the cosine-similarity heatmap of mean codes. Several runs share
one metrics table, one curves figure and one probe figure. Images are embedded as data URIs and
the page has no JavaScript, so it reads offline as one file.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from latentcode.analysis.plots import (
    plot_code_samples,
    plot_embedding,
    plot_probe_scores,
    plot_similarity,
)
from latentcode.analysis.probes import decode, headline_lines, summary_rows, write_table
from latentcode.errors import LatentcodeError
from latentcode.provenance import check_codes_from_runs, check_one_task, codes_of_runs
from latentcode.rundir import RunRecord
from latentcode.store import CodeFile


class ReportError(LatentcodeError, ValueError):
    """Inputs a report cannot be made from; says which and why."""


@dataclass
class Report:
    path: Path
    runs: list[RunRecord]
    probe_table: pd.DataFrame | None
    figures: list[Path] = field(default_factory=list)

    def headline(self) -> list[str]:
        """One line per model: the OOD task metric and the best-layer decoding of the sub-task."""
        lines = []
        for run in self.runs:
            metric = run.headline_metric
            final = run.final_metrics()
            parts = [f"{split} {metric} {values[metric]:.3f}" for split, values in final.items()
                     if metric in values and split != "train"]
            lines.append(f"{run.name:12s} task: " + ", ".join(parts))
        if self.probe_table is not None and len(self.probe_table):
            lines += headline_lines(self.probe_table)
        return lines


# -- figures ---------------------------------------------------------------------------------------
def plot_training_curves(runs: Sequence[RunRecord], path_stem: Path, dpi: float = 100) -> Path:
    """Training loss, and the task metric of every evaluated split, against steps; one line per run."""
    seen = {split for run in runs for record in run.metrics if record.get("event") == "eval" for split in record["splits"]}
    canonical = ["train", "test", "ood", "unseen_terms"]
    splits = [split for split in canonical if split in seen] + sorted(seen - set(canonical))
    task = runs[0].task
    metric = runs[0].headline_metric
    figure = Figure(figsize=(4.2 * (1 + len(splits)), 3.6), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 1 + len(splits), squeeze=False)[0]
    for run in runs:
        train = [record for record in run.metrics if record.get("event") == "train"]
        if train:
            axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label=run.name)
        evaluations = [record for record in run.metrics if record.get("event") == "eval"]
        for axis, split in zip(axes[1:], splits, strict=True):
            points = [(r["step"], r["splits"][split].get(metric)) for r in evaluations if split in r["splits"]]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", markersize=3, label=run.name)
    axes[0].set(title=f"training loss ({task})", xlabel="step", ylabel="loss", yscale="log")
    for axis, split in zip(axes[1:], splits, strict=True):
        axis.set(title=f"{split}: {metric}", xlabel="step", ylabel=metric)
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    path = path_stem.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path


# -- HTML ------------------------------------------------------------------------------------------
_STYLE = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: .85em; margin: .8em 0; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin: .5em 0; }
.note { color: #666; font-size: .9em; } pre { background: #f7f7f7; padding: .6em; overflow-x: auto; }
"""


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(frame: pd.DataFrame, float_format: str = "{:.3f}") -> str:
    return frame.to_html(index=False, border=0, na_rep="–", float_format=lambda value: float_format.format(value))


def _metrics_frame(runs: Sequence[RunRecord]) -> pd.DataFrame:
    rows = []
    for run in runs:
        for split, values in run.final_metrics().items():
            rows.append({"model": run.name, "split": split, **{k: v for k, v in values.items()
                                                                   if not k.startswith("feature_accuracy_")}})
    return pd.DataFrame(rows)


def _settings_frame(runs: Sequence[RunRecord]) -> pd.DataFrame:
    rows = []
    for run in runs:
        train = run.config["train"]
        rows.append({
            "model": run.name, "run": str(run.path), "task": json.dumps(train["task"]),
            "steps": run.config.get("steps"), "batch": train["batch_size"], "lr": train["learning_rate"],
            "weight decay": train["weight_decay"], "warmup": train["warmup_steps"], "seed": train["seed"],
            "scale": train.get("scale"), "wall s": (run.summary or {}).get("wall_seconds"),
        })
    return pd.DataFrame(rows)


def build_report(
    run_dirs: Sequence[str | Path] = (),
    codes_files: Sequence[str | Path] = (),
    out: str | Path = "report.html",
    label: str | None = None,
    fit_split: str = "train",
    test_split: str = "ood",
    embedding_split: str | None = None,
    methods: Sequence[str] = ("tsne",),
    max_points: int = 1000,
    title: str = "latentcode report",
    overwrite: bool = False,
    progress: bool = True,
) -> Report:
    """Write the report to `out` (figures and tables beside it in `<out stem>_files/`)."""
    out = Path(out)
    if out.is_dir():
        raise ReportError(f"out={str(out)!r} is a directory; expected the path of the HTML file to write")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True to replace it, or choose another out")
    if not run_dirs and not codes_files:
        raise ReportError("a report needs at least one run directory or codes file")
    runs = [RunRecord.read(path) for path in run_dirs]
    code_files = [CodeFile(path) for path in codes_files or codes_of_runs(runs)]
    codes_paths = [code_file.path for code_file in code_files]
    # Numbers side by side must be comparable: one task, and codes of the runs they are shown with.
    check_one_task(code_files, runs)
    check_codes_from_runs(runs, code_files)
    files_dir = out.with_name(f"{out.stem}_files")
    files_dir.mkdir(parents=True, exist_ok=True)

    steps = _Steps(progress, total=(1 if runs else 0) + 2 * len(code_files) + len(code_files) * len(methods))
    sections: list[str] = []
    figures: list[Path] = []
    if runs:
        curves = plot_training_curves(runs, files_dir / "training_curves")
        figures.append(curves)
        steps.advance("training curves")
        sections.append("<h2>Training</h2>" + _table(_settings_frame(runs), "{:g}") + _image(curves, "training curves")
                        + "<h3>Final metrics per split</h3>" + _table(_metrics_frame(runs)))

    probe_table = None
    if code_files:
        task_names = {code_file.task_config.get("name") for code_file in code_files}
        probe_labels = {code_file.task_analysis.get("probe_label") for code_file in code_files}
        probe_label = label or (probe_labels.pop() if len(probe_labels) == 1 else None)
        if probe_label is None:
            raise ReportError(f"give a label to decode (--label); the codes files come from tasks {sorted(task_names)}")
        usable = [f for f in code_files if fit_split in f.splits and test_split in f.splits]
        skipped = [f for f in code_files if f not in usable]
        probe_html = ""
        if usable:
            probe_table = decode(usable, probe_label, fit_split=fit_split, test_split=test_split, progress=progress)
            steps.advance(f"probes ({probe_label})", len(usable))
            write_table(probe_table, files_dir / "probes")
            probe_plot = plot_probe_scores(probe_table, files_dir / "probe_scores")[0]
            figures.append(probe_plot)
            summary = summary_rows(probe_table)
            summary = summary[summary["site"] == "all"]
            probe_html = (
                f"<p>Logistic-regression decoding of <b>{html.escape(probe_label)}</b> from the latent codes of each "
                f"layer (all sites of a layer concatenated), fitted on <b>{fit_split}</b> and scored on "
                f"<b>{test_split}</b>. <i>validation</i> scores the probe on held-out folds of {fit_split}; the "
                f"<i>selected</i> layer has the best validation score, the test split is never used to choose. "
                "Baselines, scored on the same test split: <i>majority</i> predicts the most frequent value "
                "(per column for a multi-hot label), <i>prevalence_random</i> draws values at their "
                f"{fit_split} prevalence, <i>all_present</i> predicts every column of a multi-hot label present, "
                "<i>shuffled_labels</i> is a probe fitted the same way on shuffled labels.</p>"
                + "".join(f"<p><b>{html.escape(line)}</b></p>" for line in headline_lines(probe_table))
                + _image(probe_plot, "probe scores")
                + _table(summary[["model", "layer", "label", "metric", "value", "validation", "selected",
                                  "strongest_baseline", "strongest_baseline_value", "beats_baselines",
                                  "n_fit", "n_test"]])
                + f'<p class="note">Full table (every column): {html.escape(str(files_dir / "probes.csv"))}</p>'
            )
        if skipped:
            probe_html += "<p class=note>No probe for " + ", ".join(
                f"{html.escape(str(f.path))} (splits {f.splits})" for f in skipped) + f": it lacks {fit_split!r} or {test_split!r}.</p>"
        sections.append("<h2>Decoding the sub-task from latent codes</h2>" + probe_html)

        picture_label = label or code_files[0].task_analysis.get("picture_label", probe_label)
        picture_html = []
        for code_file in code_files:
            stem = code_file.path.stem
            split = embedding_split or (test_split if test_split in code_file.splits else None)
            for method in methods:
                paths = plot_embedding(code_file, picture_label, files_dir / f"{stem}_{method}", method=method,
                                       split=split, max_points=max_points)
                figures += paths
                picture_html.append(f"<h3>{html.escape(code_file.model_name)}: {method} of latent codes</h3>"
                                    + _image(paths[0], f"{method} {stem}"))
                steps.advance(f"{method} {stem}")
            if picture_label.split("[")[0] in code_file.label_names:
                heatmap = plot_similarity(code_file, picture_label, files_dir / f"{stem}_similarity", split=split)
                samples = plot_code_samples(code_file, picture_label, files_dir / f"{stem}_samples", split=split)
                figures += heatmap + samples
                picture_html.append(f"<h3>{html.escape(code_file.model_name)}: cosine similarity of mean codes</h3>"
                                    + _image(heatmap[0], f"similarity {stem}") + _image(samples[0], f"samples {stem}"))
            steps.advance(f"heatmap {stem}")
        sections.append("<h2>Latent codes</h2>" + "".join(picture_html))

    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    inputs = "".join(f"<li>{html.escape(str(p))}</li>" for p in [*map(str, run_dirs), *map(str, codes_paths)])
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p class=note>Written {created} by latentcode. Inputs:</p><ul class=note>{inputs}</ul>"
        + "".join(sections) + "</body></html>"
    )
    temporary = out.with_name(f".{out.name}.tmp")
    temporary.write_text(page)
    temporary.replace(out)
    steps.close()
    return Report(out, runs, probe_table, figures)


class _Steps:
    """A progress bar over the report's long steps (tqdm), or nothing."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
        if enabled and total:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="report", unit="step")

    def advance(self, what: str, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
