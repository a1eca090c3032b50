"""The codes of one forward pass at selected pairs, per layer `[batch, head, n_pairs]` (no per-site
dictionary, so that every pair of a model is cheap to hold): the donor's codes that patching
writes into the base."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from latentcode.intervention.patching.inputs import call_model
from latentcode.sources.detect import detect_source
from latentcode.sources.site_pairs import SitePairs
from latentcode.sources.sites import Selector, SiteError, parse_selector
from latentcode.sources.source import AttentionSource


class LayerCodes:
    """Codes of the selected pairs per layer, `[batch, head, n_pairs]` in the pairs' order; filled
    by a source's sink, which may hand a layer over in blocks of queries."""

    def __init__(self, pairs: SitePairs):
        self.pairs = pairs
        self.codes: dict[int, Tensor] = {}
        self.positions: dict[int, tuple[Tensor, Tensor]] = {}
        self.lengths: dict[int, tuple[int, int | None]] = {}  # layer -> (keys, queries where they differ)

    def sink(self, layer: int, queries: Tensor, keys: Tensor, codes: Tensor) -> None:
        if layer not in self.positions:
            return
        all_queries, all_keys = self.positions[layer]
        if len(queries) == len(all_queries) and torch.equal(queries.cpu(), all_queries) \
                and torch.equal(keys.cpu(), all_keys):
            self.codes[layer] = codes
            return
        column = {pair: index for index, pair in enumerate(zip(all_queries.tolist(), all_keys.tolist(), strict=True))}
        columns = torch.tensor([column[pair] for pair in zip(queries.tolist(), keys.tolist(), strict=True)])
        if layer not in self.codes:
            self.codes[layer] = codes.new_full((codes.shape[0], codes.shape[1], len(all_queries)), float("nan"))
        self.codes[layer][:, :, columns.to(codes.device)] = codes

    def pairs_for(self, layer: int, seq_len: int, n_queries: int | None = None) -> tuple[Tensor, Tensor] | None:
        pairs = self.pairs(layer, seq_len, n_queries)
        if pairs is not None:
            self.positions[layer] = pairs
            self.lengths[layer] = (seq_len, n_queries)
        return pairs


def record_codes(model: nn.Module, inputs: Any, sites: str | Selector | Sequence = "*:*:*",
                 source: AttentionSource | None = None) -> tuple[dict[int, Tensor], dict[int, tuple[Tensor, Tensor]]]:
    """The codes at `sites` of one forward pass, per layer: `({layer: [batch, head, n]}, {layer:
    (query_positions [n], key_positions [n])})`, float32 tensors (no per-site dictionary, so every
    pair of a model is cheap to hold)."""
    source = source if source is not None else detect_source(model)
    layer_codes = LayerCodes(SitePairs(parse_selector(sites), source.n_layers(), source.name))
    with source.capture(layer_codes.pairs_for, "pattern", layer_codes.sink), torch.no_grad():
        call_model(model, inputs)
    if not layer_codes.codes:
        raise SiteError(f"no latent code was recorded at {parse_selector(sites).spec()!r}: no selected layer ran")
    return layer_codes.codes, {layer: layer_codes.positions[layer] for layer in layer_codes.codes}
