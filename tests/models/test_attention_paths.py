"""The attention layer's paths (full, blockwise, sdpa, associative) equal the layer's formulas, written
out here, in outputs and in the gradients of the input and of every parameter; "auto" chooses as
documented; hooks that need whole tensors get them, QueryBlockHooks and the Recorder get blocks."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from latentcode import ModelConfig, Site, build_model
from latentcode.extraction import Recorder
from latentcode.intervention import Intervention, ZeroAblate
from latentcode.models import attention as attention_module
from latentcode.models import attention_paths
from latentcode.models.attention import Attention, InputShapeError, attention_path
from latentcode.models.attention_paths import BlockPlan, plan_blocks
from latentcode.models.config import POSITIONS
from latentcode.models.normalization import SCORE_NORMALIZATIONS
from latentcode.models.path_policy import AUTO_MIN_POSITIONS, AttentionPathError
from latentcode.models.query_block_hook import QueryBlockHook
from latentcode.models.value_network import VALUE_NETWORKS
from tests.models.reference import reference_position_bias, reference_rotary

PAIRS = [(normalization, network) for normalization in SCORE_NORMALIZATIONS for network in VALUE_NETWORKS]
N_POSITIONS = 11  # not a multiple of the block (4) or the tile (3)


def make_layer(attention, causal=True, positions="rotary", train=False, attn_dropout=0.3, n_ctx=12,
               v_dim=6, seed=0) -> Attention:
    """An attention layer with 2 heads (d_head 4, d_head_v 3) and non-zero biases."""
    config = ModelConfig(attention=attention, d_model=8, n_heads=2, kqv_dim=8, v_dim=v_dim, n_ctx=n_ctx,
                         d_in=3, d_out=2, causal=causal, positions=positions, attn_dropout=attn_dropout)
    torch.manual_seed(seed)
    layer = Attention(config)
    with torch.no_grad():
        for name in ("b_Q", "b_K", "b_V", "b_O"):
            getattr(layer, name).copy_(0.3 * torch.randn_like(getattr(layer, name)))
    return layer.train(train)


def formulas(layer: Attention, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """The layer from its formulas (the module docstrings; the positions from tests/models/reference.py), with the dropout mask `keep` or None."""
    config = layer.config
    q = torch.einsum("bpm,hmd->bphd", x, layer.W_Q) + layer.b_Q
    k = torch.einsum("bpm,hmd->bphd", x, layer.W_K) + layer.b_K
    v = torch.einsum("bpm,hmd->bphd", x, layer.W_V) + layer.b_V
    if config.positions == "rotary":
        q, k = reference_rotary(q, config.rotary_base), reference_rotary(k, config.rotary_base)
    n_positions = x.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if config.positions == "relative":  # only the learned table is read from the layer
        scores = scores + reference_position_bias(layer.relative_position_bias.bias_table, n_positions)
    allowed = torch.ones(n_positions, n_positions, dtype=torch.bool)
    if config.causal:
        allowed = allowed.tril()
    codes = sigma_by_formula(config.score_normalization, scores, allowed, config.rms_head_eps)
    if keep is not None:
        codes = codes * keep
    z = value_network_by_formula(config.value_network, codes, v, layer.value_network)
    return torch.einsum("bqhd,hdm->bqm", z, layer.W_O) + layer.b_O


def sigma_by_formula(normalization, scores, allowed, eps):
    """The latent codes `[batch, head, query, key]` of `scores` by `normalization`'s formula; a name
    without a formula here is refused, never computed as another."""

    def softmax_over_keys(scores):
        return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)

    def rms_over_heads(codes):
        codes = codes.masked_fill(~allowed, 0.0)
        return codes / torch.sqrt(codes.square().mean(dim=1, keepdim=True) + eps)

    formulas = {
        "softmax": softmax_over_keys,
        "identity": lambda scores: scores.masked_fill(~allowed, 0.0),
        "rms_head": rms_over_heads,
        "softmax_rms_head": lambda scores: rms_over_heads(softmax_over_keys(scores)),
    }
    if normalization not in formulas:
        raise ValueError(f"the test reference has no formula for the score normalization {normalization!r}; "
                         f"it knows {sorted(formulas)}: write one")
    return formulas[normalization](scores)


def value_network_by_formula(network, codes, v, module):
    """z `[batch, query, head, d_head_v]` of the codes and values by `network`'s formula (`module`:
    the layer's value network, for W_value2); a name without a formula here is refused."""
    if network in ("linear", "relu_linear"):
        z = torch.einsum("bhqk,bkhd->bqhd", codes, v)
        return torch.relu(z) if network == "relu_linear" else z
    if network not in ("hyper_linear", "hyper_relu", "hyper_deep"):
        raise ValueError(f"the test reference has no formula for the value network {network!r}: write one")
    hidden = torch.einsum("bhqk,bkhd->bqkd", codes, v)
    hidden = hidden if network == "hyper_linear" else torch.relu(hidden)
    if network == "hyper_deep":
        hidden = torch.relu(torch.einsum("bhqk,bqkd,hde->bqke", codes, hidden, module.W_value2))
    return torch.einsum("bhqk,bqkd->bqhd", codes, hidden)


@pytest.mark.parametrize("normalization", ["sparsemax", "", "Softmax", "softmax_rms_head_extra"])
def test_the_reference_refuses_a_normalization_it_has_no_formula_for(normalization):
    """So that a new sigma cannot pass the path tests by being compared with another one's formula."""
    scores, allowed = torch.randn(1, 2, 3, 3), torch.ones(3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=rf"no formula for the score normalization '{normalization}'"):
        sigma_by_formula(normalization, scores, allowed, 1e-6)
    with pytest.raises(ValueError, match="no formula for the value network 'hyper_gelu'"):
        value_network_by_formula("hyper_gelu", scores, torch.randn(1, 3, 2, 4), None)


def outputs_and_gradients(layer, forward, x, seed=1):
    """forward(x) and the gradients of sum(output * w) for x and every parameter of the layer."""
    x = x.clone().requires_grad_()
    torch.manual_seed(seed)  # the layer's dropout mask, drawn as the formulas' mask is below
    output = forward(x)
    weight = torch.randn(output.shape, generator=torch.Generator().manual_seed(7))
    parameters = [parameter for _, parameter in sorted(layer.named_parameters())]
    return [output.detach(), *torch.autograd.grad((output * weight).sum(), [x, *parameters])]


def expected_by_formulas(layer, x, seed=1):
    def forward(x):
        keep = None
        if layer.training and layer.attn_dropout > 0:
            keep = F.dropout(torch.ones(1, 1, x.shape[1], x.shape[1]), layer.attn_dropout, training=True)
        return formulas(layer, x, keep)

    return outputs_and_gradients(layer, forward, x, seed)


def through_path(layer, x, path, seed=1):
    with attention_path(layer, path):
        result = outputs_and_gradients(layer, layer, x, seed)
    assert layer.last_path == path
    return result


def assert_all_close(got, expected, relative=2e-5, rtol=1e-4):
    """Each tensor within `relative` of its largest entry (sums in another order differ by that)."""
    largest = max(tensor.abs().max().item() for tensor in expected)
    for index, (got_tensor, expected_tensor) in enumerate(zip(got, expected, strict=True)):
        # The floor: gradients that vanish in theory (b_K under softmax without rotary) are float noise.
        atol = max(relative * expected_tensor.abs().max().item(), relative / 10 * largest)
        torch.testing.assert_close(got_tensor, expected_tensor, atol=atol, rtol=rtol,
                                   msg=lambda message, index=index: f"tensor {index}: {message}")


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 queries and tiles of 3 keys, so that 11 positions need several of both."""

    def plan(value_network, n_heads, batch, n_positions, query_block=None, score_readers=(), pattern_readers=(),
             fused=False):
        return BlockPlan(4, 3, tuple(score_readers), tuple(pattern_readers))

    monkeypatch.setattr(attention_module, "plan_blocks", plan)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("pair", PAIRS, ids=["+".join(pair) for pair in PAIRS])
def test_full_and_blockwise_paths_equal_the_formulas(pair, causal, positions, mode, small_blocks):
    """Every (normalization, value network), in training mode with attention dropout (the same
    [query, key] mask in every path) and in eval mode; outputs and all gradients."""
    layer = make_layer(pair, causal=causal, positions=positions, train=mode == "train")
    x = torch.randn(2, N_POSITIONS, 8)
    expected = expected_by_formulas(layer, x)
    assert_all_close(through_path(layer, x, "full"), expected)
    assert_all_close(through_path(layer, x, "blockwise"), expected)


@pytest.mark.parametrize("v_dim", [4, 6], ids=["d_head_v=n_heads", "d_head_v>n_heads"])
def test_hyper_deep_is_the_same_network_whichever_way_its_second_layer_is_summed(v_dim, small_blocks):
    """hyper_deep sums sum_h a[h] W_value2[h] per pair for narrow heads and reassociates for wide ones."""
    layer = make_layer("hyla_deep", v_dim=v_dim)
    x = torch.randn(2, N_POSITIONS, 8)
    expected = expected_by_formulas(layer, x)
    assert_all_close(through_path(layer, x, "full"), expected)
    assert_all_close(through_path(layer, x, "blockwise"), expected)


@pytest.mark.parametrize("mode", ["eval", "train-without-dropout"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_sdpa_path_equals_the_formulas(causal, positions, mode):
    layer = make_layer("softmax", causal=causal, positions=positions, train=mode != "eval", attn_dropout=0.0)
    x = torch.randn(2, N_POSITIONS, 8)
    assert_all_close(through_path(layer, x, "sdpa"), expected_by_formulas(layer, x))


@pytest.mark.parametrize("positions", ["rotary", "none"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_associative_path_equals_the_formulas(causal, positions, monkeypatch):
    monkeypatch.setattr(attention_paths, "LINEAR_CHUNK", 4)  # several chunks, the last one short
    layer = make_layer("linear", causal=causal, positions=positions, attn_dropout=0.0)
    x = torch.randn(2, N_POSITIONS, 8)
    assert_all_close(through_path(layer, x, "associative"), expected_by_formulas(layer, x))


@pytest.mark.parametrize("path", ["full", "sdpa", "associative", "blockwise"])
def test_paths_keep_working_under_autocast(path):
    """Under bfloat16 autocast each path's output and gradients equal the formulas computed in
    float32 without autocast (not another path under autocast), to bfloat16's precision (8 bits of
    mantissa: 2^-8 = 0.4% per rounding; a few roundings in a row, so 5% of each tensor's largest
    entry). Rotary positions, as make_layer's default."""
    attention = {"full": "hyla", "sdpa": "softmax", "associative": "linear", "blockwise": "hyla"}[path]
    layer = make_layer(attention, attn_dropout=0.0)
    x = torch.randn(2, N_POSITIONS, 8)
    expected = expected_by_formulas(layer, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = through_path(layer, x, path)
    assert got[0].dtype == torch.bfloat16, "the output is computed under autocast"
    for index, (got_tensor, expected_tensor) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(got_tensor.float(), expected_tensor, atol=0.05 * expected_tensor.abs().max().item(),
                                   rtol=0.05, msg=lambda message, index=index: f"tensor {index}: {message}")


# -- choosing a path ------------------------------------------------------------------------------


def model_of(attention, n_ctx=AUTO_MIN_POSITIONS + 8, **overrides):
    config = ModelConfig(**{**dict(attention=attention, n_layers=2, d_model=16, n_heads=4, kqv_dim=16, d_mlp=16,
                                   n_ctx=n_ctx, d_in=5, d_out=3, causal=True, positions="rotary"), **overrides})
    return build_model(config, seed=0)


@pytest.mark.parametrize(
    ("attention", "overrides", "train", "n_positions", "path"),
    [
        ("hyla", {}, False, AUTO_MIN_POSITIONS - 1, "full"),
        ("softmax", {}, False, AUTO_MIN_POSITIONS - 1, "full"),
        ("hyla", {}, True, AUTO_MIN_POSITIONS - 1, "fused"),
        ("softmax", {}, True, AUTO_MIN_POSITIONS - 1, "fused"),
        ("linear", {"positions": "relative"}, True, AUTO_MIN_POSITIONS - 1, "fused"),
        ("linear_rmshead_relu", {}, True, AUTO_MIN_POSITIONS - 1, "full"),  # relu_linear: no kernel
        ("hyla_deep", {}, True, AUTO_MIN_POSITIONS - 1, "full"),  # hyper_deep: no kernel
        ("hyla", {}, True, AUTO_MIN_POSITIONS, "blockwise"),
        ("softmax", {}, False, AUTO_MIN_POSITIONS, "sdpa"),
        ("softmax", {"attn_dropout": 0.0}, True, AUTO_MIN_POSITIONS, "sdpa"),
        ("softmax", {}, True, AUTO_MIN_POSITIONS, "blockwise"),  # our dropout mask: not SDPA's
        ("linear", {}, False, AUTO_MIN_POSITIONS, "associative"),
        ("linear", {"positions": "relative"}, False, AUTO_MIN_POSITIONS, "blockwise"),
        ("linear_rmshead_relu", {}, False, AUTO_MIN_POSITIONS, "blockwise"),
    ],
)
def test_auto_chooses_the_path_the_docstring_says(attention, overrides, train, n_positions, path):
    model = model_of(attention, **overrides).train(train)
    with torch.no_grad():
        model(torch.randn(2, n_positions, 5))
    assert [block.attn.last_path for block in model.blocks] == [path, path]


def test_auto_gives_the_full_paths_bits_on_short_sequences_in_evaluation():
    """The shipped checkpoints' sequences are short: "auto" must evaluate them exactly as before (in
    training it takes the fused kernel, tests/models/test_fused_short.py)."""
    model = model_of("hyla").eval()
    x = torch.randn(3, AUTO_MIN_POSITIONS - 1, 5)
    outputs = {}
    for path in ("auto", "full"):
        torch.manual_seed(0)
        with attention_path(model, path):
            outputs[path] = model(x)
    assert torch.equal(outputs["auto"], outputs["full"])


def test_plan_blocks_sizes_blocks_by_bytes_and_obeys_an_explicit_block_size():
    layer = model_of("hyla", n_ctx=1024, kqv_dim=256, v_dim=256, d_model=64).blocks[0].attn  # d_head_v 64
    plan = plan_blocks(layer.value_network, layer.n_heads, batch=2, n_positions=1024)
    codes_block_bytes = 4 * 2 * 4 * plan.query_block * 1024
    tile_bytes = 4 * 2 * plan.query_block * plan.key_tile * 64
    assert codes_block_bytes <= attention_paths.BLOCK_BYTES and tile_bytes <= attention_paths.BLOCK_BYTES
    assert tile_bytes >= attention_paths.BLOCK_BYTES // 4, "tiles near the budget, not tiny"
    assert plan_blocks(layer.value_network, 4, 2, 1024, query_block=100).query_block == 100
    assert plan_blocks(layer.value_network, 4, 2, 50, query_block=100).query_block == 50
    softmax = model_of("softmax", n_ctx=1024).blocks[0].attn
    assert plan_blocks(softmax.value_network, softmax.n_heads, 2, 1024).key_tile == 1024, "the linear value network needs no key tiles"


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, -3, 2.5, True, "64"])
def test_a_query_block_size_that_is_not_a_positive_integer_is_refused_in_one_line(size):
    layer = make_layer("hyla")
    with pytest.raises(AttentionPathError, match=rf"^query_block_size must be a positive integer .*got {size!r}$"):
        layer.query_block_size = size
    model = model_of("hyla")
    with pytest.raises(AttentionPathError, match="query_block_size must be a positive integer"), \
            attention_path(model, "blockwise", query_block_size=size):
        pass
    assert [block.attn.query_block_size for block in model.blocks] == [None, None], "restored on error"


def test_a_block_size_sets_the_queries_per_block():
    model = model_of("hyla")
    starts = []
    model.blocks[0].attn.hook_pattern.register_forward_hook(QueryBlockHook(lambda block, start: starts.append(start)))
    with attention_path(model, "blockwise", query_block_size=50), torch.no_grad():
        model(torch.randn(1, 120, 5))
    assert starts == [0, 50, 100]


def test_sequences_longer_than_n_ctx_are_refused_in_one_line():
    model = model_of("hyla", n_ctx=20)
    with pytest.raises(InputShapeError, match=r"^input has 21 positions but the model accepts at most n_ctx=20"):
        model(torch.randn(1, 21, 5))
    layer = model.blocks[0].attn  # called directly, the layer checks too
    with pytest.raises(InputShapeError, match=r"^attention input has 21 positions but the layer accepts at most n_ctx=20"):
        layer(torch.randn(1, 21, 16))


def test_unknown_or_impossible_paths_are_refused_with_the_reason():
    layer = make_layer("hyla")
    with pytest.raises(AttentionPathError, match=r"unknown attention path 'fast'; expected one of"):
        layer.path = "fast"
    x = torch.randn(1, 5, 8)
    with pytest.raises(AttentionPathError, match=r"'sdpa' cannot compute this layer: it needs softmax scores and the "
                                                 r"linear value network, this layer has rms_head \+ hyper_relu"):
        with attention_path(layer, "sdpa"):
            layer(x)
    softmax = make_layer("softmax", train=True, attn_dropout=0.1)
    with pytest.raises(AttentionPathError, match=r"training mode with attn_dropout=0.1"):
        with attention_path(softmax, "sdpa"):
            softmax(x)
    linear = make_layer("linear", positions="relative")
    with pytest.raises(AttentionPathError, match=r"relative position bias"):
        with attention_path(linear, "associative"):
            linear(x)
    handle = layer.hook_pattern.register_forward_hook(lambda module, inputs, output: None)
    with pytest.raises(AttentionPathError, match=r"'blockwise' cannot run while a hook needs the whole"):
        with attention_path(layer, "blockwise"):
            layer(x)
    handle.remove()


# -- hooks ----------------------------------------------------------------------------------------

LONG = AUTO_MIN_POSITIONS + 4


@pytest.mark.parametrize(
    "hook_name",
    ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_attn_scores", "blocks.0.attn.value_network.hook_hidden"],
)
def test_a_hook_on_a_whole_tensor_gets_it_whole_through_the_full_path(hook_name):
    model = model_of("hyla").eval()
    x = torch.randn(2, LONG, 5)
    seen = {}
    with torch.no_grad():
        model.run_with_hooks(x, fwd_hooks=[(hook_name, lambda tensor, hook: seen.update(shape=tensor.shape))])
    assert seen["shape"][2 if "hidden" not in hook_name else 1] == LONG and seen["shape"][-2 if "hidden" in hook_name else -1] == LONG
    assert [block.attn.last_path for block in model.blocks] == ["full", "blockwise"]


def test_run_with_cache_and_backward_hooks_take_the_full_path():
    model = model_of("hyla").eval()
    x = torch.randn(2, LONG, 5)
    _, cache = model.run_with_cache(x)
    assert cache["blocks.1.attn.hook_pattern"].shape == (2, 4, LONG, LONG)
    assert model.blocks[1].attn.last_path == "full"
    gradients = []
    model.blocks[0].attn.hook_pattern.register_full_backward_hook(lambda module, grad_in, grad_out: gradients.append(grad_out))
    model(x).sum().backward()
    assert model.blocks[0].attn.last_path == "full" and gradients[0][0].shape == (2, 4, LONG, LONG)


@pytest.mark.parametrize("hook_point", ["hook_pattern", "hook_attn_scores"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_query_block_hooks_read_every_block_once_and_the_blocks_make_the_whole_tensor(hook_point, causal):
    """Under a causal mask a block's masked keys read as the full path has them: codes 0, raw scores."""
    model = model_of("hyla", causal=causal).eval()
    x = torch.randn(2, LONG, 5)
    blocks = {}

    def read(block, query_start):
        assert query_start not in blocks, "each block once per forward pass, never again in the backward"
        blocks[query_start] = block.detach().clone()

    handle = getattr(model.blocks[1].attn, hook_point).register_forward_hook(QueryBlockHook(read))
    with attention_path(model, "blockwise", query_block_size=40):
        model(x).sum().backward()
    assert model.blocks[1].attn.last_path == "blockwise" and sorted(blocks) == [0, 40, 80, 120]
    handle.remove()
    _, cache = model.run_with_cache(x)  # whole tensors, full path
    torch.testing.assert_close(torch.cat([blocks[start] for start in sorted(blocks)], dim=2),
                               cache[f"blocks.1.attn.{hook_point}"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("score", ["pattern", "scores"])
def test_recording_sites_of_a_long_sequence_stays_blockwise_and_equals_the_full_pattern(score):
    model = model_of("hyla").eval()
    x1, x2 = torch.randn(2, LONG, 5), torch.randn(3, LONG, 5)
    sites = "0:-1:-1,1:100:3,*:5:5,0:3:100,1:0:0"  # 0:3:100 is masked (causal): code 0
    with Recorder(model, sites, score=score) as recorder:
        with torch.no_grad():
            model(x1)
            model(x2)
        assert [block.attn.last_path for block in model.blocks] == ["blockwise", "blockwise"]
    codes = recorder.pop()
    name = "hook_pattern" if score == "pattern" else "hook_attn_scores"
    whole = [torch.cat([model.run_with_cache(x)[1][f"blocks.{layer}.attn.{name}"] for x in (x1, x2)]) for layer in (0, 1)]
    assert len(codes) == 6
    for site, values in codes.items():
        np.testing.assert_allclose(values, whole[site.layer][:, :, site.query, site.key].numpy(), rtol=1e-5, atol=1e-6)
    if score == "pattern":
        assert not codes[Site(0, 3, 100)].any()


def test_an_intervention_on_a_long_sequence_takes_the_full_path_and_edits_what_it_did_before():
    model = model_of("hyla").eval()
    x = torch.randn(2, LONG, 5)
    outputs = {}
    for path in ("auto", "full"):
        with attention_path(model, path), Intervention(model, ZeroAblate(heads=[0, 2]), sites="*:-1:-1"), torch.no_grad():
            outputs[path] = model(x)
        assert [block.attn.last_path for block in model.blocks] == ["full", "full"]
    assert torch.equal(outputs["auto"], outputs["full"])
    with torch.no_grad():
        assert not torch.allclose(outputs["auto"], model(x))


def test_global_module_hooks_take_the_full_path():
    model = model_of("hyla").eval()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, inputs, output: None)
    try:
        with torch.no_grad():
            model(torch.randn(1, LONG, 5))
    finally:
        handle.remove()
    assert model.blocks[0].attn.last_path == "full"


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["hyla", "hyla_deep", "hyla_softmax", "softmax", "linear"])
def test_long_sequence_of_a_wider_model_through_auto_equals_the_full_path(attention):
    """Real block and tile sizes (not the small ones above), 300 positions, training mode. In float64,
    so that the comparison is tight: in float32 the two paths' sums over 300 keys, taken in different
    orders, differ by up to about 2e-4 of a gradient's largest entry (hyla_deep), in float64 by 1e-14."""
    model = model_of(attention, n_ctx=300, d_model=64, n_heads=4, kqv_dim=64, attn_dropout=0.0).train().double()
    x = torch.randn(2, 300, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    results = {}
    for path in ("auto", "full"):
        model.zero_grad()
        with attention_path(model, path):
            output = model(x)
            output.square().mean().backward()
        results[path] = [output.detach(), *[parameter.grad.clone() for parameter in model.parameters()]]
        if path == "auto":
            assert model.blocks[0].attn.last_path != "full"
    assert_all_close(results["auto"], results["full"], relative=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kind", ["causal block", "random", "none masked", "all masked"])
def test_masked_fills_what_masked_fill_fills_and_passes_the_same_gradient(kind):
    """`normalization.masked` passes over only the keys from the first masked one; values and gradients
    must be those of `masked_fill` through the whole mask, whatever the mask's shape."""
    from latentcode.models.normalization import masked

    generator = torch.Generator().manual_seed(0)
    queries, keys = 8, 40
    allowed = {"causal block": torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries),
               "random": torch.rand(queries, keys, generator=generator) > 0.3,
               "none masked": torch.ones(queries, keys, dtype=torch.bool),
               "all masked": torch.zeros(queries, keys, dtype=torch.bool)}[kind]
    scores = torch.randn(2, 3, queries, keys, generator=generator, requires_grad=True)
    weights = torch.randn(2, 3, queries, keys, generator=generator)
    for value in (0.0, float("-inf")):
        expected = scores.masked_fill(~allowed, value)
        got = masked(scores, allowed, value)
        assert torch.equal(got, expected)
        assert got.data_ptr() != scores.data_ptr()  # a new tensor, as masked_fill's
        expected_grad, = torch.autograd.grad((expected.nan_to_num(neginf=0.0) * weights).sum(), scores)
        got_grad, = torch.autograd.grad((got.nan_to_num(neginf=0.0) * weights).sum(), scores)
        assert torch.equal(got_grad, expected_grad)


def test_rms_over_heads_gradient_is_autograds_of_the_written_formula_and_refuses_a_second():
    """HYLA's sigma has its gradient written out (normalization._RmsOverHeads): equal to autograd's chain
    through the formula it replaces (float64, a causal mask), gradcheck passes, and a second derivative
    is refused rather than computed without the rms's dependence on the scores."""
    from latentcode.models.normalization import rms_over_heads

    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 5, 7, 9, generator=generator, dtype=torch.float64, requires_grad=True)
    allowed = torch.ones(7, 9, dtype=torch.bool).tril(2)
    weights = torch.randn(3, 5, 7, 9, generator=generator, dtype=torch.float64)

    def written(x):
        x = x.masked_fill(~allowed, 0.0)
        return x * torch.rsqrt(x.square().mean(dim=1, keepdim=True) + 1e-6)

    assert torch.equal(rms_over_heads(scores, allowed, 1e-6), written(scores))
    ours, = torch.autograd.grad((rms_over_heads(scores, allowed, 1e-6) * weights).sum(), scores)
    chain, = torch.autograd.grad((written(scores) * weights).sum(), scores)
    assert torch.allclose(ours, chain, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: rms_over_heads(x, allowed, 1e-6), (scores,))
    # A graph of the gradient is refused even where another term of the loss has one (torch's
    # once_differentiable would let the rms term through as a constant there).
    loss = (rms_over_heads(scores, None, 1e-6) * weights).sum() + scores.pow(3).sum()
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(loss, scores, create_graph=True)
