"""Record latent codes from a PyTorch model the toolkit has never seen.

The model below is written from scratch: its own embedding, its own attention computed with
`torch.nn.functional.scaled_dot_product_attention` (causal, grouped-query: 4 query heads share 2
key/value heads), and a `torch.nn.MultiheadAttention` read-out layer. Nothing in it knows about
latentcode, and nothing in it is changed: the Recorder intercepts each attention call, recomputes
the attention probabilities of the requested (query, key) pairs from that call's own inputs, and
hands the model the original result.

    python examples/hooks_on_a_new_model.py          # a few seconds on a CPU

For attention written without SDPA or nn.MultiheadAttention (explicit matmul + softmax), see
`latentcode.sources.AdapterSource`.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from latentcode.extraction import Recorder
from latentcode.sources import Site, TorchAttentionSource


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_kv = nn.Linear(d_model, 2 * n_kv_heads * self.d_head, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.to_q(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
        k, v = self.to_kv(x).view(batch, length, 2, self.n_kv_heads, self.d_head).permute(2, 0, 3, 1, 4)
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.to_out(mixed.transpose(1, 2).reshape(batch, length, -1))


class TinyCounter(nn.Module):
    """Reads a sequence of symbols and predicts, at the end, how often the last one occurred."""

    def __init__(self, n_symbols=10, d_model=32, n_layers=2):
        super().__init__()
        self.embed = nn.Embedding(n_symbols, d_model)
        self.position = nn.Parameter(torch.randn(64, d_model) / math.sqrt(d_model))
        self.mixers = nn.ModuleList(GroupedQueryAttention(d_model, n_heads=4, n_kv_heads=2) for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.readout = nn.MultiheadAttention(d_model, num_heads=2, batch_first=True)
        self.head = nn.Linear(d_model, 1)

    def forward(self, symbols: torch.Tensor) -> torch.Tensor:
        h = self.embed(symbols) + self.position[: symbols.shape[1]]
        for mixer, norm in zip(self.mixers, self.norms, strict=True):
            h = h + mixer(norm(h))
        last = h[:, -1:]
        summary, _ = self.readout(last, h, h, need_weights=False)  # one query over all positions
        return self.head(summary[:, 0])


def fmt(values) -> str:
    return "[" + ", ".join(f"{float(value):.3f}" for value in values) + "]"


def main() -> None:
    torch.manual_seed(0)
    model = TinyCounter().eval()
    symbols = torch.randint(0, 10, (4, 12))
    without_recording = model(symbols)
    source = TorchAttentionSource(model)

    # Sites are (layer, query, key); negative positions count from the end. The last token attending
    # to itself in the two self-attention layers (calls 0 and 1), and the read-out's single query
    # (position 0 of its query axis) attending to the last token (call 2).
    with Recorder(model, [(0, -1, -1), (1, -1, -1), (2, 0, -1)], source=source) as recorder:
        prediction = model(symbols)
    codes = recorder.pop()

    print("attention layers, by call order:")
    for layer, name in enumerate(source.layer_names()):
        print(f"  {layer}: {name}")
    print(f"predictions identical with and without recording: {torch.equal(prediction, without_recording)}")
    print("latent codes  [examples, heads]:")
    for site in sorted(codes):
        print(f"  {site}: {codes[site].shape}  first example {fmt(codes[site][0])}")

    # The same code computed by hand from layer 1's own q and k, to show what was recorded.
    mixer = model.mixers[1]
    with torch.no_grad():
        h = model.embed(symbols) + model.position[:12]
        h = h + model.mixers[0](model.norms[0](h))
        x = model.norms[1](h)
        q = mixer.to_q(x).view(4, 12, 4, 8).transpose(1, 2)
        k = mixer.to_kv(x).view(4, 12, 2, 2, 8).permute(2, 0, 3, 1, 4)[0].repeat_interleave(2, dim=1)
        by_hand = torch.softmax(q[:, :, -1:] @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)[:, :, 0, -1]
    recorded = torch.from_numpy(codes[Site(1, 11, 11)])
    print(f"layer 1, token 11 -> 11, by hand: {fmt(by_hand[0])}")
    print(f"max |recorded - by hand| = {(recorded - by_hand).abs().max().item():.1e}")


if __name__ == "__main__":
    main()
