"""Which source reads a model's latent codes: the first of the sources that applies."""

from __future__ import annotations

from torch import nn

from latentcode.extraction.bridge import BridgeSource, is_transformer_bridge
from latentcode.extraction.source import AttentionSource, HookPointSource
from latentcode.extraction.torch_attention import TorchAttentionSource


def detect_source(model: nn.Module) -> AttentionSource:
    """The source for `model`: HookPoints if it has them (our models, HookedTransformer), the
    TransformerBridge source for transformer-lens 4.x bridges, else SDPA/MultiheadAttention
    interception. Use `AdapterSource` explicitly for anything else."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if is_transformer_bridge(model):
        return BridgeSource(model)
    if HookPointSource.applies_to(model):
        return HookPointSource(model, name="latentcode" if _is_ours(model) else "transformer_lens")
    return TorchAttentionSource(model)



def _is_ours(model: nn.Module) -> bool:
    # By the class's module, so that reading a TransformerLens model never imports our models.
    return type(model).__module__.startswith("latentcode.")
