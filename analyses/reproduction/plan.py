"""The plan: every run the results page needs, as `latentcode train` commands, and training the missing ones.

Every run is a `latentcode train` command (printed by `python analyses/reproduce.py plan`), so each is
reproducible from its config; seeds are stated (`--seed s --set task_seed=s`). `train` runs the
missing ones through latentcode.training.sweeps' process scheduler (`run_jobs`), one thread each, and
records each finished run (config.json, metrics.jsonl, summary.json and, since issue 36, its final
weights in float16: `recording.py`) into analyses/results/runs/NAME/, which is committed and is all the
page reads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import RECORDED

ATTENTIONS = ("softmax", "linear", "hyla")
ABLATIONS = ("linear_rmshead", "linear_rmshead_relu", "hyla_no_rmshead", "hyla_no_relu", "hyla_no_relu_no_rmshead",
             "hyla_softmax_instead", "hyla_deep", "hyla_softmax")
# SRAVEN on the paper's permuted task, at the smallest setting a 2-core CPU learns (the search is on
# the page): M = 2 features (the fewest with a correspondence to find), K = 8 values, 2 layers of the
# paper's SRAVEN block (d_model 128, 16 heads, kqv 64), 8,000 steps of 128.
SRAVEN_SETTING = (("n_features", 2), ("n_layers", 2))
# Where `train` trains (not committed) and the page's list of commands says runs go.
RUNS = Path("analyses/output/runs")
# Runs a session could not finish, parked by `park` (committed): config, metrics and the latest
# checkpoint, from which `train` resumes them on any machine.
UNFINISHED = RECORDED.parent / "unfinished"


@dataclass(frozen=True)
class PlannedRun:
    """One run of the plan: `name` is its directory, `group` what `train --only` selects."""

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


def sraven(group: str, attention: str, seed: int, n_heads: int = 16, hold_out: str = "greedy",
           tag: str = "") -> PlannedRun:
    """`tag` only names the run: the same command trained by a later version of the code (`corrected`:
    after the `lecun_normal_` fix, e45163f, where the older runs of that name were trained before it)."""
    heads = (("n_heads", n_heads),) if n_heads != 16 else ()
    split = (("hold_out", hold_out),) if hold_out != "greedy" else ()
    name = (f"sraven-M2-{attention}{f'-h{n_heads}' if heads else ''}{f'-{hold_out}' if split else ''}"
            f"{f'-{tag}' if tag else ''}-s{seed}")
    return PlannedRun(name, group, "sraven", attention, seed, SRAVEN_SETTING + heads + split)


def plan() -> list[PlannedRun]:
    """Every run the page reads, by group (`train --only GROUP ...`)."""
    runs = [fuzzy("table_a1", a, s, 0.7) for s in (0, 1, 2) for a in ATTENTIONS]
    runs += [fuzzy("fig2c", a, 0, f) for f in (0.3, 0.5) for a in ATTENTIONS]
    runs += [fuzzy("ablations", a, 0, 0.7) for a in ABLATIONS]
    runs += [sraven("sraven", a, 0) for a in ATTENTIONS]
    runs += [sraven("fig5c", a, 0, n_heads=1) for a in ("hyla", "softmax")]
    runs += [sraven("sraven", a, s) for s in (1, 2) for a in ATTENTIONS]
    # Issue 26: the permuted trio again with held-out multisets as hard as the training ones (the
    # default split holds out mostly progression pairs), seed 0 first. Not trained yet.
    runs += [sraven("sraven_stratified", a, s, hold_out="stratified") for s in (0, 1, 2) for a in ATTENTIONS]
    # Issue 50: the permuted trio with one initialisation (the corrected `lecun_normal_`), 5 seeds each,
    # all trained by the same code. HYLA's seeds 0-2 with this init also exist as the issue 36 reruns
    # (results/hyla_seed/...-lr1e-3-w800-corrected-init, the same command on older kernels); they train
    # last, after the runs that had no corrected-init counterpart at all.
    runs += [sraven("sraven_init", a, s, tag="corrected") for s in (0, 1, 2) for a in ("softmax", "linear")]
    runs += [sraven("sraven_init", a, s, tag="corrected") for s in (3, 4) for a in ATTENTIONS]
    runs += [sraven("sraven_init", "hyla", s, tag="corrected") for s in (0, 1, 2)]
    runs += [PlannedRun(f"language-{a}-s0", "language", "language", a, 0, ()) for a in ATTENTIONS]
    # The same bytes per step in windows of 128, the authors' sequence length: does the comparison
    # depend on the window?
    runs += [PlannedRun(f"language-{a}-T128-s0", "language", "language", a, 0,
                        (("seq_len", 128), ("batch_size", 32), ("n_train_instances", 32000)))
             for a in ATTENTIONS]
    # Issue 26: a budget where every model learns beyond the previous byte (windows of 128, four times
    # the steps: 4,000 of 32 windows), two seeds; HYLA first, the slowest and the one at risk.
    runs += [PlannedRun(f"language-{a}-T128-4k-s{s}", "language_budget", "language", a, s,
                        (("seq_len", 128), ("batch_size", 32), ("n_train_instances", 128000)))
             for s in (0, 1) for a in ("hyla", "linear", "softmax")]
    return runs


def commands() -> list[str]:
    """The training command of every planned run, into RUNS: what `plan` prints and the page lists."""
    return [" ".join(run.command(RUNS / run.name)) for run in plan()]


# -- training ----------------------------------------------------------------------------------------
def record(run_dir: Path, name: str) -> None:
    """Copy a finished run's JSON files and final weights into analyses/results/runs/NAME (committed)."""
    from .recording import record_run

    record_run(run_dir, RECORDED / name)


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


def now() -> str:
    return time.strftime("%H:%M:%S")


def train(args: argparse.Namespace) -> None:
    """Train the runs of the groups `args.only` that are not recorded yet, `args.jobs` at a time in
    `args.runs`: a run with a checkpoint resumes, a run started but never checkpointed starts again,
    a run another process is training is skipped; each finished run is recorded."""
    from latentcode.rundir import RunDirectory
    from latentcode.training import Job, run_jobs

    todo = [run for run in plan() if run.group in args.only and not RunDirectory(RECORDED / run.name).is_finished]
    print(f"{len(todo)} runs to train: {', '.join(run.name for run in todo) or 'none'}")

    def jobs() -> Iterator[Job]:  # drawn when a process slot is free: the checks hold at that moment
        for run in todo:
            directory = RunDirectory(Path(args.runs) / run.name)
            if in_training(directory.path):
                print(f"{now()} skip {run.name}: another process is training it", flush=True)
                continue
            if directory.is_finished:  # trained, not recorded yet
                record(directory.path, run.name)
                print(f"{now()} done {run.name}", flush=True)
                continue
            if not directory.path.exists() and (UNFINISHED / run.name).is_dir():
                shutil.copytree(UNFINISHED / run.name, directory.path)
                print(f"{now()} restored {run.name} from {UNFINISHED / run.name}", flush=True)
            resumable = directory.checkpoints_path.is_dir()
            if not resumable and directory.path.exists():
                shutil.rmtree(directory.path)  # started but never checkpointed: nothing to keep
            yield Job(run.name, ["latentcode", "train", "--resume", str(directory.path), "--quiet"] if resumable
                      else run.command(directory.path))

    def started(job: Job) -> None:
        print(f"{now()} start {' '.join(job.command)}", flush=True)

    def finished(job: Job, returncode: int) -> None:
        directory = RunDirectory(Path(args.runs) / job.name)
        if directory.is_finished:
            record(directory.path, job.name)
            shutil.rmtree(UNFINISHED / job.name, ignore_errors=True)  # parked by an earlier session
            print(f"{now()} done {job.name}", flush=True)
        else:
            print(f"{now()} FAILED {job.name} (exit {returncode})", flush=True)

    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    run_jobs(jobs(), args.jobs, environment, on_start=started, on_finish=finished, poll_seconds=5)


def park(args: argparse.Namespace) -> None:
    """Keep each unfinished run of the groups `args.only` in `args.runs` for the next session: its
    config.json, metrics.jsonl and latest checkpoint into results/unfinished/NAME/ (to commit), from which
    `train` resumes it exactly (resuming drops the metrics logged after that checkpoint)."""
    from latentcode.files import AtomicOutputs
    from latentcode.rundir import RunDirectory

    for run in plan():
        directory = RunDirectory(Path(args.runs) / run.name)
        if run.group not in args.only or directory.is_finished or not directory.checkpoints_path.is_dir():
            continue
        checkpoints = sorted(path for path in directory.checkpoints_path.iterdir() if path.is_dir())
        if not checkpoints:
            continue
        parked = UNFINISHED / run.name
        with AtomicOutputs(lock=parked, purpose="parking an unfinished run") as outputs:
            for source in (directory.config_path, directory.metrics_path):
                outputs.write_bytes(parked / source.name, source.read_bytes())
            for file in checkpoints[-1].iterdir():
                outputs.write_bytes(parked / "checkpoints" / checkpoints[-1].name / file.name, file.read_bytes())
        print(f"{now()} parked {run.name} at {checkpoints[-1].name} in {parked}", flush=True)
