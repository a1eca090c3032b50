"""Recording from our models: the codes equal the attention pattern and scores computed from the
formulas (tests/models/reference.py); selectors and their errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from latentcode import ModelConfig, build_model
from latentcode.extraction import Recorder
from latentcode.models.hook_state import any_hooks
from latentcode.sources import Site, SiteError, parse_selector
from latentcode.sources.sites import MAX_ALL_PAIRS
from tests.models.reference import (
    reference_attention_with_pattern,
    reference_mlp,
    reference_normalize,
    reference_position_bias,
    reference_scores,
)

CONFIG = ModelConfig(attention="hyla", n_layers=3, d_model=16, n_heads=4, kqv_dim=8, d_mlp=16, n_ctx=12, d_in=5, d_out=5)


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=0).eval()


def pattern_and_scores_by_formulas(model, x):
    """Every layer's latent codes and scores `[batch, head, query, key]` from the formulas
    (tests/models/reference.py: loops, the position bias from the T5 formula), not from the model's
    hooks: layer norm, attention, residual, MLP, residual, layer after layer."""
    config = model.config
    residual = x @ model.embed.W_E + model.embed.b_E
    patterns, scores = [], []
    with torch.no_grad():
        for block in model.blocks:
            ln1 = F.layer_norm(residual, (config.d_model,), block.ln1.w, block.ln1.b, config.layer_norm_eps)
            bias = reference_position_bias(block.attn.relative_position_bias.bias_table, x.shape[1])
            scores.append(reference_scores(block.attn, ln1, position_bias=bias))
            patterns.append(reference_normalize(config.score_normalization, scores[-1], None, config.rms_head_eps))
            residual = residual + reference_attention_with_pattern(block.attn, ln1, patterns[-1], config.value_network)
            ln2 = F.layer_norm(residual, (config.d_model,), block.ln2.w, block.ln2.b, config.layer_norm_eps)
            residual = residual + reference_mlp(block.mlp, ln2)
    return patterns, scores


@pytest.fixture(scope="module")
def two_batches_and_formulas(model):
    """Two batches and, for their concatenation, every layer's codes and scores by the formulas."""
    x1, x2 = (torch.rand(n, 12, 5, generator=torch.Generator().manual_seed(n)) for n in (4, 3))
    return x1, x2, pattern_and_scores_by_formulas(model, torch.cat([x1, x2]))


@pytest.mark.parametrize("score", ["pattern", "scores"])
def test_recorded_codes_equal_the_attention_computed_from_the_formulas(model, score, two_batches_and_formulas):
    x1, x2, by_formulas = two_batches_and_formulas
    with Recorder(model, "0:-1:-1,2:3:7,*:5:5", score=score) as recorder:
        model(x1)
        model(x2)
    codes = recorder.pop()
    assert sorted(codes) == [Site(0, 5, 5), Site(0, 11, 11), Site(1, 5, 5), Site(2, 3, 7), Site(2, 5, 5)]
    reference = by_formulas[score == "scores"]
    for site, values in codes.items():
        assert values.shape == (7, 4) and values.dtype == np.float32
        np.testing.assert_allclose(values, reference[site.layer][:, :, site.query, site.key].numpy(),
                                   rtol=1e-4, atol=1e-5)
    assert recorder.pop() == {}, "pop forgets what it returned"


def test_all_pairs_and_sraven_rule_selectors(model):
    with Recorder(model, "all-pairs:1") as recorder:
        model(torch.rand(2, 12, 5))
    assert len(recorder.pop()) == 144
    selector = parse_selector("sraven-rule", {"name": "sraven", "n_features": 4})
    assert selector.resolve(n_layers=2, seq_len=36) == [Site(0, 35, 27), Site(0, 35, 31), Site(1, 35, 27), Site(1, 35, 31)]
    assert selector.default_variant == "unpermuted"


def test_recorder_leaves_the_model_and_other_hooks_alone(model):
    x = torch.rand(2, 12, 5)
    baseline = model(x)
    with Recorder(model, "last-self") as recorder:
        patched = model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda a, hook: a * 0)])
    assert not torch.allclose(patched, baseline)
    # Hooks run in the order they were added: the recorder, entered first, reads the codes the
    # model computed, before the patching hook added later by run_with_hooks zeroes them.
    _, cache = model.run_with_cache(x)
    np.testing.assert_allclose(recorder.pop()[Site(0, 11, 11)], cache["blocks.0.attn.hook_pattern"][:, :, 11, 11].numpy())
    torch.testing.assert_close(model(x), baseline)
    assert not any_hooks(model.modules()), "no hooks left behind"


@pytest.mark.parametrize(
    "sites, message",
    [
        ("3:0:0", r"site 3:0:0: layer 3 is outside the model's 3 layers \(0..2\)"),
        ("0:12:0", r"position 12 is outside the sequence of 12 tokens"),
        ("0:-13:0", r"position -13 is outside the sequence of 12 tokens"),
        ("0:1", r"cannot read site '0:1'"),
        ("sraven-rule", r"unknown selector 'sraven-rule'.*no task was given"),
        ("all-pairs", r"all-pairs needs a layer, as in all-pairs:0"),
    ],
)
def test_site_errors_name_the_site_and_the_range(model, sites, message):
    with pytest.raises(SiteError, match=message):
        with Recorder(model, sites):
            model(torch.rand(1, 12, 5))


def test_all_pairs_is_bounded():
    big = build_model(CONFIG.replace(n_ctx=80), seed=0)
    with pytest.raises(SiteError, match=f"more than the {MAX_ALL_PAIRS} allowed"):
        with Recorder(big, "all-pairs:0"):
            big(torch.rand(1, 80, 5))
