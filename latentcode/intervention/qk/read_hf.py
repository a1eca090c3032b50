"""One head of a Hugging Face Llama-family causal LM (Llama, Mistral, Qwen2: RMSNorm, RoPE, GQA,
optional q/k/v/o biases; SmolLM2 is one) read for the decomposition, and rerun with the head's
queries or keys replaced (path patching).

Read by forward hooks, whatever attention implementation the model uses, in float32 whatever the model's dtype: the
components from `embed_tokens`, each earlier layer's `o_proj` input (split per head, times its columns of the
o_proj weight) and `mlp` output; the frozen RMS scale from the input of the layer's
`input_layernorm`; cos and sin of RoPE from the model's `rotary_emb`; the reference queries and keys
from `q_proj`/`k_proj`, rotated. Under GQA the key map of query head h is that of key/value head
h // (heads per key/value head).

Refused, in one line each: soft-capped scores (Gemma 2: tanh is not linear), ALiBi (Bloom, MPT,
Falcon with alibi), per-head q/k normalisation (Qwen3, OLMo 2: not implemented here), partial
rotary, a sliding window shorter than the sequence, any other architecture.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from latentcode.intervention.qk.components import (
    CannotDecompose,
    FrozenNorm,
    HeadMaps,
    HeadReading,
    LayerWrites,
)

DECOMPOSED_TYPES = ("llama", "mistral", "qwen2")


def refusal(config, n_positions: int) -> str | None:
    """Why this model's scores cannot be decomposed here exactly, or None."""
    kind = getattr(config, "model_type", "?")
    cap = getattr(config, "attn_logit_softcapping", None)
    if cap:
        return (f"{kind} soft-caps its scores ({cap} * tanh(s / {cap}), attn_logit_softcapping): tanh is not "
                f"linear, so no sum of query x key terms equals the score")
    if kind in ("bloom", "mpt") or getattr(config, "alibi", False):
        return f"{kind} adds ALiBi slopes to its scores, which this decomposition does not implement"
    if kind not in DECOMPOSED_TYPES:
        return (f"model type {kind!r} is not decomposed here (per-head q/k norms, soft caps and other score "
                f"maps are not implemented); expected one of {', '.join(DECOMPOSED_TYPES)}")
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        return f"{kind} rotates only part of each head (partial_rotary_factor), which is not implemented here"
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and window < n_positions:
        return f"{kind} attends within a sliding window of {window} < the sequence's {n_positions} positions"
    return None


def head_columns(weight: Tensor, head: int, width: int) -> Tensor:
    """Rows `head * width:(head + 1) * width` of a projection weight `[out, d_model]`,
    transposed: `[d_model, width]`."""
    return weight[head * width:(head + 1) * width].T.detach().float()


def head_bias(linear: nn.Linear, head: int, width: int) -> Tensor | None:
    return None if linear.bias is None else linear.bias[head * width:(head + 1) * width].detach().float()


def read(model: nn.Module, tokens: Tensor, layer: int, head: int) -> tuple[HeadReading, Tensor]:
    """The `HeadReading` of (layer, head) on one sequence `tokens` `[pos]` or `[1, pos]`, and the logits."""
    tokens = torch.as_tensor(tokens)
    tokens = tokens[None] if tokens.ndim == 1 else tokens
    config = model.config
    why = refusal(config, tokens.shape[1])
    if why:
        raise CannotDecompose(why)
    base = model.model
    layers = base.layers
    attention = layers[layer].self_attn
    n_heads, d_head = config.num_attention_heads, attention.head_dim
    n_kv_heads = getattr(config, "num_key_value_heads", None) or n_heads
    kv_head = head // (n_heads // n_kv_heads)
    captured: dict[str, Tensor] = {}

    def keep(name):
        def hook(module, inputs, output):
            captured[name] = (output[0] if isinstance(output, tuple) else output).detach().float()
        return hook

    def keep_input(name):
        def hook(module, inputs):
            captured[name] = inputs[0].detach().float()
        return hook

    handles = [base.embed_tokens.register_forward_hook(keep("embed")),
               base.rotary_emb.register_forward_hook(lambda module, inputs, output: captured.update(
                   cos=output[0].detach(), sin=output[1].detach())),
               layers[layer].input_layernorm.register_forward_pre_hook(keep_input("residual")),
               attention.q_proj.register_forward_hook(keep("queries")),
               attention.k_proj.register_forward_hook(keep("keys"))]
    for earlier in range(layer):
        handles += [layers[earlier].self_attn.o_proj.register_forward_pre_hook(keep_input(f"z{earlier}")),
                    layers[earlier].mlp.register_forward_hook(keep(f"mlp{earlier}"))]
    logits = _logits_with_hooks(model, tokens, handles)
    residual = captured["residual"][0].float()
    norm = layers[layer].input_layernorm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    frozen = FrozenNorm(False, torch.rsqrt(residual.pow(2).mean(-1) + eps), norm.weight.detach().float(), None, eps)
    maps = HeadMaps(frozen, head_columns(attention.q_proj.weight, head, d_head),
                    head_bias(attention.q_proj, head, d_head),
                    head_columns(attention.k_proj.weight, kv_head, d_head),
                    head_bias(attention.k_proj, kv_head, d_head),
                    float(attention.scaling), captured["cos"][0].float(), captured["sin"][0].float())
    writes = []
    for earlier in range(layer):
        o_proj = layers[earlier].self_attn.o_proj
        z = captured[f"z{earlier}"][0]
        W_O = o_proj.weight.detach().float().T.reshape(n_heads, -1, o_proj.weight.shape[0])  # [head, d_head, d_model]
        b_O = None if o_proj.bias is None else o_proj.bias.detach().float()
        writes.append(LayerWrites(z.view(z.shape[0], n_heads, -1), W_O, b_O, captured[f"mlp{earlier}"][0]))
    everywhere = torch.arange(tokens.shape[1])
    queries = maps.rotate(captured["queries"][0].view(tokens.shape[1], n_heads, d_head)[:, head], everywhere)
    keys = maps.rotate(captured["keys"][0].view(tokens.shape[1], n_kv_heads, d_head)[:, kv_head], everywhere)
    name = getattr(config, "name_or_path", "") or config.model_type
    reading = HeadReading(str(name), layer, head, config.num_hidden_layers, n_heads, captured["embed"][0], None,
                          writes, residual, maps, queries, keys)
    return reading, logits


def rerun(model: nn.Module, tokens: Tensor, reading: HeadReading, side: str, replaced: Tensor
          ) -> tuple[Tensor, Tensor, Tensor]:
    """The model run again with the head's unrotated queries (side "query") or keys ("key") replaced by
    `replaced` `[pos, d_head]` for this query head only (its key/value head's other query heads keep
    their keys): the head's softmax over the causal keys and its output through o_proj are recomputed
    from the new scores and the values of the same pass. Returns (scores, codes `[query, key]`, logits)."""
    tokens = torch.as_tensor(tokens)
    tokens = tokens[None] if tokens.ndim == 1 else tokens
    n_positions = tokens.shape[1]
    config = model.config
    attention = model.model.layers[reading.layer].self_attn
    n_heads = config.num_attention_heads
    n_kv_heads = getattr(config, "num_key_value_heads", None) or n_heads
    kv_head = reading.head // (n_heads // n_kv_heads)
    everywhere = torch.arange(n_positions)
    maps = reading.maps
    rotated = maps.rotate(replaced, everywhere)
    queries, keys = (rotated, reading.keys) if side == "query" else (reading.queries, rotated)
    scores = queries @ keys.T * maps.score_scale
    causal = torch.ones(n_positions, n_positions, dtype=torch.bool, device=scores.device).tril()
    codes = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    captured: dict[str, Tensor] = {}

    def keep_values(module, inputs, output):
        captured["values"] = output.detach()[0].view(n_positions, n_kv_heads, -1)[:, kv_head]

    def replace_head(module, inputs):
        z = inputs[0].clone()
        width = z.shape[-1] // n_heads
        z[0, :, reading.head * width:(reading.head + 1) * width] = (codes @ captured["values"].float()).to(z.dtype)
        return (z, *inputs[1:])

    handles = [attention.v_proj.register_forward_hook(keep_values),
               attention.o_proj.register_forward_pre_hook(replace_head)]
    logits = _logits_with_hooks(model, tokens, handles)
    return scores, codes, logits


def _logits_with_hooks(model, tokens, handles: list) -> torch.Tensor:
    """`model(tokens).logits` without gradients, the hooks `handles` removed afterwards whatever happens."""
    try:
        with torch.no_grad():
            return model(tokens).logits
    finally:
        for handle in handles:
            handle.remove()
