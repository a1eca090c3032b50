"""Recording from our models: the codes equal the attention pattern; selectors and their errors."""

import numpy as np
import pytest
import torch

from latentcode import ModelConfig, build_model
from latentcode.extraction import Recorder
from latentcode.models.hook_state import any_hooks
from latentcode.sources import Site, SiteError, parse_selector
from latentcode.sources.sites import MAX_ALL_PAIRS

CONFIG = ModelConfig(attention="hyla", n_layers=3, d_model=16, n_heads=4, kqv_dim=8, d_mlp=16, n_ctx=12, d_in=5, d_out=5)


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=0).eval()


def pattern_and_scores(model, x):
    _, cache = model.run_with_cache(x)
    return ([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(3)],
            [cache[f"blocks.{layer}.attn.hook_attn_scores"] for layer in range(3)])


@pytest.mark.parametrize("score", ["pattern", "scores"])
def test_recorded_codes_equal_the_attention_computed_directly(model, score):
    x1, x2 = torch.rand(4, 12, 5), torch.rand(3, 12, 5)
    with Recorder(model, "0:-1:-1,2:3:7,*:5:5", score=score) as recorder:
        model(x1)
        model(x2)
    codes = recorder.pop()
    assert sorted(codes) == [Site(0, 5, 5), Site(0, 11, 11), Site(1, 5, 5), Site(2, 3, 7), Site(2, 5, 5)]
    reference = [torch.cat(pair) for pair in zip(*[pattern_and_scores(model, x)[score == "scores"] for x in (x1, x2)],
                                                 strict=True)]
    for site, values in codes.items():
        assert values.shape == (7, 4) and values.dtype == np.float32
        np.testing.assert_allclose(values, reference[site.layer][:, :, site.query, site.key].numpy(), rtol=1e-6)
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
