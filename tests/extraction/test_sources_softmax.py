"""SoftmaxSource (hand-written attention) and cross-attention sites, on Hugging Face `transformers` models
built from configs (random weights, no download), against each model's own eager `output_attentions` /
`cross_attentions`."""

import numpy as np
import pytest
import torch

from latentcode.extraction import Recorder
from latentcode.sources import TorchAttentionSource, detect_source
from latentcode.sources.softmax_capture import SoftmaxCaptureError, SoftmaxSource
from latentcode.store import Site

transformers = pytest.importorskip("transformers")

BATCH, LENGTH, DECODER_LENGTH, VOCAB = 3, 7, 5, 99

GPT2 = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0)
LLAMA = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=32,
)  # fmt: skip
BART = dict(
    vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=32,
)  # fmt: skip


def padding_mask(length=LENGTH):
    mask = torch.ones(BATCH, length, dtype=torch.long)
    mask[1, length - 2:] = 0  # right padding: every query still has a key
    mask[2, 3:] = 0
    return mask


def built(model_class, config_class, implementation, **config):
    torch.manual_seed(0)
    return model_class(config_class(**config, attn_implementation=implementation)).eval()


def token_ids(length, seed):
    return torch.randint(0, VOCAB, (BATCH, length), generator=torch.Generator().manual_seed(seed))


def recorded(model, layer, inputs, n_queries, n_keys, score="pattern", source=None):
    """`[batch, head, query, key]` of one layer, recorded site by site (explicit LAYER:QUERY:KEY sites)."""
    sites = ",".join(f"{layer}:{q}:{k}" for q in range(n_queries) for k in range(n_keys))
    with Recorder(model, sites, score=score, source=source) as recorder:
        model(**inputs)
    codes = recorder.pop()
    return np.stack(
        [np.stack([codes[Site(layer, q, k)] for k in range(n_keys)], axis=-1) for q in range(n_queries)], axis=-2
    )


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_eager_decoder_codes_equal_output_attentions(name, padded):
    if name == "gpt2":
        model = built(transformers.GPT2Model, transformers.GPT2Config, "eager", **GPT2)
        expected_names = ["h.0.attn", "h.1.attn"]
    else:  # grouped-query attention: the softmax sees the repeated key heads
        model = built(transformers.LlamaModel, transformers.LlamaConfig, "eager", **LLAMA)
        expected_names = ["layers.0.self_attn", "layers.1.self_attn"]
    inputs = {"input_ids": token_ids(LENGTH, 1)}
    if padded:
        inputs["attention_mask"] = padding_mask()
    reference = model(**inputs, output_attentions=True).attentions
    source = detect_source(model)
    assert isinstance(source, SoftmaxSource)
    for layer in range(2):
        codes = recorded(model, layer, inputs, LENGTH, LENGTH, source=source)
        np.testing.assert_allclose(codes, reference[layer].detach().numpy(), rtol=1e-6, atol=1e-7)
    assert source.layer_names() == expected_names


def test_raw_scores_are_minus_infinity_where_masked_and_softmax_to_the_pattern():
    model = built(transformers.GPT2Model, transformers.GPT2Config, "eager", **GPT2)
    inputs = {"input_ids": token_ids(LENGTH, 2), "attention_mask": padding_mask()}
    scores = recorded(model, 1, inputs, LENGTH, LENGTH, score="scores", source=SoftmaxSource(model))
    future = np.triu(np.ones((LENGTH, LENGTH), dtype=bool), k=1)
    padded_keys = (padding_mask() == 0).numpy()[:, None, None, :]
    masked = np.broadcast_to(future | padded_keys, scores.shape)
    assert np.isneginf(scores[masked]).all() and np.isfinite(scores[~masked]).all()
    reference = model(**inputs, output_attentions=True).attentions[1].detach()
    rows_with_a_key = ~masked.all(axis=-1)  # fully masked rows: the model's own softmax is uniform there
    pattern = torch.softmax(torch.from_numpy(scores), -1).numpy()
    np.testing.assert_allclose(pattern[rows_with_a_key], reference.numpy()[rows_with_a_key], atol=1e-6)


T5 = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=1, num_decoder_layers=1, num_heads=4)
ENCODER_DECODERS = {  # name: (model class, config class, config, attention implementation, layer names)
    "bart-sdpa": ("BartModel", "BartConfig", BART, "sdpa", ["encoder.layers.0.self_attn", "decoder.layers.0.self_attn",
                                                            "decoder.layers.0.encoder_attn"]),
    "bart-eager": ("BartModel", "BartConfig", BART, "eager", ["encoder.layers.0.self_attn", "decoder.layers.0.self_attn",
                                                              "decoder.layers.0.encoder_attn"]),
    "t5-eager": ("T5Model", "T5Config", T5, "eager", ["encoder.block.0.layer.0.SelfAttention",
                                                      "decoder.block.0.layer.0.SelfAttention",
                                                      "decoder.block.0.layer.1.EncDecAttention"]),
}  # fmt: skip


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", sorted(ENCODER_DECODERS))
def test_encoder_decoder_self_and_cross_attention_equal_eager_attentions(name, padded):
    model_class, config_class, config, implementation, expected_names = ENCODER_DECODERS[name]
    model_class, config_class = getattr(transformers, model_class), getattr(transformers, config_class)
    model = built(model_class, config_class, implementation, **config)
    eager = built(model_class, config_class, "eager", **config)
    eager.load_state_dict(model.state_dict())
    inputs = {"input_ids": token_ids(LENGTH, 3), "decoder_input_ids": token_ids(DECODER_LENGTH, 4)}
    if padded:
        inputs["attention_mask"] = padding_mask()
        inputs["decoder_attention_mask"] = padding_mask(DECODER_LENGTH)
    reference = eager(**inputs, output_attentions=True)
    source = detect_source(model)
    assert isinstance(source, TorchAttentionSource if implementation == "sdpa" else SoftmaxSource)
    expected = [  # (layer's reference, queries, keys)
        (reference.encoder_attentions[0], LENGTH, LENGTH),
        (reference.decoder_attentions[0], DECODER_LENGTH, DECODER_LENGTH),
        (reference.cross_attentions[0], DECODER_LENGTH, LENGTH),  # decoder queries, encoder keys
    ]
    for layer, (attention, n_queries, n_keys) in enumerate(expected):
        codes = recorded(model, layer, inputs, n_queries, n_keys, source=source)
        np.testing.assert_allclose(codes, attention.detach().numpy(), rtol=1e-4, atol=1e-6)
    assert source.layers() == [
        {"name": expected_names[0], "kind": "self", "queries": LENGTH, "keys": LENGTH},
        {"name": expected_names[1], "kind": "self", "queries": DECODER_LENGTH, "keys": DECODER_LENGTH},
        {"name": expected_names[2], "kind": "cross", "queries": DECODER_LENGTH, "keys": LENGTH},
    ]


def test_last_self_on_cross_attention_is_the_last_decoder_query_and_the_last_encoder_key():
    model = built(transformers.BartModel, transformers.BartConfig, "eager", **BART)
    inputs = {"input_ids": token_ids(LENGTH, 5), "decoder_input_ids": token_ids(DECODER_LENGTH, 6)}
    reference = model(**inputs, output_attentions=True).cross_attentions[0].detach().numpy()
    with Recorder(model, "last-self") as recorder:
        model(**inputs)
    codes = recorder.pop()
    assert Site(2, DECODER_LENGTH - 1, LENGTH - 1) in codes
    np.testing.assert_allclose(codes[Site(2, DECODER_LENGTH - 1, LENGTH - 1)], reference[:, :, -1, -1], atol=1e-7)


def test_a_chosen_module_without_a_softmax_or_with_several_is_named():
    class TwoSoftmaxes(torch.nn.Module):
        def forward(self, scores):
            return scores.softmax(-1) + torch.softmax(scores, dim=-1)

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.attn = inner

        def forward(self, scores):
            return self.attn(scores)

    scores = torch.randn(2, 3, 4, 4)
    with pytest.raises(SoftmaxCaptureError, match=r"module 'attn' computed several softmaxes"):
        model = Wrapper(TwoSoftmaxes())
        with Recorder(model, "last-self", source=SoftmaxSource(model)):
            model(scores)
    model = Wrapper(torch.nn.Identity())
    with pytest.raises(SoftmaxCaptureError, match=r"module 'attn' \(Identity\) ran but computed no softmax"):
        with Recorder(model, "last-self", source=SoftmaxSource(model)):
            model(scores)
    with pytest.raises(SoftmaxCaptureError, match=r"no module of Wrapper matches 'nothing'"):
        SoftmaxSource(model, "nothing")


# -- interventions through SoftmaxSource and on cross-attention ---------------------------------------
def sdpa_and_eager_pair(model_class, config_class, **config):
    sdpa = built(model_class, config_class, "sdpa", **config)
    eager = built(model_class, config_class, "eager", **config)
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_an_edit_of_a_hand_written_softmax_equals_the_same_edit_through_sdpa(name):
    """Eager (SoftmaxSource) and SDPA (TorchAttentionSource, tested on its own) models with the same
    weights give the same edited outputs; for BART the edit is on the cross-attention (layer 2)."""
    from latentcode.intervention import Intervention, SetCode

    if name == "gpt2":
        sdpa, eager = sdpa_and_eager_pair(transformers.GPT2Model, transformers.GPT2Config, **GPT2)
        inputs = {"input_ids": token_ids(LENGTH, 7), "attention_mask": padding_mask()}
        sites = "1:-1:2"
    else:
        sdpa, eager = sdpa_and_eager_pair(transformers.BartModel, transformers.BartConfig, **BART)
        inputs = {"input_ids": token_ids(LENGTH, 8), "decoder_input_ids": token_ids(DECODER_LENGTH, 9)}
        sites = "2:-1:-1"  # the last decoder query, the last encoder key
    plain = eager(**inputs).last_hidden_state
    edit = SetCode(np.array([0.9, 0.0, 0.5, 0.2], dtype=np.float32))
    outputs = {}
    for implementation, model in (("eager", eager), ("sdpa", sdpa)):
        with Intervention(model, edit, sites=sites, record=sites) as intervention:
            outputs[implementation] = model(**inputs).last_hidden_state.detach()
        (site, codes), = intervention.pop().items()
        np.testing.assert_allclose(codes, np.broadcast_to(edit.value, (BATCH, 4)), atol=1e-7)
    assert isinstance(Intervention(eager, edit, sites=sites).source, SoftmaxSource)
    assert not torch.allclose(outputs["eager"], plain, atol=1e-4)  # the edit reached the output
    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], rtol=1e-4, atol=1e-5)


def test_an_edit_that_changes_nothing_changes_no_bit_of_a_hand_written_model():
    from latentcode.intervention import Intervention, ScaleHeads

    model = built(transformers.LlamaModel, transformers.LlamaConfig, "eager", **LLAMA)
    inputs = {"input_ids": token_ids(LENGTH, 10)}
    plain = model(**inputs).last_hidden_state
    with Intervention(model, ScaleHeads(1.0), sites="*:-1:-1"):
        unchanged = model(**inputs).last_hidden_state
    assert torch.equal(plain, unchanged)


def test_the_error_for_a_model_no_source_could_read_names_the_attention_like_modules():
    from latentcode.sources import NoAttentionCaptured

    class HandWritten(torch.nn.Module):  # attention by hand, not a Hugging Face model: not detected
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.ModuleDict({"attn": torch.nn.Identity()})])

        def forward(self, x):
            return torch.softmax(x @ x.transpose(-1, -2), dim=-1) @ self.blocks[0]["attn"](x)

    model = HandWritten()
    with pytest.raises(NoAttentionCaptured, match=r"SoftmaxSource\(model, .*modules named like attention: blocks\.0\.attn"):
        with Recorder(model, "last-self"):
            model(torch.randn(2, 3, 4, 5))


def test_a_codes_file_records_which_layer_is_cross_attention_and_both_lengths(tmp_path):
    from latentcode.store import CodeFile, CodeWriter

    model = built(transformers.BartModel, transformers.BartConfig, "sdpa", **BART)
    inputs = {"input_ids": token_ids(LENGTH, 7), "decoder_input_ids": token_ids(DECODER_LENGTH, 8)}
    with Recorder(model, "2:-1:0,2:-1:-1") as recorder:
        model(**inputs)
    codes = recorder.pop()
    with CodeWriter(tmp_path / "codes.h5", list(codes), n_heads=4,
                    metadata={"attention_layers": recorder.layers(), "source": recorder.source.name}) as writer:
        writer.append(codes, split="all")
    layers = CodeFile(tmp_path / "codes.h5").attention_layers
    assert [layer["kind"] for layer in layers] == ["self", "self", "cross"]
    assert (layers[2]["queries"], layers[2]["keys"]) == (DECODER_LENGTH, LENGTH)
    assert sorted((site.query, site.key) for site in codes) == [(DECODER_LENGTH - 1, 0), (DECODER_LENGTH - 1, LENGTH - 1)]
