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

Each is a `ScoreNormalization` that declares what it is, so that the attention layer picks its
faster paths by what sigma does, never by its name (`latentcode.models.path_policy`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from latentcode.models.fused_short import RMS, SOFTMAX


@dataclass(frozen=True)
class ScoreNormalization:
    """sigma: `(scores [batch, head, query, key], allowed bool [query, key] or None, eps) -> latent codes`.

    is_softmax_over_keys: sigma(scores) = softmax over keys, masked pairs -inf, and nothing more.
    is_identity: sigma(scores) = scores, masked pairs 0, and nothing more.
    acts_per_query: each query row's codes depend on that row's scores alone (true of every sigma
        here: softmax normalizes over the keys of one query, rms over the heads of one pair).
    fused_code: how `latentcode.models.fused_short`'s kernel computes it (bits SOFTMAX and RMS), or None.
    """

    function: Callable[[Tensor, Tensor | None, float], Tensor]
    is_softmax_over_keys: bool = False
    is_identity: bool = False
    acts_per_query: bool = True
    fused_code: int | None = None

    def __call__(self, scores: Tensor, allowed: Tensor | None, eps: float) -> Tensor:
        return self.function(scores, allowed, eps)


def masked(scores: Tensor, allowed: Tensor, value: float) -> Tensor:
    """`scores.masked_fill(~allowed, value)` (a new tensor; `allowed` bool `[query, key]`), passing
    over only the keys from the first one some query may not see (a causal block masks only its last
    keys): on the CPU a fill through a broadcast mask runs at about a tenth of a copy's speed."""
    blocked = ~allowed
    if blocked.dim() != 2:
        return scores.masked_fill(blocked, value)
    masked_keys = blocked.any(dim=0).nonzero()
    filled = scores.clone()
    if len(masked_keys):
        first = int(masked_keys[0])
        filled[..., first:].masked_fill_(blocked[:, first:], value)
    return filled


def softmax_over_keys(scores: Tensor, allowed: Tensor | None, eps: float = 0.0) -> Tensor:
    if allowed is not None:
        scores = masked(scores, allowed, float("-inf"))
    return torch.softmax(scores, dim=-1)


def identity(scores: Tensor, allowed: Tensor | None, eps: float = 0.0) -> Tensor:
    if allowed is not None:
        scores = masked(scores, allowed, 0.0)
    return scores


def rms_over_heads(scores: Tensor, allowed: Tensor | None, eps: float) -> Tensor:
    """`scores[b, h, q, k] / sqrt(mean_h scores[b, :, q, k]^2 + eps)`; masked pairs are zero."""
    return _RmsOverHeads.apply(identity(scores, allowed), eps)


class _RmsOverHeads(torch.autograd.Function):
    """a = s r with r = (mean_h s_h^2 + eps)^(-1/2) over the head axis (dim 1), and its gradient in one
    formula, d loss / d s = r (g - a mean_h(g a)) for g = d loss / d a (three passes over
    `[batch, head, query, key]` fewer than autograd's chain). Differentiable once: a backward that would
    build a graph (`create_graph=True`) is refused rather than computed without r's dependence on s."""

    @staticmethod
    def forward(ctx, scores: Tensor, eps: float) -> Tensor:
        inverse_rms = torch.rsqrt(scores.square().mean(dim=1, keepdim=True) + eps)
        codes = scores * inverse_rms
        ctx.save_for_backward(codes, inverse_rms)
        return codes

    @staticmethod
    def backward(ctx, grad_codes: Tensor) -> tuple[Tensor, None]:
        if torch.is_grad_enabled():
            raise RuntimeError("rms over heads is differentiable once (its gradient is written out): a second "
                               "derivative (create_graph=True) is not computed")
        codes, inverse_rms = ctx.saved_tensors
        along_codes = (grad_codes * codes).mean(dim=1, keepdim=True)
        return inverse_rms * (grad_codes - codes * along_codes), None


def softmax_then_rms_over_heads(scores: Tensor, allowed: Tensor | None, eps: float) -> Tensor:
    return rms_over_heads(softmax_over_keys(scores, allowed), allowed, eps)


SCORE_NORMALIZATIONS: dict[str, ScoreNormalization] = {
    "softmax": ScoreNormalization(softmax_over_keys, is_softmax_over_keys=True, fused_code=SOFTMAX),
    "identity": ScoreNormalization(identity, is_identity=True, fused_code=0),
    "rms_head": ScoreNormalization(rms_over_heads, fused_code=RMS),
    "softmax_rms_head": ScoreNormalization(softmax_then_rms_over_heads, fused_code=SOFTMAX | RMS),
}
"""Score normalization name -> sigma: the one place the names live (`ModelConfig` validates with it)."""
