"""AdapterSource: attention the other sources cannot see (explicit matmul/softmax here), read
through a named module and a function of its inputs/outputs."""

import numpy as np
import pytest
import torch
from torch import nn

from latentcode.extraction import Recorder
from latentcode.sources import AdapterSource, NoAttentionCaptured
from latentcode.store import Site

BATCH, LENGTH, HEADS = 3, 5, 2


class HandWrittenAttention(nn.Module):
    """Causal attention with an explicit softmax; returns (output, probabilities, raw scores)."""

    def __init__(self, d_model=8):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        batch, length, d_model = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, HEADS, d_model // HEADS).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / (d_model // HEADS) ** 0.5
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
        probabilities = scores.softmax(-1)
        return (probabilities @ v).transpose(1, 2).reshape(batch, length, d_model), probabilities, scores


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(HandWrittenAttention() for _ in range(2))

    def forward(self, x):
        self.seen = []
        for layer in self.layers:
            out, probabilities, scores = layer(x)
            self.seen.append((probabilities.detach(), scores.detach()))
            x = x + out
        return x


def record(model, source, sites, score="pattern"):
    with Recorder(model, sites, score=score, source=source) as recorder:
        model(torch.randn(BATCH, LENGTH, 8))
    return recorder.pop()


def all_sites(layer):
    return [(layer, q, k) for q in range(LENGTH) for k in range(LENGTH)]


def as_grid(codes, layer):
    return np.stack([np.stack([codes[Site(layer, q, k)] for k in range(LENGTH)], -1) for q in range(LENGTH)], -2)


def test_adapter_records_the_pattern_the_function_returns():
    torch.manual_seed(0)
    model = Model()
    source = AdapterSource(model, ["layers.0", "layers.1"], lambda module, args, kwargs, output: output[1])
    assert source.n_layers() == 2 and source.layer_names() == ["layers.0", "layers.1"]
    for layer in range(2):
        codes = record(model, source, all_sites(layer))
        np.testing.assert_array_equal(as_grid(codes, layer), model.seen[layer][0].numpy())


@pytest.mark.parametrize("score", ["pattern", "scores"])
def test_raw_scores_give_both_kinds(score):
    torch.manual_seed(0)
    model = Model()
    layers = {"first": model.layers[0], "second": "layers.1"}
    source = AdapterSource(model, layers, lambda module, args, kwargs, output: output[2], score_kind="scores")
    assert source.layer_names() == ["first", "second"]
    codes = record(model, source, all_sites(1), score=score)
    probabilities, scores = model.seen[1]
    expected = probabilities if score == "pattern" else scores
    np.testing.assert_allclose(as_grid(codes, 1), expected.numpy(), rtol=1e-6, atol=1e-7)


def test_adapter_can_recompute_attention_from_the_module_inputs():
    torch.manual_seed(0)
    model = Model()

    def from_inputs(module, args, kwargs, output):
        return module(args[0])[1]  # recompute from the hidden states the module received

    source = AdapterSource(model, ["layers.0", "layers.1"], from_inputs)
    codes = record(model, source, "*:-1:0")
    np.testing.assert_allclose(codes[Site(1, LENGTH - 1, 0)], model.seen[1][0][:, :, -1, 0].numpy(), rtol=1e-6)


def test_a_module_that_does_not_exist_is_named_with_suggestions():
    with pytest.raises(ValueError, match=r"no module named 'layers\.2\.attn'.*layers\.0\.qkv"):
        AdapterSource(Model(), ["layers.2.attn"], lambda *a: None)


def test_scores_fn_returning_the_wrong_shape_is_a_clear_error():
    model = Model()
    source = AdapterSource(model, ["layers.0"], lambda module, args, kwargs, output: output[0])
    with pytest.raises(ValueError, match=r"layer 0 \(layers.0\) must return a \[batch, head, query, key\] tensor, got \(3, 5, 8\)"):
        record(model, source, "last-self")


def test_raw_scores_cannot_be_asked_of_a_pattern_adapter():
    model = Model()
    source = AdapterSource(model, ["layers.0"], lambda module, args, kwargs, output: output[1])
    with pytest.raises(ValueError, match="raw scores were asked for"):
        record(model, source, "last-self", score="scores")


def test_a_named_module_that_never_runs_raises_no_attention_captured():
    model = Model()
    model.unused = nn.Linear(2, 2)
    source = AdapterSource(model, ["unused"], lambda module, args, kwargs, output: output)
    with pytest.raises(NoAttentionCaptured):
        record(model, source, "last-self")


def test_a_module_called_twice_in_one_pass_keeps_the_last_call():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = HandWrittenAttention()

        def forward(self, x):
            first, _, _ = self.attention(x)
            self.second = self.attention(first)[1].detach()
            return self.second

    model = Twice()
    source = AdapterSource(model, ["attention"], lambda module, args, kwargs, output: output[1])
    x = torch.randn(BATCH, LENGTH, 8)
    with Recorder(model, "0:-1:1", source=source) as recorder:
        model(x)
        model(x)
    codes = recorder.pop()[Site(0, LENGTH - 1, 1)]
    assert codes.shape == (2 * BATCH, HEADS), "one row per example and pass, not per call"
    np.testing.assert_allclose(codes[:BATCH], model.second[:, :, -1, 1].numpy(), rtol=1e-6)
