"""One head of a transformer-lens 4.x `TransformerBridge` read for the decomposition, and rerun with
the head's queries or keys replaced (path patching).

Read from the bridge's own cache: `hook_embed`, `hook_pos_embed` (learned positions: the component
`position`), each earlier block's `attn.hook_z` (times `attn.W_O`) and `hook_mlp_out`; the frozen scale
from `blocks.{layer}.ln1.hook_scale` (the divisor the bridge itself used); the reference queries and keys
from `attn.hook_q`/`hook_k`. LayerNorm (`normalization_type` "LN") and RMSNorm ("RMS") are folded in.

Refused in one line: soft-capped scores (`attn_scores_soft_cap`), positions other than learned
embeddings or none (rotary, ALiBi, shortformer: not implemented here for bridges; give a Hugging Face
Llama-family model directly for RoPE), q/k normalisation, and norms without weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from latentcode.intervention.qk.components import (
    CannotDecompose,
    FrozenNorm,
    HeadMaps,
    HeadReading,
    LayerWrites,
)


def refusal(cfg) -> str | None:
    cap = getattr(cfg, "attn_scores_soft_cap", -1.0)
    if cap and cap > 0:
        return (f"the bridge soft-caps its scores ({cap} * tanh(s / {cap}), attn_scores_soft_cap): tanh is not "
                f"linear, so no sum of query x key terms equals the score")
    positions = getattr(cfg, "positional_embedding_type", "standard")
    if positions not in ("standard", "none", None):
        return (f"positional_embedding_type {positions!r} is not decomposed for bridges (expected 'standard'); "
                f"for RoPE give the Hugging Face model itself")
    if getattr(cfg, "use_qk_norm", False):
        return "the bridge normalises queries and keys per head (use_qk_norm), which is not implemented here"
    if getattr(cfg, "normalization_type", "LN") not in ("LN", "RMS"):
        return f"normalization_type {cfg.normalization_type!r} is not decomposed here; expected 'LN' or 'RMS'"
    return None


def score_scale(cfg) -> float:
    if not getattr(cfg, "use_attn_scale", True):
        return 1.0
    scale = getattr(cfg, "attn_scale", -1.0)
    return 1.0 / (scale if scale and scale > 0 else math.sqrt(cfg.d_head))


def as_batch(tokens: Tensor) -> Tensor:
    tokens = torch.as_tensor(tokens)
    return tokens[None] if tokens.ndim == 1 else tokens


def read(bridge: nn.Module, tokens: Tensor, layer: int, head: int) -> tuple[HeadReading, Tensor]:
    """The `HeadReading` of (layer, head) on one sequence `tokens` `[pos]` or `[1, pos]`, and the logits."""
    cfg = bridge.cfg
    why = refusal(cfg)
    if why:
        raise CannotDecompose(why)
    tokens = as_batch(tokens)
    n_heads = cfg.n_heads
    n_kv_heads = getattr(cfg, "n_key_value_heads", None) or n_heads
    kv_head = head // (n_heads // n_kv_heads)
    wanted = {"hook_embed", "hook_pos_embed", f"blocks.{layer}.ln1.hook_in", f"blocks.{layer}.ln1.hook_scale",
              f"blocks.{layer}.attn.hook_q", f"blocks.{layer}.attn.hook_k"}
    wanted |= {f"blocks.{earlier}.{name}" for earlier in range(layer) for name in ("attn.hook_z", "hook_mlp_out")}
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(tokens, names_filter=lambda name: name in wanted)
    block = bridge.blocks[layer]
    attention = block.attn
    norm = block.ln1.original_component
    centred = cfg.normalization_type == "LN"
    offset = getattr(norm, "bias", None)
    frozen = FrozenNorm(centred, 1.0 / cache[f"blocks.{layer}.ln1.hook_scale"][0, :, 0], norm.weight.detach(),
                        None if offset is None else offset.detach(), cfg.eps)
    maps = HeadMaps(frozen, attention.W_Q[head].detach(), attention.b_Q[head].detach(),
                    attention.W_K[kv_head].detach(), attention.b_K[kv_head].detach(), score_scale(cfg))
    writes = [LayerWrites(cache[f"blocks.{earlier}.attn.hook_z"][0], bridge.blocks[earlier].attn.W_O.detach(),
                          bridge.blocks[earlier].attn.b_O.detach(), cache[f"blocks.{earlier}.hook_mlp_out"][0])
              for earlier in range(layer)]
    position = cache["hook_pos_embed"][0] if "hook_pos_embed" in cache else None
    reading = HeadReading(f"TransformerBridge {cfg.model_name}", layer, head, cfg.n_layers, n_heads,
                          cache["hook_embed"][0], position, writes, cache[f"blocks.{layer}.ln1.hook_in"][0], maps,
                          cache[f"blocks.{layer}.attn.hook_q"][0, :, head],
                          cache[f"blocks.{layer}.attn.hook_k"][0, :, kv_head])
    return reading, logits


def rerun(bridge: nn.Module, tokens: Tensor, reading: HeadReading, side: str, replaced: Tensor
          ) -> tuple[Tensor, Tensor, Tensor]:
    """The bridge run again with the head's queries (side "query") or keys ("key") replaced by `replaced`
    `[pos, d_head]` at its own hook (`attn.hook_q`/`hook_k`); returns (scores, codes `[query, key]` from
    `hook_pattern`, logits). Refused where keys are shared by several query heads (GQA)."""
    cfg = bridge.cfg
    if side == "key" and (getattr(cfg, "n_key_value_heads", None) or cfg.n_heads) != cfg.n_heads:
        raise CannotDecompose("path patching one query head's keys in a bridge with shared key/value heads is not "
                              "implemented; give the Hugging Face model itself")
    tokens = as_batch(tokens)
    name = f"blocks.{reading.layer}.attn.hook_{'q' if side == 'query' else 'k'}"
    captured: dict[str, Tensor] = {}

    def replace(tensor, hook):
        tensor = tensor.clone()
        tensor[0, :, reading.head] = replaced.to(tensor.dtype)
        return tensor

    def keep(key):
        def hook(tensor, hook):  # hook.name may be an alias's; the key is ours
            captured[key] = tensor.detach()[0]
        return hook

    prefix = f"blocks.{reading.layer}.attn"
    with torch.no_grad():
        logits = bridge.run_with_hooks(tokens, fwd_hooks=[
            (name, replace), (f"{prefix}.hook_q", keep("q")), (f"{prefix}.hook_k", keep("k")),
            (f"{prefix}.hook_pattern", keep("pattern"))])
    scores = captured["q"][:, reading.head] @ captured["k"][:, reading.head].T * reading.maps.score_scale
    return scores, captured["pattern"][reading.head], logits
