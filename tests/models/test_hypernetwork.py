"""The hypernetwork view: sum_k network_{q,k}(x_k) + b_O equals the layer's real output."""

import pytest
import torch

from latentcode import ModelConfig, build_model, value_network_view
from latentcode.errors import LatentcodeError
from latentcode.models import VALUE_NETWORKS, NoExactView, ViewTooLarge
from tests.models.tiny import TINY, tiny_model

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


def test_hyla_view_layers_are_the_head_sums_of_the_value_and_out_weights():
    model = tiny_model("hyla")
    view = value_network_view(model, torch.randn(1, 5, 3), layer=1, queries=[0], keys=[4])
    attn = model.blocks[1].attn
    a = view.latent_codes[0, :, 0, 0]  # codes of (q = 0, k = 4)
    first = sum(a[h] * attn.W_V[h].T for h in range(3))
    torch.testing.assert_close(view.weights[0][0, 0, 0], first)
    torch.testing.assert_close(view.biases[0][0, 0, 0], sum(a[h] * attn.b_V[h] for h in range(3)))
    torch.testing.assert_close(view.weights[1][0, 0, 0], sum(a[h] * attn.W_O[h].T for h in range(3)))
    assert view.biases[1] is None and view.value_network == "hyper_relu"


@pytest.mark.parametrize("value_network", [name for name in VALUE_NETWORKS if name != "relu_linear"])
def test_floats_per_pair_counts_the_generated_tensors(value_network):
    """The memory bound uses exactly the size of what the view returns."""
    model = tiny_model(("identity", value_network))
    view = value_network_view(model, torch.randn(2, 5, 3), layer=0, queries=[0, 3], keys=[1, 2, 4])
    generated = sum(tensor.numel() for tensor in view.weights + view.biases if tensor is not None)
    per_pair = model.blocks[0].attn.value_network.floats_per_pair(TINY["d_model"])
    assert generated == 2 * 2 * 3 * per_pair


def test_relu_linear_has_no_exact_view():
    model = tiny_model("linear_rmshead_relu")
    with pytest.raises(NoExactView, match="nonlinearity after summing over keys") as refused:
        value_network_view(model, torch.randn(1, 5, 3), layer=0)
    assert isinstance(refused.value, LatentcodeError) and isinstance(refused.value, ValueError)
    assert "'relu_linear'" in str(refused.value) and "hyper_relu" in str(refused.value)


def test_the_memory_bound_is_the_size_of_the_generated_weights():
    model = tiny_model("softmax")  # one generated layer [d_model, d_model] and its bias per pair
    x = torch.randn(1, 5, 3)
    d_model = TINY["d_model"]
    needed = 1 * 5 * 5 * (d_model * d_model + d_model) * 4  # float32 bytes
    value_network_view(model, x, layer=0, max_bytes=needed)
    with pytest.raises(ViewTooLarge, match=rf"25 \(batch x query x key\) pairs need .*\({needed} bytes\), "
                       rf"above max_bytes=.*\({needed - 1} bytes\)") as refused:
        value_network_view(model, x, layer=0, max_bytes=needed - 1)
    assert isinstance(refused.value, LatentcodeError) and isinstance(refused.value, ValueError)


def test_selection_errors():
    model = tiny_model("hyla")
    x = torch.randn(1, 5, 3)
    with pytest.raises(IndexError, match=r"layer 2 is outside the model's 2 layers"):
        value_network_view(model, x, layer=2)
    with pytest.raises(IndexError, match=r"query positions \[7\] are outside the sequence of 5 positions"):
        value_network_view(model, x, layer=0, queries=[7])
    big = build_model(ModelConfig(attention="softmax", d_model=64, n_heads=4, kqv_dim=8, n_ctx=32, d_in=2, d_out=1))
    with pytest.raises(ViewTooLarge, match=r"GiB \(\d+ bytes\), above max_bytes"):
        value_network_view(big, torch.randn(64, 32, 2), layer=0, max_bytes=2**20)


def test_view_restores_training_mode():
    model = tiny_model("hyla").train()
    value_network_view(model, torch.randn(1, 5, 3), layer=0)
    assert model.training
