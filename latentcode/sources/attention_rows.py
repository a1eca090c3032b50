"""Arithmetic on attention tensors `[batch, head, query, key]` that every source shares.

A source reads (and, under an intervention, writes) the latent codes of selected (query, key)
pairs; the pairs come as two index tensors `(query_positions [n], key_positions [n])`. Sources
that recompute attention do so for the requested query rows only: `rows, inverse =
torch.unique(query_positions, return_inverse=True)`, so that pair `i` lives in row `inverse[i]`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def is_every_pair(pairs: tuple[Tensor, Tensor], n_queries: int, n_keys: int) -> bool:
    """Whether `pairs` are every (query, key) pair in row-major order (query 0's keys first): then
    the codes are the attention tensor itself, flattened, and need no gather or scatter."""
    queries, keys = pairs
    if len(queries) != n_queries * n_keys:
        return False
    return bool(torch.equal(queries.cpu(), torch.arange(n_queries).repeat_interleave(n_keys))
                and torch.equal(keys.cpu(), torch.arange(n_keys).repeat(n_queries)))


def gather_pairs(attention: Tensor, pairs: tuple[Tensor, Tensor]) -> Tensor:
    """`attention[:, :, q_i, k_i]` for each pair: `[batch, head, n_pairs]`, in the graph (gradients flow);
    every pair in row-major order is a flattening view."""
    if is_every_pair(pairs, *attention.shape[-2:]):
        return attention.flatten(-2)
    queries, keys = (index.to(attention.device) for index in pairs)
    return attention[:, :, queries, keys]


def slice_pairs(attention: Tensor, pairs: tuple[Tensor, Tensor]) -> Tensor:
    """`attention[:, :, q_i, k_i]` for each pair: `[batch, head, n_pairs]`, detached and float32."""
    return gather_pairs(attention, pairs).detach().float()


def write_pairs(attention: Tensor, pairs: tuple[Tensor, Tensor], codes: Tensor) -> Tensor:
    """A copy of `attention` with `codes` `[batch, head, n_pairs]` written at the pairs (autograd-safe:
    the input, which softmax's backward may need, is left as it was); codes of every pair in
    row-major order are the new attention tensor, reshaped."""
    if is_every_pair(pairs, *attention.shape[-2:]):
        return codes.to(attention.dtype).reshape(attention.shape)
    queries, keys = (index.to(attention.device) for index in pairs)
    edited = attention.clone()
    edited[:, :, queries, keys] = codes.to(attention.dtype)
    return edited


def codes_of_rows(rows_attention: Tensor, inverse: Tensor, keys: Tensor) -> Tensor:
    """`[batch, head, rows, key]` + pair indices -> `[batch, head, n_pairs]`, detached float32."""
    return rows_attention[:, :, inverse.to(rows_attention.device), keys.to(rows_attention.device)].detach().float()


def check_pairs(pairs: tuple[Tensor, Tensor], n_queries: int, n_keys: int, where: str) -> None:
    queries, keys = pairs
    if len(queries) and (int(queries.max()) >= n_queries or int(keys.max()) >= n_keys):
        raise IndexError(
            f"{where}: the call has {n_queries} queries and {n_keys} keys, but query position "
            f"{int(queries.max())} / key position {int(keys.max())} was requested; with a key/value "
            "cache or cross-attention the query axis is shorter than the key axis, so select positions "
            "explicitly"
        )


def softmax_rows(scores: Tensor, sinks: Tensor | None = None) -> Tensor:
    """softmax over keys; rows whose keys are all masked (-inf) become zeros, not NaN. `sinks` `[head]`:
    one logit per head in each row's denominator that takes no key (gpt-oss), so rows sum to < 1."""
    if sinks is not None:
        sink = sinks.to(device=scores.device, dtype=scores.dtype).reshape(1, -1, 1, 1)
        combined = torch.cat([scores, sink.expand(*scores.shape[:-1], 1)], dim=-1)
        return torch.softmax(combined, dim=-1)[..., :-1]
    probabilities = torch.softmax(scores, dim=-1)
    fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return probabilities.masked_fill(fully_masked, 0.0)


def as_minus_infinity(additive: Tensor) -> Tensor:
    """float32 copy of an additive mask or of scores, with the large negative numbers that stand for
    minus infinity (at or below half the dtype's lowest value, as Hugging Face `transformers` uses
    them) turned into -inf."""
    lowest = torch.finfo(additive.dtype).min if additive.dtype.is_floating_point else -math.inf
    return additive.float().masked_fill(additive <= lowest / 2, float("-inf"))


def changed(edited: Tensor, original: Tensor) -> Tensor:
    """Boolean mask of the entries an edit changed (NaN kept as NaN counts as unchanged)."""
    edited = edited.to(original.dtype)
    return ~((edited == original) | (torch.isnan(edited) & torch.isnan(original)))
