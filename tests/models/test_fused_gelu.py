"""The fused tanh-GELU kernels (`latentcode.models.fused_gelu`) equal the formula evaluated in float64,
values and gradients, from -30 to 30 with the limits and NaN exact; an MLP in training mode equals the
same MLP through `F.gelu` (outputs, parameter gradients, hooks); evaluation mode is `F.gelu` bit for
bit; without the kernels training falls back; any split over threads gives the numbers of one; the
kernels are operators that pass opcheck and that torch.compile keeps in its graph."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from latentcode.models import fused_gelu
from latentcode.models.feedforward import MLP
from tests.models.kernel_counts import CountOps, recording_backend

C, K = math.sqrt(2 / math.pi), 0.044715


@pytest.fixture
def compiled(kernels):
    """The extension loaded (tests/models/conftest.py), else the test skips."""


def float64_reference(x: torch.Tensor):
    """gelu(x) and gelu'(x) of float32 `x` in float64 (gelu as x sigmoid(z), no cancellation; gelu'
    by autograd through it), with the tolerance scales: |gelu| and |s| + |x s (1 - s) z'| (the sum's
    terms), times the condition number 1 + |z| (1 - s) of sigmoid(z) in z."""
    x64 = x.double().requires_grad_()
    z = 2 * C * (x64 + K * x64**3)
    s = torch.sigmoid(z)
    value = x64 * s
    (derivative,) = torch.autograd.grad(value.sum(), x64)
    with torch.no_grad():
        condition = 1 + z.abs() * (1 - s)
        derivative_terms = s.abs() + (x64 * s * (1 - s) * 2 * C * (1 + 3 * K * x64**2)).abs()
        return value.detach(), derivative, value.abs() * condition, derivative_terms * condition


def assert_within(got: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor, x: torch.Tensor):
    """|got - expected| <= 4e-7 scale + 1e-35.

    Why 4e-7 (3.4 float32 epsilons): the kernel rounds in float32 (unit roundoff 6e-8) a handful of
    times per value and Cephes' expf polynomial is good to about 1 ulp; the worst seen was 1.7e-7
    (here and over 10 million normal draws of scales 0.1 to 12). A wrong k, c or ln 2, a polynomial
    coefficient wrong in its third digit or a derivative constant off by 1e-4 fails. Why times the
    condition number: z is itself rounded to float32, which moves exp(-|z|) by |z| roundoffs; for
    x << 0 (|z| up to 87) no float32 evaluation, torch's included, does better. Why 1e-35: exp below
    float32's smallest normal (1.2e-38) is taken as 0, so values under |x| 1.2e-38 and derivatives
    under |x z'(x)| 1.2e-38 (< 4e-36 where it happens, |x| ~ 10) come out as 0."""
    error = (got.double() - expected).abs()
    bound = 4e-7 * scale + 1e-35
    worst = (error / bound).argmax()
    assert (error <= bound).all(), (f"x = {x.flatten()[worst].item()!r}: got {got.flatten()[worst].item()!r}, "
                                    f"expected {expected.flatten()[worst].item()!r}")


def test_the_reference_is_torchs_tanh_approximation():
    """x sigmoid(2c (x + k x^3)) is 0.5 x (1 + tanh(c (x + k x^3))): the float64 reference of these
    tests is the function `F.gelu(approximate="tanh")` computes (where 1 + tanh does not cancel)."""
    x = torch.linspace(-5, 30, 10_001)
    expected = F.gelu(x.double(), approximate="tanh")
    torch.testing.assert_close(float64_reference(x)[0], expected, rtol=1e-12, atol=1e-15)


def test_values_and_gradients_equal_the_formula_in_float64(compiled):
    """600,001 points from -30 to 30, 0, -0, the smallest normal (600,006 floats: the last 6 go through
    the padded tail), and a float32 gradient other than 1."""
    x = torch.cat([torch.linspace(-30, 30, 600_001), torch.tensor([0.0, -0.0, 1.2e-38, -1.2e-38, 1e-30])])
    grad_y = torch.rand(x.shape, generator=torch.Generator().manual_seed(0)) + 0.5
    value, derivative, value_scale, derivative_scale = float64_reference(x)

    assert_within(fused_gelu.forward(x), value, value_scale, x)
    assert_within(fused_gelu.backward(x, torch.ones_like(x)), derivative, derivative_scale, x)
    grad_y64 = grad_y.double()
    assert_within(fused_gelu.backward(x, grad_y), derivative * grad_y64, derivative_scale * grad_y64, x)


def test_large_inputs_give_the_limits_and_nan_stays_nan(compiled):
    """gelu(x) -> x and gelu' -> 1 as x -> inf, gelu -> -0 and gelu' -> 0 as x -> -inf (no NaN from
    inf * 0 or an overflowing x^3); NaN in, NaN out (in a full vector and in the tail), the other
    floats of its vector unaffected."""
    inf, nan = math.inf, math.nan
    x = torch.tensor([-inf, -1e30, -30.0, nan, -20.0, 20.0, 30.0, 1e30, inf, nan])
    value, derivative = fused_gelu.forward(x), fused_gelu.backward(x, torch.ones_like(x))
    exact = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(value, torch.tensor([-0.0, -0.0, -0.0, nan, -0.0, 20, 30, 1e30, inf, nan]), **exact)
    assert torch.signbit(value[[0, 1, 2, 4]]).all(), "-0: gelu tends to 0 from below"
    torch.testing.assert_close(derivative, torch.tensor([0.0, 0, 0, nan, 0, 1, 1, 1, 1, nan]), **exact)


SPLIT_INPUTS = 200_003
"""Floats of the thread-split test: three parts of at least 65,536, not a multiple of the 16-float split alignment."""


def test_any_split_over_threads_gives_the_numbers_of_one_thread(compiled):
    """200,003 floats over 3 of torch's threads (parts of at least 65,536 floats on 16-float lines, the last
    one shorter and not a multiple of 8): the numbers of one thread, bit for bit."""
    x = torch.randn(SPLIT_INPUTS, generator=torch.Generator().manual_seed(1)) * 4
    grad_y = torch.randn(SPLIT_INPUTS, generator=torch.Generator().manual_seed(2))
    one_thread = fused_gelu.forward(x), fused_gelu.backward(x, grad_y)
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        split = fused_gelu.forward(x), fused_gelu.backward(x, grad_y)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(split[0], one_thread[0]) and torch.equal(split[1], one_thread[1])
    reference, derivative, *_ = float64_reference(x)
    torch.testing.assert_close(one_thread[0].double(), reference, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(one_thread[1].double(), derivative * grad_y.double(), rtol=1e-5, atol=1e-6)


def mlp_outputs_and_gradients(mlp: MLP, x: torch.Tensor) -> list[torch.Tensor]:
    """The MLP's output, its parameters' gradients and the input's, with a forward hook that scales
    hook_pre and a backward hook that records the gradient at hook_post."""
    recorded = []
    mlp.zero_grad()
    x = x.clone().requires_grad_()
    handles = [mlp.hook_pre.add_hook(lambda activation, hook: activation * 1.5),
               mlp.hook_post.add_hook(lambda grad, hook: recorded.append(grad), dir="bwd")]
    try:
        out = mlp(x)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    finally:
        for handle in handles:
            handle.hook.remove()
    return [out.detach(), x.grad, *[p.grad for p in mlp.parameters()], *recorded]


def wide_input() -> torch.Tensor:
    """Pre-activations from about -12 to 12, through the negative tail where torch's 1 + tanh cancels."""
    return torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(3)) * 3


def test_mlp_in_training_equals_its_f_gelu_outputs_and_gradients(compiled):
    """Output, input and parameter gradients, and the gradient at hook_post, equal those through
    `F.gelu` and those of the MLP in float64, within 1e-6 of each tensor's largest magnitude: the
    matrix products' float32 sums (16 to 40 terms) differ by a few 1e-7 of it whichever GELU runs."""
    torch.manual_seed(0)
    mlp = MLP(16, 40).train()
    with CountOps() as ops:
        fused = mlp_outputs_and_gradients(mlp, wide_input())
    assert ops.counts == {"gelu_tanh": 1, "gelu_tanh_backward": 1}, "the kernels ran, once each"
    with fused_gelu.use_fused(False), CountOps() as ops:
        unfused = mlp_outputs_and_gradients(mlp, wide_input())
    assert not ops.counts, "use_fused(False) turns them off"
    in_float64 = mlp_outputs_and_gradients(copy.deepcopy(mlp).double(), wide_input().double())
    assert len(fused) == len(unfused) == len(in_float64) == 7
    for got, expected, exact in zip(fused, unfused, in_float64, strict=True):
        scale = exact.abs().max().item()
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6 * scale)
        torch.testing.assert_close(got.double(), exact, rtol=0, atol=1e-6 * scale)


def test_evaluation_is_f_gelu_bit_for_bit(compiled):
    """The computation of the shipped results: addmm, F.gelu(approximate="tanh"), addmm."""
    torch.manual_seed(0)
    mlp = MLP(16, 40).eval()
    x = wide_input()
    with CountOps() as ops:
        with torch.no_grad():
            pre = torch.addmm(mlp.b_in, x.reshape(-1, 16), mlp.W_in)
            expected = torch.addmm(mlp.b_out, F.gelu(pre, approximate="tanh"), mlp.W_out).view(x.shape)
            assert torch.equal(mlp(x), expected)
        assert torch.equal(mlp(x.requires_grad_()).detach(), expected), "with gradients too"
    assert not ops.counts


def test_float64_autocast_and_a_second_derivative(compiled):
    x = torch.randn(4, 8, requires_grad=True)
    assert fused_gelu.available(x) and not fused_gelu.available(x.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_gelu.available(x)
    with fused_gelu.use_fused(False):
        assert not fused_gelu.available(x)
    with pytest.raises(RuntimeError, match=r"differentiable once.*use_fused\(False\)"):
        torch.autograd.grad(fused_gelu.gelu(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):  # also where the gradient needs a graph
        torch.autograd.grad((fused_gelu.gelu(x) ** 2).sum(), x, create_graph=True)


def test_under_the_formula_switch_training_takes_f_gelu(compiled, monkeypatch):
    monkeypatch.setenv("LATENTCODE_KERNELS", "formula")
    torch.manual_seed(0)
    mlp = MLP(16, 40).train()
    x = wide_input()
    assert not fused_gelu.available(x) and fused_gelu.KERNELS.failure() == "LATENTCODE_KERNELS=formula"
    with CountOps() as ops:
        fallback = mlp_outputs_and_gradients(mlp, x)
    assert not ops.counts
    with fused_gelu.use_fused(False):
        for got, expected in zip(fallback, mlp_outputs_and_gradients(mlp, x), strict=True):
            assert torch.equal(got, expected)


def test_the_operators_pass_opcheck_and_the_formula_gradcheck(compiled):
    """`latentcode::gelu_tanh` and its backward are registered operators (fake implementation, autograd
    formula): opcheck on float32 (with and without a gradient); the formula the other dtypes take passes
    gradcheck in float64, and the operator's values and gradients equal the formula's in float32."""
    x = torch.randn(37, 41, generator=torch.Generator().manual_seed(2)) * 3
    grad = torch.randn(37, 41, generator=torch.Generator().manual_seed(3))
    torch.library.opcheck(torch.ops.latentcode.gelu_tanh.default, (x,))
    torch.library.opcheck(torch.ops.latentcode.gelu_tanh.default, (x.clone().requires_grad_(),))
    torch.library.opcheck(torch.ops.latentcode.gelu_tanh_backward.default, (x, grad))
    in_float64 = (x[:5, :7].double()).requires_grad_()
    assert torch.autograd.gradcheck(fused_gelu.gelu, (in_float64,))
    assert torch.equal(fused_gelu.gelu(in_float64), F.gelu(in_float64, approximate="tanh"))
    leaf = x.clone().requires_grad_()
    got = fused_gelu.gelu(leaf)
    (got_grad,) = torch.autograd.grad(got, leaf, grad)
    formula = F.gelu(leaf, approximate="tanh")
    (formula_grad,) = torch.autograd.grad(formula, leaf, grad)
    # within a few float32 roundings of the largest value (torch's own 1 + tanh loses digits for x < -5,
    # the kernel's sigmoid form does not: the float64 comparisons above hold the kernel to 4e-7)
    torch.testing.assert_close(got, formula, rtol=0, atol=1e-6 * formula.abs().max().item())
    torch.testing.assert_close(got_grad, formula_grad, rtol=0, atol=1e-6 * formula_grad.abs().max().item())
    with pytest.raises(RuntimeError, match="float32"):  # the operator itself takes float32 only
        torch.ops.latentcode.gelu_tanh(x.double())


def test_torch_compile_traces_the_mlp_through_the_operators_without_a_graph_break(compiled):
    """fullgraph=True fails on any graph break; the recording backend runs the traced graphs as AOT-eager
    does (no C++ compilation): the forward graph holds the kernel, the backward graph its gradient, and the
    numbers are F.gelu's (a counting dispatch mode cannot be on under torch.compile)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    mlp = MLP(16, 40).train()
    x = wide_input()
    backend, graphs = recording_backend()
    compiled_mlp = torch.compile(mlp, backend=backend, fullgraph=True)
    output = compiled_mlp(x)
    output.square().sum().backward()
    assert len(graphs) == 2
    assert "latentcode::gelu_tanh" in graphs[0] and "latentcode::gelu_tanh_backward" in graphs[1]
    gradient = mlp.W_in.grad.clone()
    mlp.zero_grad()
    with fused_gelu.use_fused(False):
        expected = mlp(x)
        expected.square().sum().backward()
    scale = expected.abs().max().item()
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-6 * scale)
    torch.testing.assert_close(gradient, mlp.W_in.grad, rtol=0, atol=1e-5 * mlp.W_in.grad.abs().max().item())
    torch._dynamo.reset()
