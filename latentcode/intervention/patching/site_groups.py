"""Groups of sites patched together: `SiteGroup`, and the grids a sweep runs over (`site_grid`: layer x
query x key block; `head_grid`: layer x head)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latentcode.sources.sites import Selector, SiteError, block, parse_selector


@dataclass(frozen=True)
class SiteGroup:
    """Sites patched together: the pairs of `selector` (every layer it names) and `heads` (None:
    all heads). `coordinates` are its columns in the sweep's table (e.g. layer, query, keys)."""

    selector: Selector
    heads: tuple[int, ...] | None = None
    coordinates: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        heads = "" if self.heads is None else " heads " + ",".join(map(str, self.heads))
        return self.selector.spec() + heads


def _blocks(length: int, blocks: int | Sequence[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """`blocks` contiguous half-open ranges covering 0..length (as equal as possible), or the given
    (start, stop) ranges; None: one range per position."""
    if blocks is None:
        return [(position, position + 1) for position in range(length)]
    if isinstance(blocks, int):
        if not 1 <= blocks <= length:
            raise SiteError(f"key_blocks={blocks}: expected 1..{length} (the number of keys) blocks")
        edges = np.linspace(0, length, blocks + 1).round().astype(int)
        return [(int(start), int(stop)) for start, stop in zip(edges[:-1], edges[1:], strict=True)]
    return [(int(start), int(stop)) for start, stop in blocks]


def site_grid(
    n_layers: int,
    seq_len: int,
    layers: Iterable[int] | None = None,
    queries: Iterable[int] | None = None,
    key_blocks: int | Sequence[tuple[int, int]] | None = None,
    n_keys: int | None = None,
) -> list[SiteGroup]:
    """One group per layer x query row x key block: `queries` (default every position) and
    `key_blocks` (an int: that many contiguous blocks of keys; a list of (start, stop) ranges; None:
    one key each). Coordinates: layer, query, key_start, key_stop (half-open)."""
    n_keys = seq_len if n_keys is None else n_keys
    layers = range(n_layers) if layers is None else list(layers)
    queries = range(seq_len) if queries is None else [q % seq_len for q in queries]
    groups = []
    for layer in layers:
        for query in queries:
            for start, stop in _blocks(n_keys, key_blocks):
                selector = block(layer, query, range(start, stop))
                groups.append(SiteGroup(selector, coordinates={"layer": layer, "query": query,
                                                               "key_start": start, "key_stop": stop}))
    return groups


def head_grid(n_layers: int, n_heads: int, sites: str | Selector = "*:*:*", layers: Iterable[int] | None = None
              ) -> list[SiteGroup]:
    """One group per (layer, head): that head's codes at `sites` within the layer (default every pair)."""
    selector = parse_selector(sites)
    groups = []
    for layer in range(n_layers) if layers is None else layers:
        in_layer = Selector("explicit", requests=tuple((layer, q, k) for request_layer, q, k in selector.requests
                                                      if request_layer in (None, layer)))
        if not in_layer.requests:
            continue
        for head in range(n_heads):
            groups.append(SiteGroup(in_layer, heads=(head,), coordinates={"layer": layer, "head": head}))
    return groups



def union_of(groups: Sequence[SiteGroup]) -> Selector:
    return Selector("explicit", requests=tuple(request for group in groups for request in group.selector.requests))
