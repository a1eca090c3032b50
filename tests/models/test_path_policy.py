"""The attention layer's path is chosen by what sigma and the value network declare, not by their
names; and a hook that moves a long sequence to the full path changes its numbers by float rounding
only, for every preset."""

import pytest
import torch

from latentcode import ATTENTION_PRESETS, ModelConfig, build_model
from latentcode.models.normalization import (
    SCORE_NORMALIZATIONS,
    ScoreNormalization,
    softmax_over_keys,
)
from latentcode.models.path_policy import AUTO_MIN_POSITIONS, AttentionPathError, choose_path
from latentcode.models.value_network import VALUE_NETWORKS, LinearValueNetwork

LONG = AUTO_MIN_POSITIONS + 4


def long_model(attention, **overrides):
    config = ModelConfig(**{**dict(attention=attention, n_layers=2, d_model=16, n_heads=4, kqv_dim=16, d_mlp=16,
                                   n_ctx=LONG, d_in=5, d_out=3, causal=True, positions="rotary"), **overrides})
    return build_model(config, seed=0).eval()


def test_only_softmax_declares_itself_a_softmax_and_only_identity_the_identity():
    """The declarations the fast paths rely on, checked against what each sigma computes."""
    scores, allowed = torch.randn(2, 4, 6, 6) * 3, torch.ones(6, 6, dtype=torch.bool).tril()
    for name, sigma in SCORE_NORMALIZATIONS.items():
        codes = sigma(scores, allowed, 1e-6)
        is_softmax = torch.allclose(codes, torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1))
        is_identity = torch.equal(codes, scores.masked_fill(~allowed, 0.0))
        assert (sigma.is_softmax_over_keys, sigma.is_identity) == (is_softmax, is_identity), name
        # acts_per_query: the codes of the last query rows do not change when the first rows' scores do.
        changed = scores.clone()
        changed[:, :, :3] += 5 * torch.randn(2, 4, 3, 6)
        assert sigma.acts_per_query == torch.equal(sigma(changed, allowed, 1e-6)[:, :, 3:], codes[:, :, 3:]), name
    weighted_sums = [name for name, network in VALUE_NETWORKS.items() if network.is_weighted_sum_of_values]
    assert weighted_sums == ["linear"]


def test_the_path_follows_declared_capabilities_not_names():
    """A HYLA layer whose sigma and value network are swapped for a softmax and a weighted sum (the
    names in its config still say rms_head + hyper_relu) takes the sdpa path; a sigma that does not
    act per query row is never computed blockwise."""
    layer = long_model("hyla").blocks[0].attn
    assert choose_path(layer, LONG).path == "blockwise"
    layer.normalization = ScoreNormalization(softmax_over_keys, is_softmax_over_keys=True)
    layer.value_network = LinearValueNetwork(layer.n_heads, layer.d_head_v)
    assert choose_path(layer, LONG).path == "sdpa"

    layer = long_model("hyla").blocks[0].attn
    layer.normalization = ScoreNormalization(SCORE_NORMALIZATIONS["rms_head"], acts_per_query=False)
    assert choose_path(layer, LONG).path == "full"
    layer.path = "blockwise"
    with pytest.raises(AttentionPathError, match=r"^attention path 'blockwise' cannot compute this layer: its "
                                                 r"score normalization does not act on each query row alone"):
        choose_path(layer, LONG)


@pytest.mark.parametrize("hook_point", ["attn.hook_pattern", "attn.hook_attn_scores", "attn.value_network"])
@pytest.mark.parametrize("attention", list(ATTENTION_PRESETS))
def test_a_hook_that_moves_a_long_sequence_to_the_full_path_changes_its_numbers_by_rounding_only(
    attention, hook_point
):
    """The path without hooks (sdpa, associative or blockwise) and the full path a TransformerLens
    hook asks for give the same output, in float64 to 1e-12 of its largest entry (the sums are taken
    in other orders)."""
    model = long_model(attention).double()
    x = torch.randn(2, LONG, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        unhooked = model(x)
        fast_paths = [block.attn.last_path for block in model.blocks]
        module = model.blocks[0].get_submodule(hook_point)
        handle = module.register_forward_hook(lambda module, inputs, output: None)
        try:
            hooked = model(x)
        finally:
            handle.remove()
    assert fast_paths[0] != "full" and model.blocks[0].attn.last_path == "full"
    assert model.blocks[1].attn.last_path == fast_paths[1], "a hook on one layer leaves the others alone"
    torch.testing.assert_close(hooked, unhooked, atol=1e-12 * unhooked.abs().max().item(), rtol=0)
