"""Score normalizations sigma: raw attention scores `[batch, head, query, key]` -> latent codes.

The latent code of a key-query pair is `a[:, q, k] = sigma(scores)[:, q, k]`, one value per head.

- `softmax`: over keys (standard attention).
- `identity`: no normalization (linear attention).
- `rms_head`: for every (query, key) pair, divide the H scores by their root mean square across
  the head axis (no learnable scale). This is HYLA's normalization: it normalizes the latent code
  itself rather than the distribution over keys.
- `softmax_rms_head`: softmax over keys, then rms_head.

Masked pairs (`allowed[q, k] == False`) contribute nothing to any variant: they are -inf before a
softmax and exactly zero otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

ScoreNormalization = Callable[[Tensor, "Tensor | None", float], Tensor]
"""`(scores [batch, head, query, key], allowed bool [query, key] or None, eps) -> latent codes`."""


def softmax_over_keys(scores: Tensor, allowed: Tensor | None, eps: float = 0.0) -> Tensor:
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1)


def identity(scores: Tensor, allowed: Tensor | None, eps: float = 0.0) -> Tensor:
    if allowed is not None:
        scores = scores.masked_fill(~allowed, 0.0)
    return scores


def rms_over_heads(scores: Tensor, allowed: Tensor | None, eps: float) -> Tensor:
    """`scores[b, h, q, k] / sqrt(mean_h scores[b, :, q, k]^2 + eps)`; masked pairs are zero."""
    scores = identity(scores, allowed)
    mean_square = scores.square().mean(dim=1, keepdim=True)
    return scores * torch.rsqrt(mean_square + eps)


def softmax_then_rms_over_heads(scores: Tensor, allowed: Tensor | None, eps: float) -> Tensor:
    return rms_over_heads(softmax_over_keys(scores, allowed), allowed, eps)


SCORE_NORMALIZATIONS: dict[str, ScoreNormalization] = {
    "softmax": softmax_over_keys,
    "identity": identity,
    "rms_head": rms_over_heads,
    "softmax_rms_head": softmax_then_rms_over_heads,
}
