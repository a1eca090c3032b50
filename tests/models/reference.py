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


def t5_bucket(distance, n_buckets, max_distance):
    """T5's unidirectional bucket of a distance `query - key` clipped at 0 (keys after the query are at
    distance 0), from the formula: distances below n_buckets // 2 have a bucket each; larger ones
    share logarithmically spaced buckets, max_exact + floor(log(d / max_exact) / log(max_distance /
    max_exact) * (n_buckets - max_exact)), the last bucket taking every distance beyond."""
    max_exact = n_buckets // 2
    if distance < max_exact:
        return distance
    spaced = math.log(distance / max_exact) / math.log(max_distance / max_exact) * (n_buckets - max_exact)
    return min(max_exact + math.floor(spaced), n_buckets - 1)


def reference_position_bias(bias_table, n_positions):
    """The relative position bias `[head, query, key]`: bias_table[h, bucket(max(query - key, 0))],
    with n_buckets = max_distance = the table's width (the paper's setting, n_ctx)."""
    n_buckets = bias_table.shape[1]
    bucket = torch.tensor([[t5_bucket(max(query - key, 0), n_buckets, n_buckets) for key in range(n_positions)]
                           for query in range(n_positions)])
    return bias_table[:, bucket]


def reference_rotary(x, base=10000.0):
    """Rotary position embedding of queries or keys `x [batch, pos, head, d_head]`, from the formula
    (GPT-NeoX layout): component i and component i + d_head / 2 form a pair, rotated at position p by
    the angle p * base ** (-2 i / d_head): (a, b) -> (a cos - b sin, a sin + b cos)."""
    n_positions, d_head = x.shape[1], x.shape[-1]
    half = d_head // 2
    first, second = [], []
    for i in range(half):
        angle = torch.tensor([position * base ** (-2 * i / d_head) for position in range(n_positions)],
                             dtype=torch.float64)
        cos, sin = angle.cos().to(x.dtype)[None, :, None], angle.sin().to(x.dtype)[None, :, None]
        a, b = x[..., i], x[..., i + half]
        first.append(a * cos - b * sin)
        second.append(a * sin + b * cos)
    return torch.stack(first + second, dim=-1)


def reference_scores(attn, x, position_bias=None, rotary=None):
    """Scores `[batch, head, query, key]` of one attention layer, from the formulas, for input x:
    q . k / sqrt(d_head) (+ position_bias[h, q, k]), q and k rotated by `rotary` where given."""
    batch, n_pos, d_model = x.shape
    n_heads, _, d_head = attn.W_Q.shape
    q = torch.zeros(batch, n_pos, n_heads, d_head)
    k = torch.zeros(batch, n_pos, n_heads, d_head)
    for b in range(batch):
        for t in range(n_pos):
            for h in range(n_heads):
                q[b, t, h] = x[b, t] @ attn.W_Q[h] + attn.b_Q[h]
                k[b, t, h] = x[b, t] @ attn.W_K[h] + attn.b_K[h]
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
    return scores


def reference_attention(attn, x, normalization, value_network, position_bias=None, allowed=None, eps=1e-6, rotary=None):
    """Output [batch, pos, d_model] of one attention layer, from the formulas, for input x, and its
    latent codes [batch, head, query, key].

    attn: an object with W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O (and value_network.W_value2 for hyper_deep).
    position_bias: [head, query, key] or None. rotary: a function applied to q and k, or None.
    """
    scores = reference_scores(attn, x, position_bias, rotary)
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
