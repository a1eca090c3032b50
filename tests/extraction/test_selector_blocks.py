"""Selectors for every pair, whole rows and columns and blocks (issue 22): the spec strings and
`block()` resolve to the pairs a hand-written list would give, the Recorder reads them, and bad
ranges are refused with the range and the sequence length."""

import pytest
import torch

from latentcode import ModelConfig, build_model
from latentcode.extraction import Recorder
from latentcode.sources.sites import SiteError, block, parse_selector
from latentcode.store import Site


def sites(spec, n_layers=3, seq_len=6):
    return parse_selector(spec).resolve(n_layers, seq_len)


def test_whole_row_column_layer_and_every_pair():
    assert sites("*:5:*") == [Site(layer, 5, key) for layer in range(3) for key in range(6)]
    assert sites("*:-1:*") == sites("*:5:*")
    assert sites("*:*:0") == [Site(layer, query, 0) for layer in range(3) for query in range(6)]
    assert sites("1:*:*") == [Site(1, query, key) for query in range(6) for key in range(6)]
    assert len(sites("*:*:*")) == 3 * 36


def test_ranges_are_half_open_and_count_negative_ends_from_the_end():
    assert sites("2:1..3:4..") == [Site(2, 1, 4), Site(2, 1, 5), Site(2, 2, 4), Site(2, 2, 5)]
    assert sites("0:-2..:..1") == [Site(0, 4, 0), Site(0, 5, 0)]
    assert sites("0:5:0|2|-1") == [Site(0, 5, 0), Site(0, 5, 2), Site(0, 5, 5)]


def test_block_builds_the_same_selectors_as_the_spec_strings():
    assert block(2, range(1, 3), range(4, 6)).resolve(3, 6) == sites("2:1..3:4..6")
    assert block(queries=-1).resolve(3, 6) == sites("*:-1:*")
    assert block([0, 2], 3, [0, 1]).resolve(3, 6) == sites("0:3:0|1,2:3:0|1")
    assert parse_selector(block(1, range(0, 2), None).spec()).resolve(3, 6) == block(1, range(0, 2), None).resolve(3, 6)


@pytest.mark.parametrize("spec, message", [
    ("0:2..9:*", "reaches past the sequence of 6 tokens"),
    ("0:4..2:*", "selects no position"),
    ("0:*:x", "cannot read site"),
    ("7:*:*", "layer 7 is outside"),
])
def test_bad_ranges_are_refused_with_what_was_wrong(spec, message):
    with pytest.raises(SiteError, match=message):
        sites(spec)


def test_block_refuses_steps_and_empty_layers():
    with pytest.raises(SiteError, match="step 2"):
        block(0, range(0, 6, 2))
    with pytest.raises(SiteError, match="layers is empty"):
        block([], 0, 0)


def test_the_recorder_reads_a_whole_row_as_the_pattern_has_it():
    config = ModelConfig(attention="softmax", n_layers=2, d_model=8, n_heads=2, kqv_dim=8, d_mlp=8, n_ctx=5, d_in=3, d_out=2)
    model = build_model(config, seed=0).eval()
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    with Recorder(model, "*:-1:*") as recorder, torch.no_grad():
        model(x)
    codes = recorder.pop()
    _, cache = model.run_with_cache(x)
    for layer in range(2):
        for key in range(5):
            expected = cache[f"blocks.{layer}.attn.hook_pattern"][:, :, 4, key]
            torch.testing.assert_close(torch.as_tensor(codes[Site(layer, 4, key)]), expected)
