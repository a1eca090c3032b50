"""HookPointSource on transformer-lens 3.x `HookedTransformer`s (for users who pinned 3.x; 4.x
removed the class and these tests skip there). A randomly initialized model from a
HookedTransformerConfig, no download; references come from its own `run_with_cache`."""

import numpy as np
import pytest
import torch

from latentcode.extraction import Recorder
from latentcode.sources import HookPointSource, detect_source
from latentcode.store import Site

transformer_lens = pytest.importorskip("transformer_lens")
try:
    transformer_lens.HookedTransformer  # noqa: B018 (4.x raises ImportError on access)
except (AttributeError, ImportError):
    pytest.skip("transformer-lens >= 4 has no HookedTransformer", allow_module_level=True)

BATCH, LENGTH, VOCAB, LAYERS = 2, 7, 50, 2


@pytest.fixture(scope="module")
def model():
    config = transformer_lens.HookedTransformerConfig(
        n_layers=LAYERS, d_model=32, d_head=8, n_heads=4, d_mlp=64, n_ctx=16, d_vocab=VOCAB,
        act_fn="gelu", attn_only=False, seed=0,
    )
    return transformer_lens.HookedTransformer(config).eval()


def tokens():
    return torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("score, hook", [("pattern", "hook_pattern"), ("scores", "hook_attn_scores")])
def test_codes_equal_the_cached_attention_of_every_pair(model, score, hook):
    assert isinstance(detect_source(model), HookPointSource) and detect_source(model).name == "transformer_lens"
    _, cache = model.run_with_cache(tokens())
    for layer in range(LAYERS):
        with Recorder(model, f"all-pairs:{layer}", score=score) as recorder:
            model(tokens())
        codes = recorder.pop()
        reference = cache[f"blocks.{layer}.attn.{hook}"].numpy()  # [batch, head, query, key]
        for query in range(LENGTH):
            for key in range(query + 1):  # causal: later keys hold -inf scores / zero pattern
                np.testing.assert_allclose(codes[Site(layer, query, key)], reference[:, :, query, key], atol=1e-6)


def test_last_self_selector_and_a_layer_beyond_the_model(model):
    with Recorder(model, "last-self") as recorder:
        model(tokens())
    assert recorder.sites == [Site(layer, LENGTH - 1, LENGTH - 1) for layer in range(LAYERS)]
    with pytest.raises(ValueError, match=r"layer 5"):
        with Recorder(model, "5:-1:-1"):
            model(tokens())
