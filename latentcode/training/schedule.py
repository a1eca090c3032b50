"""The paper's learning-rate schedule: linear warmup from 0, then a cosine decay to a floor.

With `c` the number of optimizer updates already made (so update `c + 1` uses `lr(c)`), `W`
warmup steps and `T` updates in all:

    lr(c) = base * c / W                                              for c <= W
    lr(c) = base * (f + (1 - f) * (1 + cos(pi * (c - W) / (T - 1 - W))) / 2)   for W < c <= T - 1

so the first update uses 0, the update after warmup the full rate, and the last update
`f * base` (f = 0.1 in the paper). This is optax's `warmup_cosine_decay_schedule(0, base, W, T)`
with its end reached exactly at the last update.
"""

from __future__ import annotations

import math

import torch


def lr_multiplier(completed_steps: int, warmup_steps: int, total_steps: int, final_fraction: float = 0.1) -> float:
    """`lr(c) / base` for `c = completed_steps` (see the module docstring)."""
    if completed_steps <= warmup_steps:
        return completed_steps / warmup_steps if warmup_steps > 0 else 1.0
    decay_length = max(total_steps - 1 - warmup_steps, 1)
    progress = min((completed_steps - warmup_steps) / decay_length, 1.0)
    return final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                    final_fraction: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepping once per optimizer update with `lr_multiplier`."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, warmup_steps, total_steps, final_fraction))
