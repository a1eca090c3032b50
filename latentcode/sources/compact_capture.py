"""Recording a compact store (`latentcode.store.compact`) from intercepted SDPA calls, and from the eager
attention calls of transformers models that run only eagerly (`latentcode.sources.eager_attention`).

`CompactAttentionSource` is `TorchAttentionSource` that also hands every intercepted call, as a
`CompactLayer` (its queries and keys, key/value grouping, scale and mask, and an eager call's
soft-capping and sinks), to a callback that writes it to disk before the next layer runs: memory holds
one layer's queries and keys, never `[H, T, T]`. Site codes are recorded as by `TorchAttentionSource`.

A call's mask must be what the compact store holds: `is_causal`, or a boolean/additive mask (shared by
the heads, 0 or -inf) that is causal or not, with or without a sliding window, with padding keys;
anything else (a position bias, a mask per head, cross-attention, a key cache) is a `CompactError`
naming the layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from latentcode.errors import LatentcodeError
from latentcode.sources.attention_calls import additive_mask
from latentcode.sources.source import PairsFor, Sink
from latentcode.sources.torch_attention import TorchAttentionSource
from latentcode.store.compact import LayerMask


class CompactError(LatentcodeError):
    """An attention call whose codes the compact store cannot hold exactly; says which and why."""


@dataclass
class CompactLayer:
    """One call: `query` float32 `[B, H, T, d]`, `key` float32 `[B, H_kv, T, d]`, `key_valid` bool `[B, T]`."""

    query: np.ndarray
    key: np.ndarray
    key_valid: np.ndarray
    mask: LayerMask


def unique_key_heads(key: Tensor, n_heads: int) -> Tensor:
    """Keys `[B, H, T, d]` that repeat each key/value head r times (transformers' repeat_kv) -> `[B, H/r, T, d]`,
    the largest such r; keys without repeats unchanged."""
    for repeats in range(n_heads, 1, -1):
        if n_heads % repeats:
            continue
        grouped = key.reshape(key.shape[0], n_heads // repeats, repeats, *key.shape[2:])
        if torch.equal(grouped, grouped[:, :, :1].expand_as(grouped)):
            return grouped[:, :, 0]
    return key


def layer_mask(call: dict[str, Any], n_queries: int, where: str) -> tuple[np.ndarray, bool, int]:
    """`(key_valid [B, T], causal, window)` of an SDPA call, checked to give exactly its mask on every
    query that is a token."""
    mask, is_causal = call.get("attn_mask"), bool(call.get("is_causal", False))
    batch = call["query"].shape[0]
    if mask is None:
        return np.ones((batch, n_queries), dtype=bool), is_causal, 0
    additive = additive_mask(mask, true_means="attend")
    finite = additive[torch.isfinite(additive)]
    if finite.numel() and bool((finite != 0).any()):
        raise CompactError(f"{where}: its mask adds a bias to the scores (e.g. ALiBi); the compact store holds "
                           "causal, sliding-window and padding masks only: record its sites densely")
    allowed = torch.isfinite(additive)
    while allowed.dim() < 4:
        allowed = allowed[None]
    if allowed.shape[1] != 1 and not bool((allowed == allowed[:, :1]).all()):
        raise CompactError(f"{where}: its mask differs between heads; the compact store holds one mask per layer")
    allowed = allowed[:, 0].expand(batch, n_queries, allowed.shape[-1])
    if is_causal:
        allowed = allowed & torch.ones(n_queries, n_queries, dtype=torch.bool, device=allowed.device).tril()
    key_valid = allowed.any(dim=1)  # [B, T]: a key some query attends to
    positions = torch.arange(n_queries, device=allowed.device)
    later = positions[None, :] > positions[:, None]  # [q, k]: k > q
    rows = key_valid  # queries that are tokens (self-attention: the same positions)
    causal = not bool((allowed & later & rows[:, :, None]).any())
    first_key = torch.where(allowed, positions, n_queries).min(dim=-1).values  # [B, q]
    first_valid = torch.where(key_valid, positions, n_queries).min(dim=-1).values[:, None]
    spans = torch.where(rows & (first_key > first_valid), positions - first_key + 1, 0)
    window = int(spans.max()) if causal and spans.numel() else 0
    rebuilt = key_valid[:, None, :].expand_as(allowed)
    if causal:
        rebuilt = rebuilt & ~later
    if window:
        rebuilt = rebuilt & (positions[None, :] > positions[:, None] - window)
    if not bool(((rebuilt == allowed) | ~rows[:, :, None]).all()):
        raise CompactError(f"{where}: its mask is not causal / sliding-window / padding; the compact store cannot "
                           "hold it exactly: record its sites densely")
    return key_valid.cpu().numpy(), causal, window


def compact_layer(call: dict[str, Any], where: str) -> CompactLayer:
    """What the compact store keeps of one SDPA call (see the module docstring)."""
    query, key = call["query"], call["key"]
    if query.dim() != 4 or key.dim() != 4:
        raise CompactError(f"{where}: a {query.dim()}-D attention call; the compact store reads [batch, head, "
                           "position, dim] calls")
    if query.shape[-2] != key.shape[-2]:
        raise CompactError(f"{where}: {query.shape[-2]} queries and {key.shape[-2]} keys; the compact store holds "
                           "self-attention over a whole sequence (no key cache, no cross-attention)")
    if key.shape[1] == query.shape[1]:
        key = unique_key_heads(key, query.shape[1])
    key_valid, causal, window = layer_mask(call, query.shape[-2], where)
    scale = call.get("scale")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    # An eager call's soft-capping (Gemma 2) and sinks (gpt-oss; one per query head), stored with the mask
    sinks = call.get("sinks")
    if sinks is not None and sinks.numel() != query.shape[1]:
        raise CompactError(f"{where}: {sinks.numel()} sinks for {query.shape[1]} query heads; the compact store "
                           "holds one sink logit per query head")
    mask = LayerMask(scale=scale, causal=causal, window=window, softcap=float(call.get("softcap") or 0.0),
                     sinks=None if sinks is None else tuple(float(value) for value in sinks.cpu()))
    return CompactLayer(query=query.detach().float().cpu().numpy(), key=key.detach().float().cpu().numpy(),
                        key_valid=key_valid, mask=mask)


class CompactAttentionSource(TorchAttentionSource):
    """`TorchAttentionSource` that also calls `on_layer(layer, CompactLayer)` for every SDPA call while
    capturing (`on_layer` None: as TorchAttentionSource)."""

    def __init__(self, model: torch.nn.Module, on_layer: Callable[[int, CompactLayer], None] | None = None):
        super().__init__(model)
        self.on_layer = on_layer

    def _on_call(self, pairs_for: PairsFor, score: str, sink: Sink, layer: int, where: str, kind: str,
                 call: dict[str, Any], result: Any) -> Any:
        if kind not in ("sdpa", "eager"):
            raise CompactError(f"{where}: an nn.MultiheadAttention call; the compact store reads SDPA calls "
                               "and transformers' eager attention")
        if self.on_layer is not None:
            with torch.no_grad():
                self.on_layer(layer, compact_layer(call, where))
        return super()._on_call(pairs_for, score, sink, layer, where, kind, call, result)
