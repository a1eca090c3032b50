"""One head of our hooked transformer (`latentcode.models.Transformer`: softmax, linear or HYLA
attention, pre-LayerNorm, biases, relative or rotary positions) read for the decomposition, and
rerun with one head's queries or keys replaced (path patching).

The components come from `hook_embed`, each earlier layer's `attn.hook_z` (times its W_O) and
`hook_mlp_out`; the frozen scale from `blocks.{layer}.hook_resid_pre`; the reference queries and keys
from `attn.hook_q`/`hook_k` (`hook_rot_q`/`hook_rot_k` with rotary positions). The score is the
score before sigma for every sigma (softmax, rms over heads, the identity).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from latentcode.intervention.qk.components import FrozenNorm, HeadMaps, HeadReading, LayerWrites
from latentcode.models.scores import score_scale


def as_sequence(model: nn.Module, tokens: Tensor) -> Tensor:
    """`tokens` as a batch of one sequence: `[1, pos]` integers or `[1, pos, d_in]` floats."""
    tokens = torch.as_tensor(tokens)
    single = 2 if model.config.d_in is not None else 1
    return tokens[None] if tokens.ndim == single else tokens


@contextmanager
def forward_hooks(hooks: dict[nn.Module, Callable]):
    """Forward hooks on modules for the block, removed on exit; the model in eval mode meanwhile."""
    handles = [module.register_forward_hook(hook) for module, hook in hooks.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def keep(store: dict, name: str) -> Callable:
    def hook(module, inputs, output):
        store[name] = output.detach()[0].float()  # read in float32 whatever the model's dtype
    return hook


def weight(tensor: Tensor | None) -> Tensor | None:
    """A parameter detached, in float32 (the decomposition's arithmetic whatever the model's dtype)."""
    return None if tensor is None else tensor.detach().float()


def read(model: nn.Module, tokens: Tensor, layer: int, head: int) -> tuple[HeadReading, Tensor]:
    """The `HeadReading` of (layer, head) on one sequence, and the model's output `[1, pos, d_out]`."""
    tokens = as_sequence(model, tokens)
    captured: dict[str, Tensor] = {}
    blocks = model.blocks
    attention = blocks[layer].attn
    rotary = attention.rotary is not None
    hooks = {model.hook_embed: keep(captured, "embed"), blocks[layer].hook_resid_pre: keep(captured, "residual"),
             (attention.hook_rot_q if rotary else attention.hook_q): keep(captured, "queries"),
             (attention.hook_rot_k if rotary else attention.hook_k): keep(captured, "keys")}
    for earlier in range(layer):
        hooks[blocks[earlier].attn.hook_z] = keep(captured, f"z{earlier}")
        hooks[blocks[earlier].hook_mlp_out] = keep(captured, f"mlp{earlier}")
    with forward_hooks(hooks), torch.no_grad():
        output = model(tokens)
    residual = captured["residual"]
    n_positions = residual.shape[0]
    norm = blocks[layer].ln1
    variance = residual.var(-1, unbiased=False)
    frozen = FrozenNorm(True, torch.rsqrt(variance + norm.eps), weight(norm.w), weight(norm.b), norm.eps)
    position_bias = None
    if attention.relative_position_bias is not None:
        position_bias = weight(attention.relative_position_bias(n_positions)[head])
    maps = HeadMaps(frozen, weight(attention.W_Q[head]), weight(attention.b_Q[head]), weight(attention.W_K[head]),
                    weight(attention.b_K[head]), score_scale(attention.d_head),
                    weight(attention.rotary.cos[:n_positions]) if rotary else None,
                    weight(attention.rotary.sin[:n_positions]) if rotary else None, position_bias)
    writes = [LayerWrites(captured[f"z{earlier}"], weight(blocks[earlier].attn.W_O), weight(blocks[earlier].attn.b_O),
                          captured[f"mlp{earlier}"]) for earlier in range(layer)]
    reading = HeadReading(f"{model.config.attention_name} transformer", layer, head, model.config.n_layers,
                          attention.n_heads, captured["embed"], None, writes, residual, maps,
                          captured["queries"][:, head], captured["keys"][:, head])
    return reading, output


def rerun(model: nn.Module, tokens: Tensor, reading: HeadReading, side: str, replaced: Tensor
          ) -> tuple[Tensor, Tensor, Tensor]:
    """The model run again with the head's unrotated queries (side "query") or keys ("key") replaced by
    `replaced` `[pos, d_head]`, everything else as it was: (scores `[query, key]` before sigma, codes
    `[query, key]` after sigma, output `[1, pos, d_out]`) of the head, read from the model's own hooks."""
    tokens = as_sequence(model, tokens)
    attention = model.blocks[reading.layer].attn
    head = reading.head
    captured: dict[str, Tensor] = {}

    def replace(module, inputs, output):
        output = output.clone()
        output[:, :, head] = replaced.to(output.dtype)
        return output

    hooks = {attention.hook_q if side == "query" else attention.hook_k: replace,
             attention.hook_attn_scores: keep(captured, "scores"), attention.hook_pattern: keep(captured, "codes")}
    with forward_hooks(hooks), torch.no_grad():
        output = model(tokens)
    return captured["scores"][head], captured["codes"][head], output
