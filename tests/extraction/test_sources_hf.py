"""TorchAttentionSource on Hugging Face `transformers` models built from configs (random weights, no
download): the SDPA implementation, captured, against the eager implementation's
`output_attentions` for the same weights."""

import numpy as np
import pytest
import torch

from latentcode.extraction import Recorder
from latentcode.sources import TorchAttentionSource, detect_source
from latentcode.store import Site

transformers = pytest.importorskip("transformers")

BATCH, LENGTH, VOCAB = 3, 7, 99


def padding_mask():
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1, 5:] = 0  # right padding: every query still has a key
    mask[2, 3:] = 0
    return mask


def sdpa_and_eager(model_class, config_class, **config):
    torch.manual_seed(0)
    sdpa = model_class(config_class(**config, attn_implementation="sdpa")).eval()
    eager = model_class(config_class(**config, attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    assert sdpa.config._attn_implementation == "sdpa"
    return sdpa, eager


def all_pairs(model, layer, inputs, score="pattern", source=None):
    with Recorder(model, f"all-pairs:{layer}", score=score, source=source) as recorder:
        model(**inputs)
    codes = recorder.pop()
    return np.stack(
        [np.stack([codes[Site(layer, q, k)] for k in range(LENGTH)], axis=-1) for q in range(LENGTH)], axis=-2
    )


BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=VOCAB)
LLAMA = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=32,
)  # fmt: skip


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_hugging_face_sdpa_codes_equal_eager_output_attentions(name, padded):
    if name == "bert":
        sdpa, eager = sdpa_and_eager(transformers.BertModel, transformers.BertConfig, **BERT)
        expected_names = ["encoder.layer.0.attention.self", "encoder.layer.1.attention.self"]
    else:  # causal, grouped-query attention (enable_gqa when unpadded)
        sdpa, eager = sdpa_and_eager(transformers.LlamaModel, transformers.LlamaConfig, **LLAMA)
        expected_names = ["layers.0.self_attn", "layers.1.self_attn"]
    inputs = {"input_ids": torch.randint(0, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))}
    if padded:
        inputs["attention_mask"] = padding_mask()
    reference = eager(**inputs, output_attentions=True).attentions
    source = detect_source(sdpa)
    assert isinstance(source, TorchAttentionSource)
    for layer in range(2):
        codes = all_pairs(sdpa, layer, inputs, source=source)
        np.testing.assert_allclose(codes, reference[layer].detach().numpy(), rtol=1e-4, atol=1e-6)
    assert source.layer_names() == expected_names


def test_hugging_face_raw_scores_are_minus_infinity_where_padded_and_softmax_to_the_pattern():
    sdpa, eager = sdpa_and_eager(transformers.BertModel, transformers.BertConfig, **BERT)
    inputs = {"input_ids": torch.randint(0, VOCAB, (BATCH, LENGTH)), "attention_mask": padding_mask()}
    scores = all_pairs(sdpa, 1, inputs, score="scores")
    padded_keys = (padding_mask() == 0).numpy()[:, None, None, :].repeat(LENGTH, axis=2).repeat(4, axis=1)
    assert np.isneginf(scores[padded_keys]).all() and np.isfinite(scores[~padded_keys]).all()
    reference = eager(**inputs, output_attentions=True).attentions[1].detach()
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(scores), -1).numpy(), reference.numpy(), atol=1e-6)
