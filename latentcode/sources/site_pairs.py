"""`SitePairs`: the (query, key) pairs a selector asks for in each layer, resolved while forward
passes run (a source may learn the number of layers, and every pass the sequence length, only then).

Shared by the `Recorder` and the `Intervention`, so that both read a selector the same way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from latentcode.sources.sites import (
    Selector,
    SiteError,
    all_pairs,
    check_layer,
    expand_request,
    request_spec,
)


class SitePairs:
    """The pairs of `selector` per (layer, sequence length), as `(query_positions, key_positions)`
    index tensors; `n_layers` is None when the source learns it only during a forward pass."""

    def __init__(self, selector: Selector, n_layers: int | None, source_name: str):
        self.selector = selector
        self.n_layers = n_layers
        self.source_name = source_name
        if n_layers is not None:
            if selector.all_pairs_layer is not None:
                check_layer(selector.all_pairs_layer, n_layers, selector.name)
            for layer, query, key in selector.requests:
                if layer is not None:
                    check_layer(layer, n_layers, request_spec((layer, query, key)))
        self._cache: dict[tuple[int, int], tuple[Tensor, Tensor] | None] = {}

    def requested_layer(self, layer: int | None) -> int | None:
        if layer is None or layer >= 0:
            return layer
        if self.n_layers is None:
            raise SiteError(
                f"negative layer {layer} needs the number of attention layers, which the "
                f"{self.source_name} source learns only during a forward pass; give a non-negative layer"
            )
        return layer % self.n_layers

    def wanted_layers(self) -> set[int]:
        """The layers named explicitly (a request for every layer names none)."""
        wanted = {self.requested_layer(layer) for layer, _, _ in self.selector.requests} - {None}
        if self.selector.all_pairs_layer is not None:
            wanted.add(self.requested_layer(self.selector.all_pairs_layer))
        return wanted

    def __call__(self, layer: int, seq_len: int, n_queries: int | None = None) -> tuple[Tensor, Tensor] | None:
        """The absolute (query, key) positions of `layer` on `seq_len` keys, or None: none there.

        `n_queries`: the length of the query axis where it differs from the key axis (cross-attention:
        queries of the decoder, keys of the encoder); query positions are resolved against it."""
        n_queries = seq_len if n_queries is None else n_queries
        key = (layer, seq_len, n_queries)
        if key not in self._cache:
            selector = self.selector
            if selector.all_pairs_layer is not None:
                wanted = layer == self.requested_layer(selector.all_pairs_layer)
                pairs = all_pairs(n_queries, seq_len) if wanted else []
            else:
                pairs = []
                # Self-attention has one sequence; cross-attention a query and a key axis of their own.
                query_axis, key_axis = ("sequence", "sequence") if n_queries == seq_len else ("query", "key")
                for request in selector.requests:
                    requested_layer, query, key_position = request
                    requested = self.requested_layer(requested_layer)
                    if requested is None or requested == layer:
                        try:
                            pairs += expand_request(query, key_position, n_queries, seq_len, (query_axis, key_axis))
                        except SiteError as error:
                            raise SiteError(f"site {request_spec(request)} in layer {layer}: {error}") from None
                pairs = list(dict.fromkeys(pairs))
            if pairs:
                queries, keys = zip(*pairs, strict=True)
                self._cache[key] = (torch.tensor(queries), torch.tensor(keys))
            else:
                self._cache[key] = None
        return self._cache[key]

    def check_ran(self, layers_seen: set[int]) -> None:
        """After a pass of a source that did not know its layers: every named layer ran."""
        if self.n_layers is not None or not layers_seen:
            return
        ran = max(layers_seen) + 1
        missing = sorted(layer for layer in self.wanted_layers() if layer >= ran)
        if missing:
            raise SiteError(f"sites in layer(s) {missing} were requested but the model ran only {ran} attention layers")
