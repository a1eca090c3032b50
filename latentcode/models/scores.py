"""The first half of attention, written once for every path: scores -> sigma -> dropout.

    scores[b, h, q, k] = q[b, q, h] . k[b, k, h] / sqrt(d_head) + position_bias[h, q, k]
    a[b, h, q, k]      = sigma(scores)[b, h, q, k]              the latent codes (masked pairs: see
                                                                `latentcode.models.normalization`)
    a_dropped          = a * keep[q, k]                         training only: one mask `[query, key]`,
                                                                kept codes scaled by 1 / (1 - p)

The full path (`latentcode.models.attention`) applies these to whole `[batch, head, query, key]`
tensors, the blockwise path (`latentcode.models.attention_paths`) to one block of queries at a
time, with the same functions, so that both compute the same numbers. The sdpa and associative
paths never form the scores tensor; they take only `score_scale`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, einsum

from latentcode.models.normalization import ScoreNormalization
from latentcode.models.positions import RelativePositionBias


def score_scale(d_head: int) -> float:
    """The factor of q . k in the scores: 1 / sqrt(d_head)."""
    return 1.0 / math.sqrt(d_head)


def by_head(x: Tensor, scale: float = 1.0) -> Tensor:
    """`x` `[batch, pos, head, d]` times `scale`, as one contiguous `[batch * head, pos, d]`: the layout in
    which a block's scores are one batched matrix product of slices, without copies."""
    batch, n_positions, n_heads, width = x.shape
    x = x.transpose(1, 2) * scale if scale != 1.0 else x.transpose(1, 2)
    return x.reshape(batch * n_heads, n_positions, width).contiguous()


def dropout_mask(n_queries: int, n_keys: int, p: float, like: Tensor) -> Tensor:
    """One attention dropout mask `[1, 1, query, key]` for every batch element and head, as the
    authors' Flax configuration draws it (`broadcast_dropout=True`): 0 for a dropped pair, 1 / (1 - p)
    for a kept one, in `like`'s dtype and device."""
    return F.dropout(like.new_ones(1, 1, n_queries, n_keys), p, training=True)


def drop_out(latent_codes: Tensor, keep: Tensor | None) -> Tensor:
    """Latent codes `[batch, head, query, key]` times the dropout mask `keep` (`[1, 1, query, key]`,
    the rows and keys of these codes), or unchanged where `keep` is None (eval mode, p = 0)."""
    return latent_codes if keep is None else latent_codes * keep


@dataclass(frozen=True)
class ScoresToCodes:
    """scores -> sigma of one attention layer, with the few values of its configuration it needs.

    d_head: the width of a query or key head; sigma: the score normalization
    (`latentcode.models.normalization`); eps: its epsilon (rms over heads); allowed: bool
    `[n_ctx, n_ctx]`, the keys each query may attend to (causal), or None for every key;
    position_bias: the layer's relative position bias, or None.

    Every method takes a block of queries whose first is `query_start` (0: the whole sequence) and
    keys from position 0 on.
    """

    d_head: int
    sigma: ScoreNormalization
    eps: float
    allowed: Tensor | None = None
    position_bias: RelativePositionBias | None = None

    def scores(self, queries: Tensor, keys: Tensor, query_start: int = 0) -> Tensor:
        """Scores `[batch, head, query, key]` of `queries` `[batch, query, head, d_head]` (positions
        `query_start, ...`) against `keys` `[batch, key, head, d_head]`, position bias included."""
        # Scaling the queries rather than the scores saves a pass over [batch, head, query, key].
        scores = einsum("bqhd,bkhd->bhqk", queries * score_scale(self.d_head), keys)
        if self.position_bias is None:
            return scores
        return scores + self.position_bias.block(query_start, query_start + queries.shape[1], keys.shape[1])

    def product_block(
        self, queries_by_head: Tensor, keys_by_head: Tensor, batch: int, query_start: int, query_end: int,
        n_keys: int,
    ) -> Tensor:
        """q . k / sqrt(d_head) `[batch, head, query, key]` of queries `query_start:query_end` against keys
        `:n_keys`, from `by_head(q, score_scale(d_head))` and `by_head(k)` (the scores without position bias)."""
        product = torch.bmm(queries_by_head[:, query_start:query_end], keys_by_head[:, :n_keys].transpose(1, 2))
        return product.view(batch, -1, query_end - query_start, n_keys)

    def with_position_bias(self, product: Tensor, query_start: int = 0) -> Tensor:
        """The scores: `product_block`'s (queries from `query_start`, keys from 0) plus the position bias."""
        if self.position_bias is None:
            return product
        n_queries, n_keys = product.shape[-2:]
        return product + self.position_bias.block(query_start, query_start + n_queries, n_keys)

    def codes(self, scores: Tensor, query_start: int = 0) -> Tensor:
        """The latent codes sigma(scores) `[batch, head, query, key]` of scores of queries
        `query_start, ...` against keys `0, ...` (masked pairs as sigma masks them)."""
        n_queries, n_keys = scores.shape[-2:]
        allowed = None
        if self.allowed is not None:
            allowed = self.allowed[query_start : query_start + n_queries, :n_keys]
        return self.sigma(scores, allowed, self.eps)
