"""Groups of sites patched together: `SiteGroup`, and the grids a sweep runs over (`site_grid`: layer x
query x key block; `head_grid`: layer x head; offset bands; `partition_grid`: query part x key part).

A task cuts its positions into parts in several ways (its *partitions*, `task_partitions`: SRAVEN's
feature slots, panels, panel rows and columns, context vs query; fuzzy logic's examples and the
query), and a group is one layer's (or head's) codes from a query part to a key part:

    group(layer, Q, K) = {(layer, q, k) : q in Q, k in K}

so a group can be the queried feature's cells (every M-th position), not only a run of contiguous keys.

    partitions = task_partitions(task)                 # {"slot": {"slot 0": (0, 4, 8, ...), ...}, ...}
    groups = partition_grid(partitions, "slot", "slot", layers=[2])      # 16 groups: slot i x slot j
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latentcode.errors import UsageError
from latentcode.sources.sites import EVERY, Selector, SiteError, block, parse_selector
from latentcode.tasks.partitions import Partitions, parse_grid


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
    """One group per (layer, head): that head's codes at `sites` within the layer (default every pair;
    a negative layer counts from the end, `all-pairs:L` is every pair of layer L)."""
    selector = parse_selector(sites)
    requests = selector.requests
    if selector.all_pairs_layer is not None:
        requests = ((selector.all_pairs_layer, EVERY, EVERY),)
    groups = []
    for layer in range(n_layers) if layers is None else layers:
        in_layer = Selector("explicit", requests=tuple((layer, q, k) for request_layer, q, k in requests
                                                      if request_layer is None or request_layer % n_layers == layer))
        if not in_layer.requests:
            continue
        for head in range(n_heads):
            groups.append(SiteGroup(in_layer, heads=(head,), coordinates={"layer": layer, "head": head}))
    return groups


def union_of(groups: Sequence[SiteGroup]) -> Selector:
    return Selector("explicit", requests=tuple(request for group in groups for request in group.selector.requests))


# Relative-offset bands of the causal pairs (k <= q), disjoint and covering them all.
BANDS = ("sink k=0", "self k=q", "previous k=q-1", "k=q-4..q-2", "further 0<k<q-4")
CONTROLS = {
    "heads": "another head of the same layer drawn at random (seeded), patched from the same donors",
    "offsets": "as many pairs of the same layer (all heads) drawn at random (seeded) among its causal pairs outside "
               "the band, patched from the same donors; none where fewer are left",
}


def band_pairs(band: str, seq_len: int) -> list[tuple[int, int]]:
    """The (query, key) pairs of an offset band (BANDS) in a sequence of `seq_len` positions."""
    def keys(query: int) -> range:
        return {"sink k=0": range(0, 1 if query > 0 else 0), "self k=q": range(query, query + 1),
                "previous k=q-1": range(query - 1, query) if query >= 2 else range(0),
                "k=q-4..q-2": range(max(1, query - 4), max(1, query - 1)),
                "further 0<k<q-4": range(1, max(1, query - 4))}[band]
    return [(query, key) for query in range(seq_len) for key in keys(query)]


def offset_groups(seq_len: int) -> int:
    """Groups of one layer of the offsets grid: each band, and a control for each band that leaves at
    least as many causal pairs outside it."""
    causal = seq_len * (seq_len + 1) // 2
    sizes = [len(band_pairs(band, seq_len)) for band in BANDS]
    return len(BANDS) + sum(causal - size >= size for size in sizes)


def control_heads(layers_and_heads: list[tuple[int, int]], n_heads: int, seed: int) -> list[int]:
    """For each (layer, head), another head of the same layer drawn at random (seed `seed`)."""
    rng = np.random.default_rng(seed)
    return [int(rng.choice([other for other in range(n_heads) if other != head])) for _, head in layers_and_heads]


def heads_with_controls(n_layers: int, n_heads: int, sites: str | Selector, layers: Iterable[int], seed: int
                        ) -> tuple[list[SiteGroup], list[int | None]]:
    """`head_grid`'s groups and, for each, the index of its control: another head of the same layer
    (one of the grid's own groups, so it costs nothing)."""
    groups = head_grid(n_layers, n_heads, sites=sites, layers=layers)
    units = [(group.coordinates["layer"], group.coordinates["head"]) for group in groups]
    row_of = {unit: index for index, unit in enumerate(units)}
    if n_heads < 2:
        return groups, [None] * len(groups)
    heads = control_heads(units, n_heads, seed)
    return groups, [row_of[(layer, head)] for (layer, _), head in zip(units, heads, strict=True)]


def offsets_with_controls(seq_len: int, layers: Iterable[int], seed: int) -> tuple[list[SiteGroup], list[int | None]]:
    """Per layer each band of BANDS (every head), then the control groups: for each band as many causal
    pairs of the layer outside it, drawn at random (seed `seed`; None where fewer are left); and for
    each band the index of its control."""
    rng = np.random.default_rng(seed)
    causal = [(query, key) for query in range(seq_len) for key in range(query + 1)]
    groups, control_groups, controls = [], [], []
    for layer in layers:
        for band in BANDS:
            pairs = band_pairs(band, seq_len)
            groups.append(SiteGroup(Selector("explicit", requests=tuple((layer, q, k) for q, k in pairs)),
                                    coordinates={"layer": layer, "band": band, "pairs": len(pairs)}))
            outside = sorted(set(causal) - set(pairs))
            if len(outside) < len(pairs):
                controls.append(None)
                continue
            drawn = [outside[i] for i in sorted(rng.choice(len(outside), size=len(pairs), replace=False))]
            controls.append(len(control_groups))
            control_groups.append(SiteGroup(Selector("explicit", requests=tuple((layer, q, k) for q, k in drawn)),
                                            coordinates={"layer": layer, "band": f"random {len(pairs)} pairs"}))
    return groups + control_groups, [None if c is None else len(groups) + c for c in controls]


def part_group(layer: int, queries: Iterable[int], keys: Iterable[int], heads: tuple[int, ...] | None = None,
               **coordinates: Any) -> SiteGroup:
    """The codes of `layer` from every query in `queries` to every key in `keys` (and `heads`)."""
    queries, keys = sorted(set(queries)), sorted(set(keys))
    if not queries or not keys:
        raise UsageError(f"a site group needs at least one query and one key; got queries {queries}, keys {keys}")
    coordinates = {"layer": layer, **coordinates, "n_queries": len(queries), "n_keys": len(keys)}
    return SiteGroup(block(layer, queries, keys), heads=heads, coordinates=coordinates)


def partition_grid(partitions: Partitions, query_partition: str, key_partition: str | None = None, *,
                   layers: Iterable[int], n_heads: int | None = None) -> list[SiteGroup]:
    """One group per layer x query part x key part (x head, where `n_heads` is given): coordinates
    layer, query_part, key_part (the part names), n_queries, n_keys (and head)."""
    key_partition = query_partition if key_partition is None else key_partition
    parse_grid(f"{query_partition}/{key_partition}", partitions)
    groups = []
    for layer in layers:
        for query_name, queries in partitions[query_partition].items():
            for key_name, keys in partitions[key_partition].items():
                for head in [None] if n_heads is None else range(n_heads):
                    heads = None if head is None else (head,)
                    extra = {} if head is None else {"head": head}
                    groups.append(part_group(layer, queries, keys, heads, query_part=query_name, key_part=key_name,
                                             **extra))
    return groups
