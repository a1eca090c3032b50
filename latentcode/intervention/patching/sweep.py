"""The exact patching sweep: for each site group, the metric of the base input with the group's codes
taken from the donor; several groups share one forward pass (the base batch repeated, each copy
patched at one group). With the forward passes it compares: a base and a donor batch (a tensor, or a
dict of tensors passed as keyword arguments), a metric of the model's output, and the donor's codes at
the selected pairs per layer (`LayerCodes`, `record_codes`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.errors import UsageError
from latentcode.intervention.patching.site_groups import SiteGroup, union_of
from latentcode.sources.detect import detect_source
from latentcode.sources.site_pairs import SitePairs
from latentcode.sources.sites import Selector, SiteError, parse_selector
from latentcode.sources.source import AttentionSource

# metric(output of the model on a batch) -> one number per example, Tensor [batch]
Metric = Callable[[Any], Tensor]


def check_eval(model: nn.Module) -> None:
    if model.training:
        raise UsageError(f"{type(model).__name__} is in training mode: patching compares forward passes, which "
                         "dropout would make random; call model.eval() first")


@contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """The model's parameters need no gradient inside (no weight gradient is computed or kept); their
    `requires_grad` restored on exit, also when the block raises."""
    kept = [(parameter, parameter.requires_grad) for parameter in model.parameters()]
    try:
        for parameter, _ in kept:
            parameter.requires_grad_(False)
        yield
    finally:
        for parameter, requires_grad in kept:
            parameter.requires_grad_(requires_grad)


def batch_size_of(inputs: Any) -> int:
    tensors = [inputs] if isinstance(inputs, Tensor) else [v for v in inputs.values() if isinstance(v, Tensor)]
    if not tensors:
        raise UsageError(f"inputs must be a tensor or a dict of tensors (keyword arguments of the model), got "
                         f"{type(inputs).__name__}")
    return int(tensors[0].shape[0])


def device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters are (the CPU for a model without any)."""
    parameter = next(model.parameters(), None)
    return torch.device("cpu") if parameter is None else parameter.device


def placement(model: nn.Module) -> dict[str, str]:
    """Where and in what the model ran, for a summary: {"device": "cuda:0", "model_dtype": "bfloat16"}."""
    parameter = next(model.parameters(), None)
    dtype = "float32" if parameter is None else str(parameter.dtype).removeprefix("torch.")
    return {"device": str(device_of(model)), "model_dtype": dtype}


def call_model(model: nn.Module, inputs: Any) -> Any:
    """The model's output on `inputs` (a tensor, or keyword arguments), moved to the model's device first."""
    device = device_of(model)
    if isinstance(inputs, Tensor):
        return model(inputs.to(device))
    return model(**{key: value.to(device) if isinstance(value, Tensor) else value for key, value in inputs.items()})


def to_numpy(tensor: Tensor) -> Any:
    """A tensor as numpy on the CPU, half precisions (which numpy lacks) as float32, float64 kept."""
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor).numpy()


def repeat_batch(inputs: Any, times: int) -> Any:
    """The batch repeated `times` times along dim 0 (copy g is examples g*B .. (g+1)*B-1)."""
    if isinstance(inputs, Tensor):
        return inputs.repeat(times, *([1] * (inputs.ndim - 1)))
    return {key: repeat_batch(value, times) if isinstance(value, Tensor) else value for key, value in inputs.items()}


def check_same_shapes(base: Any, donor: Any) -> None:
    def shape(inputs: Any) -> Any:
        if isinstance(inputs, Tensor):
            return tuple(inputs.shape)
        return {key: tuple(value.shape) for key, value in inputs.items() if isinstance(value, Tensor)}

    if shape(base) != shape(donor):
        raise UsageError(f"base and donor inputs must have the same shape (one donor per base example); got "
                         f"{shape(base)} and {shape(donor)}")


def per_example(values: Any, batch: int, what: str) -> Tensor:
    if not isinstance(values, Tensor) or values.shape != (batch,):
        shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise UsageError(f"the metric must return one number per example, a tensor [{batch}]; it returned {shape}")
    return values


def slice_output(output: Any, start: int, stop: int) -> Any:
    """Examples start..stop of a model's output: a tensor, a tuple/list (first entries sliced) or an
    object with `logits` (Hugging Face outputs)."""
    if isinstance(output, Tensor):
        return output[start:stop]
    if isinstance(output, (tuple, list)):
        return type(output)(slice_output(item, start, stop) if isinstance(item, Tensor) else item for item in output)
    if hasattr(output, "logits"):
        return output.logits[start:stop]
    raise UsageError(f"cannot split the model's output of type {type(output).__name__} into examples; return a tensor")


def mean_and_se(values: np.ndarray) -> tuple[float, float]:
    """The mean of `values` and its standard error std / sqrt(n) (NaN for one value): the summary over
    pairs (or windows) of a per-example effect, as patch reports it (intervene bootstraps instead: a
    task metric need not be a mean)."""
    n = len(values)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")


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


def captured(model: nn.Module, inputs: Any, selector: Selector, source: AttentionSource) -> LayerCodes:
    """The codes at `selector`'s pairs of one forward pass of `inputs` (no gradients)."""
    layer_codes = LayerCodes(SitePairs(selector, source.n_layers(), source.name))
    with source.capture(layer_codes.pairs_for, "pattern", layer_codes.sink), torch.no_grad():
        call_model(model, inputs)
    return layer_codes


def record_codes(model: nn.Module, inputs: Any, sites: str | Selector | Sequence = "*:*:*",
                 source: AttentionSource | None = None) -> tuple[dict[int, Tensor], dict[int, tuple[Tensor, Tensor]]]:
    """The codes at `sites` of one forward pass, per layer: `({layer: [batch, head, n]}, {layer:
    (query_positions [n], key_positions [n])})`, float32 tensors (no per-site dictionary, so every
    pair of a model is cheap to hold)."""
    source = source if source is not None else detect_source(model)
    layer_codes = captured(model, inputs, parse_selector(sites), source)
    if not layer_codes.codes:
        raise SiteError(f"no latent code was recorded at {parse_selector(sites).spec()!r}: no selected layer ran")
    return layer_codes.codes, {layer: layer_codes.positions[layer] for layer in layer_codes.codes}


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
        donor = donor.to(codes.device, codes.dtype).repeat(len(mask), 1, 1)
        return torch.where(mask.to(codes.device).repeat_interleave(self.batch, dim=0), donor, codes)


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
    as fit in `max_examples_per_pass` examples: 256 SRAVEN examples stay under glibc's mmap threshold;
    the allocator is left as it is, see `latentcode.keep_freed_memory()` and
    `benchmarks/bench_patching_allocator.py`). `on_pass(examples)` is called after each patched pass
    with its number of examples (progress)."""
    metrics = _metrics(metric)
    check_eval(model)
    if not groups:
        raise UsageError("no site groups to sweep: give a list of SiteGroup (site_grid, head_grid)")
    check_same_shapes(base_inputs, donor_inputs)
    batch = batch_size_of(base_inputs)
    source = source if source is not None else detect_source(model)
    groups_per_pass = groups_per_pass or max(1, max_examples_per_pass // batch)

    donor = captured(model, donor_inputs, union_of(groups), source)

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
