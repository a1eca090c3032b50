"""Intervene on the latent codes of a PyTorch model the toolkit has never seen.

The model below is written from scratch: an embedding, two causal attention layers that call
`torch.nn.functional.scaled_dot_product_attention`, and a linear read-out of the last token. Nothing
in it knows about latentcode and nothing in it is changed: while an `Intervention` is active, each
SDPA call recomputes the attention probabilities of the affected query rows from its own inputs,
edits them, and returns `edited_probabilities @ value` for those rows (the fused call's own
result everywhere else).

    python examples/intervene_on_sdpa_model.py          # a few seconds on a CPU

It shows: an identity edit changes no bit; zero-ablating two heads of the last token; activation
patching (the last token's codes taken from a second input); recording the edited codes in the
same pass; and the edited layer checked against attention written by hand.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from latentcode.intervention import Interchange, Intervention, SetCode, ZeroAblate
from latentcode.store import Site


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def heads(self, x: torch.Tensor):
        batch, length, _ = x.shape
        return self.qkv(x).view(batch, length, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(x)
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [batch, head, pos, d_head]
        return self.out(mixed.transpose(1, 2).reshape(x.shape))


class TinyModel(nn.Module):
    def __init__(self, n_symbols=10, d_model=32, n_heads=4, n_layers=2):
        super().__init__()
        self.embed = nn.Embedding(n_symbols, d_model)
        self.position = nn.Parameter(torch.randn(64, d_model) / math.sqrt(d_model))
        self.layers = nn.ModuleList(CausalSelfAttention(d_model, n_heads) for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.readout = nn.Linear(d_model, n_symbols)

    def forward(self, symbols: torch.Tensor) -> torch.Tensor:
        h = self.embed(symbols) + self.position[: symbols.shape[1]]
        for layer, norm in zip(self.layers, self.norms, strict=True):
            h = h + layer(norm(h))
        return self.readout(h[:, -1])


def main() -> None:
    torch.manual_seed(0)
    model = TinyModel().eval()
    symbols = torch.randint(0, 10, (4, 12))
    other = torch.randint(0, 10, (4, 12))
    with torch.no_grad():
        clean, clean_other = model(symbols), model(other)

        # 1. Every code of layer 1 set to its own value: no output bit changes.
        identity = Interchange.from_inputs(model, symbols, sites="all-pairs:1")
        with Intervention(model, identity):
            print(f"identity edit, outputs bit-identical: {torch.equal(model(symbols), clean)}")

        # 2. Zero-ablate heads 0 and 2 of the last token attending to itself, in both layers.
        with Intervention(model, ZeroAblate(heads=[0, 2]), sites="last-self"):
            ablated = model(symbols)
        print(f"zero-ablating heads 0, 2 at last-self: max |change| of the logits {(ablated - clean).abs().max():.3f}")

        # 3. Activation patching: the last token's codes over every key of layer 1 from the other input.
        last_row = [(1, -1, key) for key in range(12)]
        patch = Interchange.from_inputs(model, other, sites=last_row)
        with Intervention(model, patch, record="1:-1:-1") as intervention:
            patched = model(symbols)
        moved = (patched - clean).norm() / (clean_other - clean).norm()
        print(f"patching layer 1's last query row from the other input moves the logits {moved:.0%} of the way to the "
              "other input's")
        recorded = intervention.pop()[Site(1, 11, 11)]  # the code layer 1 computed with: the other input's
        print("recorded (edited) code equals the other input's: "
              f"{np.array_equal(recorded, patch.codes[Site(1, 11, 11)])}")

        # 4. The edited layer 0, by hand: softmax(q kᵀ / sqrt(d)) with one probability set, times v.
        layer = model.layers[0]
        x = model.norms[0](model.embed(symbols) + model.position[:12])
        q, k, v = layer.heads(x)
        probabilities = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(
            ~torch.ones(12, 12, dtype=torch.bool).tril(), float("-inf")), dim=-1)
        probabilities[:, :, 11, 3] = 0.5  # the edit; the row need not sum to one any more
        by_hand = layer.out((probabilities @ v).transpose(1, 2).reshape(x.shape))
        with Intervention(model, SetCode(np.full(4, 0.5, np.float32)), sites="0:11:3"):
            edited = layer(x)
        print(f"edited layer 0 vs by hand: max |difference| {(edited - by_hand).abs().max():.1e}")


if __name__ == "__main__":
    main()
