"""Hook names and shapes as in TransformerLens, forward/backward for every preset, input errors, MoE."""

import pytest
import torch

from latentcode import ATTENTION_PRESETS, ModelConfig, build_model
from latentcode.models import InputShapeError
from latentcode.models.feedforward import MixtureOfExperts
from tests.models.reference import reference_mlp

SRAVEN_LIKE = dict(n_layers=2, d_model=16, n_heads=4, kqv_dim=8, v_dim=12, d_mlp=24, n_ctx=12, d_in=6, d_out=6)


def expected_hook_shapes(batch, pos, config):
    s = config.sizes
    shapes = {"hook_embed": (batch, pos, s.d_model), "ln_final.hook_normalized": (batch, pos, s.d_model)}
    for layer in range(config.n_layers):
        shapes |= {
            f"blocks.{layer}.hook_resid_pre": (batch, pos, s.d_model),
            f"blocks.{layer}.ln1.hook_normalized": (batch, pos, s.d_model),
            f"blocks.{layer}.attn.hook_q": (batch, pos, s.n_heads, s.d_head),
            f"blocks.{layer}.attn.hook_k": (batch, pos, s.n_heads, s.d_head),
            f"blocks.{layer}.attn.hook_v": (batch, pos, s.n_heads, s.d_head_v),
            f"blocks.{layer}.attn.hook_attn_scores": (batch, s.n_heads, pos, pos),
            f"blocks.{layer}.attn.hook_pattern": (batch, s.n_heads, pos, pos),
            f"blocks.{layer}.attn.hook_z": (batch, pos, s.n_heads, s.d_head_v),
            f"blocks.{layer}.hook_attn_out": (batch, pos, s.d_model),
            f"blocks.{layer}.hook_resid_mid": (batch, pos, s.d_model),
            f"blocks.{layer}.ln2.hook_normalized": (batch, pos, s.d_model),
            f"blocks.{layer}.mlp.hook_pre": (batch, pos, s.d_mlp),
            f"blocks.{layer}.mlp.hook_post": (batch, pos, s.d_mlp),
            f"blocks.{layer}.hook_mlp_out": (batch, pos, s.d_model),
            f"blocks.{layer}.hook_resid_post": (batch, pos, s.d_model),
        }
    return shapes


@pytest.mark.parametrize("attention", list(ATTENTION_PRESETS))
def test_every_preset_runs_forward_backward_and_caches_the_hooks(attention):
    config = ModelConfig(attention=attention, **SRAVEN_LIKE)
    model = build_model(config, seed=0).train()
    x = torch.rand(3, 10, 6)
    out = model(x)
    assert out.shape == (3, 10, 6)
    out.square().mean().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
    _, cache = model.run_with_cache(x)
    for name, shape in expected_hook_shapes(3, 10, config).items():
        assert tuple(cache[name].shape) == shape, name
    if config.value_network.startswith("hyper"):
        assert cache["blocks.0.attn.value_network.hook_hidden"].shape == (3, 10, 10, 3)


def test_run_with_hooks_can_patch_the_latent_code():
    model = build_model(ModelConfig(attention="hyla", **SRAVEN_LIKE), seed=0).eval()
    x = torch.rand(2, 10, 6)
    baseline = model(x)
    zeroed = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_pattern", lambda a, hook: a * 0)])
    _, cache = model.run_with_cache(x)
    # With zero codes the second attention layer outputs only its bias; its MLP still runs.
    resid_mid = cache["blocks.1.hook_resid_pre"] + model.blocks[1].attn.b_O
    resid_post = resid_mid + model.blocks[1].mlp(model.blocks[1].ln2(resid_mid))
    torch.testing.assert_close(zeroed, model.unembed(model.ln_final(resid_post)))
    assert not torch.allclose(zeroed, baseline)
    assert len(model.hook_dict["blocks.1.attn.hook_pattern"].fwd_hooks) == 0, "hooks are removed afterwards"


def test_token_models_and_rotary_positions():
    config = ModelConfig(attention="softmax", positions="rotary", causal=True, d_vocab=11, **{
        k: v for k, v in SRAVEN_LIKE.items() if k not in ("d_in", "d_out")})
    model = build_model(config, seed=0)
    tokens = torch.randint(0, 11, (2, 7))
    assert model(tokens).shape == (2, 7, 11)
    _, cache = model.run_with_cache(tokens)
    assert cache["blocks.0.attn.hook_rot_q"].shape == (2, 7, 4, 2)


def test_width_factor_scales_widths_and_heads_but_not_head_width():
    config = ModelConfig(attention="softmax", width_factor=2, **SRAVEN_LIKE)
    s = config.sizes
    assert (s.d_model, s.n_heads, s.d_head, s.d_head_v, s.d_mlp) == (32, 8, 2, 3, 48)
    model = build_model(config)
    assert model.blocks[0].attn.W_Q.shape == (8, 32, 2)
    assert model.blocks[0].attn.W_O.shape == (8, 3, 32)
    assert model(torch.rand(1, 4, 6)).shape == (1, 4, 6)


def test_parameter_names_and_shapes_follow_transformer_lens():
    model = build_model(ModelConfig(attention="softmax", **SRAVEN_LIKE))
    attn = model.blocks[0].attn
    assert attn.W_Q.shape == attn.W_K.shape == (4, 16, 2)
    assert attn.W_V.shape == (4, 16, 3) and attn.W_O.shape == (4, 3, 16)
    assert attn.b_Q.shape == attn.b_K.shape == (4, 2) and attn.b_V.shape == (4, 3) and attn.b_O.shape == (16,)
    assert attn.relative_position_bias.bias_table.shape == (4, 12)


@pytest.mark.parametrize(
    "bad_input, message",
    [
        (torch.rand(2, 10, 5), r"expected input of shape \[batch, pos <= 12, d_in=6\].*got shape \[2, 10, 5\]"),
        (torch.rand(10, 6), r"got shape \[10, 6\]"),
        (torch.rand(2, 13, 6), r"13 positions but the model accepts at most n_ctx=12"),
        (torch.ones(2, 10, 6, dtype=torch.long), r"got dtype torch.int64"),
    ],
)
def test_wrong_inputs_name_expected_and_received(bad_input, message):
    model = build_model(ModelConfig(attention="softmax", **SRAVEN_LIKE))
    with pytest.raises(InputShapeError, match=message):
        model(bad_input)


def test_token_model_refuses_float_input():
    config = ModelConfig(d_vocab=5, n_ctx=4, n_layers=1, d_model=8, n_heads=2, kqv_dim=4, d_mlp=8)
    with pytest.raises(InputShapeError, match=r"integer tokens.*got shape \[1, 4, 5\]"):
        build_model(config)(torch.rand(1, 4, 5))


def test_mixture_of_experts_equals_top_k_mixture_written_out():
    torch.manual_seed(0)
    moe = MixtureOfExperts(d_model=6, d_mlp=8, n_experts=5, top_k=2)
    x = torch.randn(2, 7, 6)
    got = moe(x)
    expected = torch.zeros_like(x)
    for b in range(2):
        for t in range(7):
            logits = x[b, t] @ moe.W_gate
            chosen = sorted(range(5), key=lambda e: -logits[e].item())[:2]
            weights = torch.softmax(logits[chosen], dim=0)
            for weight, e in zip(weights, chosen, strict=True):
                expected[b, t] += weight * reference_mlp(moe.experts[e], x[b, t])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_moe_model_trains():
    model = build_model(ModelConfig(attention="hyla", ffn="moe", **SRAVEN_LIKE), seed=0)
    out = model(torch.rand(2, 10, 6))
    out.sum().backward()
    assert model.blocks[0].mlp.W_gate.grad is not None
