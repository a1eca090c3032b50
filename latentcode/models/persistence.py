"""Save and load a model as a directory: `config.json` plus `model.safetensors`.

    MODEL_DIR/
      config.json          ModelConfig.to_json()
      model.safetensors    the state dict (parameters only); metadata: format, latentcode version

Saving writes into a temporary sibling directory and renames it into place, so an interrupted save
never leaves a half-written model under the final name, and it refuses to replace an existing
non-empty directory unless `overwrite=True`. Loading checks that every weight matches the shape
the config implies and names what differs.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from latentcode.errors import LatentcodeError
from latentcode.files import WriteError, give_umask_mode
from latentcode.models.config import ModelConfig

FORMAT = "latentcode-model/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class ModelFileError(LatentcodeError, ValueError):
    """A model directory that cannot be loaded; the message says what is wrong."""


def save_safetensors(tensors: dict, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' `save_file`, with its I/O failures (no space left, ...) as the one-line WriteError:
    safetensors raises its own SafetensorError, not an OSError, so callers' `except OSError` missed them."""
    from safetensors import SafetensorError

    try:
        save_file(tensors, path, metadata=metadata)
    except SafetensorError as error:
        reason = str(error)
        system = re.search(r"I/O error: (.*?)(?: \(os error \d+\))?$", reason)
        raise WriteError(f"cannot write {path}: {system.group(1) if system else reason}") from None


def save_model(model: torch.nn.Module, path: str | Path, overwrite: bool = False,
               dtype: torch.dtype | None = None) -> Path:
    """Write the model directory of a `Transformer` (see the module docstring); `dtype` (e.g.
    torch.float16) stores the weights in a smaller type, which `load_model` turns back into the
    model's float32."""
    from latentcode import __version__

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"cannot save a model to {path}: it exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"{path} already exists and is not empty; choose another path or pass overwrite=True")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    give_umask_mode(staging, directory=True)  # mkdtemp's 0700 would survive the rename
    try:
        (staging / CONFIG_FILE).write_text(model.config.to_json() + "\n")
        state = {name: tensor.detach().cpu().to(dtype or tensor.dtype).contiguous()
                 for name, tensor in model.state_dict().items()}
        save_safetensors(state, staging / WEIGHTS_FILE, metadata={"format": FORMAT, "latentcode_version": __version__})
        give_umask_mode(staging / WEIGHTS_FILE)  # safetensors writes 0600 whatever the umask
        if path.exists():
            # a random name: a fixed `.NAME.old` could be a planted link or another writer's backup
            backup = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            path.rename(backup)  # onto the new, empty directory
            staging.rename(path)
            shutil.rmtree(backup)
        else:
            staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def read_model_files(path: str | Path,
                     device: str | torch.device = "cpu") -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The config and the stored weights of a model directory (see `latentcode.models.load_model`)."""
    path = Path(path)
    config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not config_path.is_file():
        raise ModelFileError(f"{path} is not a latentcode model directory: {CONFIG_FILE} is missing "
                             f"(expected {CONFIG_FILE} and {WEIGHTS_FILE}, as written by model.save)")
    try:
        config = ModelConfig.from_dict(json.loads(config_path.read_text()))
    except json.JSONDecodeError as error:
        raise ModelFileError(f"{config_path} is not valid JSON: {error}") from error
    if not weights_path.is_file():
        raise ModelFileError(f"{path} has {CONFIG_FILE} but no {WEIGHTS_FILE}")
    try:
        state = load_file(weights_path, device=str(device))
    except Exception as error:  # safetensors raises several types for corrupt files
        raise ModelFileError(f"cannot read {weights_path}: {error}") from error
    return config, state


def check_weights_fit(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], path: str | Path) -> None:
    """Refuse stored weights whose names or shapes differ from what the config implies; names each."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = [f"{name}: file {list(state[name].shape)}, config {list(expected[name].shape)}"
                   for name in sorted(set(state) & set(expected)) if state[name].shape != expected[name].shape]
    problems = [problem for problem, found in ((f"missing weights {missing}", missing),
                                               (f"weights the config does not have {unexpected}", unexpected),
                                               ("shapes differ: " + "; ".join(wrong_shape), wrong_shape)) if found]
    if problems:
        raise ModelFileError(f"the weights in {Path(path) / WEIGHTS_FILE} do not match {CONFIG_FILE}: "
                             + ", ".join(problems))
