"""Interventions on transformer-lens 3.x `HookedTransformer`s through hook_pattern (skipped with
4.x, which removed the class). The reference is TransformerLens's own `run_with_hooks`."""

import numpy as np
import pytest
import torch

from latentcode.intervention import Interchange, Intervention, SetCode, ZeroAblate

transformer_lens = pytest.importorskip("transformer_lens")
try:
    transformer_lens.HookedTransformer  # noqa: B018 (4.x raises ImportError on access)
except (AttributeError, ImportError):
    pytest.skip("transformer-lens >= 4 has no HookedTransformer", allow_module_level=True)

BATCH, LENGTH, VOCAB = 2, 7, 50
VALUE = np.array([0.5, -0.25, 1.5, 0.0], dtype=np.float32)


def test_edits_equal_run_with_hooks_and_identity_changes_no_bit():
    config = transformer_lens.HookedTransformerConfig(
        n_layers=2, d_model=32, d_head=8, n_heads=4, d_mlp=64, n_ctx=16, d_vocab=VOCAB, act_fn="gelu", seed=0
    )
    model = transformer_lens.HookedTransformer(config).eval()
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))

    def set_by_hook(pattern, hook):
        pattern = pattern.clone()
        pattern[:, :, LENGTH - 1, 2] = torch.from_numpy(VALUE)[None, :]
        pattern[:, [1, 3], 3, 3] = 0.0
        return pattern

    with torch.no_grad():
        expected = model(tokens)
        identity = [Interchange.from_inputs(model, tokens, sites=f"all-pairs:{layer}") for layer in range(2)]
        with Intervention(model, identity):
            assert torch.equal(model(tokens), expected)
        with Intervention(model, [SetCode(VALUE, sites="1:-1:2"), ZeroAblate(heads=[1, 3], sites="1:3:3")]):
            edited = model(tokens)
        reference = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_pattern", set_by_hook)])
    assert (reference - expected).abs().max() > 1e-4
    torch.testing.assert_close(edited, reference, atol=1e-6, rtol=1e-6)
