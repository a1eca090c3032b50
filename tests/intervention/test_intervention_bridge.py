"""Interventions on transformer-lens 4.x TransformerBridges built offline (as in
tests/extraction/test_sources_bridge.py): boot_native and GPT-2 compute attention from hook_pattern,
so edits reach the output; BERT fires hook_pattern after the Hugging Face module ran, so an edit is
refused. The reference for an edit is TransformerLens's own `run_with_hooks` with a hook that writes
the same values into hook_pattern."""

import numpy as np
import pytest
import torch

from latentcode.intervention import CannotIntervene, Interchange, Intervention, SetCode, ZeroAblate
from latentcode.models.hook_state import attached_hooks

transformer_lens = pytest.importorskip("transformer_lens")
if not hasattr(transformer_lens, "TransformerBridge"):
    pytest.skip("transformer-lens < 4 has no TransformerBridge", allow_module_level=True)
transformers = pytest.importorskip("transformers")

from tests.extraction.bridge_models import LENGTH, VOCAB, hf_bridge, tokens, word_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def native():
    config = transformer_lens.TransformerBridgeConfig(
        d_model=32, d_head=8, n_layers=2, n_ctx=16, n_heads=4, d_vocab=VOCAB, seed=0
    )
    return transformer_lens.TransformerBridge.boot_native(config).eval()


def hooks(model):
    return [(name, attached_hooks(m).forward, attached_hooks(m).forward_pre) for name, m in model.named_modules()]


VALUE = np.array([0.5, -0.25, 1.5, 0.0], dtype=np.float32)


def set_by_hook(pattern, hook):
    pattern = pattern.clone()
    pattern[:, :, LENGTH - 1, 2] = torch.from_numpy(VALUE)[None, :]
    pattern[:, [1, 3], 3, 3] = 0.0
    return pattern


@pytest.mark.parametrize("kind", ["native", "gpt2"])
def test_bridge_edits_equal_run_with_hooks_and_identity_changes_no_bit(kind, tokenizer):
    bridge = native() if kind == "native" else hf_bridge("gpt2", tokenizer)
    with torch.no_grad():
        expected = bridge(tokens())
        identity = [Interchange.from_inputs(bridge, tokens(), sites=f"all-pairs:{layer}") for layer in range(2)]
        with Intervention(bridge, identity):
            assert torch.equal(bridge(tokens()), expected)
        edits = [SetCode(VALUE, sites="1:-1:2"), ZeroAblate(heads=[1, 3], sites="1:3:3")]
        with Intervention(bridge, edits, record="1:-1:2"):
            edited = bridge(tokens())
        reference = bridge.run_with_hooks(tokens(), fwd_hooks=[("blocks.1.attn.hook_pattern", set_by_hook)])
    assert (reference - expected).abs().max() > 1e-4
    torch.testing.assert_close(edited, reference, atol=1e-6, rtol=1e-6)


def test_a_bridge_that_fires_hook_pattern_after_the_hf_module_is_refused(tokenizer):
    bridge = hf_bridge("bert", tokenizer)
    bridge(tokens())  # the bridge adds hooks of its own on its first forward pass
    hooks_before = hooks(bridge)
    with pytest.raises(CannotIntervene, match=r"blocks.0.attn: .*fires hook_pattern afterwards") as raised:
        with Intervention(bridge, ZeroAblate()):
            bridge(tokens())
    assert "\n" not in str(raised.value)
    assert hooks(bridge) == hooks_before  # only the bridge's own hooks are left
