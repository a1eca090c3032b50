"""The exact patching sweep: for each site group, the metric of the base input with the group's codes
taken from the donor; several groups share one forward pass (the base batch repeated, each copy
patched at one group)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.errors import UsageError
from latentcode.intervention.next_token import mean_and_se
from latentcode.intervention.patching.inputs import (
    Metric,
    batch_size_of,
    call_model,
    check_eval,
    check_same_shapes,
    per_example,
    repeat_batch,
    slice_output,
    to_numpy,
)
from latentcode.intervention.patching.layer_codes import LayerCodes
from latentcode.intervention.patching.site_groups import SiteGroup, union_of
from latentcode.sources.detect import detect_source
from latentcode.sources.site_pairs import SitePairs
from latentcode.sources.sites import SiteError
from latentcode.sources.source import AttentionSource


@dataclass
class PatchingSweep:
    """The result of `patching_sweep`.

    `patched[name]` and `base[name]`: each metric per group and example `[groups, batch]` and
    unpatched `[batch]`; `effects`: the first metric's patched minus base `[groups, batch]`.
    `table` (pandas) has one row per group: its coordinates, `group` (selector and heads), `n`, and
    per metric NAME its mean `NAME`, standard error `NAME_se` and unpatched mean `NAME_base`; and
    `effect`, `effect_se` for the first metric (paired over examples)."""

    groups: list[SiteGroup]
    patched: dict[str, np.ndarray]
    base: dict[str, np.ndarray]
    forward_passes: int

    @property
    def metric_names(self) -> list[str]:
        return list(self.patched)

    @property
    def effects(self) -> np.ndarray:
        first = self.metric_names[0]
        return self.patched[first] - self.base[first][None]

    @property
    def table(self):
        import pandas as pd

        n = self.effects.shape[1]
        rows = []
        for index, group in enumerate(self.groups):
            row = {**group.coordinates, "group": group.name, "n": n}
            for name in self.metric_names:
                row[name], row[f"{name}_se"] = mean_and_se(self.patched[name][index])
                row[f"{name}_base"] = float(self.base[name].mean())
            row["effect"], row["effect_se"] = mean_and_se(self.effects[index])
            rows.append(row)
        return pd.DataFrame(rows)


class _GroupedPatch:
    """The editor of one pass: example copy g takes the donor's codes at group g's pairs (and heads)."""

    def __init__(self, groups: list[SiteGroup], donor: LayerCodes, batch: int, n_layers: int | None, source_name: str):
        self.groups = groups
        self.donor = donor
        self.batch = batch
        self.group_pairs = [SitePairs(group.selector, n_layers, source_name) for group in groups]
        self.masks: dict[tuple[int, int], Tensor | None] = {}

    def mask(self, layer: int, queries: Tensor, keys: Tensor, n_heads: int) -> Tensor | None:
        """Boolean `[groups, head, n_pairs]`: which of the layer's pairs (and heads) each group patches."""
        seq_len, n_queries = self.donor.lengths[layer]
        key = (layer, seq_len, n_queries)
        if key not in self.masks:
            column = {pair: index for index, pair in enumerate(zip(queries.tolist(), keys.tolist(), strict=True))}
            mask = torch.zeros(len(self.groups), n_heads, len(queries), dtype=torch.bool)
            for index, (group, pairs) in enumerate(zip(self.groups, self.group_pairs, strict=True)):
                group_pairs = pairs(layer, seq_len, n_queries)
                if group_pairs is None:
                    continue
                columns = [column[pair] for pair in zip(*(p.tolist() for p in group_pairs), strict=True)]
                heads = list(range(n_heads)) if group.heads is None else list(group.heads)
                if any(not 0 <= head < n_heads for head in heads):
                    raise SiteError(f"group {group.name}: heads {heads} outside the {n_heads} heads of layer {layer}")
                mask[index, torch.tensor(heads)[:, None], torch.tensor(columns)[None, :]] = True
            self.masks[key] = mask if mask.any() else None
        return self.masks[key]

    def __call__(self, layer: int, queries: Tensor, keys: Tensor, codes: Tensor) -> Tensor:
        donor = self.donor.codes.get(layer)
        if donor is None:
            return codes
        mask = self.mask(layer, queries, keys, codes.shape[1])
        if mask is None:
            return codes
        groups = mask.shape[0]
        pattern_shape = mask.shape[1:]
        mask = mask.to(codes.device)[:, None].expand(groups, self.batch, *pattern_shape).reshape(groups * self.batch,
                                                                                                  *pattern_shape)
        donor = donor.to(codes.device, codes.dtype).repeat(groups, 1, 1)
        return torch.where(mask, donor, codes)


def _metrics(metric: Metric | Mapping[str, Metric]) -> dict[str, Metric]:
    if callable(metric):
        return {"metric": metric}
    if isinstance(metric, Mapping) and metric and all(callable(m) for m in metric.values()):
        return dict(metric)
    raise UsageError(f"metric must be a function of the model's output (one number per example) or a dict of "
                     f"them by name, got {metric!r}")


def patching_sweep(
    model: nn.Module,
    base_inputs: Any,
    donor_inputs: Any,
    groups: Sequence[SiteGroup],
    metric: Metric | Mapping[str, Metric],
    *,
    source: AttentionSource | None = None,
    groups_per_pass: int | None = None,
    max_examples_per_pass: int = 256,
    on_pass: Callable[[int], None] | None = None,
) -> PatchingSweep:
    """Patch the codes of each group from `donor_inputs` into `base_inputs` (example i takes donor
    example i's codes) and measure `metric` (one number per example; or a dict of such metrics by
    name, all read from the same passes) of the patched output; one row per group (see
    `PatchingSweep`). Several groups share one forward pass (`groups_per_pass`, by default as many
    as fit in `max_examples_per_pass` examples: passes of 256 SRAVEN examples keep their largest
    tensors under glibc's 32 MB mmap limit and, where the caller ran `latentcode.keep_freed_memory()`
    (`latentcode patch` does; this function never changes the process's allocator), reuse the last
    pass's memory; passes of 1024 were no faster per example and spent as long in the kernel).
    `on_pass(examples)` is called after each patched pass with its number of examples (progress)."""
    metrics = _metrics(metric)
    check_eval(model)
    if not groups:
        raise UsageError("no site groups to sweep: give a list of SiteGroup (site_grid, head_grid)")
    check_same_shapes(base_inputs, donor_inputs)
    batch = batch_size_of(base_inputs)
    source = source if source is not None else detect_source(model)
    groups_per_pass = groups_per_pass or max(1, max_examples_per_pass // batch)

    donor = LayerCodes(SitePairs(union_of(groups), source.n_layers(), source.name))
    with source.capture(donor.pairs_for, "pattern", donor.sink), torch.no_grad():
        call_model(model, donor_inputs)
    def measure(output: Any) -> dict[str, np.ndarray]:
        return {name: to_numpy(per_example(function(output), batch, name))
                for name, function in metrics.items()}

    with torch.no_grad():
        base = measure(call_model(model, base_inputs))
    patched_rows: dict[str, list[np.ndarray]] = {name: [] for name in metrics}
    passes = 2
    for start in range(0, len(groups), groups_per_pass):
        chunk = list(groups[start:start + groups_per_pass])
        editor = _GroupedPatch(chunk, donor, batch, source.n_layers(), source.name)
        with source.edit(donor.pairs_for, editor), torch.no_grad():
            output = call_model(model, repeat_batch(base_inputs, len(chunk)))
        passes += 1
        if on_pass is not None:
            on_pass(len(chunk) * batch)
        for index in range(len(chunk)):
            for name, values in measure(slice_output(output, index * batch, (index + 1) * batch)).items():
                patched_rows[name].append(values)
    patched = {name: np.stack(rows) for name, rows in patched_rows.items()}
    return PatchingSweep(list(groups), patched, base, passes)
