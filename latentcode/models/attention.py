"""Multi-head attention as a score normalization sigma composed with a value network.

    q, k, v        = x W_Q + b_Q, x W_K + b_K, x W_V + b_V        [batch, pos, head, d_head(_v)]
    scores[h,q,k]  = q[q,h] . k[k,h] / sqrt(d_head) + position_bias[h,q,k]
    a              = sigma(scores)                                 the latent codes, hook_pattern
    z              = value_network(a, v)                           [batch, query, head, d_head_v]
    out[q]         = sum_h z[q,h] W_O[h] + b_O

Parameters carry TransformerLens's names and shapes: `W_Q, W_K` `[n_heads, d_model, d_head]`,
`W_V` `[n_heads, d_model, d_head_v]`, `W_O` `[n_heads, d_head_v, d_model]`, `b_Q, b_K`
`[n_heads, d_head]`, `b_V` `[n_heads, d_head_v]`, `b_O` `[d_model]`.

Attention dropout (training mode only) multiplies the latent codes after `hook_pattern`, so
recorded codes are never dropped out. As in the authors' public configuration (Flax's
`broadcast_dropout=True`), one dropout mask `[query, key]` is shared by all batch elements and
heads of a forward pass: a dropped pair loses its whole latent code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from latentcode.models.config import ModelConfig
from latentcode.models.hooks import HookPoint
from latentcode.models.normalization import SCORE_NORMALIZATIONS
from latentcode.models.positions import RelativePositionBias, Rotary
from latentcode.models.value_network import VALUE_NETWORKS


def lecun_normal_(weight: Tensor, fan_in: int) -> Tensor:
    """Truncated normal with variance 1 / fan_in: Flax's default kernel init, used by the authors."""
    std = 1.0 / math.sqrt(fan_in)
    return nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        sizes = config.sizes
        self.config = config
        self.n_heads, self.d_head, self.d_head_v = sizes.n_heads, sizes.d_head, sizes.d_head_v
        d_model = sizes.d_model

        self.W_Q = nn.Parameter(lecun_normal_(torch.empty(self.n_heads, d_model, self.d_head), d_model))
        self.W_K = nn.Parameter(lecun_normal_(torch.empty(self.n_heads, d_model, self.d_head), d_model))
        self.W_V = nn.Parameter(lecun_normal_(torch.empty(self.n_heads, d_model, self.d_head_v), d_model))
        self.W_O = nn.Parameter(
            lecun_normal_(torch.empty(self.n_heads, self.d_head_v, d_model), self.n_heads * self.d_head_v)
        )
        self.b_Q = nn.Parameter(torch.zeros(self.n_heads, self.d_head))
        self.b_K = nn.Parameter(torch.zeros(self.n_heads, self.d_head))
        self.b_V = nn.Parameter(torch.zeros(self.n_heads, self.d_head_v))
        self.b_O = nn.Parameter(torch.zeros(d_model))

        self.score_normalization = config.score_normalization
        self.normalize = SCORE_NORMALIZATIONS[self.score_normalization]
        self.value_network = VALUE_NETWORKS[config.value_network](self.n_heads, self.d_head_v)
        self.attn_dropout = config.attn_dropout
        self.rms_head_eps = config.rms_head_eps

        self.relative_position_bias = (
            RelativePositionBias(self.n_heads, config.n_ctx) if config.positions == "relative" else None
        )
        self.rotary = (
            Rotary(self.d_head, config.n_ctx, config.rotary_base) if config.positions == "rotary" else None
        )
        if config.causal:
            allowed = torch.ones(config.n_ctx, config.n_ctx, dtype=torch.bool).tril()
            self.register_buffer("allowed", allowed, persistent=False)
        else:
            self.allowed = None

        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head, d_head_v]
        if self.rotary is not None:
            self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head]
            self.hook_rot_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos], before sigma
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos], the latent codes
        self.hook_z = HookPoint()  # [batch, pos, head, d_head_v]

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys, values `[batch, pos, head, d]` from the attention input `[batch, pos, d_model]`.

        One matrix product for all three (the weights are concatenated on the fly, a small copy).
        """
        batch, n_positions, d_model = x.shape
        h, dk, dv = self.n_heads, self.d_head, self.d_head_v
        weight = torch.cat(
            [w.permute(1, 0, 2).reshape(d_model, -1) for w in (self.W_Q, self.W_K, self.W_V)], dim=1
        )
        bias = torch.cat([self.b_Q.reshape(-1), self.b_K.reshape(-1), self.b_V.reshape(-1)])
        qkv = torch.addmm(bias, x.reshape(-1, d_model), weight).view(batch, n_positions, -1)
        q, k, v = qkv.split([h * dk, h * dk, h * dv], dim=-1)
        return (
            q.view(batch, n_positions, h, dk),
            k.view(batch, n_positions, h, dk),
            v.view(batch, n_positions, h, dv),
        )

    def forward(self, x: Tensor) -> Tensor:
        """x: the attention input `[batch, pos, d_model]` -> attention output `[batch, pos, d_model]`."""
        batch, n_positions, _ = x.shape
        q, k, v = self.project_qkv(x)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if self.rotary is not None:
            q, k = self.hook_rot_q(self.rotary(q)), self.hook_rot_k(self.rotary(k))

        # Scaling the queries rather than the scores saves a pass over [batch, head, query, key].
        scores = torch.einsum("bqhd,bkhd->bhqk", q * (1.0 / math.sqrt(self.d_head)), k)
        if self.relative_position_bias is not None:
            scores = scores + self.relative_position_bias(n_positions)
        scores = self.hook_attn_scores(scores)

        allowed = None if self.allowed is None else self.allowed[:n_positions, :n_positions]
        latent_codes = self.hook_pattern(self.normalize(scores, allowed, self.rms_head_eps))
        if self.training and self.attn_dropout > 0:
            keep = latent_codes.new_ones(1, 1, n_positions, n_positions)
            latent_codes = latent_codes * F.dropout(keep, self.attn_dropout, training=True)

        z = self.hook_z(self.value_network(latent_codes, v))
        out = torch.addmm(
            self.b_O, z.reshape(batch * n_positions, -1), self.W_O.reshape(-1, self.W_O.shape[-1])
        )
        return out.view(batch, n_positions, -1)
