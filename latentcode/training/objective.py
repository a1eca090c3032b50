"""Losses: what the model predicts at its last positions, scored against the task's targets.

- regression (fuzzy logic): MSE of the output at the last position against the query's target;
- classification (SRAVEN): cross-entropy of the outputs at the last M positions (mean over
  positions and instances).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def prediction_positions(output: Tensor, n_predictions: int) -> Tensor:
    """The model outputs that carry predictions: `[batch, n_predictions, d_out]`."""
    return output[:, -n_predictions:, :]


def task_loss(objective: str, predictions: Tensor, targets: Tensor) -> Tensor:
    """predictions `[batch, n_predictions, d_out]`; targets `[batch, n_predictions]`."""
    if objective == "regression":
        return F.mse_loss(predictions[..., 0].float(), targets.float())
    if objective == "classification":
        return F.cross_entropy(predictions.float().flatten(0, 1), targets.long().flatten())
    raise ValueError(f"unknown objective {objective!r}; expected 'regression' or 'classification'")


def to_tensors(batch, device: torch.device) -> tuple[Tensor, Tensor]:
    """A task Batch's `x` and `y` as tensors on `device`."""
    return torch.from_numpy(batch.x).to(device), torch.from_numpy(batch.y).to(device)
