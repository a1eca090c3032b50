"""Whether a codes file comes from the model being edited: its `checkpoint_sha256` against the model's.

`extract` records the SHA-256 of the weights file for run and model directories, and of the weights
as safetensors bytes for a model object (`latentcode.provenance`); `checkpoint_sha256_of`
computes the same for the model being edited.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from latentcode.errors import LatentcodeError
from latentcode.store import CodeFile


class CodesOfAnotherModel(LatentcodeError, ValueError):
    """A codes file extracted from another checkpoint than the model being edited."""


def checkpoint_sha256_of(run_or_model: str | Path | nn.Module) -> str:
    """The SHA-256 `extract` records for this run directory, model directory or model object."""
    from latentcode.models.persistence import WEIGHTS_FILE
    from latentcode.provenance import sha256_of_state
    from latentcode.safe_reads import sha256_of_file

    if isinstance(run_or_model, nn.Module):
        return sha256_of_state(run_or_model)
    path = Path(run_or_model)
    for weights in (path / "model" / WEIGHTS_FILE, path / WEIGHTS_FILE):
        if weights.is_file():
            return sha256_of_file(weights)
    raise FileNotFoundError(
        f"{path} is neither a run directory (with model/{WEIGHTS_FILE}) nor a model directory (with {WEIGHTS_FILE})"
    )


def check_codes_file_matches(
    codes_file: CodeFile, model: str | Path | nn.Module | None = None, checkpoint_sha256: str | None = None
) -> None:
    """Raise `CodesOfAnotherModel` unless the file comes from `model` / `checkpoint_sha256` (no check
    when neither is given or the file records no checkpoint)."""
    recorded = str(codes_file.attrs.get("checkpoint_sha256") or "")
    if not recorded or (model is None and checkpoint_sha256 is None):
        return
    expected = checkpoint_sha256 if checkpoint_sha256 is not None else checkpoint_sha256_of(model)
    if recorded != expected:
        raise CodesOfAnotherModel(
            f"{codes_file.path} comes from checkpoint sha256 {recorded}, but the model being edited has sha256 "
            f"{expected}; use codes extracted from this model (latentcode extract RUN_DIR ...)"
        )
