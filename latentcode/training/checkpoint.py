"""Checkpoints without pickles: tensors in safetensors, everything else in JSON.

    checkpoints/step_XXXXXXXX/
      model.safetensors       the model's state dict
      optimizer.safetensors   the optimizer's per-parameter tensors, named "state.{index}.{name}"
                              (AdamW: step, exp_avg, exp_avg_sq)
      trainer_state.json      format; step (the data-stream position); the optimizer's param_groups
                              and any non-tensor per-parameter state; the scheduler's and the grad
                              scaler's state dicts (numbers); the loop's progress: the last
                              evaluation's metrics, the losses, instances and seconds of the unfinished
                              logging interval, the training seconds so far

Neither file type can run code when read: nothing here calls `pickle` or `torch.load`. The RNG is
not saved because the trainer reseeds torch's RNG at the start of every step from (seed, step,
process) and draws its data from explicit per-step seeds; a checkpoint taken at the end of a step
therefore needs no RNG state to resume bit-exactly. Python floats survive JSON exactly.

A loaded JSON structure must look like the live object's own state dict (same keys, same JSON
types), so a crafted file can fail to load but cannot set attributes the object does not have.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from latentcode.errors import LatentcodeError
from latentcode.files import give_umask_mode
from latentcode.models.persistence import save_safetensors

CHECKPOINT_FORMAT = "latentcode-checkpoint/2"
STATE_FILE = "trainer_state.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"

# What `torch.save`, `pickle` and accelerate's `save_state` write; none of it is ever loaded.
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib")
PICKLE_PROTOCOL_HEADERS = tuple(bytes([0x80, protocol]) for protocol in range(2, 6))
ZIP_HEADER = b"PK\x03\x04"


class CheckpointError(LatentcodeError, ValueError):
    """A checkpoint that cannot be loaded into this run."""


@dataclass
class LoopState:
    """What the training loop carries across a checkpoint besides model, optimizer and schedule.

    step: optimizer steps done (the data-stream position).
    last_eval: the metrics of the last evaluation at or before `step` ({} if none yet).
    interval_losses, interval_instances, interval_seconds: the logging interval still open at
        `step`, so the first row logged after a resume averages the same steps as an
        uninterrupted run's.
    elapsed_seconds: training seconds up to `step`, summed over all sessions of the run.
    """

    step: int = 0
    last_eval: dict[str, dict[str, float]] = field(default_factory=dict)
    interval_losses: list[float] = field(default_factory=list)
    interval_instances: int = 0
    interval_seconds: float = 0.0
    elapsed_seconds: float = 0.0


# -- refusing pickles ------------------------------------------------------------------------------
def is_pickle_based(path: Path) -> bool:
    """Whether `path` is a pickle or a `torch.save` archive (by name or by its first bytes)."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    with path.open("rb") as file:
        header = file.read(4)
    if header[:2] in PICKLE_PROTOCOL_HEADERS:
        return True
    if header == ZIP_HEADER:  # torch.save's format: a zip holding data.pkl
        try:
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith(".pkl") for name in archive.namelist())
        except zipfile.BadZipFile:
            return False
    return False


def pickle_files(root: Path) -> list[Path]:
    """The pickle-based files anywhere under `root`, sorted."""
    return sorted(path for path in Path(root).rglob("*") if path.is_file() and is_pickle_based(path))


def refuse_pickles(root: Path) -> None:
    """Raise CheckpointError if anything under the run directory `root` is pickle-based."""
    found = pickle_files(root)
    if found:
        shown = ", ".join(str(path.relative_to(root)) for path in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise CheckpointError(
            f"{root} holds pickle-based files ({shown}{more}), which can run code when loaded, so latentcode "
            "loads nothing from this run; checkpoints written before latentcode-checkpoint/2 are of this kind: "
            "remove those files or checkpoints, or start the run again in a new directory"
        )


# -- JSON structures checked against the live object -----------------------------------------------
def _json_type(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(type(value).__name__)
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def _like(template: Any, loaded: Any, where: str) -> Any:
    """`loaded` (from JSON) in the shape of `template` (a live state dict): same keys and types;
    lists become tuples where the template has tuples (AdamW's betas)."""
    if _json_type(template) != _json_type(loaded):
        raise CheckpointError(f"{where} is {loaded!r}, expected a value like {template!r}")
    if isinstance(template, dict):
        if set(template) != set(loaded):
            raise CheckpointError(f"{where} has keys {sorted(loaded)}, expected {sorted(template)}")
        return {key: _like(template[key], loaded[key], f"{where}.{key}") for key in template}
    if isinstance(template, (list, tuple)):
        if len(template) != len(loaded):
            raise CheckpointError(f"{where} has {len(loaded)} entries, expected {len(template)}")
        pairs = enumerate(zip(template, loaded, strict=True))
        items = [_like(t, value, f"{where}[{i}]") for i, (t, value) in pairs]
        return tuple(items) if isinstance(template, tuple) else items
    if isinstance(template, int) and not isinstance(template, bool) and not isinstance(loaded, int):
        raise CheckpointError(f"{where} is {loaded!r}, expected an integer")
    return loaded


def _metrics_like(loaded: Any, where: str) -> dict[str, dict[str, float]]:
    """Evaluation metrics: {split: {metric: number}}."""
    valid = isinstance(loaded, dict) and all(
        isinstance(values, dict) and all(_json_type(v) == "number" for v in values.values())
        for values in loaded.values()
    )
    if not valid:
        raise CheckpointError(f"{where} is {loaded!r}, expected {{split: {{metric: number}}}}")
    return loaded


# -- the optimizer as tensors plus JSON ------------------------------------------------------------
def optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The optimizer's state dict split into safetensors tensors and a JSON-able structure."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    numbers: dict[str, dict[str, Any]] = {}
    for index, entries in state["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                numbers.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "state": numbers}


def optimizer_from_files(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                         structure: dict[str, Any]) -> None:
    """Load what `optimizer_to_files` wrote into `optimizer`, checking it fits its parameters."""
    current = optimizer.state_dict()
    param_groups = _like(current["param_groups"], structure.get("param_groups"), "optimizer.param_groups")
    if [group["params"] for group in param_groups] != [group["params"] for group in current["param_groups"]]:
        raise CheckpointError("optimizer.param_groups number the parameters differently from this optimizer")
    shapes = dict(enumerate(p.shape for group in optimizer.param_groups for p in group["params"]))
    state: dict[int, dict[str, Any]] = {}

    def entries_of(index: str, what: str) -> dict[str, Any]:
        if not index.isdigit() or int(index) not in shapes:
            raise CheckpointError(f"optimizer {what} names parameter {index!r}, which this optimizer does not have")
        return state.setdefault(int(index), {})

    for name, tensor in tensors.items():
        prefix, index, entry = (name.split(".", 2) + ["", ""])[:3]
        if prefix != "state" or not entry:
            raise CheckpointError(f"optimizer tensor {name!r} is not named state.INDEX.NAME")
        entries = entries_of(index, f"tensor {name!r}")
        if tensor.ndim > 0 and tensor.shape != shapes[int(index)]:
            raise CheckpointError(
                f"optimizer tensor {name!r} has shape {list(tensor.shape)}, expected {list(shapes[int(index)])}"
            )
        entries[entry] = tensor
    numbers = structure.get("state")
    if not isinstance(numbers, dict):
        raise CheckpointError(f"optimizer.state is {numbers!r}, expected a dict of per-parameter numbers")
    for index, values in numbers.items():
        if not isinstance(values, dict) or not all(_json_type(v) == "number" for v in values.values()):
            raise CheckpointError(f"optimizer.state.{index} is {values!r}, expected a dict of numbers")
        entries_of(index, "state").update(values)
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})


# -- saving and loading ----------------------------------------------------------------------------
def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    grad_scaler: Any, loop: LoopState, train_config: dict[str, Any] | None = None) -> None:
    """Write a checkpoint into the (new, empty) directory `path`; trainer_state.json comes last.
    train_config: the "train" section of the run's config.json as it was when the run started, so
    that a resume can tell whether config.json was edited since (`recorded_train_config`)."""
    path.mkdir(parents=True, exist_ok=True)
    model_state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    save_safetensors(model_state, path / MODEL_FILE, metadata={"format": CHECKPOINT_FORMAT})
    optimizer_tensors, optimizer_structure = optimizer_to_files(optimizer)
    save_safetensors(optimizer_tensors, path / OPTIMIZER_FILE, metadata={"format": CHECKPOINT_FORMAT})
    for written in (path / MODEL_FILE, path / OPTIMIZER_FILE):
        give_umask_mode(written)  # safetensors writes 0600 whatever the umask
    state = {
        "format": CHECKPOINT_FORMAT,
        "step": loop.step,
        "loop": asdict(loop),
        "optimizer": optimizer_structure,
        "scheduler": scheduler.state_dict(),
        "grad_scaler": grad_scaler.state_dict() if grad_scaler is not None else None,
    }
    if train_config is not None:
        state["train_config"] = train_config
    (path / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")


def recorded_train_config(path: Path) -> dict[str, Any] | None:
    """The run's "train" config recorded in the checkpoint `path` (None: not recorded, or unreadable:
    loading the checkpoint reports that)."""
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    recorded = state.get("train_config") if isinstance(state, dict) else None
    return recorded if isinstance(recorded, dict) else None


def _read_state(path: Path) -> tuple[dict[str, Any], LoopState]:
    """trainer_state.json of the checkpoint `path`, and the loop state it holds, checked."""
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"cannot read {path / STATE_FILE}: {error}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path / STATE_FILE} has format {found!r}, expected {CHECKPOINT_FORMAT!r}")
    loaded = state.get("loop")
    template = asdict(LoopState())
    if isinstance(loaded, dict):  # the two fields whose length varies, checked on their own
        template["last_eval"] = _metrics_like(loaded.get("last_eval"), "loop.last_eval")
        losses = loaded.get("interval_losses")
        if not isinstance(losses, list) or not all(_json_type(loss) == "number" for loss in losses):
            raise CheckpointError(f"loop.interval_losses is {losses!r}, expected a list of numbers")
        template["interval_losses"] = losses
    loop = LoopState(**_like(template, loaded, "loop"))
    if loop.step < 1 or loop.step != state.get("step"):
        raise CheckpointError(f"{path / STATE_FILE} records an invalid step {state.get('step')!r}")
    return state, loop


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    grad_scaler: Any) -> LoopState:
    """Load the checkpoint directory `path` into the live objects; returns the loop's state."""
    state, loop = _read_state(path)
    model.load_state_dict(load_file(path / MODEL_FILE))
    optimizer_from_files(optimizer, load_file(path / OPTIMIZER_FILE), state.get("optimizer") or {})
    scheduler.load_state_dict(_like(scheduler.state_dict(), state.get("scheduler"), "scheduler"))
    if grad_scaler is not None:
        grad_scaler.load_state_dict(_like(grad_scaler.state_dict(), state.get("grad_scaler"), "grad_scaler"))
    return loop
