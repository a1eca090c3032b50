"""The recorded runs (analyses/results/runs/NAME/: config.json, metrics.jsonl, summary.json), read
through the run-directory reader, latentcode.rundir.RunRecord: where every number of the page comes from."""

from __future__ import annotations

import numpy as np

from latentcode.rundir import RunDirectory, RunRecord

from . import RECORDED


def recorded_run(name: str) -> RunRecord | None:
    """The run NAME as recorded; None where it is not (not trained yet)."""
    directory = RunDirectory(RECORDED / name)
    return RunRecord.read(directory.path) if directory.config_path.is_file() else None


def summary_of(name: str) -> dict | None:
    """The recorded run's summary.json; None where the run is not recorded or did not finish."""
    run = recorded_run(name)
    return None if run is None else run.summary


def metric_of(name: str, split: str, metric: str) -> float | None:
    """A final metric of the recorded run in percent (100 x the recorded value); None if not recorded."""
    summary = summary_of(name)
    return None if summary is None else 100 * summary["final_metrics"][split][metric]


def ood_r2(name: str) -> float | None:
    return metric_of(name, "ood", "r2")


def eval_records(name: str) -> list[dict]:
    """The evaluations a recorded run logged, in step order ([] where the run is not recorded)."""
    run = recorded_run(name)
    return [] if run is None else [record for record in run.metrics if record.get("event") == "eval"]


def minutes(names: list[str]) -> str:
    """The median wall time of the recorded runs among `names`, in minutes ("–" if none is recorded)."""
    walls = [summary_of(name)["wall_seconds"] / 60 for name in names if summary_of(name)]
    return f"{np.median(walls):.0f}" if walls else "–"


def mean_and_error(values: list[float]) -> str:
    """Mean ± standard error over seeds, as the page shows it."""
    if not values:
        return "not trained yet"
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{np.mean(values):.2f} ± {np.std(values, ddof=1) / np.sqrt(len(values)):.2f} ({len(values)} seeds)"


def draw_curves(axis, name: str, metric: str, splits: tuple[str, str], color: str, model: str, scale: float = 1.0):
    """`metric` of the run `name` against the step: the first split solid, the second dashed."""
    evals = eval_records(name)
    steps = [record["step"] for record in evals]
    for split, style in zip(splits, ("-", "--"), strict=True):
        axis.plot(steps, [scale * record["splits"][split][metric] for record in evals], style, marker="o",
                  markersize=3, color=color, label=f"{model}, {split}")
