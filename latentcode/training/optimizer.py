"""AdamW with weight decay on matrices only.

Exempt from weight decay: biases, LayerNorm parameters, the relative-position table and any
parameter with one dimension. (The authors' code masks by `ndim != 1`, which in their Flax layout
also decays the per-head query/key/value biases `[heads, d_head]` and the relative-position table
`[heads, buckets]`; we follow the recipe as stated and exempt them by name.)
"""

from __future__ import annotations

import torch
from torch import nn

EXEMPT_NAME_PARTS = ("bias_table",)


def is_decayed(name: str, parameter: nn.Parameter) -> bool:
    """Whether AdamW's weight decay applies to the parameter called `name`."""
    leaf = name.rsplit(".", 1)[-1]
    if parameter.ndim <= 1:
        return False
    if leaf.startswith("b_") or leaf in ("b", "w", "bias"):
        return False
    return not any(part in name for part in EXEMPT_NAME_PARTS)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decayed, exempt = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (decayed if is_decayed(name, parameter) else exempt).append(parameter)
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, learning_rate: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with Optax's defaults (betas 0.9/0.999, eps 1e-8), as in the authors' code; torch's fused
    implementation (one kernel per parameter: a third of the time of its default loop on the CPU)."""
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=learning_rate, betas=(0.9, 0.999), eps=1e-8,
                             fused=True)
