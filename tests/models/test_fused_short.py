"""The fused short-sequence path (`latentcode.models.fused_short`) equals the layer's formulas in outputs
and in the gradients of the input and of every parameter, for every pair of sigma and value network it
declares, in training (with attention dropout) and when forced in evaluation; "auto" takes it in training
only; it keeps no state across threads; without a compiler training takes the full path."""

import pytest
import torch

from latentcode.models import fused_short
from latentcode.models.attention import attention_path
from latentcode.models.c_kernels import CompiledLibrary
from latentcode.models.config import POSITIONS
from latentcode.models.normalization import SCORE_NORMALIZATIONS
from latentcode.models.path_policy import AUTO_MIN_POSITIONS, AttentionPathError
from latentcode.models.value_network import VALUE_NETWORKS
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
    if fused_short.KERNELS.load() is None:
        pytest.skip(f"the fused kernels could not be built here: {fused_short.KERNELS.failure()}")


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


@pytest.mark.parametrize("runner", ["openmp", "python pool"])
def test_threads_give_the_same_numbers_as_one(runner, monkeypatch):
    """Each thread computes its own batch elements (z and the q, k, v gradients bit for bit); the position
    bias's gradient adds the threads' parts (to float tolerance). On torch's OpenMP threads (a library
    built with OpenMP) and on the Python pool (one built without)."""
    kernels_or_skip()
    if runner == "python pool":
        monkeypatch.setattr(fused_short, "uses_openmp", lambda library: False)
    elif not fused_short.uses_openmp(fused_short.KERNELS.load()):
        pytest.skip("the compiler here builds the kernels without OpenMP")
    generator = torch.Generator().manual_seed(0)
    batch, n_positions, n_heads, d_head = 7, 13, 4, 3
    inputs = [torch.randn(batch, n_positions, n_heads, d_head, generator=generator) for _ in range(3)]
    inputs.append(torch.randn(n_heads, n_positions, n_positions, generator=generator))
    keep = (torch.rand(n_positions, n_positions, generator=generator) > 0.2).float() / 0.8
    grad_z = torch.randn(batch, n_positions, n_heads, d_head, generator=generator)
    results = {}
    previous = torch.get_num_threads()
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            leaves = [tensor.clone().requires_grad_() for tensor in inputs]
            z = fused_short.FusedShortAttention.apply(*leaves, None, keep, fused_short.RMS, fused_short.HYPER_RELU, 1e-6)
            results[threads] = [z, *torch.autograd.grad(z, leaves, grad_z)]
    finally:
        torch.set_num_threads(previous)
    for one, several in zip(results[1][:4], results[3][:4], strict=True):
        assert torch.equal(one, several)
    torch.testing.assert_close(results[3][4], results[1][4])


def test_without_a_compiler_training_takes_the_full_path(tmp_path, monkeypatch):
    monkeypatch.setattr(fused_short, "KERNELS", CompiledLibrary("fused_short", fused_short.SOURCE,
                                                               fused_short.COMPILE_FLAGS, fused_short._declare))
    monkeypatch.setenv("LATENTCODE_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    model = model_of("hyla").train()
    model(torch.randn(2, 9, 5))
    assert [block.attn.last_path for block in model.blocks] == ["full", "full"]
    assert "no-such-compiler" in fused_short.KERNELS.failure()
    assert not list((tmp_path / "kernels").glob("*.so")), "nothing half-built is left to load"


def test_a_library_built_for_the_shape_computes_the_generic_ones_numbers(monkeypatch):
    """Training batches of the paper's sizes take a library compiled for their shape (loops unrolled): the
    same sums in the same order, which the compiler may contract into multiply-adds differently, so the same
    numbers to float32 rounding (and not another formula: the tolerance is a few units in the last place)."""
    kernels_or_skip()
    generator = torch.Generator().manual_seed(1)
    batch, n_positions, n_heads, d_head = 3, 10, 4, 2
    inputs = [torch.randn(batch, n_positions, n_heads, d_head, generator=generator) for _ in range(3)]
    inputs.append(torch.randn(n_heads, n_positions, n_positions, generator=generator))
    keep = (torch.rand(n_positions, n_positions, generator=generator) > 0.2).float() / 0.8
    allowed = torch.ones(n_positions, n_positions, dtype=torch.bool).tril()
    grad_z = torch.randn(batch, n_positions, n_heads, d_head, generator=generator)
    results = {}
    for threshold in (10**9, 0):  # generic, then shaped
        monkeypatch.setattr(fused_short, "SHAPED_MIN_ENTRIES", threshold)
        for sigma, network in ((fused_short.SOFTMAX, fused_short.LINEAR), (fused_short.RMS, fused_short.HYPER_RELU)):
            leaves = [tensor.clone().requires_grad_() for tensor in inputs]
            z = fused_short.FusedShortAttention.apply(*leaves, allowed, keep, sigma, network, 1e-6)
            results[threshold, sigma] = [z, *torch.autograd.grad(z, leaves, grad_z)]
    assert (n_positions, n_heads, d_head, d_head) in fused_short._shaped
    for sigma in (fused_short.SOFTMAX, fused_short.RMS):
        for generic, shaped in zip(results[10**9, sigma], results[0, sigma], strict=True):
            torch.testing.assert_close(shaped, generic, rtol=1e-5, atol=1e-6 * generic.abs().max().item())


def test_a_second_derivative_is_refused_not_computed_as_if_the_gradient_were_constant():
    kernels_or_skip()
    layer = make_layer("hyla", train=True)
    x = torch.randn(2, N_POSITIONS, 8, requires_grad=True)
    with attention_path(layer, "fused"):
        loss = layer(x).square().sum() + x.pow(3).sum()  # another term with a graph of its own
        with pytest.raises(RuntimeError, match="differentiable once"):
            torch.autograd.grad(loss, x, create_graph=True)
