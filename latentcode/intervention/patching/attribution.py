"""Attribution patching: the first-order estimate of patching every code from the donor into the base,
from one backward pass (gradient x (donor code - base code)), and how well it estimates the exact
sweep."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.errors import UsageError
from latentcode.intervention.patching.site_groups import SiteGroup
from latentcode.intervention.patching.sweep import (
    LayerCodes,
    Metric,
    PatchingSweep,
    batch_size_of,
    call_model,
    check_eval,
    check_same_shapes,
    frozen,
    per_example,
    record_codes,
    to_numpy,
)
from latentcode.sources.detect import detect_source
from latentcode.sources.site_pairs import SitePairs
from latentcode.sources.sites import Selector, SiteError, parse_selector
from latentcode.sources.source import AttentionSource, DifferentiableEditor
from latentcode.validation import check_placement, place


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

    def map(self, layer: int, n_queries: int, n_keys: int | None = None, heads: Sequence[int] | None = None
            ) -> np.ndarray:
        """Mean effect over examples, summed over `heads` (default all), as `[query, key]` (NaN where
        no pair was measured)."""
        n_keys = n_queries if n_keys is None else n_keys
        effect = self.effects[layer] if heads is None else self.effects[layer][:, list(heads)]
        values = to_numpy(effect.sum(1).mean(0))
        grid = np.full((n_queries, n_keys), np.nan)
        queries, keys = self.positions[layer]
        grid[queries.cpu().numpy(), keys.cpu().numpy()] = values
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
        return to_numpy(torch.stack(rows))

    def table(self):
        """Tidy table: layer, head, query, key, effect (mean over examples), effect_se."""
        import pandas as pd

        frames = []
        for layer, effect in self.effects.items():
            queries, keys = self.positions[layer]
            batch, n_heads, n = effect.shape
            mean = to_numpy(effect.mean(0))
            se = to_numpy(effect.std(0, unbiased=True) / math.sqrt(batch)) if batch > 1 else np.full_like(mean, np.nan)
            frames.append(pd.DataFrame({
                "layer": layer, "head": np.repeat(np.arange(n_heads), n),
                "query": np.tile(queries.cpu().numpy(), n_heads), "key": np.tile(keys.cpu().numpy(), n_heads),
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
    device: str | Any | None = None,
    dtype: str | Any | None = None,
) -> Attribution:
    """First-order estimate of patching every code at `sites` (default every pair of every layer)
    from the donor into the base: gradient of `metric` (summed over examples) with respect to each
    base code, times (donor code - base code), per example, layer, head, query and key. One forward
    pass of the donor, one forward and one backward pass of the base. The parameters are frozen for the
    base pass (their `requires_grad` restored after it), so no weight gradient is computed and `.grad`
    is never touched.

    `donor_codes`: the donor's codes at the same `sites`, `{layer: [batch, head, n]}` as the first
    element `record_codes(model, donor_inputs, sites)` returns, where they are at hand already (one
    donor batch read by several metrics): the donor pass is skipped, and `donor_inputs` may be None.

    device, dtype: where and in what the model runs (given, it is moved and cast, as `nn.Module.to`
    does; None: where and as it is); the inputs follow it, the effects come back on the CPU."""
    place(model, *check_placement(device, dtype))
    check_eval(model)
    if donor_codes is None:
        if donor_inputs is None:
            raise UsageError("attribution needs the donor: give donor_inputs, or donor_codes from record_codes")
        check_same_shapes(base_inputs, donor_inputs)
    batch = batch_size_of(base_inputs)
    source = source if source is not None else detect_source(model)
    selector = parse_selector(sites)
    if donor_codes is None:
        donor_codes, _ = record_codes(model, donor_inputs, selector, source)

    base_codes: dict[int, Tensor] = {}
    differentiable_codes: dict[int, Tensor] = {}
    base_pairs = LayerCodes(SitePairs(selector, source.n_layers(), source.name))

    def keep(layer: int, queries: Tensor, keys: Tensor, codes: Tensor) -> Tensor:
        """The base codes themselves, the gradient taken with respect to them: d metric / d codes is
        the gradient along every path (later layers' patterns included, as they are computed from
        them). A layer whose codes need no gradient yet (nothing before it was selected) gets them as
        a leaf."""
        if layer in base_codes:
            raise UsageError(f"layer {layer} ran twice in one forward pass (its queries in blocks?); attribution needs "
                             "each layer's codes once: pass shorter sequences or fewer sites")
        if layer not in donor_codes or donor_codes[layer].shape != codes.shape:  # refused before the backward pass
            found = tuple(donor_codes[layer].shape) if layer in donor_codes else "no codes"
            raise UsageError(f"donor_codes of layer {layer}: expected [batch, head, pairs] = {tuple(codes.shape)} "
                             f"(record_codes of the donor at the same sites), got {found}")
        base_codes[layer] = codes.detach()
        if not codes.requires_grad:
            codes = codes.detach().requires_grad_(True)
        differentiable_codes[layer] = codes
        return codes

    with frozen(model):  # no weight gradient is computed or kept
        with torch.enable_grad(), source.edit(base_pairs.pairs_for, DifferentiableEditor(keep)):
            value = per_example(metric(call_model(model, base_inputs)), batch, "metric").sum()
        layers = sorted(differentiable_codes)
        if not layers or not value.requires_grad:
            raise UsageError("the metric does not depend on any recorded code (no gradient): is the model's output "
                             "computed from its attention, and does the metric use the output?")
        gradients = torch.autograd.grad(value, [differentiable_codes[layer] for layer in layers], allow_unused=True)
    effects, grads, differences = {}, {}, {}
    for layer, gradient in zip(layers, gradients, strict=True):
        base = base_codes[layer].detach()
        gradient = torch.zeros_like(base) if gradient is None else gradient.detach()
        difference = donor_codes[layer].to(base.device, base.dtype) - base
        effects[layer], grads[layer] = (gradient * difference).cpu(), gradient.cpu()
        differences[layer] = difference.cpu()
    return Attribution(effects, {layer: base_pairs.positions[layer] for layer in layers}, grads, differences,
                       {layer: base_pairs.lengths[layer] for layer in layers})


def compare_attribution(sweep: PatchingSweep, attribution: Attribution) -> dict[str, float]:
    """How well attribution estimates the exact sweep, over the sweep's groups: Pearson and Spearman
    correlation of the mean effects (NaN where undefined), and the number of groups."""
    found = correlations(sweep.effects.mean(1), attribution.for_groups(sweep.groups).mean(1))
    return {**{name: math.nan if value is None else value for name, value in found.items()},
            "groups": len(sweep.groups)}


def correlations(exact: np.ndarray, estimate: np.ndarray) -> dict[str, float | None]:
    """Pearson and Spearman correlation of two per-group vectors; None where undefined (fewer than 3
    groups or a constant vector), computed without scipy's warnings."""
    if len(exact) < 3 or np.std(exact) == 0 or np.std(estimate) == 0:
        return {"pearson": None, "spearman": None}
    from scipy.stats import pearsonr, spearmanr

    return {"pearson": float(pearsonr(exact, estimate)[0]), "spearman": float(spearmanr(exact, estimate)[0])}
