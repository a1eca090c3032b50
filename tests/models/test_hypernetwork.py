"""The hypernetwork view: sum_k network_{q,k}(x_k) + b_O equals the layer's real output."""

import pytest
import torch

from latentcode import ModelConfig, build_model, value_network_view
from tests.models.tiny import tiny_model

EXACT = ["softmax", "linear", "hyla", "linear_rmshead", "hyla_no_rmshead", "hyla_no_relu",
         "hyla_no_relu_no_rmshead", "hyla_softmax_instead", "hyla_deep", "hyla_softmax"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention", EXACT)
def test_generated_networks_reproduce_the_layer_output(attention, causal):
    model = tiny_model(attention, causal=causal)
    x = torch.randn(2, 5, 3)
    _, cache = model.run_with_cache(x)
    for layer in range(2):
        view = value_network_view(model, x, layer)
        torch.testing.assert_close(view.output(), cache[f"blocks.{layer}.hook_attn_out"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(view.latent_codes, cache[f"blocks.{layer}.attn.hook_pattern"])


def test_linear_view_is_sum_over_heads_of_out_times_value():
    model = tiny_model("softmax")
    x = torch.randn(1, 5, 3)
    view = value_network_view(model, x, layer=1, queries=[-1], keys=[0, 2])
    assert view.weights[0].shape == (1, 1, 2, 6, 6)  # [batch, q, k, d_model, d_model]
    attn = model.blocks[1].attn
    a = view.latent_codes[0, :, 0, 1]  # codes of (q = last, k = 2)
    expected = sum(a[h] * attn.W_O[h].T @ attn.W_V[h].T for h in range(3))
    torch.testing.assert_close(view.weights[0][0, 0, 1], expected)
    assert view.queries.tolist() == [4] and view.keys.tolist() == [0, 2]


def test_hyla_view_has_two_generated_layers_and_relu():
    model = tiny_model("hyla")
    view = value_network_view(model, torch.randn(2, 5, 3), layer=0, queries=[1, 2], keys=[3])
    assert [w.shape for w in view.weights] == [(2, 2, 1, 2, 6), (2, 2, 1, 6, 2)]
    assert view.activations == ["relu"]
    deep = value_network_view(tiny_model("hyla_deep"), torch.randn(2, 5, 3), layer=0)
    assert [w.shape[-2:] for w in deep.weights] == [(2, 6), (2, 2), (6, 2)]


def test_relu_linear_has_no_exact_view():
    with pytest.raises(ValueError, match="nonlinearity after summing over keys"):
        value_network_view(tiny_model("linear_rmshead_relu"), torch.randn(1, 5, 3), layer=0)


def test_selection_errors():
    model = tiny_model("hyla")
    x = torch.randn(1, 5, 3)
    with pytest.raises(IndexError, match=r"layer 2 is outside the model's 2 layers"):
        value_network_view(model, x, layer=2)
    with pytest.raises(IndexError, match=r"query positions \[7\] are outside the sequence of 5 positions"):
        value_network_view(model, x, layer=0, queries=[7])
    big = build_model(ModelConfig(attention="softmax", d_model=64, n_heads=4, kqv_dim=8, n_ctx=32, d_in=2, d_out=1))
    with pytest.raises(MemoryError, match=r"GiB, above max_bytes"):
        value_network_view(big, torch.randn(64, 32, 2), layer=0, max_bytes=2**20)


def test_view_restores_training_mode():
    model = tiny_model("hyla").train()
    value_network_view(model, torch.randn(1, 5, 3), layer=0)
    assert model.training
