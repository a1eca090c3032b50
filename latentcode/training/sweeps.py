"""Sweeps: a grid of training runs, sequentially or as independent processes, and a results table.

    latentcode sweep --preset sraven --scale cpu --grid attention=softmax,linear,hyla \\
        --grid learning_rate=3e-4,1e-3 --seeds 0,1 --out sweeps/sraven

Each grid point is an ordinary run directory `OUT/<field=value,...>`; a sweep started again skips
finished runs and resumes unfinished ones. The table `OUT/results.csv` (and `.json`) has one row
per run: its grid values, status and final metrics per split (`test.accuracy`, `ood.accuracy`,
...). Best hyperparameters are chosen per attention preset on the in-distribution validation
metric (the `test` split: R² for fuzzy logic, accuracy for SRAVEN), never on OOD data, and
written to `OUT/best.json`.

With `jobs` > 1 the runs train as processes through `run_jobs`, the one process scheduler: it runs
any sequence of commands a few at a time (analyses/reproduce.py trains its plan with it).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import operator
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from latentcode.files import AtomicOutputs, atomic_write_text, open_for_append
from latentcode.rundir import RunDirectory
from latentcode.tasks import task_class
from latentcode.training.presets import build_train_config, presets
from latentcode.training.run import Run
from latentcode.training.threads import thread_environment


def selection_metric(preset: str) -> tuple[str, str]:
    """(split, metric) a sweep of `preset` selects on: the task's in-distribution headline metric."""
    analysis = task_class(presets()[preset].task["name"]).analysis
    return analysis.selection_split, analysis.headline_metric


def expand_grid(grid: dict[str, list[Any]], seeds: list[int]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, once per seed."""
    return [{**dict(zip(grid, values, strict=True)), "seed": seed}
            for values in itertools.product(*grid.values()) for seed in seeds]


def run_name(point: dict[str, Any]) -> str:
    return ",".join(f"{key}={value}" for key, value in point.items())


def paper_grid(preset: str) -> dict[str, list[Any]]:
    return {key: list(values) for key, values in presets()[preset].paper_grid.items()}


def sweep(
    preset: str,
    scale: str,
    grid: dict[str, list[Any]],
    out: str | Path,
    seeds: list[int] | None = None,
    jobs: int = 1,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run every grid point (see the module docstring) and return the results table's rows."""
    from latentcode.training.trainer import TrainingDiverged, train

    out = Path(out)
    seeds = seeds or [0]
    grid = {key: list(values) for key, values in grid.items()}
    grid.setdefault("attention", ["softmax"])
    points = expand_grid(grid, seeds)
    # Build every config first: a bad value fails the sweep before any run starts.
    configs = {run_name(point): (point, build_train_config(preset, scale, **point)) for point in points}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "sweep.json", json.dumps({"preset": preset, "scale": scale, "grid": grid, "seeds": seeds},
                                                     indent=2))

    runs = [(name, point, config, RunDirectory(out / name)) for name, (point, config) in configs.items()]
    pending = [(name, point, config, directory) for name, point, config, directory in runs
               if not directory.is_finished]
    if jobs <= 1:
        for index, (name, _, config, directory) in enumerate(pending, 1):
            if progress:
                print(f"[{index}/{len(pending)}] {name}", flush=True)
            try:
                if directory.config_path.exists():  # started before: continue it (from step 0 if never checkpointed)
                    train(resume=directory.path, progress=progress)
                else:
                    train(config, directory.path, progress=progress)
            except TrainingDiverged as error:
                print(f"{name}: {error}", file=sys.stderr)
    else:
        _run_in_processes(pending, jobs, progress)
    rows = results_table(out, configs)
    write_results(out, rows, preset)
    return rows


def _run_in_processes(pending: list, jobs: int, progress: bool) -> None:
    """Each run as `python -m latentcode.cli train ...` in its own process, `jobs` at a time, each with
    its share of the cores as its threads (`thread_environment`): processes with a thread per core
    each would spin against each other."""

    def runs():  # drawn one at a time: a run's config file is written just before it starts
        for name, _, config, directory in pending:
            directory.path.mkdir(parents=True, exist_ok=True)
            config_file = directory.path.parent / f".{name}.train.json"
            atomic_write_text(config_file, config.to_json())
            if directory.config_path.exists():  # started before: continue it
                command = [sys.executable, "-m", "latentcode.cli", "train", "--resume", str(directory.path), "--quiet"]
            else:
                command = [sys.executable, "-m", "latentcode.cli", "train", "--config", str(config_file),
                           "--out", str(directory.path), "--quiet"]
            yield Job(name, command, log=directory.path.parent / f"{name}.log")

    def started(job: Job) -> None:
        if progress:
            print(f"started {job.name}", flush=True)

    def finished(job: Job, returncode: int) -> None:
        if progress:
            status = "done" if returncode == 0 else f"failed (exit {returncode}, see {job.name}.log)"
            print(f"{job.name}: {status}", flush=True)

    run_jobs(runs(), jobs, thread_environment(jobs), on_start=started, on_finish=finished)


@dataclass(frozen=True)
class Job:
    """One process of a sweep: `command` (argv), its output and errors into the file `log`
    (truncated first; None: this process's own stdout and stderr)."""

    name: str
    command: list[str]
    log: Path | None = None


def run_jobs(jobs: Iterable[Job], parallel: int, environment: Mapping[str, str], *,
             on_start: Callable[[Job], None] | None = None, on_finish: Callable[[Job, int], None] | None = None,
             poll_seconds: float = 0.5) -> dict[str, int]:
    """Run every job as its own process with `environment`, at most `parallel` at a time, in order;
    returns {name: exit status}. The next job is drawn from `jobs` only when a process slot is free,
    so a generator decides at that moment what to run (or to skip). A job's log file is closed when
    its process ends, and every open one when this returns or raises (processes still running are
    left to finish)."""
    pending = iter(jobs)
    running: list[tuple[Job, subprocess.Popen, IO | None]] = []
    returncodes: dict[str, int] = {}
    try:
        while True:
            while len(running) < parallel and (job := next(pending, None)) is not None:
                log = open_for_append(job.log, "w") if job.log is not None else None
                try:
                    process = subprocess.Popen(job.command, stdout=log, stderr=subprocess.STDOUT if log else None,
                                               env=dict(environment))
                except BaseException:
                    if log is not None:
                        log.close()
                    raise
                running.append((job, process, log))
                if on_start:
                    on_start(job)
            if not running:
                return returncodes
            for item in list(running):
                job, process, log = item
                if process.poll() is None:
                    continue
                running.remove(item)
                if log is not None:
                    log.close()
                returncodes[job.name] = process.returncode
                if on_finish:
                    on_finish(job, process.returncode)
            if running:
                time.sleep(poll_seconds)
    finally:
        for _, _, log in running:
            if log is not None:
                log.close()


def results_table(out: Path, configs: dict[str, tuple[dict, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name, (point, _) in configs.items():
        directory = RunDirectory(out / name)
        row: dict[str, Any] = {"run": name, **point}
        if directory.is_finished:
            run = Run(directory.path)
            row["status"] = "finished"
            row["wall_seconds"] = run.summary.get("wall_seconds")
            row |= {f"{split}.{key}": value for split, values in run.final_metrics.items()
                    for key, value in values.items()}
        elif any(record.get("event") == "diverged" for record in directory.read_metrics()):
            row["status"] = "diverged"
        else:
            row["status"] = "unfinished"
        rows.append(row)
    return rows


def best_runs(rows: list[dict[str, Any]], preset: str) -> dict[str, dict[str, Any]]:
    """Per attention preset, the finished run with the best in-distribution validation metric."""
    key = ".".join(selection_metric(preset))
    better = operator.lt if task_class(presets()[preset].task["name"]).analysis.lower_is_better else operator.gt
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        value = row.get(key)
        if row.get("status") != "finished" or value is None or not math.isfinite(value):
            continue
        current = best.get(row["attention"])
        if current is None or better(value, current[key]):
            best[row["attention"]] = row
    return best


def write_results(out: Path, rows: list[dict[str, Any]], preset: str) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    split, metric = selection_metric(preset)
    best = best_runs(rows, preset)
    # The three tables as one set (all or none), never through a planted link.
    with AtomicOutputs(lock=out / "results", purpose="writing sweep results") as outputs:
        outputs.write_text(out / "results.csv", table.getvalue())
        outputs.write_text(out / "results.json", json.dumps(rows, indent=2, default=str))
        outputs.write_text(out / "best.json", json.dumps(
            {"selected_on": f"{split}.{metric} (in-distribution validation; never OOD)", "best": best}, indent=2,
            default=str))
