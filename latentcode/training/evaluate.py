"""Evaluate a model on fixed evaluation sets: loss and the task's metrics, per split.

The evaluation sets are `task.eval_set(split, n)`: the same instances for every model and every
evaluation, so curves and runs are comparable. The model runs in eval mode (no dropout).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from latentcode.tasks import Batch, Task
from latentcode.training.objective import prediction_positions, task_loss, to_tensors


def predict(model: nn.Module, task: Task, batch: Batch, batch_size: int = 256) -> np.ndarray:
    """Model outputs at the prediction positions, float32 `[n, n_predictions, d_out]`."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    outputs = []
    try:
        with torch.no_grad():
            for start in range(0, len(batch), batch_size):
                x = torch.from_numpy(batch.x[start : start + batch_size]).to(device)
                outputs.append(prediction_positions(model(x), task.n_predictions).float().cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(outputs)


def evaluate(model: nn.Module, task: Task, eval_sets: dict[str, Batch],
             batch_size: int = 256) -> dict[str, dict[str, float]]:
    """`{split: {"loss": ..., **task metrics}}` for each evaluation set."""
    results = {}
    for split, batch in eval_sets.items():
        prediction = predict(model, task, batch, batch_size)
        _, y = to_tensors(batch, torch.device("cpu"))
        loss = task_loss(task.objective, torch.from_numpy(prediction), y).item()
        results[split] = {"loss": loss, **task.evaluate(prediction, batch)}
    return results


def eval_sets_of(task: Task, n: int, variant: str | None = None) -> dict[str, Batch]:
    """The fixed evaluation set of every split of `task` (in `variant`, default the task's)."""
    return {split: task.eval_set(split, n, variant=variant) for split in task.splits}
