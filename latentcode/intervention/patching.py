"""Where does a latent code matter? Activation patching of codes over a grid of site groups, and its
first-order estimate (attribution patching) for every (layer, head, query, key) at once.

Both compare a *base* input with a *donor* input (the same shape, e.g. an instance whose rule
differs) under a `metric` of the model's output, one number per example (e.g. the logit of the
donor's counterfactual answer minus that of the base answer):

    exact     effect(G)  = metric(model(base) with the codes of group G taken from model(donor))
                           - metric(model(base))
    estimate  effect(G) ~= sum over (layer, head, query, key) in G of
                           d metric / d a[h, q, k]  *  (a_donor[h, q, k] - a_base[h, q, k])

(the gradient taken at the base input, one backward pass for every site; Nanda's "attribution
patching"). The estimate is exact where the metric is linear in the codes (a test checks it on a
linear toy model); elsewhere compare it with the exact sweep (`compare_attribution`).

    groups = site_grid(n_layers=4, seq_len=36, queries=range(32, 36), key_blocks=9)
    sweep = patching_sweep(model, base_x, donor_x, groups, metric)         # -> PatchingSweep
    sweep.table                                   # one row per group: effect, its s.e., n, ...
    attribution = attribution_patching(model, base_x, donor_x, metric)     # -> Attribution
    attribution.for_groups(groups)                # the same table, estimated

The codes are edited where `Intervention` edits them (after σ, before the value network; for HYLA
after RMSHead), through the same sources, so every model the `Intervention` edits can be swept:
our models, TransformerLens models, SDPA / `nn.MultiheadAttention` models and hand-written softmaxes
(`SoftmaxSource`). Models must be in eval mode (dropout would make the comparison noisy).

Cost: a sweep runs `ceil(groups / groups_per_pass)` forward passes of `groups_per_pass x batch`
examples (the base batch repeated, each copy patched at one group), plus one pass each for the base
and the donor: about `groups x` a bare forward pass, with the Python overhead of one pass shared by
`groups_per_pass` groups. Attribution costs one forward pass of the donor, and one forward and one
backward pass of the base (`benchmarks/bench_patching.py` measures both).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.errors import UsageError
from latentcode.extraction.detect import detect_source
from latentcode.extraction.site_pairs import SitePairs
from latentcode.extraction.sites import Positions, Selector, SiteError, block, parse_selector
from latentcode.extraction.source import AttentionSource, DifferentiableEditor

# metric(output of the model on a batch) -> one number per example, Tensor [batch]
Metric = Callable[[Any], Tensor]


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


# -- running the model -----------------------------------------------------------------------------
def _check_eval(model: nn.Module) -> None:
    if model.training:
        raise UsageError(f"{type(model).__name__} is in training mode: patching compares forward passes, which "
                         "dropout would make random; call model.eval() first")


def _batch_size(inputs: Any) -> int:
    tensors = [inputs] if isinstance(inputs, Tensor) else [v for v in inputs.values() if isinstance(v, Tensor)]
    if not tensors:
        raise UsageError(f"inputs must be a tensor or a dict of tensors (keyword arguments of the model), got {type(inputs).__name__}")
    return int(tensors[0].shape[0])


def _call(model: nn.Module, inputs: Any) -> Any:
    return model(inputs) if isinstance(inputs, Tensor) else model(**inputs)


def _repeat(inputs: Any, times: int) -> Any:
    """The batch repeated `times` times along dim 0 (copy g is examples g*B .. (g+1)*B-1)."""
    if isinstance(inputs, Tensor):
        return inputs.repeat(times, *([1] * (inputs.ndim - 1)))
    return {key: _repeat(value, times) if isinstance(value, Tensor) else value for key, value in inputs.items()}


def _check_shapes(base: Any, donor: Any) -> None:
    base_shape = base.shape if isinstance(base, Tensor) else {k: tuple(v.shape) for k, v in base.items() if isinstance(v, Tensor)}
    donor_shape = donor.shape if isinstance(donor, Tensor) else {k: tuple(v.shape) for k, v in donor.items() if isinstance(v, Tensor)}
    if base_shape != donor_shape:
        raise UsageError(f"base and donor inputs must have the same shape (one donor per base example); got "
                         f"{tuple(base_shape) if isinstance(base_shape, torch.Size) else base_shape} and "
                         f"{tuple(donor_shape) if isinstance(donor_shape, torch.Size) else donor_shape}")


def _per_example(values: Any, batch: int, what: str) -> Tensor:
    if not isinstance(values, Tensor) or values.shape != (batch,):
        shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise UsageError(f"the metric must return one number per example, a tensor [{batch}]; it returned {shape}")
    return values


class _LayerCodes:
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
        if len(queries) == len(all_queries) and torch.equal(queries.cpu(), all_queries) and torch.equal(keys.cpu(), all_keys):
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
    layer_codes = _LayerCodes(SitePairs(parse_selector(sites), source.n_layers(), source.name))
    with source.capture(layer_codes.pairs_for, "pattern", layer_codes.sink), torch.no_grad():
        _call(model, inputs)
    if not layer_codes.codes:
        raise SiteError(f"no latent code was recorded at {parse_selector(sites).spec()!r}: no selected layer ran")
    return layer_codes.codes, {layer: layer_codes.positions[layer] for layer in layer_codes.codes}


# -- the exact sweep -------------------------------------------------------------------------------
def _mean_and_se(values: np.ndarray) -> tuple[float, float]:
    n = len(values)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")


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
                row[name], row[f"{name}_se"] = _mean_and_se(self.patched[name][index])
                row[f"{name}_base"] = float(self.base[name].mean())
            row["effect"], row["effect_se"] = _mean_and_se(self.effects[index])
            rows.append(row)
        return pd.DataFrame(rows)


class _GroupedPatch:
    """The editor of one pass: example copy g takes the donor's codes at group g's pairs (and heads)."""

    def __init__(self, groups: list[SiteGroup], donor: _LayerCodes, batch: int, n_layers: int | None, source_name: str):
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
        mask = mask.to(codes.device)[:, None].expand(groups, self.batch, *mask.shape[1:]).reshape(groups * self.batch, *mask.shape[1:])
        donor = donor.to(codes.device, codes.dtype).repeat(groups, 1, 1)
        return torch.where(mask, donor, codes)


def _union(groups: Sequence[SiteGroup]) -> Selector:
    return Selector("explicit", requests=tuple(request for group in groups for request in group.selector.requests))


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
    max_examples_per_pass: int = 1024,
) -> PatchingSweep:
    """Patch the codes of each group from `donor_inputs` into `base_inputs` (example i takes donor
    example i's codes) and measure `metric` (one number per example; or a dict of such metrics by
    name, all read from the same passes) of the patched output; one row per group (see
    `PatchingSweep`). Several groups share one forward pass (`groups_per_pass`, by default as many
    as fit in `max_examples_per_pass` examples; larger passes were no faster per example on a CPU)."""
    metrics = _metrics(metric)
    _check_eval(model)
    if not groups:
        raise UsageError("no site groups to sweep: give a list of SiteGroup (site_grid, head_grid)")
    _check_shapes(base_inputs, donor_inputs)
    batch = _batch_size(base_inputs)
    source = source if source is not None else detect_source(model)
    groups_per_pass = groups_per_pass or max(1, max_examples_per_pass // batch)

    donor = _LayerCodes(SitePairs(_union(groups), source.n_layers(), source.name))
    with source.capture(donor.pairs_for, "pattern", donor.sink), torch.no_grad():
        _call(model, donor_inputs)
    def measure(output: Any) -> dict[str, np.ndarray]:
        return {name: _per_example(function(output), batch, name).detach().cpu().numpy()
                for name, function in metrics.items()}

    with torch.no_grad():
        base = measure(_call(model, base_inputs))
    patched_rows: dict[str, list[np.ndarray]] = {name: [] for name in metrics}
    passes = 2
    for start in range(0, len(groups), groups_per_pass):
        chunk = list(groups[start:start + groups_per_pass])
        editor = _GroupedPatch(chunk, donor, batch, source.n_layers(), source.name)
        with source.edit(donor.pairs_for, editor), torch.no_grad():
            output = _call(model, _repeat(base_inputs, len(chunk)))
        passes += 1
        for index in range(len(chunk)):
            for name, values in measure(_slice_output(output, index * batch, (index + 1) * batch)).items():
                patched_rows[name].append(values)
    patched = {name: np.stack(rows) for name, rows in patched_rows.items()}
    return PatchingSweep(list(groups), patched, base, passes)


def _slice_output(output: Any, start: int, stop: int) -> Any:
    """Examples start..stop of a model's output: a tensor, a tuple/list (first entries sliced) or an
    object with `logits` (Hugging Face outputs)."""
    if isinstance(output, Tensor):
        return output[start:stop]
    if isinstance(output, (tuple, list)):
        return type(output)(_slice_output(item, start, stop) if isinstance(item, Tensor) else item for item in output)
    if hasattr(output, "logits"):
        return output.logits[start:stop]
    raise UsageError(f"cannot split the model's output of type {type(output).__name__} into examples; return a tensor")


# -- attribution patching --------------------------------------------------------------------------
@dataclass
class Attribution:
    """Per-example first-order effects `{layer: [batch, head, n_pairs]}` at the pairs `positions`
    `{layer: (query_positions, key_positions)}`; `gradients` and `differences` (donor - base codes)
    likewise."""

    effects: dict[int, Tensor]
    positions: dict[int, tuple[Tensor, Tensor]]
    gradients: dict[int, Tensor]
    differences: dict[int, Tensor]
    lengths: dict[int, tuple[int, int | None]]  # layer -> (keys, queries where they differ)

    def map(self, layer: int, n_queries: int, n_keys: int | None = None, heads: Sequence[int] | None = None) -> np.ndarray:
        """Mean effect over examples, summed over `heads` (default all), as `[query, key]` (NaN where
        no pair was measured)."""
        n_keys = n_queries if n_keys is None else n_keys
        effect = self.effects[layer] if heads is None else self.effects[layer][:, list(heads)]
        values = effect.sum(1).mean(0).numpy()
        grid = np.full((n_queries, n_keys), np.nan)
        queries, keys = self.positions[layer]
        grid[queries.numpy(), keys.numpy()] = values
        return grid

    def for_groups(self, groups: Sequence[SiteGroup]) -> np.ndarray:
        """Estimated effect of patching each group, per example: `[groups, batch]` (the sum of the
        group's site-and-head effects)."""
        rows = []
        for group in groups:
            total = None
            pairs = SitePairs(group.selector, None, "attribution")
            for layer, (queries, keys) in self.positions.items():
                group_pairs = pairs(layer, *self.lengths[layer])
                if group_pairs is None:
                    continue
                column = {pair: index for index, pair in enumerate(zip(queries.tolist(), keys.tolist(), strict=True))}
                try:
                    columns = [column[pair] for pair in zip(*(p.tolist() for p in group_pairs), strict=True)]
                except KeyError as missing:
                    raise SiteError(f"group {group.name} has pair {missing.args[0]} of layer {layer}, which the "
                                    "attribution did not measure; attribute at sites that cover the groups") from None
                effect = self.effects[layer][:, :, columns]
                if group.heads is not None:
                    effect = effect[:, list(group.heads)]
                value = effect.sum(dim=(1, 2))
                total = value if total is None else total + value
            if total is None:
                raise SiteError(f"group {group.name} has no site among the attributed layers {sorted(self.positions)}")
            rows.append(total)
        return torch.stack(rows).numpy()

    def table(self):
        """Tidy table: layer, head, query, key, effect (mean over examples), effect_se."""
        import pandas as pd

        frames = []
        for layer, effect in self.effects.items():
            queries, keys = self.positions[layer]
            batch, n_heads, n = effect.shape
            mean = effect.mean(0).numpy()
            se = (effect.std(0, unbiased=True) / math.sqrt(batch)).numpy() if batch > 1 else np.full_like(mean, np.nan)
            frames.append(pd.DataFrame({
                "layer": layer, "head": np.repeat(np.arange(n_heads), n),
                "query": np.tile(queries.numpy(), n_heads), "key": np.tile(keys.numpy(), n_heads),
                "effect": mean.reshape(-1), "effect_se": se.reshape(-1)}))
        return pd.concat(frames, ignore_index=True)


def attribution_patching(
    model: nn.Module,
    base_inputs: Any,
    donor_inputs: Any,
    metric: Metric,
    sites: str | Selector | Sequence = "*:*:*",
    *,
    source: AttentionSource | None = None,
    donor_codes: Mapping[int, Tensor] | None = None,
) -> Attribution:
    """First-order estimate of patching every code at `sites` (default every pair of every layer)
    from the donor into the base: gradient of `metric` (summed over examples) with respect to each
    base code, times (donor code - base code), per example, layer, head, query and key. One forward
    pass of the donor, one forward and one backward pass of the base. The parameters are frozen for the
    base pass (their `requires_grad` restored after it), so no weight gradient is computed and `.grad`
    is never touched.

    `donor_codes`: the donor's codes at the same `sites`, `{layer: [batch, head, n]}` as the first
    element `record_codes(model, donor_inputs, sites)` returns, where they are at hand already (one
    donor batch read by several metrics): the donor pass is skipped, and `donor_inputs` may be None."""
    _check_eval(model)
    if donor_codes is None:
        if donor_inputs is None:
            raise UsageError("attribution needs the donor: give donor_inputs, or donor_codes from record_codes")
        _check_shapes(base_inputs, donor_inputs)
    batch = _batch_size(base_inputs)
    source = source if source is not None else detect_source(model)
    selector = parse_selector(sites)
    if donor_codes is None:
        donor_codes, _ = record_codes(model, donor_inputs, selector, source)

    base_codes: dict[int, Tensor] = {}
    differentiable_codes: dict[int, Tensor] = {}
    base_pairs = _LayerCodes(SitePairs(selector, source.n_layers(), source.name))

    def keep(layer: int, queries: Tensor, keys: Tensor, codes: Tensor) -> Tensor:
        """The base codes themselves, the gradient taken with respect to them: d metric / d codes is
        the gradient along every path (later layers' patterns included, as they are computed from
        them). A layer whose codes need no gradient yet (nothing before it was selected) gets them as
        a leaf."""
        if layer in base_codes:
            raise UsageError(f"layer {layer} ran twice in one forward pass (its queries in blocks?); attribution needs "
                             "each layer's codes once: pass shorter sequences or fewer sites")
        base_codes[layer] = codes.detach()
        if not codes.requires_grad:
            codes = codes.detach().requires_grad_(True)
        differentiable_codes[layer] = codes
        return codes

    # The parameters need no gradient: frozen for the pass, no weight gradient is computed or kept.
    frozen = [(parameter, parameter.requires_grad) for parameter in model.parameters()]
    try:
        for parameter, _ in frozen:
            parameter.requires_grad_(False)
        with torch.enable_grad(), source.edit(base_pairs.pairs_for, DifferentiableEditor(keep)):
            value = _per_example(metric(_call(model, base_inputs)), batch, "metric").sum()
        layers = sorted(differentiable_codes)
        if not layers or not value.requires_grad:
            raise UsageError("the metric does not depend on any recorded code (no gradient): is the model's output "
                             "computed from its attention, and does the metric use the output?")
        gradients = torch.autograd.grad(value, [differentiable_codes[layer] for layer in layers], allow_unused=True)
    finally:
        for parameter, requires_grad in frozen:
            parameter.requires_grad_(requires_grad)
    effects, grads, differences = {}, {}, {}
    for layer, gradient in zip(layers, gradients, strict=True):
        base = base_codes[layer].detach()
        gradient = torch.zeros_like(base) if gradient is None else gradient.detach()
        if layer not in donor_codes or donor_codes[layer].shape != base.shape:
            found = tuple(donor_codes[layer].shape) if layer in donor_codes else "no codes"
            raise UsageError(f"donor_codes of layer {layer}: expected [batch, head, pairs] = {tuple(base.shape)} "
                             f"(record_codes of the donor at the same sites), got {found}")
        difference = donor_codes[layer].to(base.device, base.dtype) - base
        effects[layer], grads[layer], differences[layer] = (gradient * difference).cpu(), gradient.cpu(), difference.cpu()
    return Attribution(effects, {layer: base_pairs.positions[layer] for layer in layers}, grads, differences,
                       {layer: base_pairs.lengths[layer] for layer in layers})


def compare_attribution(sweep: PatchingSweep, attribution: Attribution) -> dict[str, float]:
    """How well attribution estimates the exact sweep, over the sweep's groups: Pearson and Spearman
    correlation of the mean effects, and the number of groups."""
    from scipy.stats import pearsonr, spearmanr

    exact = sweep.effects.mean(1)
    estimate = attribution.for_groups(sweep.groups).mean(1)
    if len(exact) < 3 or np.std(exact) == 0 or np.std(estimate) == 0:
        return {"pearson": float("nan"), "spearman": float("nan"), "groups": len(exact)}
    return {"pearson": float(pearsonr(exact, estimate)[0]), "spearman": float(spearmanr(exact, estimate)[0]),
            "groups": len(exact)}


__all__ = ["Attribution", "PatchingSweep", "Positions", "SiteGroup", "attribution_patching", "compare_attribution",
           "head_grid", "patching_sweep", "record_codes", "site_grid"]
