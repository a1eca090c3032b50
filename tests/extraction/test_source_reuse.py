"""A source object stays reusable after a Recorder or an Intervention raised in the middle of a pass
(issue 23): the layers counted up to the error must not become the source's layers, or a later
Recorder refuses valid sites of later layers ("layer 2 is outside the model's 2 layers")."""

import pytest
import torch
from torch import nn

from latentcode.extraction import Recorder
from latentcode.intervention import Intervention, ZeroAblate
from latentcode.sources import SiteError, TorchAttentionSource
from latentcode.sources.softmax_capture import SoftmaxSource
from latentcode.store import Site
from tests.extraction.torch_models import SdpaModel


class HandWrittenAttention(nn.Module):
    def __init__(self, d_model=16, n_heads=4):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        batch, length, d_model = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        pattern = torch.softmax(q @ k.transpose(-1, -2) / self.d_head**0.5, dim=-1)
        return (pattern @ v).transpose(1, 2).reshape(batch, length, d_model)


class HandWrittenModel(nn.Module):
    def __init__(self, n_layers=3, d_model=16):
        super().__init__()
        self.embed = nn.Linear(3, d_model)
        self.blocks = nn.ModuleList()
        for _ in range(n_layers):
            block = nn.Module()
            block.attn = HandWrittenAttention(d_model)
            self.blocks.append(block)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block.attn(h)
        return h


def model_and_source(kind):
    torch.manual_seed(0)
    if kind == "torch":
        model = SdpaModel(n_layers=3).eval()
        return model, TorchAttentionSource(model)
    model = HandWrittenModel(n_layers=3).eval()
    return model, SoftmaxSource(model, r"blocks\.\d+\.attn")


@pytest.mark.parametrize("kind", ["torch", "softmax"])
def test_a_source_is_reusable_after_a_recorder_refused_a_position_outside_a_shorter_call(kind):
    model, source = model_and_source(kind)
    long_inputs, short_inputs = torch.randn(2, 6, 3), torch.randn(2, 4, 3)
    with Recorder(model, "1:5:5", source=source):
        model(long_inputs)
    names = source.layer_names()
    assert len(names) == 3
    # Position 5 is outside the 4 tokens of the shorter call: refused in layer 1, mid-pass.
    with pytest.raises(SiteError, match="position 5 is outside"):
        with Recorder(model, "1:5:5", source=source):
            model(short_inputs)
    assert source.layer_names() == names
    with Recorder(model, "2:-1:-1", source=source) as recorder:
        model(short_inputs)
    assert list(recorder.pop()) == [Site(2, 3, 3)]
    with Intervention(model, ZeroAblate(), sites="2:-1:-1", source=source, record="2:-1:-1") as intervention:
        model(short_inputs)
    assert (intervention.pop()[Site(2, 3, 3)] == 0).all()


@pytest.mark.parametrize("kind", ["torch", "softmax"])
def test_a_first_pass_that_raised_teaches_the_source_no_layers(kind):
    model, source = model_and_source(kind)
    with pytest.raises(SiteError, match="position 9 is outside"):
        with Intervention(model, ZeroAblate(), sites="1:9:0", source=source):
            model(torch.randn(2, 6, 3))
    assert source.n_layers() is None
    with Recorder(model, "2:-1:-1", source=source) as recorder:
        model(torch.randn(2, 6, 3))
    assert list(recorder.pop()) == [Site(2, 5, 5)]
    assert source.n_layers() == 3
