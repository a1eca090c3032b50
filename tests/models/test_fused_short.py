"""The fused short-sequence path (`latentcode.models.fused_short`) equals the layer's formulas in outputs
and in the gradients of the input and of every parameter, for every pair of sigma and value network it
declares, in training (with attention dropout) and when forced in evaluation; "auto" takes it in training
only; it keeps no state across threads; without the kernels training takes the full path; its operators
pass opcheck, and torch.compile trains a tiny HYLA model through them without a graph break."""

import pytest
import torch

from latentcode.models import fused_short
from latentcode.models.attention import attention_path
from latentcode.models.config import POSITIONS
from latentcode.models.normalization import SCORE_NORMALIZATIONS
from latentcode.models.path_policy import AUTO_MIN_POSITIONS, AttentionPathError
from latentcode.models.value_network import VALUE_NETWORKS
from tests.models.kernel_counts import CountOps, recording_backend
from tests.models.test_attention_paths import (
    N_POSITIONS,
    assert_all_close,
    expected_by_formulas,
    make_layer,
    model_of,
    through_path,
)

# The kernel's formulas (module docstring): four sigmas, and the value networks that are a sum over keys
# of a[h, q, k] times one vector per pair (linear, hyper_linear, hyper_relu); not relu_linear (a relu after
# the sum) nor hyper_deep (a second generated layer).
FUSED_SIGMAS = ["softmax", "identity", "rms_head", "softmax_rms_head"]
FUSED_NETWORKS = ["linear", "hyper_linear", "hyper_relu"]
FUSED_PAIRS = [(sigma, network) for sigma in FUSED_SIGMAS for network in FUSED_NETWORKS]


def kernels_or_skip():
    from latentcode.models.kernel_ops import EXTENSION

    if EXTENSION.load() is None:
        pytest.skip(f"the fused kernels could not be built here: {EXTENSION.failure()}")


def test_the_declared_pairs_are_the_kernels_formulas():
    declared = [(sigma, network) for sigma in SCORE_NORMALIZATIONS for network in VALUE_NETWORKS
                if SCORE_NORMALIZATIONS[sigma].fused_code is not None and VALUE_NETWORKS[network].fused_code is not None]
    assert sorted(declared) == sorted(FUSED_PAIRS)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("pair", FUSED_PAIRS, ids=["+".join(pair) for pair in FUSED_PAIRS])
def test_the_fused_path_equals_the_formulas(pair, causal, positions, mode):
    kernels_or_skip()
    layer = make_layer(pair, causal=causal, positions=positions, train=mode == "train")
    x = torch.randn(3, N_POSITIONS, 8)
    assert_all_close(through_path(layer, x, "fused"), expected_by_formulas(layer, x))


def test_the_fused_path_equals_the_formulas_at_the_papers_head_widths():
    """SRAVEN's heads are 4 wide and fuzzy logic's 2, with 16 and 8 heads: not multiples of a vector."""
    kernels_or_skip()
    for n_heads, kqv, n_positions in ((16, 64, 36), (8, 16, 32)):
        model = model_of("hyla", n_ctx=n_positions, n_heads=n_heads, kqv_dim=kqv, positions="relative",
                         causal=False, attn_dropout=0.1).train()
        layer = model.blocks[0].attn
        x = torch.randn(2, n_positions, 16)
        assert_all_close(through_path(layer, x, "fused"), expected_by_formulas(layer, x))


def test_auto_takes_the_fused_path_in_training_only_and_trains_as_the_full_path_does():
    kernels_or_skip()
    model = model_of("hyla", attn_dropout=0.1)
    x = torch.randn(3, AUTO_MIN_POSITIONS - 1, 5)
    results = {}
    for path in ("auto", "full"):
        torch.manual_seed(0)
        with attention_path(model, path):
            output = model.train()(x)
            results[path] = [output, *torch.autograd.grad(output.square().sum(), list(model.parameters()))]
        assert [block.attn.last_path for block in model.blocks] == (["fused"] * 2 if path == "auto" else ["full"] * 2)
    assert_all_close(results["auto"], results["full"])
    model.eval()(x)
    assert [block.attn.last_path for block in model.blocks] == ["full", "full"]


def test_a_hook_that_reads_the_codes_or_float64_keeps_training_on_the_full_path():
    kernels_or_skip()
    model = model_of("softmax").train()
    x = torch.randn(2, 20, 5)
    seen = []
    handle = model.blocks[0].attn.hook_pattern.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    model(x)
    handle.remove()
    assert seen == [torch.Size([2, 4, 20, 20])]
    assert [block.attn.last_path for block in model.blocks] == ["full", "fused"]
    model.double()(x.double())
    assert [block.attn.last_path for block in model.blocks] == ["full", "full"]


def test_forcing_the_fused_path_where_it_cannot_run_says_why():
    layer = make_layer("linear_rmshead_relu", train=True)
    with attention_path(layer, "fused"), pytest.raises(AttentionPathError, match="rms_head \\+ relu_linear"):
        layer(torch.randn(1, 5, 8))
    layer = make_layer("softmax", train=True, n_ctx=fused_short.MAX_POSITIONS + 8)
    with attention_path(layer, "fused"), pytest.raises(AttentionPathError, match=f"at most {fused_short.MAX_POSITIONS}"):
        layer(torch.randn(1, fused_short.MAX_POSITIONS + 1, 8))


def random_inputs(batch, n_positions, n_heads, d_head, seed):
    """Queries, keys, values [batch, position, head, d_head], a position bias, a dropout mask and grad_z."""
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(batch, n_positions, n_heads, d_head, generator=generator) for _ in range(3)]
    inputs.append(torch.randn(n_heads, n_positions, n_positions, generator=generator))
    keep = (torch.rand(n_positions, n_positions, generator=generator) > 0.2).float() / 0.8
    grad_z = torch.randn(batch, n_positions, n_heads, d_head, generator=generator)
    return inputs, keep, grad_z


def test_threads_give_the_same_numbers_as_one():
    """Each of torch's OpenMP threads computes its own batch elements (z and the q, k, v gradients bit for
    bit); the position bias's gradient adds the threads' parts (to float tolerance)."""
    kernels_or_skip()
    inputs, keep, grad_z = random_inputs(7, 13, 4, 3, seed=0)
    results = {}
    previous = torch.get_num_threads()
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            leaves = [tensor.clone().requires_grad_() for tensor in inputs]
            z = fused_short.short_attention(*leaves, None, keep, fused_short.RMS, fused_short.HYPER_RELU, 1e-6)
            results[threads] = [z, *torch.autograd.grad(z, leaves, grad_z)]
    finally:
        torch.set_num_threads(previous)
    for one, several in zip(results[1][:4], results[3][:4], strict=True):
        assert torch.equal(one, several)
    torch.testing.assert_close(results[3][4], results[1][4])


def test_under_the_formula_switch_training_takes_the_full_path(monkeypatch):
    kernels_or_skip()
    monkeypatch.setenv("LATENTCODE_KERNELS", "formula")
    model = model_of("hyla").train()
    with CountOps() as ops:
        model(torch.randn(2, 9, 5)).sum().backward()
    assert [block.attn.last_path for block in model.blocks] == ["full", "full"]
    assert not ops.counts
    assert "LATENTCODE_KERNELS=formula" in fused_short.why_not(model.blocks[0].attn.W_Q, 9)


def test_the_papers_shapes_run_unrolled_copies_with_the_generic_ones_numbers():
    """SRAVEN's shape (T=36, 16 heads of 4) runs a copy of the kernels compiled for it (loops unrolled): the
    same sums in the same order, which the compiler may contract into multiply-adds differently, so the same
    numbers to float32 rounding (and not another formula: the tolerance is a few units in the last place)."""
    kernels_or_skip()
    inputs, keep, grad_z = random_inputs(2, 36, 16, 4, seed=1)
    allowed = torch.ones(36, 36, dtype=torch.bool).tril()
    results = {}
    for shaped in (False, True):
        for sigma, network in ((fused_short.SOFTMAX, fused_short.LINEAR), (fused_short.RMS, fused_short.HYPER_RELU)):
            leaves = [tensor.clone().requires_grad_() for tensor in inputs]
            z = fused_short.short_attention(*leaves, allowed, keep, sigma, network, 1e-6, shaped=shaped)
            results[shaped, sigma] = [z, *torch.autograd.grad(z, leaves, grad_z)]
    for sigma in (fused_short.SOFTMAX, fused_short.RMS):
        for generic, shaped in zip(results[False, sigma], results[True, sigma], strict=True):
            torch.testing.assert_close(shaped, generic, rtol=1e-5, atol=1e-6 * generic.abs().max().item())


def test_a_second_derivative_is_refused_not_computed_as_if_the_gradient_were_constant():
    kernels_or_skip()
    layer = make_layer("hyla", train=True)
    x = torch.randn(2, N_POSITIONS, 8, requires_grad=True)
    with attention_path(layer, "fused"):
        loss = layer(x).square().sum() + x.pow(3).sum()  # another term with a graph of its own
        with pytest.raises(RuntimeError, match="differentiable once"):
            torch.autograd.grad(loss, x, create_graph=True)


def test_the_operators_pass_opcheck_and_the_formula_gradcheck(kernels):
    """`latentcode::short_attention` and its backward (fake implementations, autograd formula) pass opcheck
    with and without a position bias; the formula the full path computes (what float64 and every other
    dtype, device or sigma take) passes gradcheck in float64; the float32 operator's values and gradients
    equal it (test_the_fused_path_equals_the_formulas above, every sigma and value network)."""
    inputs, keep, grad_z = random_inputs(2, 9, 3, 2, seed=2)
    allowed = torch.ones(9, 9, dtype=torch.bool).tril()
    for bias in (inputs[3], None):
        leaves = [tensor.clone().requires_grad_() for tensor in inputs[:3]]
        leaves.append(None if bias is None else bias.clone().requires_grad_())
        for sigma, network in ((fused_short.SOFTMAX | fused_short.RMS, fused_short.HYPER_RELU),
                               (fused_short.SOFTMAX, fused_short.LINEAR)):
            torch.library.opcheck(torch.ops.latentcode.short_attention.default,
                                  (*leaves, allowed, keep, sigma, network, 1e-6))
            torch.library.opcheck(torch.ops.latentcode.short_attention_backward.default,
                                  (*inputs[:3], bias, allowed, keep, grad_z, sigma, network, 1e-6, bias is not None))
    layer = make_layer("hyla", train=False, positions="relative").double()
    x = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    with attention_path(layer, "full"):
        assert torch.autograd.gradcheck(layer, (x,))
    with pytest.raises(RuntimeError, match="float32"):  # the operator itself takes float32 only
        torch.ops.latentcode.short_attention(*[tensor.double() for tensor in inputs], None, None, 1, 0, 1e-6)


def test_torch_compile_trains_a_tiny_hyla_model_through_the_operators(kernels):
    """torch.compile (fullgraph=False) of a tiny HYLA model in training: no graph break (none at the
    kernels), the forward graph holds the attention and GELU operators and the backward graph their
    gradients, and one AdamW step gives the parameters of the same step in eager mode."""
    import torch._dynamo

    from latentcode.training.optimizer import build_optimizer

    x = torch.randn(4, 9, 5, generator=torch.Generator().manual_seed(0))
    target = torch.randn(4, 9, 3, generator=torch.Generator().manual_seed(1))
    parameters = {}
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        model = model_of("hyla", attn_dropout=0.0, positions="relative").train()
        optimizer = build_optimizer(model, learning_rate=1e-2, weight_decay=0.1)
        forward = model
        if mode == "compiled":
            explanation = torch._dynamo.explain(model)(x)
            breaks = [str(reason) for reason in explanation.break_reasons]
            assert explanation.graph_break_count == 0 or not any("latentcode" in reason for reason in breaks), breaks
            backend, graphs = recording_backend()
            forward = torch.compile(model, backend=backend, fullgraph=False)
        loss = torch.nn.functional.mse_loss(forward(x), target)
        loss.backward()
        optimizer.step()
        assert [block.attn.last_path for block in model.blocks] == ["fused", "fused"]
        parameters[mode] = [parameter.detach().clone() for parameter in model.parameters()]
    operators = [name for graph in graphs for name in graph]
    for name in ("short_attention", "short_attention_backward", "gelu_tanh", "gelu_tanh_backward"):
        assert operators.count(f"latentcode::{name}") == 2, (name, operators)  # one per layer
    assert explanation.graph_break_count == 0, breaks
    for compiled_parameter, eager_parameter in zip(parameters["compiled"], parameters["eager"], strict=True):
        torch.testing.assert_close(compiled_parameter, eager_parameter, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
