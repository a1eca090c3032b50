"""A tiny model with non-zero biases, shared by the model tests: small enough for the loop-based
references in `reference.py`, and every bias is non-zero so those references check where it enters."""

import torch

from latentcode import ModelConfig, build_model

TINY = dict(n_layers=2, d_model=6, n_heads=3, kqv_dim=6, v_dim=6, d_mlp=8, n_ctx=5, d_in=3, d_out=2)


def tiny_model(attention, seed=0, **overrides):
    config = ModelConfig(attention=attention, **{**TINY, **overrides})
    model = build_model(config, seed=seed).eval()
    # Non-zero biases so the reference checks where every bias enters.
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.split(".")[-1] in ("b_Q", "b_K", "b_V", "b_O", "b", "b_in", "b_out"):
                parameter.copy_(0.3 * torch.randn_like(parameter))
    return model
