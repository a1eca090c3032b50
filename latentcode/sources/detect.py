"""Which source reads a model's latent codes: the first of the sources that applies."""

from __future__ import annotations

from torch import nn

from latentcode.sources.bridge import BridgeSource, is_transformer_bridge
from latentcode.sources.softmax_capture import SoftmaxSource
from latentcode.sources.source import AttentionSource, HookPointSource
from latentcode.sources.torch_attention import TorchAttentionSource


def detect_source(model: nn.Module) -> AttentionSource:
    """The source for `model`: HookPoints if it has them (our models, HookedTransformer), the
    TransformerBridge source for transformer-lens 4.x bridges, the softmax inside modules named
    like attention for Hugging Face models loaded with `attn_implementation="eager"` (they compute
    attention by hand), else SDPA/MultiheadAttention interception, which also reads the eager
    attention calls of models transformers runs only eagerly (Gemma 2, gpt-oss: their soft-capping
    and sinks, which a softmax read inside the module would miss or count as a key). For other hand-written attention
    pass `SoftmaxSource(model, modules)` naming the attention modules; for anything else `AdapterSource`."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if is_transformer_bridge(model):
        return BridgeSource(model)
    if HookPointSource.applies_to(model):
        return HookPointSource(model, name="latentcode" if _is_ours(model) else "transformer_lens")
    if _computes_attention_by_hand(model):
        return SoftmaxSource(model)
    return TorchAttentionSource(model)


def _computes_attention_by_hand(model: nn.Module) -> bool:
    """A Hugging Face model whose config says `attn_implementation="eager"` (softmax written out)."""
    config = getattr(model, "config", None)
    eager_only = getattr(type(model), "_supports_sdpa", None) is False  # read at their eager call instead
    return getattr(config, "_attn_implementation", None) == "eager" and not eager_only


def _is_ours(model: nn.Module) -> bool:
    # By the class's module, so that reading a TransformerLens model never imports our models.
    return type(model).__module__.startswith("latentcode.")
