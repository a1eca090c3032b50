"""The residual stream entering one attention layer as a sum of named components, and the head's
query and key maps with the normalisation's scale frozen: what the bilinear decomposition
(`latentcode.intervention.qk.decomposition`) multiplies.

    x[t] = embed[t] + position[t] + sum_{l' < l} (sum_h z[t, l', h] W_O[l', h] + mlp_out[t, l']) + sum b_O

Each earlier head writes z[t, h] W_O[h]; each earlier MLP its output; the output biases b_O of every
earlier attention layer are summed into the component `bias`. The normalisation in front of the layer,
with its scale 1 / sigma[t] frozen at its value for the position, is linear:

    LN(x)[t]  = (x[t] - mean(x[t])) / sigma[t] * gain + b     (LayerNorm: centring and gain)
    RMS(x)[t] = x[t] / rms[t] * gain                          (RMSNorm: the gain folded in)

so each component maps to its own part of the query and of the key; the normalisation's offset b, the
query/key biases and the summed b_O make the part of `bias`. RoPE is the linear rotation of each
position; a relative position bias is its own term, `position`, on both sides.

Names, the way a user reads a model: `embed`, `position`, `L{l}.H{h}`, `L{l}.mlp`, `bias`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from latentcode.errors import LatentcodeError


class CannotDecompose(LatentcodeError, ValueError):
    """A model or head whose scores are not an exact sum of query-side x key-side terms; says why."""


@dataclass
class LayerWrites:
    """What one earlier layer wrote into the residual stream of one sequence.

    z: `[pos, head, d_head_v]`, the input of the output projection per head; W_O: `[head, d_head_v,
    d_model]`; b_O: `[d_model]` or None; mlp_out: `[pos, d_model]` (its biases included)."""

    z: Tensor
    W_O: Tensor
    b_O: Tensor | None
    mlp_out: Tensor


@dataclass
class FrozenNorm:
    """The normalisation in front of the layer with its scale frozen: `centred` (LayerNorm) or not
    (RMSNorm), `inverse_scale` `[pos]` (1 / sigma, 1 / rms), `gain` `[d_model]`, `offset` `[d_model]` or None;
    `eps`, the epsilon under the root, to recompute the scale of another stream (path patching)."""

    centred: bool
    inverse_scale: Tensor
    gain: Tensor
    offset: Tensor | None
    eps: float = 0.0

    def recomputed_inverse_scale(self, stream: Tensor) -> Tensor:
        """1 / sigma (or 1 / rms) `[pos]` of another `stream` `[pos, d_model]`, as the model computes it."""
        if self.centred:
            return torch.rsqrt(stream.var(-1, unbiased=False) + self.eps)
        return torch.rsqrt(stream.pow(2).mean(-1) + self.eps)

    def linear(self, vectors: Tensor, positions: Tensor) -> Tensor:
        """The linear part of the normalisation applied to `vectors` `[..., len(positions), d_model]`."""
        if self.centred:
            vectors = vectors - vectors.mean(-1, keepdim=True)
        return vectors * self.inverse_scale[positions][:, None] * self.gain


@dataclass
class HeadMaps:
    """One head's frozen query and key maps. W_Q, W_K: `[d_model, d_head]` (the key/value head of a
    query head under GQA); b_Q, b_K: `[d_head]` or None; cos, sin: `[pos, d_head]` (RoPE, rotate-half
    layout) or None; score_scale: the factor of q . k; position_bias: `[query, key]` or None."""

    norm: FrozenNorm
    W_Q: Tensor
    b_Q: Tensor | None
    W_K: Tensor
    b_K: Tensor | None
    score_scale: float
    cos: Tensor | None = None
    sin: Tensor | None = None
    position_bias: Tensor | None = None

    def rotate(self, vectors: Tensor, positions: Tensor) -> Tensor:
        """RoPE of `vectors` `[..., len(positions), d_head]` at `positions` (unchanged without RoPE)."""
        if self.cos is None:
            return vectors
        first, second = vectors.chunk(2, dim=-1)
        rotated_half = torch.cat([-second, first], dim=-1)
        return vectors * self.cos[positions] + rotated_half * self.sin[positions]


@dataclass
class HeadReading:
    """Everything the decomposition needs of one head on one sequence, read by one forward pass.

    embed, position: `[pos, d_model]` (position None without learned position embeddings); layers:
    the writes of the layers before `layer`; residual: `[pos, d_model]`, the stream entering the layer
    as the model computed it; maps: the head's frozen maps; queries, keys: `[pos, d_head]`, the head's
    rotated queries and keys as the model computed them (the reference score); model: what was read."""

    model: str
    layer: int
    head: int
    n_layers: int
    n_heads: int
    embed: Tensor
    position: Tensor | None
    layers: list[LayerWrites]
    residual: Tensor
    maps: HeadMaps
    queries: Tensor
    keys: Tensor
    notes: list[str] = field(default_factory=list)

    @property
    def n_positions(self) -> int:
        return self.embed.shape[0]

    def component_names(self) -> list[str]:
        names = ["embed"] + (["position"] if self.position is not None or self.maps.position_bias is not None else [])
        for layer, writes in enumerate(self.layers):
            names += [f"L{layer}.H{head}" for head in range(writes.z.shape[1])] + [f"L{layer}.mlp"]
        return names + ["bias"]

    def residual_chunks(self, positions: Tensor) -> Iterator[tuple[list[str], Tensor]]:
        """(names, vectors `[component, len(positions), d_model]`) in the order of `component_names`,
        one group at a time (the embedding, one layer's heads, its MLP, ...), so that memory holds one
        layer's heads at a time. `bias` (the summed b_O) comes last; `position` is zero where the
        model's only position term is a relative bias (it acts on the score, not the stream)."""
        yield ["embed"], self.embed[positions][None]
        if self.position is not None:
            yield ["position"], self.position[positions][None]
        elif self.maps.position_bias is not None:
            yield ["position"], self.embed.new_zeros(1, len(positions), self.embed.shape[1])
        bias = self.embed.new_zeros(self.embed.shape[1])
        for layer, writes in enumerate(self.layers):
            heads = torch.einsum("phv,hvd->hpd", writes.z[positions], writes.W_O)
            yield [f"L{layer}.H{head}" for head in range(heads.shape[0])], heads
            yield [f"L{layer}.mlp"], writes.mlp_out[positions][None]
            if writes.b_O is not None:
                bias = bias + writes.b_O
        yield ["bias"], bias.expand(len(positions), -1)[None]

    def component(self, name: str) -> Tensor:
        """One residual component `[pos, d_model]` at every position (for path patching)."""
        everywhere = torch.arange(self.n_positions)
        for names, vectors in self.residual_chunks(everywhere):
            if name in names:
                return vectors[names.index(name)]
        raise CannotDecompose(f"no component {name!r} enters layer {self.layer}; expected one of "
                              f"{', '.join(self.component_names())}")
