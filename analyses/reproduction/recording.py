"""Recording finished runs under analyses/results/runs/NAME/ (committed): their JSON files and, since
issue 36, their final weights, so that a recorded run can be analysed again after the fact.

    RECORDED/NAME/config.json, metrics.jsonl, summary.json   as the run wrote them
    RECORDED/NAME/model/config.json, model.safetensors       the final model in float16 (half the
                                                             size; `load_model` reads it as float32)

A recorded run with weights is a run directory `latentcode.Run` and every command read
(`latentcode extract`, `latentcode reuse`). Weights are stored as `models/ship.py` stores the shipped
models: float16, loaded as float32 (the metrics in summary.json are the float32 model's).

    python analyses/reproduce.py record-sweep /work/sweeps/lane-a /work/sweeps/lane-b ...
    python analyses/reproduce.py record-weights     # the recorded runs that models/ ships (same run)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from . import RECORDED, ROOT

WEIGHTS_DTYPE = "float16"


def record_run(run_dir: Path, destination: Path, weights_from: Path | None = None) -> None:
    """Copy a finished run's JSON files and its final weights (float16) into `destination`
    (RECORDED/NAME), as one set. `weights_from`: a model directory to take the weights from instead
    (already float16). A run without a final model (model/model.safetensors) is recorded without
    weights, as runs were before issue 36."""
    from latentcode.files import AtomicOutputs
    from latentcode.rundir import RunDirectory

    finished, recorded = RunDirectory(run_dir), RunDirectory(destination)
    model_dir = weights_from if weights_from is not None else finished.path / "model"
    with tempfile.TemporaryDirectory() as scratch, \
            AtomicOutputs(lock=recorded.path, purpose="recording a run") as outputs:
        for source, target in ((finished.config_path, recorded.config_path),
                               (finished.metrics_path, recorded.metrics_path),
                               (finished.summary_path, recorded.summary_path)):
            outputs.write_bytes(target, source.read_bytes())
        if (model_dir / "model.safetensors").is_file():
            import torch

            from latentcode.models import load_model

            load_model(model_dir).save(Path(scratch) / "model", dtype=getattr(torch, WEIGHTS_DTYPE))
            for file in ("config.json", "model.safetensors"):
                outputs.write_bytes(recorded.path / "model" / file, (Path(scratch) / "model" / file).read_bytes())


def sweep_run_name(run_dir: Path) -> str:
    """`fuzzy-ATTENTION-hHEADS-fFRAC-nSTEPS-sSEED` from the run's config (never one of the plan's names,
    which carry no heads or steps)."""
    config = json.loads((run_dir / "config.json").read_text())
    train = config["train"]
    model = config["resolved_model_config"]
    steps = train["n_train_instances"] // train["batch_size"]
    return (f"fuzzy-{model['attention']}-h{model['n_heads']}-f{train['task']['frac_test']}-n{steps}-"
            f"s{train['seed']}")


def record_sweep(sweep_dirs: list[str]) -> list[str]:
    """Record every finished run of the sweep directories (with weights); returns the names recorded.
    Runs already recorded are left as they are; unfinished ones are skipped, with a line."""
    from latentcode.rundir import RunDirectory

    names = []
    for sweep_dir in map(Path, sweep_dirs):
        for run_dir in sorted(path for path in sweep_dir.iterdir() if path.is_dir()):
            if not RunDirectory(run_dir).is_finished:
                print(f"skipped {run_dir}: not finished")
                continue
            name = sweep_run_name(run_dir)
            if not (RECORDED / name / "model" / "model.safetensors").is_file():
                record_run(run_dir, RECORDED / name)
                print(f"recorded {run_dir} as {RECORDED / name}")
            names.append(name)
    return names


# Recorded runs that models/ ships: the same run (models/recreate.sh trains them with the plan's
# settings; ship.py copied their metrics), checked by equal final metrics before the weights are taken.
SHIPPED = {f"fuzzy-{attention}-f0.7-s0": f"fuzzy_logic-{attention}" for attention in ("softmax", "linear", "hyla")}
SHIPPED |= {f"sraven-M2-{attention}-s0": f"sraven-permuted-{attention}" for attention in ("softmax", "linear", "hyla")}


def record_shipped_weights() -> None:
    """Give the recorded runs that models/ ships their weights (the shipped float16 ones)."""
    models = ROOT.parent / "models"
    for name, shipped in SHIPPED.items():
        recorded, model = RECORDED / name, models / shipped
        ours = json.loads((recorded / "summary.json").read_text())["final_metrics"]
        theirs = json.loads((model / "summary.json").read_text())["final_metrics"]
        if ours != theirs:
            print(f"skipped {name}: models/{shipped} has other final metrics (another run)")
            continue
        record_run(recorded, recorded, weights_from=model / "model")
        print(f"recorded the weights of models/{shipped} for {name} (same final metrics)")


def weights_note() -> str:
    """Which recorded runs have weights, for the page."""
    with_weights = sorted(path.parent.parent.name for path in RECORDED.glob("*/model/model.safetensors"))
    without = sorted(path.name for path in RECORDED.iterdir() if path.is_dir() and path.name not in with_weights)
    size = sum(path.stat().st_size for path in RECORDED.glob("*/model/model.safetensors")) / 1e6
    return (f"{len(with_weights)} of the {len(with_weights) + len(without)} recorded runs keep their final weights "
            f"(`model/`, float16 loaded as float32, {size:.1f} MB in all): {', '.join(with_weights) or 'none'}. "
            f"The other {len(without)} were recorded before weights were kept (config, metrics and summary only; "
            "their run directories are gone).")
