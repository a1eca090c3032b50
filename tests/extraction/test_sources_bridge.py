"""BridgeSource on transformer-lens 4.x TransformerBridges built offline: boot_native (a
TL-native causal model) and boot_transformers around locally built Hugging Face models (BERT:
bidirectional with padding; GPT-2: hook_attn_scores holds raw scores). References come from the
bridge's own `run_with_cache`."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from latentcode.extraction import Recorder
from latentcode.sources import BridgeSource, detect_source, is_transformer_bridge
from latentcode.store import Site

transformer_lens = pytest.importorskip("transformer_lens")
if not hasattr(transformer_lens, "TransformerBridge"):
    pytest.skip("transformer-lens < 4 has no TransformerBridge", allow_module_level=True)
transformers = pytest.importorskip("transformers")

from tests.extraction.bridge_models import BATCH, LENGTH, VOCAB, hf_bridge, tokens, word_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def native():
    config = transformer_lens.TransformerBridgeConfig(
        d_model=32, d_head=8, n_layers=2, n_ctx=16, n_heads=4, d_vocab=VOCAB, seed=0
    )
    return transformer_lens.TransformerBridge.boot_native(config)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def right_padding():
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1, 4:] = 0
    return mask


def all_pairs(bridge, layer, score, **kwargs):
    with Recorder(bridge, f"all-pairs:{layer}", score=score) as recorder:
        bridge(tokens(), **kwargs)
    codes = recorder.pop()
    return np.stack(
        [np.stack([codes[Site(layer, q, k)] for k in range(LENGTH)], axis=-1) for q in range(LENGTH)], axis=-2
    )


def cached(bridge, name, **kwargs):
    _, cache = bridge.run_with_cache(tokens(), **kwargs)
    return cache[name].detach()


def test_detect_source_picks_the_bridge_and_names_layers(native):
    source = detect_source(native)
    assert isinstance(source, BridgeSource) and is_transformer_bridge(native)
    assert source.n_layers() == 2 and source.layer_names() == ["blocks.0.attn", "blocks.1.attn"]
    assert not is_transformer_bridge(torch.nn.Linear(2, 2))


def test_is_transformer_bridge_imports_nothing_for_other_models():
    code = (
        "import sys, torch\n"
        "from latentcode.sources.bridge import is_transformer_bridge\n"
        "assert not is_transformer_bridge(torch.nn.Linear(2, 2))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('transformer_lens', 'transformers'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("padded", [False, True])
def test_native_bridge_pattern_equals_hook_pattern(native, padded):
    kwargs = {"attention_mask": right_padding()} if padded else {}
    for layer in range(2):
        reference = cached(native, f"blocks.{layer}.attn.hook_pattern", **kwargs)
        np.testing.assert_allclose(all_pairs(native, layer, "pattern", **kwargs), reference.numpy(), atol=1e-7)


@pytest.mark.parametrize("padded", [False, True])
def test_native_bridge_raw_scores_are_rebuilt_from_q_and_k(native, padded):
    kwargs = {"attention_mask": right_padding()} if padded else {}
    _, cache = native.run_with_cache(tokens(), **kwargs)
    # boot_native's hook_attn_scores carries the post-softmax pattern, not the raw scores
    assert torch.equal(cache["blocks.1.attn.hook_attn_scores"], cache["blocks.1.attn.hook_pattern"])
    scores = all_pairs(native, 1, "scores", **kwargs)
    q, k = cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_k"]
    expected = torch.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
    masked = torch.ones(LENGTH, LENGTH, dtype=torch.bool).triu(1) | (right_padding() == 0)[:, None, None, :] * padded
    expected = expected.masked_fill(masked, float("-inf"))
    np.testing.assert_allclose(scores, expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        torch.softmax(torch.from_numpy(scores), -1).numpy(), cache["blocks.1.attn.hook_pattern"].numpy(), atol=1e-6
    )


def test_bert_bridge_with_padding(tokenizer):
    bridge = hf_bridge("bert", tokenizer)
    padding = right_padding()
    _, cache = bridge.run_with_cache(tokens(), attention_mask=padding)
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert torch.equal(cache["blocks.0.attn.hook_attn_scores"], pattern)  # post-softmax here too
    np.testing.assert_allclose(all_pairs(bridge, 0, "pattern", attention_mask=padding), pattern.numpy(), atol=1e-7)
    scores = all_pairs(bridge, 0, "scores", attention_mask=padding)
    assert np.isneginf(scores[1, :, :, 4:]).all() and np.isfinite(scores[0]).all()  # bidirectional
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(scores), -1).numpy(), pattern.numpy(), atol=1e-6)


def test_gpt2_bridge_raw_scores_come_from_hook_attn_scores(tokenizer, monkeypatch):
    bridge = hf_bridge("gpt2", tokenizer)

    def not_needed(*args, **kwargs):
        raise AssertionError("raw scores were rebuilt from q/k although hook_attn_scores holds them")

    monkeypatch.setattr(BridgeSource, "_scores_from_qk", not_needed)
    raw = cached(bridge, "blocks.1.attn.hook_attn_scores")
    assert not torch.equal(raw, cached(bridge, "blocks.1.attn.hook_pattern"))  # genuinely pre-softmax
    scores = all_pairs(bridge, 1, "scores")
    expected = raw.masked_fill(raw <= torch.finfo(raw.dtype).min / 2, float("-inf"))
    np.testing.assert_allclose(scores, expected.numpy(), rtol=1e-6)
    assert np.isneginf(scores[..., 0, 1:]).all()


def test_raw_scores_that_do_not_reproduce_the_pattern_raise(native, monkeypatch):
    monkeypatch.setattr(native.cfg, "attention_dir", "bidirectional")  # the source misses the causal mask
    with pytest.raises(RuntimeError, match="do not reproduce hook_pattern"):
        all_pairs(native, 0, "scores")
