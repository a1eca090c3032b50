"""Which kind of model this is, and its reader: our hooked transformer (`read_ours`), a transformer-lens
4.x TransformerBridge (`read_bridge`), or a Hugging Face Llama-family causal LM (`read_hf`; a
`latentcode.pretrained.Pretrained` gives its model). One function takes any of them, so that the
one-interface Subject can be taken here later in their place."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from torch import Tensor, nn

from latentcode.intervention.qk import read_bridge, read_hf, read_ours
from latentcode.intervention.qk.components import CannotDecompose, HeadReading
from latentcode.models.transformer import Transformer
from latentcode.sources.bridge import is_transformer_bridge


def unwrap(model: Any) -> nn.Module:
    """The torch module of `model` (a `Pretrained` gives its `.model`)."""
    inner = getattr(model, "model", None)
    if not isinstance(model, nn.Module) and isinstance(inner, nn.Module):
        return inner
    return model


def reader_of(model: nn.Module) -> ModuleType:
    """The reader module of `model`'s kind; refuses, in one line, a model of no known kind."""
    if isinstance(model, Transformer):
        return read_ours
    if is_transformer_bridge(model):
        return read_bridge
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) is not None and hasattr(getattr(model, "model", None), "layers"):
        return read_hf
    raise CannotDecompose(f"a {type(model).__name__} is none of the models decomposed here; expected a "
                          f"latentcode Transformer, a transformer-lens TransformerBridge or a Hugging Face "
                          f"Llama-family causal LM")


def shape_of(model: nn.Module) -> tuple[int, int]:
    """(layers, query heads) of `model`."""
    if isinstance(model, Transformer):
        return model.config.n_layers, model.blocks[0].attn.n_heads
    if is_transformer_bridge(model):
        return model.cfg.n_layers, model.cfg.n_heads
    return model.config.num_hidden_layers, model.config.num_attention_heads


def check_head(model: nn.Module, layer: int, head: int) -> None:
    n_layers, n_heads = shape_of(model)
    for name, value, count in (("layer", layer, n_layers), ("head", head, n_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise CannotDecompose(f"{name} must be an integer in 0..{count - 1} (the model has {count} "
                                  f"{name}s), got {value!r}")


def read_head(model: Any, tokens: Tensor, layer: int, head: int) -> tuple[HeadReading, Tensor]:
    """Read (layer, head) of `model` on one sequence: the `HeadReading` and the model's output."""
    model = unwrap(model)
    reader = reader_of(model)
    check_head(model, layer, head)
    if model.training:
        raise CannotDecompose("the model is in training mode (dropout would change every pass); "
                              "call model.eval() first")
    return reader.read(model, on_device_of(model, tokens), layer, head)


def on_device_of(model: nn.Module, tokens: Any) -> Tensor:
    """`tokens` as a tensor on the model's device (the inputs follow the model)."""
    import torch

    parameter = next(model.parameters(), None)
    return torch.as_tensor(tokens).to("cpu" if parameter is None else parameter.device)


def rerun_head(model: Any, tokens: Tensor, reading: HeadReading, side: str, replaced: Tensor):
    """The model run again with the head's `side` ("query" or "key") replaced: (scores, codes, output)."""
    model = unwrap(model)
    return reader_of(model).rerun(model, on_device_of(model, tokens), reading, side, replaced)


def next_token_loss(model: Any, tokens: Tensor):
    """The mean next-token cross-entropy on `tokens` as a function of the model's output, where the model
    is a language model (Hugging Face, bridge, or ours with a vocabulary and no other output); else None."""
    import torch
    import torch.nn.functional as F

    model = unwrap(model)
    if isinstance(model, Transformer) and (model.config.d_vocab is None or model.config.d_out is not None):
        return None
    targets = torch.as_tensor(tokens).reshape(-1)[1:]

    def loss(output: Tensor) -> Tensor:
        logits = getattr(output, "logits", output)
        return F.cross_entropy(logits[0, :-1].float(), targets.to(logits.device))

    return loss
