"""One self-contained HTML page per study: training curves, metrics per split, probe tables, plots.

    latentcode report runs/sraven-softmax runs/sraven-linear runs/sraven-hyla --out report.html

For each run directory it reads `config.json`, `metrics.jsonl` and `summary.json` (plain JSON: no
torch needed), and for each codes file (given, or found as `RUN_DIR/codes/*.h5`) it decodes the
task's sub-task label from the latent codes (fit on `fit_split`, scored on `test_split`), and
draws the tSNE of the codes, raw code samples, and one cosine-similarity heatmap of mean codes
comparing every model and layer on one colour scale. The words around them, a summary of the
findings first, are `latentcode.analysis.narrative`'s. Images are embedded as data URIs and the
page has no JavaScript, so it reads offline as one file.
"""

from __future__ import annotations

import base64
import html
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from latentcode.analysis.checks import default_label, label_name
from latentcode.analysis.embed import METHOD_NAMES
from latentcode.analysis.narrative import (
    CANONICAL_SPLITS,
    about_html,
    context_line,
    findings_paragraph,
    training_variants,
)
from latentcode.analysis.patch_outputs import PatchOutput
from latentcode.analysis.plots import plot_code_samples, plot_embedding, plot_probe_scores, plot_similarity
from latentcode.analysis.plots.figure import save_figure
from latentcode.analysis.plots.heatmap import WEAK_SHARE
from latentcode.analysis.probes import decode, headline_lines, headline_rows, summary_rows, write_table
from latentcode.analysis.report_plan import (  # noqa: F401 - ReportError: importable from here, as tests do
    ReportError,
    ReportPlan,
    check_report_outputs_free,
    plan_report,
)
from latentcode.files import AtomicOutputs, ExclusiveLock, check_replaceable, write_error
from latentcode.progress import Progress
from latentcode.rundir import RunRecord
from latentcode.safe_reads import read_png
from latentcode.store import CodeFile


@dataclass
class Report:
    path: Path
    runs: list[RunRecord]
    probe_table: pd.DataFrame | None
    figures: list[Path] = field(default_factory=list)
    context: str = ""  # task, variants and sites in one line (`narrative.context_line`)
    summary: str = ""  # the plain-language findings at the top of the page

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
    seen = {split for run in runs for record in run.metrics if record.get("event") == "eval"
            for split in record["splits"]}
    splits = [split for split in CANONICAL_SPLITS if split in seen] + sorted(seen - set(CANONICAL_SPLITS))
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
    variants = ", ".join(training_variants(runs))
    axes[0].set(title=f"training loss ({task}, {variants} variant)", xlabel="step", ylabel="loss", yscale="log")
    for axis, split in zip(axes[1:], splits, strict=True):
        axis.set(title=f"{split}: {metric}", xlabel="step", ylabel=metric)
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    return save_figure(figure, path_stem, ("png",), dpi)[0]


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
.caption { color: #444; font-size: .9em; margin-top: 0; max-width: 60em; }
"""


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(read_png(path, "figure")).decode("ascii")  # a PNG, never a planted link
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(frame: pd.DataFrame, float_format: str = "{:.3f}") -> str:
    return frame.to_html(index=False, border=0, na_rep="–", float_format=lambda value: float_format.format(value))


def _metrics_frame(runs: Sequence[RunRecord]) -> pd.DataFrame:
    return pd.DataFrame([{"model": run.name, "split": split,
                          **{k: v for k, v in values.items() if not k.startswith("feature_accuracy_")}}
                         for run in runs for split, values in run.final_metrics().items()])


def _settings_frame(runs: Sequence[RunRecord]) -> pd.DataFrame:
    rows = []
    for run in runs:
        train = run.config["train"]
        rows.append({
            "model": run.name, "run": str(run.path), "task": json.dumps(train["task"]),
            "variant": train.get("variant") or "default",
            "steps": run.config.get("steps"), "batch": train.get("batch_size"), "lr": train.get("learning_rate"),
            "weight decay": train.get("weight_decay"), "warmup": train.get("warmup_steps"), "seed": train.get("seed"),
            "scale": train.get("scale"), "wall s": (run.summary or {}).get("wall_seconds"),
        })
    return pd.DataFrame(rows)


def build_report(
    run_dirs: Sequence[str | Path] = (),
    codes_files: Sequence[str | Path] = (),
    out: str | Path = "report.html",
    *,
    progress: bool = True,
    **options,
) -> Report:
    """Write the report to `out` (figures and tables beside it in `<out stem>_files/`); a name
    without an .html (or .htm) suffix gets .html, so that a browser opens it. Every argument is
    checked first, by the plan `latentcode report` makes too: `options` are `plan_report`'s (label,
    fit_split, test_split, embedding_split, methods, max_points, title, overwrite, notes, patches,
    max_rows, picture_label; its defaults), of which:

    patches: path stems written by `latentcode patch` (STEM.csv, STEM.json, STEM.png): an
        'Interventions' section shows where patching codes transferred the donor's sub-task.

    max_rows: the examples of each split read from each codes file, drawn at random with seed 0
        (`CodeFile.subsample`): memory grows with it, not with the files.

    picture_label: the label spec the embeddings and the heatmap colour by, where it is not `label`
        (e.g. "terms[0]": one column of a label with many values; the demo gives one).

    notes: sentences for the 'Where the numbers come from' list, e.g. that the runs are shipped
        checkpoints whose training happened elsewhere (`latentcode demo` says so).
    """
    return run_report(plan_report(run_dirs, codes_files, out, **options), progress=progress)


def run_report(plan: ReportPlan, progress: bool = True) -> Report:
    """Draw and write the report `plan` describes (`plan_report`)."""
    out, files_dir = plan.out, plan.files_dir
    # One report into `out` at a time; the page and its files are checked again and written under the lock.
    with ExclusiveLock(out, purpose="writing a report", hint="wait until it has finished or choose another out"):
        check_report_outputs_free(out, plan.overwrite)
        for output in plan.patches:
            check_replaceable(files_dir / f"patch_{output.stem.name}.png")
        made_files_dir = not files_dir.exists()
        try:
            return _write_report(plan, progress)
        except BaseException:
            if made_files_dir:  # a failed report leaves nothing behind
                shutil.rmtree(files_dir, ignore_errors=True)
            raise


def _write_report(plan: ReportPlan, progress: bool) -> Report:
    """run_report's work, under the lock of `plan.out`."""
    runs, code_files, out, files_dir = list(plan.runs), list(plan.code_files), plan.out, plan.files_dir
    label, fit_split, test_split = plan.label, plan.fit_split, plan.test_split
    # The split the figures of codes show: the one asked for, else the test split where the files have it.
    picture_split = plan.embedding_split or (test_split if code_files and test_split in code_files[0].splits else None)
    try:
        files_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise write_error(error, files_dir) from None

    # Steps: curves, probes (one per file), and per file its embeddings and samples, then the heatmap.
    total = (1 if runs else 0) + len(code_files) * (2 + len(plan.methods)) + bool(code_files)
    steps = Progress(total, "report", unit="step", enabled=progress and total > 0, interval=0.0)
    steps.start()
    sections: list[str] = []
    figures: list[Path] = []
    if runs:
        steps.begin("training curves")
        curves = plot_training_curves(runs, files_dir / "training_curves")
        figures.append(curves)
        steps.advance(note="training curves")
        variants = ", ".join(training_variants(runs))
        sections.append(
            "<h2>Training (as recorded in the run directories)</h2>"
            f"<p>How the models were trained, read from their run directories; the task metrics were evaluated "
            f"during that training on the <b>{html.escape(variants)}</b> variant of each split (see "
            "<i>What was analysed</i> for what the splits hold).</p>"
            + _table(_settings_frame(runs), "{:g}") + _image(curves, "training curves")
            + _caption("Training loss, and the task metric of each split as evaluated during training, against "
                       "training steps; one line per model.")
            + "<h3>Final metrics per split</h3>" + _table(_metrics_frame(runs))
        )

    probe_table = probe_plot = None
    if code_files:
        probe_label = default_label(code_files, label)  # as the plan chose it
        usable = [f for f in code_files if fit_split in f.splits and test_split in f.splits]
        skipped = [f for f in code_files if f not in usable]
        probe_html = ""
        if usable:
            steps.begin(f"probes ({probe_label})")
            probe_table = decode(usable, probe_label, fit_split=fit_split, test_split=test_split,
                                 progress=steps.enabled and steps.interactive)  # its own bar, only where ours is one
            steps.advance(len(usable), note=f"probes ({probe_label})")
            write_table(probe_table, files_dir / "probes")
            probe_plot = plot_probe_scores(probe_table, files_dir / "probe_scores")[0]
            figures.append(probe_plot)
            summary = summary_rows(probe_table)
            summary = summary[summary["site"] == "all"]
            probe_html = (
                f"<p>Logistic-regression decoding of <b>{html.escape(probe_label)}</b> from the latent codes of each "
                f"layer (all sites of a layer concatenated), fitted on <b>{html.escape(fit_split)}</b> and scored on "
                f"<b>{html.escape(test_split)}</b>. <i>validation</i> scores the probe on held-out folds of "
                f"{html.escape(fit_split)}; the "
                f"<i>selected</i> layer has the best validation score, the test split is never used to choose. "
                "Baselines, scored on the same test split: <i>majority</i> predicts the most frequent value "
                "(per column for a multi-hot label), <i>prevalence_random</i> draws values at their "
                f"{html.escape(fit_split)} prevalence, <i>all_present</i> predicts every column of a multi-hot label "
                "present, <i>shuffled_labels</i> is a probe fitted the same way on shuffled labels.</p>"
                + "".join(f"<p><b>{html.escape(line)}</b></p>" for line in headline_lines(probe_table))
                + "<p class=note>The scores of every layer are the figure under <i>Headline</i>.</p>"
                + _table(summary[["model", "layer", "label", "metric", "value", "validation", "selected",
                                  "strongest_baseline", "strongest_baseline_value", "beats_baselines",
                                  "n_fit", "n_test"]])
                + f'<p class="note">Full table (every column): {html.escape(str(files_dir / "probes.csv"))}</p>'
            )
        if skipped:
            probe_html += "<p class=note>No probe for " + ", ".join(
                f"{html.escape(str(f.path))} (splits {html.escape(str(f.splits))})" for f in skipped) + (
                f": it lacks {html.escape(repr(fit_split))} or {html.escape(repr(test_split))}.</p>")
        sections.append("<h2>Decoding the sub-task from latent codes</h2>" + probe_html)

        picture_label = plan.picture_label or label or code_files[0].task_analysis.get("picture_label", probe_label)
        picture_html = _pictures(code_files, picture_label, files_dir, picture_split, plan.methods,
                                 plan.max_points, steps, figures)
        sections.append("<h2>Latent codes</h2>" + picture_html)

    if plan.patches:
        sections.append(_interventions(plan.patches, files_dir, figures))

    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    inputs = "".join(f"<li>{html.escape(str(path))}</li>"
                     for path in [*plan.run_dirs, *(code_file.path for code_file in code_files)])
    summary = findings_paragraph(runs, code_files, probe_table, fit_split, test_split,
                                 picture_label if code_files else None, picture_split)
    context = context_line(runs, code_files)
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(plan.title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(plan.title)}</h1>"
        f"<p class=note>{html.escape(context)}</p>"
        + _headline(probe_table, probe_plot)
        + f"<h2>In brief</h2><p>{html.escape(summary)}</p>"
        + about_html(runs, code_files, fit_split, test_split, picture_split, plan.notes)
        + "".join(sections)
        + f"<p class=note>Written {created} by latentcode. Inputs:</p><ul class=note>{inputs}</ul></body></html>"
    )
    with AtomicOutputs() as outputs:  # the lock of `out` is held by run_report
        outputs.write_text(out, page)
    steps.close()
    return Report(out, runs, probe_table, figures, context=context, summary=summary)


def _interventions(patches: Sequence[PatchOutput], files_dir: Path, figures: list[Path]) -> str:
    """The 'Interventions' section: per `latentcode patch` output, its map and the groups with the
    largest transfer, each beside the third-sub-task donor baseline."""
    parts = ["<h2>Interventions: where patching the codes transfers the sub-task</h2>"
             "<p>Codes of each site group were patched from a donor instance into a base instance (counterfactual "
             "pairs of the task: the donor's sub-task r' differs and its answer on the base is well-posed). "
             "<i>follow (different)</i>: how often the prediction became r''s answer; <i>follow (third)</i>: the "
             "same count when the donor has a third sub-task (the baseline: a damaged code landing on r''s answer "
             "by itself); <i>transfer</i> is their difference (± its standard error over the paired bases).</p>"]
    for output in patches:
        stem, table, summary = output.stem, output.table(), output.summary
        top = table.sort_values("transfer", ascending=False).head(10)
        columns = [c for c in ("group", "n", "follow (different)", "follow (third)", "transfer", "transfer se",
                               "keep (different)", "attribution estimate", "logit_difference effect") if c in top]
        shown = ""
        if output.png is not None:  # checked as a PNG at open; copied as every output is written
            copy = files_dir / f"patch_{stem.name}.png"
            with AtomicOutputs() as outputs:  # the lock of `out` is held by run_report
                outputs.write_bytes(copy, output.png)
            figures.append(copy)
            shown = _image(copy, f"patching map {stem.name}")
        attribution = {name: value for name, value in (summary.get("attribution_vs_exact") or {}).items()
                       if isinstance(value, (int, float))}
        parts.append(
            f"<h3>{html.escape(str(summary.get('run', stem)))}: {html.escape(str(summary.get('split')))} "
            f"({html.escape(str(summary.get('variant')))}), n = {int(summary.get('n', 0))} pairs, "
            f"{int(summary.get('groups', len(table)))} groups</h3>" + shown + _table(top[columns])
            + (f"<p>Attribution patching against the exact patches of these groups: Pearson "
               f"{attribution['pearson']:.2f}, Spearman {attribution['spearman']:.2f}.</p>"
               if {"pearson", "spearman"} <= set(attribution) else "")
            + f'<p class="note">Full table: {html.escape(str(stem.with_name(stem.name + ".csv")))}</p>')
    return "".join(parts)


def _headline(probe_table: pd.DataFrame | None, probe_plot: Path | None) -> str:
    """The page's opening: one row per model (its selected layer's headline score on the test split
    beside the strongest baseline and the gap) and the probe-score figure; the detail follows."""
    if probe_table is None or not len(headline_rows(probe_table)):
        return ""
    rows = headline_rows(probe_table)
    frame = pd.DataFrame({
        "model": rows["model"], "fit → test split": rows["fit_split"] + " → " + rows["test_split"],
        "label": rows["label"], "layer (chosen on fit split)": rows["layer"].astype(int), "metric": rows["metric"],
        "score": rows["value"], "strongest baseline": rows["strongest_baseline"],
        "baseline score": rows["strongest_baseline_value"],
        "gap": rows["value"] - rows["strongest_baseline_value"],
        "beats baselines": rows["beats_baselines"].map({True: "yes", False: "no"}).fillna("n/a"),
    })
    return ("<h2>Headline</h2>" + _table(frame) + (_image(probe_plot, "probe scores") if probe_plot else "")
            + _caption("Each model's probe at the layer chosen on the fit split, scored on the test split beside "
                       "the strongest trivial baseline; the figure has every layer. Details below."))


def _caption(text: str) -> str:
    return f'<p class="caption">{html.escape(text)}</p>'


def _pictures(
    code_files: Sequence[CodeFile], picture_label: str, files_dir: Path, split: str | None, methods: Sequence[str],
    max_points: int, steps: Progress, figures: list[Path],
) -> str:
    """The 'Latent codes' section: one similarity heatmap of every model and layer (one colour
    scale), then per model its embeddings and raw code samples, each with a caption."""
    parts = []
    first = code_files[0]
    split_words = "every split" if split is None else f"the {split} split" + (
        f" ({first.split_descriptions[split]})" if split in first.split_descriptions else "")
    one_value = all(label_name(picture_label) in code_file.label_names for code_file in code_files)
    if one_value:
        steps.begin("similarity heatmap")
        try:
            heatmap = plot_similarity(code_files, picture_label, files_dir / "similarity", split=split)
        except ValueError as error:  # e.g. a continuous label: no heatmap, and the page says why
            parts.append(f"<p class=note>No similarity heatmap of {html.escape(picture_label)}: "
                         f"{html.escape(str(error))}</p>")
        else:
            figures.extend(heatmap)
            parts.append(
                f"<h3>Similarity of the mean codes of each {html.escape(picture_label)}, all models</h3>"
                + _image(heatmap[0], "similarity of mean codes")
                + _caption(
                    f"Each cell compares the mean latent code of two values of {picture_label} on {split_words} by "
                    "cosine similarity; one row of panels per model, one panel per layer, one colour scale and one "
                    "row order for all. The title says whether the grand mean code was subtracted first (centred) "
                    "and why: where the codes share a large common part, plain cosines all sit near 1. Each "
                    f"panel's title gives the share of the code variance that {picture_label} explains; a panel where "
                    f"that share is under {WEAK_SHARE:.0%} is marked weak (its title says so, its frame is "
                    "dashed), so that "
                    "differences between value means that are a sliver of the variance never look like structure.")
            )
        steps.advance(note="similarity heatmap")
    for code_file in code_files:
        stem = code_file.path.stem
        name = html.escape(code_file.model_name)
        for method in methods:
            method_name = METHOD_NAMES.get(method, method)
            steps.begin(f"{method_name} of {code_file.model_name} ({len(code_file.layers)} layers)")
            paths = plot_embedding(code_file, picture_label, files_dir / f"{stem}_{method}", method=method,
                                   split=split, max_points=max_points, progress=False)  # the report has its bar
            figures.extend(paths)
            parts.append(
                f"<h3>{name}: {method_name} of latent codes</h3>" + _image(paths[0], f"{method} {stem}")
                + _caption(f"Each point is one example's latent code (all sites of a layer side by side), placed "
                           f"by {method_name} so that similar codes lie close; coloured by {picture_label}, on "
                           f"{split_words}. Points of one colour that gather show codes that carry "
                           f"{picture_label}; {method_name} distances between clusters mean little.")
            )
            steps.advance(note=f"{method} {stem}")
        if one_value:
            steps.begin(f"code samples of {code_file.model_name}")
            try:
                samples = plot_code_samples(code_file, picture_label, files_dir / f"{stem}_samples", split=split)
            except ValueError as error:
                parts.append(f"<p class=note>No code samples: {html.escape(str(error))}</p>")
            else:
                figures.extend(samples)
                parts.append(
                    f"<h3>{name}: raw latent codes</h3>" + _image(samples[0], f"samples {stem}")
                    + _caption(f"Random examples' latent codes at the last layer, one panel per value of "
                               f"{picture_label}: rows are examples, columns heads (of each site, separated by a "
                               "line; a layer of many sites shows a window of them, grouped by head, as its title "
                               "says). Signed codes are drawn with 0 white.")
                )
        steps.advance(note=f"samples {stem}")
    return "".join(parts)
