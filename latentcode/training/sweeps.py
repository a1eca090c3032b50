"""Sweeps: a grid of training runs, sequentially or as independent processes, and a results table.

    latentcode sweep --preset sraven --scale cpu --grid attention=softmax,linear,hyla \\
        --grid learning_rate=3e-4,1e-3 --seeds 0,1 --out sweeps/sraven

Each grid point is an ordinary run directory `OUT/<field=value,...>`; a sweep started again skips
finished runs and resumes unfinished ones. The table `OUT/results.csv` (and `.json`) has one row
per run: its grid values, status and final metrics per split (`test.accuracy`, `ood.accuracy`,
...). Best hyperparameters are chosen per attention preset on the in-distribution validation
metric (the `test` split: R² for fuzzy logic, accuracy for SRAVEN), never on OOD data, and
written to `OUT/best.json`.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


def _better(value: float, than: float, preset: str) -> bool:
    """Whether `value` of the selection metric beats `than` (lower is better for a loss)."""
    lower_is_better = task_class(presets()[preset].task["name"]).analysis.lower_is_better
    return value < than if lower_is_better else value > than


def expand_grid(grid: dict[str, list[Any]], seeds: list[int]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, once per seed."""
    keys = list(grid)
    points = []
    for values in itertools.product(*(grid[key] for key in keys)):
        for seed in seeds:
            points.append({**dict(zip(keys, values, strict=True)), "seed": seed})
    return points


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
    configs = {}
    for point in points:
        overrides = {key: value for key, value in point.items() if key != "attention"}
        configs[run_name(point)] = (point, build_train_config(preset, scale, attention=point["attention"], **overrides))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "sweep.json", json.dumps({"preset": preset, "scale": scale, "grid": grid, "seeds": seeds},
                                                     indent=2))

    pending = []
    for name, (point, config) in configs.items():
        directory = RunDirectory(out / name)
        if directory.is_finished:
            continue
        pending.append((name, point, config, directory))

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
    running: list[tuple[str, subprocess.Popen]] = []
    queue = list(pending)
    while queue or running:
        while queue and len(running) < jobs:
            name, _, config, directory = queue.pop(0)
            directory.path.mkdir(parents=True, exist_ok=True)
            config_file = directory.path.parent / f".{name}.train.json"
            atomic_write_text(config_file, config.to_json())
            if directory.config_path.exists():  # started before: continue it
                command = [sys.executable, "-m", "latentcode.cli", "train", "--resume", str(directory.path), "--quiet"]
            else:
                command = [sys.executable, "-m", "latentcode.cli", "train", "--config", str(config_file),
                           "--out", str(directory.path), "--quiet"]
            log = open_for_append(directory.path.parent / f"{name}.log", "w")
            running.append((name, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                   env=thread_environment(jobs))))
            if progress:
                print(f"started {name}", flush=True)
        for name, process in list(running):
            if process.poll() is not None:
                running.remove((name, process))
                if progress:
                    status = "done" if process.returncode == 0 else f"failed (exit {process.returncode}, see {name}.log)"
                    print(f"{name}: {status}", flush=True)
        time.sleep(0.5)


def _flatten(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
    return {f"{split}.{key}": value for split, values in metrics.items() for key, value in values.items()}


def results_table(out: Path, configs: dict[str, tuple[dict, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name, (point, _) in configs.items():
        directory = RunDirectory(out / name)
        row: dict[str, Any] = {"run": name, **point}
        if directory.is_finished:
            run = Run(directory.path)
            row["status"] = "finished"
            row["wall_seconds"] = run.summary.get("wall_seconds")
            row |= _flatten(run.final_metrics)
        elif any(record.get("event") == "diverged" for record in directory.read_metrics()):
            row["status"] = "diverged"
        else:
            row["status"] = "unfinished"
        rows.append(row)
    return rows


def best_runs(rows: list[dict[str, Any]], preset: str) -> dict[str, dict[str, Any]]:
    """Per attention preset, the finished run with the best in-distribution validation metric."""
    split, metric = selection_metric(preset)
    key = f"{split}.{metric}"
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        value = row.get(key)
        if row.get("status") != "finished" or value is None or not math.isfinite(value):
            continue
        current = best.get(row["attention"])
        if current is None or _better(value, current[key], preset):
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
