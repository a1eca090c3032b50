"""Slow reference implementations written directly from the paper's formulas.

Explicit Python loops over batch, head, query and key; no einsum, no shared code with the package
beyond reading parameters. Only for tiny sizes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def reference_normalize(normalization, scores, allowed, eps):
    """scores [batch, head, query, key]; allowed bool [query, key] or None. A normalization without a
    formula here is refused, never computed as another."""
    if normalization not in ("softmax", "identity", "rms_head", "softmax_rms_head"):
        raise ValueError(f"the reference has no formula for the score normalization {normalization!r}: write one")
    batch, n_heads, n_query, n_key = scores.shape
    out = torch.zeros_like(scores)
    is_allowed = (lambda i, j: True) if allowed is None else (lambda i, j: bool(allowed[i, j]))
    for b in range(batch):
        if normalization in ("softmax", "softmax_rms_head"):
            for h in range(n_heads):
                for i in range(n_query):
                    keys = [j for j in range(n_key) if is_allowed(i, j)]
                    total = sum(math.exp(scores[b, h, i, j].item()) for j in keys)
                    for j in keys:
                        out[b, h, i, j] = math.exp(scores[b, h, i, j].item()) / total
            source = out.clone() if normalization == "softmax_rms_head" else None
        else:
            source = scores
        if normalization == "identity":
            for h in range(n_heads):
                for i in range(n_query):
                    for j in range(n_key):
                        out[b, h, i, j] = scores[b, h, i, j] if is_allowed(i, j) else 0.0
        if normalization in ("rms_head", "softmax_rms_head"):
            for i in range(n_query):
                for j in range(n_key):
                    if not is_allowed(i, j):
                        for h in range(n_heads):
                            out[b, h, i, j] = 0.0
                        continue
                    mean_square = sum(source[b, h, i, j].item() ** 2 for h in range(n_heads)) / n_heads
                    rms = math.sqrt(mean_square + eps)
                    for h in range(n_heads):
                        out[b, h, i, j] = source[b, h, i, j] / rms
    return out


def reference_attention(attn, x, normalization, value_network, position_bias=None, allowed=None, eps=1e-6, rotary=None):
    """Output [batch, pos, d_model] of one attention layer, from the formulas, for input x.

    attn: an object with W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O (and value_network.W_value2 for hyper_deep).
    position_bias: [head, query, key] or None. rotary: a function applied to q and k, or None.
    """
    batch, n_pos, d_model = x.shape
    n_heads, _, d_head = attn.W_Q.shape
    q = torch.zeros(batch, n_pos, n_heads, d_head)
    k = torch.zeros(batch, n_pos, n_heads, d_head)
    v = torch.zeros(batch, n_pos, n_heads, attn.W_V.shape[-1])
    for b in range(batch):
        for t in range(n_pos):
            for h in range(n_heads):
                q[b, t, h] = x[b, t] @ attn.W_Q[h] + attn.b_Q[h]
                k[b, t, h] = x[b, t] @ attn.W_K[h] + attn.b_K[h]
                v[b, t, h] = x[b, t] @ attn.W_V[h] + attn.b_V[h]
    if rotary is not None:
        q, k = rotary(q), rotary(k)
    scores = torch.zeros(batch, n_heads, n_pos, n_pos)
    for b in range(batch):
        for h in range(n_heads):
            for i in range(n_pos):
                for j in range(n_pos):
                    scores[b, h, i, j] = torch.dot(q[b, i, h], k[b, j, h]) / math.sqrt(d_head)
                    if position_bias is not None:
                        scores[b, h, i, j] += position_bias[h, i, j]
    a = reference_normalize(normalization, scores, allowed, eps)
    return reference_attention_with_pattern(attn, x, a, value_network), a


def reference_attention_with_pattern(attn, x, a, value_network):
    """Output [batch, pos, d_model] of one attention layer whose latent codes are `a`
    [batch, head, query, key] (given, e.g. edited), for input x: the value network from the formulas
    (a value network without a formula here is refused)."""
    if value_network not in ("linear", "relu_linear", "hyper_linear", "hyper_relu", "hyper_deep"):
        raise ValueError(f"the reference has no formula for the value network {value_network!r}: write one")
    batch, n_pos, d_model = x.shape
    n_heads = attn.W_Q.shape[0]
    W_value = [attn.W_V[h].T for h in range(n_heads)]  # [d_head_v, d_model]
    W_out = [attn.W_O[h].T for h in range(n_heads)]  # [d_model, d_head_v]
    out = torch.zeros(batch, n_pos, d_model)
    for b in range(batch):
        for i in range(n_pos):
            y = attn.b_O.clone()
            if value_network in ("linear", "relu_linear"):
                for h in range(n_heads):
                    pooled = sum(a[b, h, i, j] * (W_value[h] @ x[b, j] + attn.b_V[h]) for j in range(n_pos))
                    if value_network == "relu_linear":
                        pooled = torch.relu(pooled)
                    y = y + W_out[h] @ pooled
            else:
                for j in range(n_pos):
                    first = sum(a[b, h, i, j] * (W_value[h] @ x[b, j] + attn.b_V[h]) for h in range(n_heads))
                    hidden = first if value_network == "hyper_linear" else torch.relu(first)
                    if value_network == "hyper_deep":
                        second = sum(a[b, h, i, j] * attn.value_network.W_value2[h].T for h in range(n_heads))
                        hidden = torch.relu(second @ hidden)
                    generated_out = sum(a[b, h, i, j] * W_out[h] for h in range(n_heads))
                    y = y + generated_out @ hidden
            out[b, i] = y
    return out


def reference_mlp(mlp, x):
    return F.gelu(x @ mlp.W_in + mlp.b_in, approximate="tanh") @ mlp.W_out + mlp.b_out
