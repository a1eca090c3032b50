"""The task's partitions of its positions (`Task.position_partitions`), of which
`latentcode.intervention.patching.partition_grid` makes site groups (a query part x a key part per
layer). Standard library only, so the command line checks a grid name before torch is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latentcode.tasks.base import Task, TaskError

# partition name -> part name -> positions
Partitions = dict[str, dict[str, tuple[int, ...]]]


def task_partitions(task: Task) -> Partitions:
    """The task's partitions of its positions (`task.position_partitions()`, an optional capability),
    always with ``context`` (the positions before the last `n_predictions`) vs ``query`` (those);
    empty parts are dropped. Each partition must cover every position once."""
    seq_len = int(task.seq_len)
    declared = task.position_partitions()  # {} from a task without the capability
    last = seq_len - int(task.n_predictions)
    partitions = {"context": {"context": tuple(range(last)), "query": tuple(range(last, seq_len))}, **declared}
    cleaned: Partitions = {}
    for name, parts in partitions.items():
        parts = {part: tuple(int(p) for p in positions) for part, positions in parts.items() if len(positions)}
        covered = sorted(p for positions in parts.values() for p in positions)
        if covered != list(range(seq_len)):
            raise TaskError(f"partition {name!r} of task {task.name!r} does not cover the "
                            f"{seq_len} positions once each (a bug in the task's position_partitions)")
        cleaned[name] = parts
    return cleaned


def parse_grid(spec: str, partitions: Mapping[str, Any]) -> tuple[str, str]:
    """`QUERY_PARTITION/KEY_PARTITION` (or one name for both) -> the two partition names."""
    names = spec.split("/")
    if len(names) == 1:
        names = names * 2
    unknown = [name for name in names if name not in partitions]
    if len(names) != 2 or unknown:
        raise TaskError(f"grid {spec!r}: expected a partition name or QUERY/KEY of two, among "
                         f"{', '.join(sorted(partitions))}; got {unknown or spec!r}")
    return names[0], names[1]


def grid_size(partitions: Mapping[str, Mapping[str, Any]], query_partition: str, key_partition: str,
              n_layers: int, n_heads: int | None = None) -> int:
    """How many groups `partition_grid` makes."""
    return n_layers * len(partitions[query_partition]) * len(partitions[key_partition]) * (n_heads or 1)
