"""What an edit does to a language model's next-token predictions over a window, one row per window:

    loss        = mean_p -log softmax(logits[p])[target[p]]
    probability = mean_p  softmax(logits[p])[target[p]]
    accuracy    = mean_p  [argmax logits[p] == target[p]]

over the window's P scored positions. `latentcode.intervention.language` (intervene) and
`latentcode.intervention.patching.language_patch` (patch) read a pretrained model's edits with these;
`mean_and_se` is their summary over windows (and the patching sweep's over examples)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

METRICS = ("next-token loss", "next-token probability", "next-token accuracy")


def window_metrics(logits: Tensor, targets: Tensor) -> Tensor:
    """logits `[batch, P, vocabulary]`, targets int64 `[batch, P]` -> `[batch, 3]`: METRICS per window
    (computed in float32 whatever the logits' dtype, on their device)."""
    log_probabilities = torch.log_softmax(logits.float(), dim=-1)
    loss = -log_probabilities.gather(-1, targets[..., None])[..., 0]
    accuracy = (logits.argmax(-1) == targets).float()
    return torch.stack([loss.mean(1), torch.exp(-loss).mean(1), accuracy.mean(1)], dim=1)


def mean_and_se(values: np.ndarray) -> tuple[float, float]:
    """The mean of `values` and its standard error std / sqrt(n) (NaN for one value)."""
    n = len(values)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
