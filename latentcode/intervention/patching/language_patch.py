"""Resample ablation of a pretrained causal LM's codes, per (layer, head): `language_patch`.

    result = patch("smollm2", task={"seq_len": 128}, n=32, layers=[3, 10])   # via plan_patch -> this module
    result.table       # one row per (layer, head): loss before, after, change ± s.e., its control, ...

Each base window w_i of the plan (`pretrained.corpus_token_windows`, one token more for the last
position's target) gets the donor window w_d(i), d a seeded derangement of the windows (`donors`:
one random cycle through all of them, so never i itself). Patching group g = (layer, head) puts the
donor's codes a_donor[h, q, k] (its attention probabilities at g's pairs) in place of the base's;
the rest of the base's forward pass is its own (`patching_sweep`, through the same SDPA interception
as every other model). Per window, from position p0 (the first query a group touches; 0 for every
pair) to the last:

    next-token loss          mean over p of -log P(token p+1 | tokens ..p)       (nats)
    next-token probability   mean over p of P(token p+1 | tokens ..p)
    next-token accuracy      mean over p of [argmax P(. | tokens ..p) = token p+1]

and each group's change = patched - unpatched, mean ± paired s.e. over windows (std / sqrt(n)).
Beside every group its control: another head of the same layer drawn at random (seeded), patched
from the same donors on the same windows (it is one of the sweep's own groups, so it costs
nothing); "change - control" ± its paired s.e. says whether the head matters more than a head
picked blindly; for the heads grid also "change - others' median" ± its paired s.e., against the
per-window median change of the layer's other swept heads (steadier than one drawn head). With
`attribution`, gradient x (donor - base codes) summed over the group's pairs (`attribution_patching`,
one backward pass per batch of windows) estimates each group's loss change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from latentcode.intervention.next_token import METRICS, mean_and_se, window_metrics
from latentcode.intervention.patching.language_plan import BANDS, LanguagePatchPlan, band_pairs

ATTRIBUTION_SHARE = 4  # attribution's passes hold a quarter of the sweep's windows


def donors(n: int, seed: int) -> np.ndarray:
    """`[n]` int: the donor window of each base window, a derangement (one random cycle through all
    n windows, seed `seed`), so no window is its own donor (n >= 2)."""
    order = np.random.default_rng(seed).permutation(n)
    donor = np.empty(n, dtype=np.int64)
    donor[order] = np.roll(order, -1)
    return donor


def control_heads(layers_and_heads: list[tuple[int, int]], n_heads: int, seed: int) -> list[int]:
    """For each (layer, head), another head of the same layer drawn at random (seed `seed`)."""
    rng = np.random.default_rng(seed)
    return [int(rng.choice([other for other in range(n_heads) if other != head])) for _, head in layers_and_heads]


CONTROLS = {
    "heads": "another head of the same layer drawn at random (seeded), patched from the same donor windows",
    "offsets": "as many pairs of the same layer (all heads) drawn at random (seeded) among its causal pairs outside "
               "the band, patched from the same donor windows; none where fewer are left",
}
def swept_groups(plan: LanguagePatchPlan) -> tuple[list, list[int | None]]:
    """The groups a sweep patches, those reported first (one per (layer, head), or per (layer, offset
    band) with `grid="offsets"`), then the control groups; and for each reported group the index of its
    control among them (None: none)."""
    from latentcode.intervention.patching.site_groups import SiteGroup, head_grid
    from latentcode.sources.sites import Selector

    if plan.grid == "heads":
        groups = head_grid(plan.shape.n_layers, plan.shape.n_heads, sites=plan.sites, layers=plan.layers)
        units = [(group.coordinates["layer"], group.coordinates["head"]) for group in groups]
        row_of = {unit: index for index, unit in enumerate(units)}
        heads = control_heads(units, plan.shape.n_heads, plan.seed)
        return groups, [row_of[(layer, head)] for (layer, _), head in zip(units, heads, strict=True)]
    rng = np.random.default_rng(plan.seed)
    causal = [(query, key) for query in range(plan.seq_len) for key in range(query + 1)]
    groups, control_groups, controls = [], [], []
    for layer in plan.layers:
        for band in BANDS:
            pairs = band_pairs(band, plan.seq_len)
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


def group_name(group) -> str:
    if "head" in group.coordinates:
        return f"l{group.coordinates['layer']}.h{group.coordinates['head']}"
    return f"l{group.coordinates['layer']} {group.coordinates['band']}"


def _per_layer(plan: LanguagePatchPlan) -> str:
    return f"{plan.shape.n_heads} heads" if plan.grid == "heads" else f"{len(BANDS)} offset bands and their controls"


def _logits(output: Any) -> Tensor:
    return output if isinstance(output, Tensor) else output.logits


def _metric_functions(first_query: int, targets: Tensor) -> dict[str, Callable[[Any], Tensor]]:
    """METRICS as functions of a model output of the batch whose targets are `targets`; the three read
    one log-softmax (kept with the output it came from, so a later output never reads a stale one)."""
    kept: list = [None, None]

    def metric(index: int) -> Callable[[Any], Tensor]:
        def of(output: Any) -> Tensor:
            if kept[0] is not output:
                kept[0], kept[1] = output, window_metrics(_logits(output)[:, first_query:], targets)
            return kept[1][:, index]
        return of

    return {name: metric(index) for index, name in enumerate(METRICS)}


def _attribution(model, base_ids: Tensor, donor_ids: Tensor, targets: Tensor, plan: LanguagePatchPlan, groups
                 ) -> np.ndarray:
    """`attribution_patching`'s estimate of each group's loss change per window, `[groups, batch]`, in
    passes of a quarter of the sweep's windows (a backward pass keeps every activation)."""
    from latentcode.intervention.patching.attribution import attribution_patching
    from latentcode.intervention.patching.site_groups import union_of

    step = max(1, plan.batch_size // ATTRIBUTION_SHARE)
    estimates = []
    for start in range(0, len(base_ids), step):
        part = slice(start, start + step)
        loss = _metric_functions(plan.first_query, targets[part])[METRICS[0]]
        with torch.enable_grad():
            attribution = attribution_patching(model, {"input_ids": base_ids[part], "use_cache": False},
                                               {"input_ids": donor_ids[part], "use_cache": False}, loss,
                                               sites=union_of(groups))
        estimates.append(attribution.for_groups(groups))
    return np.concatenate(estimates, axis=1)


def _group_row(plan: LanguagePatchPlan, model_name: str, groups, index: int, control: int | None,
               base: dict[str, np.ndarray], patched: dict[str, np.ndarray], change: dict[str, np.ndarray],
               reported: int) -> dict[str, Any]:
    """The table's row of group `index`: the loss before and after, its change (mean, s.e.) beside its
    control group's and, per head, the layer's other heads' median; the probability and accuracy changes."""
    loss_change = change[METRICS[0]]
    group = groups[index]
    row = {"model": model_name, "split": plan.split, "T": plan.seq_len, "n": plan.n, **group.coordinates,
           "group": group_name(group), "sites": group.selector.spec() if plan.grid == "heads" else "",
           "positions": f"{plan.first_query}..{plan.seq_len - 1}", "metric": "next-token loss (nats)",
           "before": float(base[METRICS[0]].mean()), "after": float(patched[METRICS[0]][index].mean())}
    row["change"], row["change se"] = mean_and_se(loss_change[index])
    if control is None:  # too few pairs left to draw as many
        row.update({"control": "", "control change": np.nan, "control change se": np.nan,
                    "change - control": np.nan, "change - control se": np.nan})
    else:
        against = loss_change[control]
        row["control"] = group_name(groups[control])
        row["control change"], row["control change se"] = mean_and_se(against)
        row["change - control"], row["change - control se"] = mean_and_se(loss_change[index] - against)
    if plan.grid == "heads":  # beside one random head, the typical head of the layer: steadier
        layer = group.coordinates["layer"]
        others = [other for other in range(reported)
                  if other != index and groups[other].coordinates["layer"] == layer]
        typical = np.median(loss_change[others], axis=0) if others else np.full(plan.n, np.nan)
        row["others' median change"] = float(typical.mean())
        row["change - others' median"], row["change - others' median se"] = mean_and_se(loss_change[index] - typical)
    for name, short in zip(METRICS[1:], ("probability", "accuracy"), strict=True):
        row[f"{short} change"], row[f"{short} change se"] = mean_and_se(change[name][index])
    return row


def language_patch(plan: LanguagePatchPlan, *, progress: bool = False, say: Callable[[str], None] | None = None):
    """The resample-ablation sweep of the module docstring: a `PatchResult` whose table has one row
    per (layer, head) and whose summary is JSON-ready."""
    import pandas as pd

    from latentcode.intervention.language import model_and_windows
    from latentcode.intervention.patching.inputs import placement
    from latentcode.intervention.patching.run import PatchResult, _correlations
    from latentcode.intervention.patching.sweep import patching_sweep
    from latentcode.progress import Progress

    pretrained, inputs, targets = model_and_windows(plan, progress)
    model = pretrained.model
    donor = donors(plan.n, plan.seed)
    groups, controls = swept_groups(plan)  # the groups reported, then any control groups
    reported = len(controls)
    batches = [slice(start, start + plan.batch_size) for start in range(0, plan.n, plan.batch_size)]
    if say is not None:
        say(f"cost: {len(groups)} groups ({len(plan.layers)} layers x {_per_layer(plan)}) x {plan.n} windows "
            f"of {plan.seq_len} tokens of the {plan.split} split = about {plan.cost['window_passes']:,} window forward "
            f"passes in {plan.cost['passes']} passes of up to {plan.batch_size} windows"
            + ("; then one forward and backward pass per batch (attribution)" if plan.attribution else ""))
    bar = Progress(plan.cost["window_passes"], "patch", unit="window", enabled=progress)
    bar.announce(f"resample ablation of {plan.name}: each of {plan.n} windows patched with the codes of another "
                 f"window (seed {plan.seed}) at one group ({_per_layer(plan)} of a layer) at a time")
    bar.start()
    patched = {name: [] for name in METRICS}
    base = {name: [] for name in METRICS}
    estimates = []
    try:
        for batch in batches:
            base_inputs = {"input_ids": inputs[batch], "use_cache": False}
            donor_inputs = {"input_ids": inputs[donor[batch]], "use_cache": False}
            if plan.attribution:  # first: a backward pass that does not fit fails before the sweep's work
                bar.begin("attribution")
                estimates.append(_attribution(model, inputs[batch], inputs[donor[batch]], targets[batch], plan,
                                              groups))
            bar.begin(f"windows {batch.start}..{min(batch.stop, plan.n) - 1}")
            sweep = patching_sweep(model, base_inputs, donor_inputs, groups,
                                   _metric_functions(plan.first_query, targets[batch]),
                                   max_examples_per_pass=plan.batch_size, on_pass=bar.advance)
            bar.advance(2 * len(inputs[batch]))  # the base and the donor
            for name in METRICS:
                patched[name].append(sweep.patched[name])
                base[name].append(sweep.base[name])
    finally:
        bar.close()
    patched = {name: np.concatenate(values, axis=1) for name, values in patched.items()}  # [groups, n]
    base = {name: np.concatenate(values) for name, values in base.items()}  # [n]
    change = {name: patched[name] - base[name][None] for name in METRICS}
    loss_change = change[METRICS[0]]
    rows = [_group_row(plan, pretrained.name, groups, index, control, base, patched, change, reported)
            for index, control in enumerate(controls)]
    table = pd.DataFrame(rows)
    summary: dict[str, Any] = {
        "model": pretrained.name, "path": str(pretrained.path), "method": "resample ablation", "split": plan.split,
        "seq_len": plan.seq_len, "n": plan.n, "seed": plan.seed, "layers": list(plan.layers), "sites": plan.sites,
        "positions": f"{plan.first_query}..{plan.seq_len - 1}", "groups": len(groups),
        "donors": donor.tolist(), "forward_passes": plan.cost["passes"],
        "control": CONTROLS[plan.grid], **placement(model),
        "loss_before": float(base[METRICS[0]].mean()),
        "largest": table.nlargest(min(5, len(table)), "change")[["group", "change", "change se"]].to_dict("records"),
    }
    if plan.attribution:
        estimate = np.concatenate(estimates, axis=1).mean(1)[:reported]
        table["attribution estimate"] = estimate
        summary["attribution_vs_exact"] = _correlations(loss_change[:reported].mean(1), estimate)
    return PatchResult((table,), summary)
