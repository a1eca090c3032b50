"""Every attention variant equals a slow reference written from the paper's formulas, and the score
normalizations have the properties the paper states."""

import math

import pytest
import torch

from latentcode import ATTENTION_PRESETS
from latentcode.models.normalization import SCORE_NORMALIZATIONS
from tests.models.reference import (
    reference_attention,
    reference_attention_with_pattern,
    reference_mlp,
    reference_normalize,
    reference_position_bias,
    reference_rotary,
)
from tests.models.tiny import TINY, tiny_model


def reference_positions(model, attn, n_positions=5):
    """The position bias and the rotary function of the reference (written from their formulas in
    tests/models/reference.py; only the learned bias table is read from the layer)."""
    if model.config.positions == "relative":
        return dict(position_bias=reference_position_bias(attn.relative_position_bias.bias_table, n_positions))
    if model.config.positions == "rotary":
        return dict(rotary=lambda t: reference_rotary(t, model.config.rotary_base))
    return {}


@pytest.mark.parametrize("positions", ["relative", "rotary"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention", list(ATTENTION_PRESETS))
def test_attention_layer_equals_reference(attention, causal, positions):
    model = tiny_model(attention, causal=causal, positions=positions)
    x = torch.randn(2, 5, TINY["d_in"])
    _, cache = model.run_with_cache(x)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        attention_input = cache[f"blocks.{layer}.ln1.hook_normalized"]
        allowed = torch.ones(5, 5, dtype=torch.bool).tril() if causal else None
        expected, expected_codes = reference_attention(
            attn, attention_input, model.config.score_normalization, model.config.value_network,
            allowed=allowed, **reference_positions(model, attn),
        )
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_attn_out"], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"], expected_codes, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "hyla", "hyla_deep"])
def test_whole_model_equals_reference_composition(attention):
    """Z = Attention(LN(X)) + X; Y = MLP(LN(Z)) + Z; final LN; linear head, from the formulas."""
    model = tiny_model(attention)
    x = torch.randn(2, 5, TINY["d_in"])
    residual = x @ model.embed.W_E + model.embed.b_E
    for block in model.blocks:
        ln1 = torch.nn.functional.layer_norm(residual, (6,), block.ln1.w, block.ln1.b, 1e-6)
        attended, _ = reference_attention(
            block.attn, ln1, model.config.score_normalization, model.config.value_network,
            **reference_positions(model, block.attn),
        )
        residual = residual + attended
        ln2 = torch.nn.functional.layer_norm(residual, (6,), block.ln2.w, block.ln2.b, 1e-6)
        residual = residual + reference_mlp(block.mlp, ln2)
    final = torch.nn.functional.layer_norm(residual, (6,), model.ln_final.w, model.ln_final.b, 1e-6)
    expected = final @ model.unembed.W_U + model.unembed.b_U
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalization", list(SCORE_NORMALIZATIONS))
@pytest.mark.parametrize("masked", [False, True])
def test_normalizations_equal_reference(normalization, masked):
    scores = torch.randn(2, 4, 5, 5) * 3
    allowed = torch.rand(5, 5) > 0.4 if masked else None
    if allowed is not None:
        allowed[:, 0] = True  # every query keeps a key, as a causal mask does
    got = SCORE_NORMALIZATIONS[normalization](scores, allowed, 1e-6)
    torch.testing.assert_close(got, reference_normalize(normalization, scores, allowed, 1e-6), atol=1e-6, rtol=1e-5)


def test_the_loop_reference_refuses_names_it_has_no_formula_for():
    scores = torch.randn(1, 2, 3, 3)
    with pytest.raises(ValueError, match="no formula for the score normalization 'sparsemax'"):
        reference_normalize("sparsemax", scores, None, 1e-6)
    model = tiny_model("hyla")
    with pytest.raises(ValueError, match="no formula for the value network 'hyper_gelu'"):
        reference_attention_with_pattern(model.blocks[0].attn, torch.randn(1, 3, 6), scores, "hyper_gelu")


def test_rms_head_codes_have_unit_rms_over_heads():
    model = tiny_model("hyla", causal=True, rms_head_eps=1e-12)  # eps only guards against 0 / 0
    _, cache = model.run_with_cache(torch.randn(3, 5, TINY["d_in"]))
    codes = cache["blocks.0.attn.hook_pattern"]  # [batch, head, query, key]
    rms = codes.square().mean(dim=1).sqrt()
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(rms[:, allowed], torch.ones_like(rms[:, allowed]), atol=1e-4, rtol=0)
    assert torch.all(codes[:, :, ~allowed] == 0)


def test_softmax_codes_sum_to_one_over_unmasked_keys():
    model = tiny_model("softmax", causal=True)
    _, cache = model.run_with_cache(torch.randn(3, 5, TINY["d_in"]))
    codes = cache["blocks.1.attn.hook_pattern"]
    torch.testing.assert_close(codes.sum(-1), torch.ones(3, 3, 5))
    assert torch.all(codes[..., torch.ones(5, 5, dtype=torch.bool).triu(1)] == 0)


@pytest.mark.parametrize("attention", list(ATTENTION_PRESETS))
def test_causal_mask_hides_later_keys_in_every_variant(attention):
    """Masked scores contribute nothing: changing later tokens leaves earlier outputs unchanged."""
    model = tiny_model(attention, causal=True)
    x = torch.randn(2, 5, TINY["d_in"])
    changed = x.clone()
    changed[:, 3:] = torch.randn(2, 2, TINY["d_in"]) * 5
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :3], model(changed)[:, :3], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(model(x)[:, 3:], model(changed)[:, 3:])


def test_attention_scale_is_inverse_sqrt_d_head():
    model = tiny_model("linear", positions="none", n_heads=1, kqv_dim=4, v_dim=4)
    x = torch.randn(1, 5, TINY["d_in"])
    _, cache = model.run_with_cache(x)
    q, k = cache["blocks.0.attn.hook_q"][0, :, 0], cache["blocks.0.attn.hook_k"][0, :, 0]
    torch.testing.assert_close(cache["blocks.0.attn.hook_attn_scores"][0, 0], q @ k.T / 2.0)


def test_attention_dropout_comes_after_the_recorded_codes():
    model = tiny_model("softmax", attn_dropout=0.5)
    x = torch.randn(4, 5, TINY["d_in"])
    _, eval_cache = model.run_with_cache(x)
    model.train()
    torch.manual_seed(0)
    _, train_cache = model.run_with_cache(x)
    model.eval()
    torch.testing.assert_close(train_cache["blocks.0.attn.hook_pattern"], eval_cache["blocks.0.attn.hook_pattern"])
    assert not torch.allclose(train_cache["blocks.0.hook_attn_out"], eval_cache["blocks.0.hook_attn_out"])


def test_attention_dropout_mask_is_shared_by_batch_and_heads():
    """With codes forced to 1 and values forced to one-hot(key), z[b, q, h] reads out the mask."""
    model = tiny_model("softmax", attn_dropout=0.5, v_dim=15)  # d_head_v = 5 = n_ctx
    x = torch.randn(4, 5, TINY["d_in"])

    def ones(codes, hook):
        return torch.ones_like(codes)

    def one_hot_of_key(values, hook):
        return torch.eye(5).expand(values.shape[0], values.shape[2], 5, 5).permute(0, 2, 1, 3).clone()

    recorded = {}
    model.train()
    torch.manual_seed(1)
    model.run_with_hooks(
        x,
        fwd_hooks=[
            ("blocks.0.attn.hook_pattern", ones),
            ("blocks.0.attn.hook_v", one_hot_of_key),
            ("blocks.0.attn.hook_z", lambda z, hook: recorded.setdefault("z", z.detach().clone())),
        ],
    )
    model.eval()
    mask = recorded["z"]  # [batch, query, head, key] = m[q, k]
    assert torch.all((mask == 0) | (mask == 2.0)), "kept codes are scaled by 1 / (1 - p) = 2"
    torch.testing.assert_close(mask, mask[:1, :, :1].expand_as(mask))
    assert 0 < (mask == 0).float().mean() < 1


def test_eval_mode_is_deterministic_and_train_mode_is_not():
    model = tiny_model("hyla", attn_dropout=0.1)
    x = torch.randn(4, 5, TINY["d_in"])
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x))
        model.train()
        outputs = [model(x) for _ in range(5)]
    assert any(not torch.allclose(outputs[0], other) for other in outputs[1:])


def test_rotary_scores_depend_only_on_relative_position():
    model = tiny_model("softmax", positions="rotary", n_ctx=8, n_heads=1, kqv_dim=4, v_dim=4)
    rotary = model.blocks[0].attn.rotary
    q, k = torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4)

    def score(query_position, key_position):
        q_at = torch.zeros(1, 8, 1, 4)
        k_at = torch.zeros(1, 8, 1, 4)
        q_at[:, query_position], k_at[:, key_position] = q[:, 0], k[:, 0]
        return (rotary(q_at)[0, query_position, 0] @ rotary(k_at)[0, key_position, 0]).item()

    assert math.isclose(score(5, 2), score(4, 1), rel_tol=1e-5)
    assert math.isclose(score(6, 6), (q.flatten() @ k.flatten()).item(), rel_tol=1e-5)
    assert not math.isclose(score(5, 2), score(5, 3), rel_tol=1e-3)
