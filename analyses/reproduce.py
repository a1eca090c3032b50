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
FUZZY = ["--preset", "fuzzy_logic", "--scale", "cpu"]


@dataclass(frozen=True)
class PlannedRun:
    name: str
    group: str
    attention: str
    seed: int
    frac_test: float

    def command(self, out: Path) -> list[str]:
        return ["latentcode", "train", *FUZZY, "--attention", self.attention, "--seed", str(self.seed),
                "--set", f"task_seed={self.seed}", "--set", f"frac_test={self.frac_test}", "--out", str(out),
                "--quiet"]


def plan() -> list[PlannedRun]:
    runs = [PlannedRun(f"fuzzy-{a}-f0.7-s{s}", "table_a1", a, s, 0.7) for s in (0, 1, 2) for a in ATTENTIONS]
    runs += [PlannedRun(f"fuzzy-{a}-f{f}-s0", "fig2c", a, 0, f) for f in (0.3, 0.5) for a in ATTENTIONS]
    runs += [PlannedRun(f"fuzzy-{a}-f0.7-s0", "ablations", a, 0, 0.7) for a in ABLATIONS]
    return runs


# -- training ----------------------------------------------------------------------------------------
def record(run_dir: Path, name: str) -> None:
    """Copy a finished run's JSON files into analyses/results/runs/NAME (committed)."""
    destination = RECORDED / name
    destination.mkdir(parents=True, exist_ok=True)
    for file in ("config.json", "metrics.jsonl", "summary.json"):
        shutil.copy2(run_dir / file, destination / file)


def train(args: argparse.Namespace) -> None:
    todo = [run for run in plan() if run.group in args.only and not (RECORDED / run.name / "summary.json").is_file()]
    print(f"{len(todo)} runs to train: {', '.join(run.name for run in todo) or 'none'}")
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    running: list[tuple[PlannedRun, Path, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < args.jobs:
            run = todo.pop(0)
            out = Path(args.runs) / run.name
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
    summary = summary_of(name)
    return None if summary is None else 100 * summary["final_metrics"]["ood"]["r2"]


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


# -- Fig. 2B / 5F: decoding the sub-task from OOD latent codes, per layer -----------------------------
# task -> (the analysis script, its table's file stem, the metric shown). The scripts run on the shipped
# checkpoints (models/TASK-ATTENTION, seed 0); their CSV and figure are copied to results/decoding/.
DECODING = {
    "fuzzy_logic": ("fuzzy_term_decoding.py", "term_decoding", "mean_balanced_accuracy"),
    "sraven": ("sraven_rule_decoding.py", "rule_decoding", "accuracy"),
}
DECODED = RESULTS / "decoding"


def decoding(args: argparse.Namespace) -> None:
    """Run the decoding scripts on the shipped checkpoints and record their tables and figures."""
    DECODED.mkdir(parents=True, exist_ok=True)
    for task, (script, stem, _) in DECODING.items():
        out = Path(args.out) / f"decoding-{task}"
        command = ["python", str(ROOT / script), "--runs-from", args.models, "--out", str(out), "--quiet",
                   "--n-codes", str(args.n_codes)]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
        for suffix in (".csv", ".png"):
            shutil.copy2(out / f"{stem}{suffix}", DECODED / f"{task}_{stem}{suffix}")


def decoding_table(task: str) -> str:
    """Per model and layer: the probe's test score (fitted on train, scored on ood), its
    cross-validated score on train (which picks the layer, marked *) and the strongest baseline."""
    import pandas as pd

    _, stem, metric = DECODING[task]
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
    from latentcode.tasks.sraven import estimate_ambiguity

    lines = ["| K (values) | strict: fraction ambiguous | authors: fraction ambiguous |", "|---|---|---|"]
    for n_values in (4, 8, 16):
        cells = []
        for rules in ("strict", "authors"):
            fraction, standard_error = estimate_ambiguity(4, n_values, 4096, seed=0, rules=rules)
            cells.append(f"{100 * fraction:.2f}% ± {100 * standard_error:.2f}%")
        lines.append(f"| {n_values} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def page(args: argparse.Namespace) -> None:
    page_path = Path(args.page)
    figures = page_path.parent / "results" / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    text = PAGE_TEMPLATE.format(
        table_a1=table_a1(), fig2c=fig2c(figures / "fig2c_ood_r2_vs_held_out.png"), ambiguity=ambiguity_table(),
        fuzzy_decoding=decoding_table("fuzzy_logic"), sraven_decoding=decoding_table("sraven"),
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
recorded them: the seed-0 runs had the machine to themselves, the seed-1 softmax and linear runs shared its 2 cores with
up to ten other processes (load average about 10), so their 2 hours are not the cost of a run.

## Table A1, fuzzy-logic column (T = 32, 70% of term combinations held out)

{table_a1}

## Fig. 2C: OOD R² against the held-out fraction (seed 0)

{fig2c}

![OOD R² against the held-out fraction](results/figures/fig2c_ood_r2_vs_held_out.png)

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

## The runs

{plan}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train_parser = commands.add_parser("train", help="train the runs of the plan that are not recorded yet")
    train_parser.add_argument("--runs", default="analyses/output/runs", help="where runs train (not committed)")
    train_parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
    train_parser.add_argument("--only", nargs="+", default=["table_a1", "fig2c", "ablations"])
    page_parser = commands.add_parser("page", help="regenerate analyses/RESULTS.md from the recorded runs")
    page_parser.add_argument("--page", default=str(PAGE), help="where the page goes (its figures beside it)")
    decoding_parser = commands.add_parser("decoding", help="Fig. 2B/5F: decode the sub-task from the shipped "
                                          "models' OOD codes, per layer; record the tables and figures")
    decoding_parser.add_argument("--models", default=str(ROOT.parent / "models"), help="finished runs TASK-ATTENTION")
    decoding_parser.add_argument("--out", default="analyses/output", help="where codes are extracted (not committed)")
    decoding_parser.add_argument("--n-codes", type=int, default=2048, help="instances per split (train, ood)")
    commands.add_parser("plan", help="print the training command of every run")
    args = parser.parse_args()
    if args.command == "train":
        train(args)
    elif args.command == "page":
        page(args)
    elif args.command == "decoding":
        decoding(args)
    else:
        for run in plan():
            print(" ".join(run.command(Path("analyses/output/runs") / run.name)))


if __name__ == "__main__":
    main()
