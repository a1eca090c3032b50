"""The bilinear decomposition of one head's pre-sigma score over the residual components of
`latentcode.intervention.qk.components`:

    s[h, q, k] = sum_i sum_j T_ij,   T_ij = score_scale * R_q(N(x_i)[q] W_Q + ...) . R_k(N(x_j)[k] W_K + ...)

with N the normalisation at its frozen scale (linear), R the RoPE rotation of the position, and the
parts that are no component's (the normalisation's offset, b_Q/b_K, the summed b_O) in the component
`bias`; a relative position bias is the term (position, position). For softmax the score is the logit;
for HYLA and linear attention it is the score before sigma (rms over heads, or none).

The terms sum to the score the model computes up to float rounding: tests/intervention/test_qk.py
states the figure per model kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from latentcode.intervention.qk.components import CannotDecompose, HeadReading


@dataclass
class QKTerms:
    """The terms of one head at a set of (query, key) pairs.

    names: the components, the same list on both sides; pairs: int64 `[pair, 2]` (query, key);
    terms: `[pair, query component, key component]`; scores: `[pair]`, the score as the model computed
    it (its own queries and keys), for comparison with `total`."""

    model: str
    layer: int
    head: int
    names: list[str]
    pairs: Tensor
    terms: Tensor
    scores: Tensor

    @property
    def total(self) -> Tensor:
        """sum_ij T_ij per pair `[pair]`: equals `scores` to float rounding."""
        return self.terms.sum((1, 2))

    @property
    def query_marginal(self) -> Tensor:
        """sum_j T_ij `[pair, component]`: what each query-side component contributes, keys summed."""
        return self.terms.sum(2)

    @property
    def key_marginal(self) -> Tensor:
        """sum_i T_ij `[pair, component]`: what each key-side component contributes, queries summed."""
        return self.terms.sum(1)

    def relative_error(self) -> float:
        """max |total - score| / max |score|: how exactly the terms sum to the model's score."""
        scale = self.scores.abs().max().clamp_min(torch.finfo(self.scores.dtype).tiny)
        return float((self.total - self.scores).abs().max() / scale)


def side_vectors(reading: HeadReading, positions: Tensor, side: str) -> Tensor:
    """Each component's rotated query (side "query") or key (side "key") at `positions`:
    `[component, len(positions), d_head]`, the last row (`bias`) with every bias of that side."""
    maps = reading.maps
    weight, bias = (maps.W_Q, maps.b_Q) if side == "query" else (maps.W_K, maps.b_K)
    parts = [maps.norm.linear(vectors, positions) @ weight for _, vectors in reading.residual_chunks(positions)]
    projected = torch.cat(parts)
    constant = projected.new_zeros(weight.shape[1])
    if maps.norm.offset is not None:
        constant = constant + maps.norm.offset @ weight
    if bias is not None:
        constant = constant + bias
    projected[-1] = projected[-1] + constant
    return maps.rotate(projected, positions)


def check_pairs(pairs: Tensor, n_positions: int) -> Tensor:
    pairs = torch.as_tensor(pairs, dtype=torch.int64)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or len(pairs) == 0:
        raise CannotDecompose(f"pairs must be a non-empty [pair, 2] array of (query, key) positions, got shape "
                              f"{list(pairs.shape)}")
    if int(pairs.min()) < 0 or int(pairs.max()) >= n_positions:
        raise CannotDecompose(f"pairs must hold positions 0..{n_positions - 1} of the sequence, got "
                              f"{int(pairs.min())}..{int(pairs.max())}")
    return pairs


def decompose(reading: HeadReading, pairs: Tensor) -> QKTerms:
    """The terms `[pair, component, component]` of the head `reading` describes at `pairs` (int
    `[pair, 2]`, query then key position)."""
    pairs = check_pairs(pairs, reading.n_positions)
    maps = reading.maps
    query_positions, query_index = torch.unique(pairs[:, 0], return_inverse=True)
    key_positions, key_index = torch.unique(pairs[:, 1], return_inverse=True)
    queries = side_vectors(reading, query_positions, "query")[:, query_index]  # [component, pair, d_head]
    keys = side_vectors(reading, key_positions, "key")[:, key_index]
    terms = torch.einsum("ipd,jpd->pij", queries * maps.score_scale, keys)
    scores = (reading.queries[pairs[:, 0]] * reading.keys[pairs[:, 1]]).sum(-1) * maps.score_scale
    names = reading.component_names()
    if maps.position_bias is not None:
        bias = maps.position_bias[pairs[:, 0], pairs[:, 1]]
        where = names.index("position")
        terms[:, where, where] += bias
        scores = scores + bias
    # on the CPU whatever the model's device: a few numbers per pair, read by tables and figures
    return QKTerms(reading.model, reading.layer, reading.head, names, pairs, terms.cpu(), scores.cpu())
