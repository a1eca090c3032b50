"""Site groups shaped by the task: a task cuts its positions into parts in several ways (its
*partitions*: SRAVEN's feature slots, panels, panel rows and columns, context vs query; fuzzy logic's
examples and the query), and a group is one layer's (or head's) codes from a query part to a key part:

    group(layer, Q, K) = {(layer, q, k) : q in Q, k in K}

A grid is every (query part x key part) of two partitions, per layer (or per layer and head), so a
group can be the queried feature's cells (every M-th position), not only a run of contiguous keys.

    partitions = task_partitions(task)                 # {"slot": {"slot 0": (0, 4, 8, ...), ...}, ...}
    groups = partition_grid(partitions, "slot", "slot", layers=[2])      # 16 groups: slot i x slot j
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from latentcode.errors import UsageError
from latentcode.intervention.patching.site_groups import SiteGroup
from latentcode.sources.sites import block
from latentcode.tasks.partitions import Partitions, grid_size, parse_grid, task_partitions

__all__ = ["Partitions", "grid_size", "parse_grid", "part_group", "partition_grid", "task_partitions"]

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
