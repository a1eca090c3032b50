"""Small models whose attention goes through F.scaled_dot_product_attention or nn.MultiheadAttention, and the
configurations they are tested in; shared by the extraction and intervention tests."""

import torch
import torch.nn.functional as F
from torch import nn


class SdpaAttention(nn.Module):
    """Attention through F.scaled_dot_product_attention; keeps each call's q, k for the reference."""

    def __init__(self, d_model, n_heads, n_kv_heads=None, heads_axis=True, **sdpa_kwargs):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads or n_heads
        self.d_head = d_model // n_heads
        self.heads_axis = heads_axis
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * self.n_kv_heads * self.d_head)
        self.out = nn.Linear(d_model, d_model)
        self.sdpa_kwargs = sdpa_kwargs

    def forward(self, x, attn_mask=None):
        batch, length, _ = x.shape
        q = self.query(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
        k, v = self.key_value(x).view(batch, length, 2, self.n_kv_heads, self.d_head).transpose(1, 3).unbind(2)
        if not self.heads_axis:  # one head, [batch, sequence, dim]
            q, k, v = q[:, 0], k[:, 0], v[:, 0]
        self.seen = {"q": q.detach(), "k": k.detach(), "attn_mask": attn_mask}
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **self.sdpa_kwargs)
        if not self.heads_axis:
            mixed = mixed[:, None].expand(-1, self.n_heads, -1, -1)
        return self.out(mixed.transpose(1, 2).reshape(batch, length, -1))


class SdpaModel(nn.Module):
    def __init__(self, d_model=16, n_heads=4, n_layers=2, **attention_kwargs):
        super().__init__()
        self.embed = nn.Linear(3, d_model)
        self.blocks = nn.ModuleList()
        for _ in range(n_layers):
            block = nn.Module()
            block.attn = SdpaAttention(d_model, n_heads, **attention_kwargs)
            block.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))
            self.blocks.append(block)

    def forward(self, x, attn_mask=None):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block.attn(h, attn_mask)
            h = h + block.mlp(h)
        return h


BATCH, LENGTH = 3, 6


def random_bool_mask():
    mask = torch.rand(BATCH, 1, LENGTH, LENGTH, generator=torch.Generator().manual_seed(1)) > 0.4
    return mask | torch.eye(LENGTH, dtype=torch.bool)  # every query keeps a key


SDPA_CASES = {
    "plain": ({}, None),
    "causal": ({"is_causal": True}, None),
    "bool-mask": ({}, random_bool_mask),
    "float-mask": ({}, lambda: torch.randn(LENGTH, LENGTH, generator=torch.Generator().manual_seed(2))),
    "scale": ({"scale": 0.3}, None),
    "gqa": ({"n_kv_heads": 2, "enable_gqa": True, "is_causal": True}, None),
    "no-head-axis": ({"heads_axis": False}, None),
}



# -- nn.MultiheadAttention ------------------------------------------------------------------------------
class MhaModel(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        self.attn = mha

    def forward(self, query, key, **kwargs):
        return self.attn(query, key, key, need_weights=False, **kwargs)[0]


L, S, E, H = 5, 7, 16, 4


def mha_case(name):
    """(MultiheadAttention, query, key, forward kwargs) for each configuration."""
    generator = torch.Generator().manual_seed(3)
    padding = torch.zeros(2, S, dtype=torch.bool)
    padding[1, 4:] = True
    if name == "batch-first-causal-padding":
        mha = nn.MultiheadAttention(E, H, batch_first=True)
        x = torch.randn(2, L, E, generator=generator)
        causal = torch.ones(L, L, dtype=torch.bool).triu(1)  # True: masked
        return mha, x, x, {"attn_mask": causal, "key_padding_mask": padding[:, :L], "is_causal": True}
    if name == "sequence-first-bool-mask":
        mha = nn.MultiheadAttention(E, H)
        x = torch.randn(L, 2, E, generator=generator)
        mask = torch.rand(L, L, generator=generator) > 0.6
        mask.fill_diagonal_(False)
        return mha, x, x, {"attn_mask": mask}
    if name == "cross-attention-kdim":
        mha = nn.MultiheadAttention(E, H, kdim=6, vdim=6, batch_first=True)
        return mha, torch.randn(2, L, E, generator=generator), torch.randn(2, S, 6, generator=generator), {
            "key_padding_mask": padding
        }
    if name == "bias-kv-zero-attn-per-head-mask":
        mha = nn.MultiheadAttention(E, H, add_bias_kv=True, add_zero_attn=True, batch_first=True)
        nn.init.normal_(mha.bias_k)
        x = torch.randn(2, L, E, generator=generator)
        return mha, x, x, {"attn_mask": torch.randn(2 * H, L, L, generator=generator)}
    raise KeyError(name)


MHA_CASES = ["batch-first-causal-padding", "sequence-first-bool-mask", "cross-attention-kdim", "bias-kv-zero-attn-per-head-mask"]


