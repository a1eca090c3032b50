"""`patch`: a patching sweep (or search) of any model, as `latentcode patch` runs it.

    result = patch("models/sraven-hyla", grid="slot", layers=[2], n=64)     # a run: counterfactual pairs
    result = patch("smollm2", task={"seq_len": 128}, grid="heads", layers=[3], n=32)   # resample ablation
    result.table, result.summary   # a row per group (transfer, damage; or loss change); <out>.json's content

`plan_patch` checks everything first (torch-free; the command line builds the same plan). One loop for
every model: load the subject, draw its inputs' bases (`measures.measure_of`), patch the groups, and
put the controls of the heads and offsets grids beside them (`site_groups.CONTROLS`, `_with_controls`;
docs/how-to/patch.md). `attribution`: attribution patching's estimate of each group's objective beside
the exact one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latentcode.intervention.patching.plan import PatchPlan, plan_patch

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class PatchResult:
    """`tables`: the sweep's table (one row per group), or the search's route on the fresh pairs and
    the candidates it weighed; `summary`: the settings and counts (JSON-ready)."""

    tables: tuple[pd.DataFrame, ...]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def table(self) -> pd.DataFrame:
        return self.tables[0]


def patch(run_or_plan: str | Path | PatchPlan, *, progress: bool = False,
          say: Callable[[str], None] | None = None, **options: Any) -> PatchResult:
    """The sweep `plan_patch(run_or_plan, **options)` describes (see there), or that of the plan
    given. `say`: called with the cost line before the work; `progress`: a bar (or lines) on stderr."""
    import torch

    from latentcode.intervention.patching.measures import measure_of
    from latentcode.intervention.patching.sweep import placement
    from latentcode.progress import Progress

    plan = run_or_plan if isinstance(run_or_plan, PatchPlan) else plan_patch(run_or_plan, **options)
    loaded = plan.subject.load(plan.device, plan.dtype, progress)
    measure = measure_of(plan, loaded, plan.n, plan.seed)
    if say is not None:
        say(measure.describe(plan))
    bar = Progress(plan.cost.get("examples", plan.cost.get("window_passes", 0)), "patch", unit=measure.unit,
                   enabled=progress)
    bar.start()
    summary = {**measure.summary(plan, loaded), **placement(loaded.model)}
    try:
        with torch.no_grad():
            run = _search if plan.search else _sweep
            tables = run(plan, loaded, measure, bar, summary)
    finally:
        bar.close()
    return PatchResult(tables, summary)


def groups_of(plan: PatchPlan) -> tuple[list, list[int | None] | None]:
    """The site groups the plan sweeps (not for a search, which finds its own): those reported first,
    then any control groups; and for each reported group the index of its control (None: none), or
    None for a grid without controls."""
    from latentcode.intervention.patching import site_groups

    if plan.partition_grid:
        return site_groups.partition_grid(plan.inputs.partitions(), *plan.partition_grid, layers=list(plan.layers),
                              n_heads=plan.n_heads if plan.per_head else None), None
    if plan.grid == "rows":
        return site_groups.site_grid(plan.n_layers, plan.task.seq_len, layers=list(plan.layers),
                                     queries=list(plan.query_positions), key_blocks=plan.key_blocks), None
    if plan.grid == "heads":
        return site_groups.heads_with_controls(plan.n_layers, plan.n_heads, plan.inputs.parse(plan.sites),
                                               plan.layers, plan.seed)
    if plan.grid == "offsets":
        return site_groups.offsets_with_controls(plan.task.seq_len, plan.layers, plan.seed)
    return [site_groups.SiteGroup(plan.inputs.parse(spec), coordinates={"spec": spec}) for spec in plan.groups], None


def _sweep(plan: PatchPlan, loaded: Any, measure: Any, progress: Any, summary: dict[str, Any]) -> tuple:
    from latentcode.intervention.patching.attribution import correlations
    from latentcode.intervention.patching.site_groups import CONTROLS

    groups, controls = groups_of(plan)
    reported = len(groups) if controls is None else len(controls)
    progress.begin(f"{len(groups)} groups x {len(measure)} {measure.unit}s")
    table, effects = measure.sweep(loaded.model, groups, on_pass=progress.advance)
    summary.update({"groups": len(groups), "forward_passes": table.attrs["forward_passes"]})
    if plan.attribution:
        progress.begin("attribution")
        estimate, exact = measure.attribution(loaded.model, groups, table)
        table["attribution estimate"] = estimate
        summary["attribution_vs_exact"] = correlations(exact[:reported], estimate[:reported])
    if controls is not None:
        summary["control"] = CONTROLS[plan.grid]
        table = _with_controls(table, effects, controls, measure.effect, plan.grid == "heads")
    measure.conclude(table, summary)
    return (table,)


def _with_controls(table: Any, effects: Any, controls: list[int | None], effect: str, heads: bool) -> Any:
    """The reported rows with their controls' `effect` beside theirs, paired over the bases; for a heads
    grid also against the per-base median of the layer's other heads."""
    import numpy as np

    from latentcode.intervention.patching.sweep import mean_and_se

    rows = table.iloc[:len(controls)].copy()
    columns: dict[str, list] = {name: [] for name in ("control", f"control {effect}", f"control {effect} se",
                                                       f"{effect} - control", f"{effect} - control se")}
    for index, control in enumerate(controls):
        against = np.full(effects.shape[1], np.nan) if control is None else effects[control]
        values = ("" if control is None else table["group"].iloc[control], *mean_and_se(against),
                  *mean_and_se(effects[index] - against))
        for name, value in zip(columns, values, strict=True):
            columns[name].append(value)
    for name, values in columns.items():
        rows[name] = values
    if heads:  # beside one random head, the typical head of the layer: steadier
        layer = rows["layer"].to_numpy()
        typical = [np.median(effects[[other for other in range(len(rows)) if other != index
                                      and layer[other] == layer[index]]], axis=0)
                   if (layer == layer[index]).sum() > 1 else np.full(effects.shape[1], np.nan)
                   for index in range(len(rows))]
        rows[f"others' median {effect}"] = [float(values.mean()) for values in typical]
        paired = [mean_and_se(effects[index] - values) for index, values in enumerate(typical)]
        rows[f"{effect} - others' median"] = [mean for mean, _ in paired]
        rows[f"{effect} - others' median se"] = [se for _, se in paired]
    return rows


def _search(plan: PatchPlan, loaded: Any, measure: Any, progress: Any, summary: dict[str, Any]) -> tuple:
    from latentcode.intervention.patching.measures import measure_of
    from latentcode.intervention.patching.search import site_search

    confirmation = measure_of(plan, loaded, plan.confirm_n, plan.seed + 1)
    result = site_search(loaded.model, plan.task, measure, confirmation, partitions=plan.inputs.partitions(),
                         layers=list(plan.layers), tolerance=plan.tolerance, on_pass=progress.advance,
                         say=progress.begin)
    summary.update({"search": result.settings, "confirmation_pairs": confirmation.counts,
                    "found": result.found.name, "examples": result.examples,
                    "route": result.confirmed.drop(columns=["group"]).to_dict("records")})
    return result.confirmed, result.candidates
