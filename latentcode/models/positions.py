"""Position information: T5-style relative position bias (the paper's default) and rotary.

Relative position bias: one learned scalar per head and bucket, added to the attention scores
before normalization. Buckets follow T5's decoder (unidirectional) scheme: the distance
`n = max(query - key, 0)`, so keys after the query share the bucket of distance 0; distances below
`n_buckets // 2` have a bucket each, larger ones share logarithmically spaced buckets up to
`max_distance`. The paper sets `n_buckets = max_distance = sequence length`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.models.config import ConfigError
from latentcode.models.initializers import embedding_normal


def relative_position_buckets(n_query: int, n_key: int, n_buckets: int, max_distance: int) -> np.ndarray:
    """T5 unidirectional bucket index of every (query, key) pair: int64 `[n_query, n_key]`."""
    query_position = np.arange(n_query)[:, None]
    key_position = np.arange(n_key)[None, :]
    distance = np.maximum(query_position - key_position, 0)  # keys after the query: distance 0
    max_exact = n_buckets // 2
    with np.errstate(divide="ignore"):
        log_bucket = max_exact + (
            np.log(distance.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
            / math.log(max_distance / max_exact)
            * (n_buckets - max_exact)
        ).astype(np.int64)
    log_bucket = np.minimum(log_bucket, n_buckets - 1)
    return np.where(distance < max_exact, distance, log_bucket).astype(np.int64)


class RelativePositionBias(nn.Module):
    """`bias[h, q, k] = bias_table[h, bucket(q, k)]`, added to the scores of every batch element."""

    def __init__(self, n_heads: int, n_ctx: int):
        super().__init__()
        if n_ctx < 2:
            raise ConfigError(f"relative positions need n_ctx >= 2, got n_ctx={n_ctx}")
        self.n_buckets = self.max_distance = n_ctx
        # [n_heads, n_buckets]; Flax's default embedding init (variance 1 / fan_in).
        self.bias_table = nn.Parameter(embedding_normal(n_heads, self.n_buckets, fan_in=self.n_buckets))
        buckets = relative_position_buckets(n_ctx, n_ctx, self.n_buckets, self.max_distance)
        self.register_buffer("buckets", torch.from_numpy(buckets), persistent=False)

    def forward(self, n_positions: int) -> Tensor:
        """Bias `[n_heads, n_positions, n_positions]` for a sequence of `n_positions` tokens."""
        return self.bias_table[:, self.buckets[:n_positions, :n_positions]]

    def block(self, query_start: int, query_end: int, n_keys: int) -> Tensor:
        """The rows `query_start:query_end` of the bias, keys `0:n_keys`: `[n_heads, rows, n_keys]`."""
        return self.bias_table[:, self.buckets[query_start:query_end, :n_keys]]


class Rotary(nn.Module):
    """Rotary position embedding (GPT-NeoX layout: the two halves of each head are rotated)."""

    def __init__(self, d_head: int, n_ctx: int, base: float = 10000.0):
        super().__init__()
        if d_head % 2:
            raise ConfigError(f"rotary positions need an even head width, got d_head={d_head}")
        inverse_frequency = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
        angle = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inverse_frequency[None, :]
        angle = torch.cat([angle, angle], dim=-1)  # [n_ctx, d_head]
        self.register_buffer("cos", angle.cos().float(), persistent=False)
        self.register_buffer("sin", angle.sin().float(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """Rotate queries or keys `[batch, pos, head, d_head]` by their position."""
        n_positions = x.shape[1]
        cos = self.cos[:n_positions, None, :].to(x.dtype)
        sin = self.sin[:n_positions, None, :].to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        rotated_half = torch.cat([-second, first], dim=-1)
        return x * cos + rotated_half * sin
