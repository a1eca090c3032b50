"""How every weight of the models starts: the one place the initialisers live.

    lecun_normal_           kernels (W_Q, W_K, W_V, W_O, W_E of a linear embedding, W_U, the MLPs'
                            W_in, W_out, the router's W_gate): Flax's `lecun_normal`, the authors' init:
                            a normal truncated at ±2 std, rescaled to variance 1 / fan_in
    embedding_normal        embedding tables (TokenEmbed's W_E, the relative position bias table):
                            a plain normal of variance 1 / fan_in
    truncated_normal_std_   hyper_deep's W_value2 (our extension; no Flax counterpart): a normal of std
                            1 / sqrt(fan_in) truncated at ±2 std without the rescaling, variance
                            0.774 / fan_in (kept as it always was, so that its init does not change)

Biases start at zero and LayerNorm scales at one; their modules write that themselves.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

# The standard deviation of a unit normal truncated at ±2: dividing by it gives the truncated draw
# variance 1 (Flax's variance_scaling divides by the same constant, 0.87962566103423978).
UNIT_NORMAL_TRUNCATED_AT_2_STD = 0.87962566103423978


def lecun_normal_(weight: Tensor, fan_in: int) -> Tensor:
    """Flax's `lecun_normal` (module docstring): fills `weight` in place and returns it."""
    std = 1.0 / math.sqrt(fan_in) / UNIT_NORMAL_TRUNCATED_AT_2_STD
    return nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


def truncated_normal_std_(weight: Tensor, fan_in: int) -> Tensor:
    """A normal of std 1 / sqrt(fan_in) truncated at ±2 std, not rescaled: fills `weight` in place, returns it."""
    std = 1 / math.sqrt(fan_in)
    return nn.init.trunc_normal_(weight, std=std, a=-2 / math.sqrt(fan_in), b=2 / math.sqrt(fan_in))


def embedding_normal(*shape: int, fan_in: int) -> Tensor:
    """A new tensor of `shape` from a normal of variance 1 / fan_in (Flax's default embedding init)."""
    return torch.randn(*shape) / math.sqrt(fan_in)
