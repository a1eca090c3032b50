"""The fused C kernels of the hyper value networks (`latentcode.models.fused_hyper`) equal the value
network's own forward and its autograd gradients, tile by tile and through the attention layer's
blockwise path (causal blocks whose lengths are not a multiple of the block or of the kernel's key
tile included); without the kernels the layer falls back to the batched-product kernels; the operators
pass opcheck and the einsum formula gradcheck in float64."""

import pytest
import torch

from latentcode.models import fused_hyper
from latentcode.models.attention import attention_path
from latentcode.models.value_network import HyperLinearValueNetwork, HyperReluValueNetwork
from tests.models.test_attention_paths import (
    assert_all_close,
    expected_by_formulas,
    make_layer,
    outputs_and_gradients,
)

NETWORKS = [HyperReluValueNetwork, HyperLinearValueNetwork]


def blockwise(layer, x, query_block):
    """The layer's output and gradients through the blockwise path with `query_block` queries per block."""
    with attention_path(layer, "blockwise", query_block):
        result = outputs_and_gradients(layer, layer, x)
    assert layer.last_path == "blockwise"
    return result


@pytest.fixture
def compiled(kernels):
    """The extension loaded (tests/models/conftest.py), else the test skips."""


@pytest.mark.parametrize("network_class", NETWORKS, ids=lambda cls: cls.config_name)
@pytest.mark.parametrize("n_heads", [4, 3], ids=["4 heads", "3 heads"])
def test_fused_kernels_equal_forward_and_its_autograd_gradients(network_class, n_heads, compiled, monkeypatch):
    """37 keys in kernel tiles of 8 (a partial last tile), values a strided slice of a longer sequence
    (as the blockwise path passes them), gradients added to an existing values gradient."""
    monkeypatch.setattr(fused_hyper, "KEY_TILE", 8)
    network = network_class(n_heads, 16)
    generator = torch.Generator().manual_seed(0)
    codes = torch.randn(2, n_heads, 5, 37, generator=generator).requires_grad_()
    longer_values = torch.randn(2, 50, n_heads, 16, generator=generator)
    values = longer_values[:, :37].clone().requires_grad_()
    grad_z = torch.randn(2, 5, n_heads, 16, generator=generator)

    expected_z = network(codes, values)  # einsum and autograd: the reference
    expected_codes_grad, expected_values_grad = torch.autograd.grad((expected_z * grad_z).sum(), [codes, values])
    assert network.fuses(values)
    z = network.forward_tile(codes.detach(), longer_values[:, :37])
    earlier = torch.randn(2, 50, n_heads, 16, generator=generator)
    grad_values_sum = earlier.clone()
    codes_grad, returned = network.backward_tile(codes.detach(), longer_values[:, :37], grad_z, grad_values_sum[:, :37])

    assert_all_close([z, codes_grad, grad_values_sum[:, :37] - earlier[:, :37]],
                     [expected_z.detach(), expected_codes_grad, expected_values_grad])
    assert torch.equal(grad_values_sum[:, 37:], earlier[:, 37:]), "keys outside the tile are left alone"
    assert returned.data_ptr() == grad_values_sum[:, :37].data_ptr(), "added in place, not copied"
    if network_class is HyperReluValueNetwork:  # the relu is there: negative hidden units pass nothing
        assert not torch.allclose(z, HyperLinearValueNetwork(n_heads, 16).forward_tile(codes.detach(), values.detach()))


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("attention", ["hyla", "hyla_no_relu", "hyla_no_rmshead"])
def test_blockwise_path_with_fused_kernels_equals_the_formulas(attention, causal, mode, compiled, monkeypatch):
    """d_head_v 8 (the kernels need a multiple of 8), 23 positions in blocks of 4 queries and kernel
    tiles of 3 keys: neither divides the length, and causal blocks end inside a tile."""
    monkeypatch.setattr(fused_hyper, "KEY_TILE", 3)
    calls = {"forward": 0, "backward": 0}
    for name in calls:
        original = getattr(fused_hyper, name)

        def counted(*args, name=name, original=original, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(fused_hyper, name, counted)
    layer = make_layer(attention, causal=causal, train=mode == "train", v_dim=16, n_ctx=24)
    x = torch.randn(2, 23, 8)
    assert_all_close(blockwise(layer, x, 4), expected_by_formulas(layer, x))
    assert calls == {"forward": 6, "backward": 6}, "one fused call per block of 4 queries, forward and backward"


def test_blockwise_path_equals_the_formulas_whether_or_not_the_kernels_are_fused(compiled):
    layer = make_layer("hyla", v_dim=16, n_ctx=24)
    x = torch.randn(2, 23, 8)
    fused = blockwise(layer, x, 5)
    with fused_hyper.use_fused(False):
        assert not layer.value_network.fuses(torch.zeros(1, 1, 2, 8))
        batched_products = blockwise(layer, x, 5)
    assert_all_close(fused, batched_products)


def test_under_the_formula_switch_the_layer_uses_the_batched_product_kernels(compiled, monkeypatch):
    monkeypatch.setenv("LATENTCODE_KERNELS", "formula")
    assert fused_hyper.library() is None
    assert fused_hyper.build_failure() == "LATENTCODE_KERNELS=formula"
    layer = make_layer("hyla", v_dim=16, n_ctx=24)
    assert not layer.value_network.fuses(torch.zeros(1, 1, 2, 8))
    x = torch.randn(2, 23, 8)
    assert_all_close(blockwise(layer, x, 5), expected_by_formulas(layer, x))


@pytest.mark.parametrize("relu", [True, False], ids=["hyper_relu", "hyper_linear"])
def test_the_operators_pass_opcheck_and_the_formula_gradcheck(compiled, relu):
    """`latentcode::hyper_values` and its backward (fake implementations, autograd formula) pass opcheck,
    values a strided slice of a longer sequence; the einsum formula (what every other dtype and device
    takes) passes gradcheck in float64, and the float32 operator's values and gradients equal it."""
    generator = torch.Generator().manual_seed(4)
    codes = torch.randn(2, 3, 5, 11, generator=generator)
    values = torch.randn(2, 14, 3, 8, generator=generator)[:, :11]
    grad_z = torch.randn(2, 5, 3, 8, generator=generator)
    torch.library.opcheck(torch.ops.latentcode.hyper_values.default, (codes, values, relu, 4))
    torch.library.opcheck(torch.ops.latentcode.hyper_values.default,
                          (codes.clone().requires_grad_(), values.clone().requires_grad_(), relu, 4))
    torch.library.opcheck(torch.ops.latentcode.hyper_values_backward.default, (codes, values, grad_z, relu, 4))
    network = (HyperReluValueNetwork if relu else HyperLinearValueNetwork)(3, 8)
    in_float64 = [codes[:, :, :2, :4].double().requires_grad_(), values[:, :4].double().requires_grad_()]
    assert torch.autograd.gradcheck(network, in_float64)
    leaves = [codes.clone().requires_grad_(), values.clone().requires_grad_()]
    got = torch.ops.latentcode.hyper_values(*leaves, relu, 4)
    expected = network(*leaves)
    assert_all_close([got, *torch.autograd.grad(got, leaves, grad_z)],
                     [expected, *torch.autograd.grad(expected, leaves, grad_z)])
