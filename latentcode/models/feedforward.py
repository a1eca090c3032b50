"""Feed-forward layers: a one-hidden-layer GELU MLP (default) or a top-k mixture of such MLPs.

GELU uses the tanh approximation, Flax's default and so the authors' (in training, float32 on the
CPU, through `latentcode.models.fused_gelu`). Parameter names follow TransformerLens: `W_in`
`[d_model, d_mlp]`, `b_in`, `W_out` `[d_mlp, d_model]`, `b_out`, and the router's `W_gate`
`[d_model, n_experts]`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from latentcode.models import fused_gelu
from latentcode.models.hooks import HookPoint
from latentcode.models.initializers import lecun_normal_


def affine(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """x W + b `[..., d_out]` of `x` `[..., d_in]`, `weight` `[d_in, d_out]`: one matrix product (addmm)."""
    return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], -1)


class MLP(nn.Module):
    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.W_in = nn.Parameter(lecun_normal_(torch.empty(d_model, d_mlp), d_model))
        self.b_in = nn.Parameter(torch.zeros(d_mlp))
        self.W_out = nn.Parameter(lecun_normal_(torch.empty(d_mlp, d_model), d_mlp))
        self.b_out = nn.Parameter(torch.zeros(d_model))
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: Tensor) -> Tensor:
        """x: `[..., d_model]` -> `[..., d_model]`."""
        pre = self.hook_pre(affine(x, self.W_in, self.b_in))
        fused = self.training and fused_gelu.available(pre)
        post = self.hook_post(fused_gelu.gelu(pre) if fused else F.gelu(pre, approximate="tanh"))
        return affine(post, self.W_out, self.b_out)


class MixtureOfExperts(nn.Module):
    """`n_experts` MLPs of the same size; a linear router picks the top-k per token.

    The chosen experts' router logits are softmaxed (over the k chosen only) and their outputs
    mixed by those weights. Each expert runs only on the tokens routed to it.
    """

    def __init__(self, d_model: int, d_mlp: int, n_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.W_gate = nn.Parameter(lecun_normal_(torch.empty(d_model, n_experts), d_model))
        self.experts = nn.ModuleList(MLP(d_model, d_mlp) for _ in range(n_experts))
        self.hook_expert_weights = HookPoint()  # [batch, pos, top_k]
        self.hook_expert_indices = HookPoint()  # [batch, pos, top_k]

    def forward(self, x: Tensor) -> Tensor:
        """x: `[batch, pos, d_model]` -> `[batch, pos, d_model]`."""
        router_logits = x @ self.W_gate  # [batch, pos, n_experts]
        top_logits, top_indices = router_logits.topk(self.top_k, dim=-1)
        weights = self.hook_expert_weights(top_logits.softmax(dim=-1))
        top_indices = self.hook_expert_indices(top_indices)

        tokens = x.reshape(-1, x.shape[-1])
        flat_indices = top_indices.reshape(-1, self.top_k)
        flat_weights = weights.reshape(-1, self.top_k)
        out = torch.zeros_like(tokens)
        for expert_index, expert in enumerate(self.experts):
            token_rows, slot = torch.nonzero(flat_indices == expert_index, as_tuple=True)
            if token_rows.numel() == 0:
                continue
            expert_out = expert(tokens[token_rows]) * flat_weights[token_rows, slot, None]
            out = out.index_add(0, token_rows, expert_out)
        return out.view(x.shape)
