"""`patch`: a patching sweep (or search) of a run directory, as `latentcode patch` runs it.

    result = patch("models/sraven-hyla", grid="slot", layers=[2], n=64)
    result.table                   # one row per group: follow (different/third/same), transfer, damage, ...
    result.summary                 # what the command line writes as <out>.json (without `seconds`)

Everything is checked first by `plan_patch` (torch-free; the command line's check builds the same
plan and hands it here), so the Python API and the command line answer a mistake with one message.
The pairs are the run's task's counterfactual pairs (`Task.counterfactual_pairs`), each group read
against the third-sub-task donor baseline (`latentcode.intervention.transfer`). A pretrained causal LM
is patched by resample ablation instead (`language_patch`: each window with another window's codes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latentcode.intervention.patching.language_plan import LanguagePatchPlan
from latentcode.intervention.patching.plan import DONORS, PatchPlan, plan_patch

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


def patch(run_or_plan: str | Path | PatchPlan | LanguagePatchPlan, *, progress: bool = False,
          say: Callable[[str], None] | None = None, **options: Any) -> PatchResult:
    """The sweep `plan_patch(run_or_plan, **options)` describes (see there), or that of the plan
    given. `say`: called with the cost line before the work; `progress`: a bar (or lines) on stderr."""
    import torch

    from latentcode.intervention.patching.inputs import placement
    from latentcode.progress import Progress
    from latentcode.provenance import sha256_of_file
    from latentcode.training.run import Run
    from latentcode.validation import place

    plan = run_or_plan if isinstance(run_or_plan, (PatchPlan, LanguagePatchPlan)) else plan_patch(run_or_plan, **options)
    if isinstance(plan, LanguagePatchPlan):
        from latentcode.intervention.patching.language_patch import language_patch

        return language_patch(plan, progress=progress, say=say)
    record = Run(plan.source.path)
    model = place(record.load_model(), plan.device, plan.dtype).eval()
    task = record.task()
    pairs = task.counterfactual_pairs(plan.n, plan.split, seed=plan.seed, variant=plan.variant,
                                      prediction=plan.prediction)
    what = "search" if plan.search else f"{plan.cost['groups']} groups"
    if say is not None:
        say(f"cost: at most {plan.cost['groups']} groups patched, about {plan.cost['examples']:,} example forward "
            f"passes ({what}; {len(pairs)} pairs x {'2 donors to select, 3 to confirm' if plan.search else '3 donors'})"
            f" on {plan.split} ({plan.variant})")
    bar = Progress(plan.cost["examples"], "patch", unit="example", enabled=progress)
    bar.start()
    summary: dict[str, Any] = {"run": str(plan.source.path), "task": task.config(), "split": plan.split,
                               "variant": plan.variant, "n": len(pairs), "prediction": pairs.prediction,
                               "pairs": pairs.counts}
    summary["checkpoint_sha256"] = sha256_of_file(record.directory.weights_path)  # a report shows it with this model only
    summary.update(placement(model))
    try:
        with torch.no_grad():
            if plan.search:
                tables = _search(plan, model, task, pairs, bar, summary)
            else:
                tables = _sweep(plan, model, task, pairs, bar, summary)
    finally:
        bar.close()
    return PatchResult(tables, summary)


def groups_of(plan: PatchPlan, task) -> list:
    """The site groups the plan sweeps (not for a search, which finds its own)."""
    from latentcode.intervention.patching.partitions import partition_grid, task_partitions
    from latentcode.intervention.patching.site_groups import SiteGroup, head_grid, site_grid
    from latentcode.sources.sites import parse_selector

    if plan.partition_grid:
        return partition_grid(task_partitions(task), *plan.partition_grid, layers=list(plan.layers),
                              n_heads=plan.n_heads if plan.per_head else None)
    if plan.grid == "rows":
        return site_grid(plan.n_layers, task.seq_len, layers=list(plan.layers), queries=list(plan.query_positions),
                         key_blocks=plan.key_blocks)
    if plan.grid == "heads":
        return head_grid(plan.n_layers, plan.n_heads, sites=plan.sites)
    return [SiteGroup(parse_selector(spec, task), coordinates={"spec": spec}) for spec in plan.groups]


def _correlations(exact, estimate) -> dict[str, float | None]:
    """Pearson and Spearman correlation of two per-group vectors; None where undefined (fewer than 3
    groups or a constant vector), computed without scipy's warnings."""
    import numpy as np

    if len(exact) < 3 or np.std(exact) == 0 or np.std(estimate) == 0:
        return {"pearson": None, "spearman": None}
    from scipy.stats import pearsonr, spearmanr

    return {"pearson": float(pearsonr(exact, estimate)[0]), "spearman": float(spearmanr(exact, estimate)[0])}


def _sweep(plan, model, task, pairs, progress, summary):
    from latentcode.intervention.patching.attribution import attribution_patching
    from latentcode.intervention.transfer import (
        counterfactual_metrics,
        output_position,
        per_example,
        transfer_sweep,
    )

    groups = groups_of(plan, task)
    progress.begin(f"{len(groups)} groups x {len(pairs)} pairs x {len(DONORS)} donors")
    table = transfer_sweep(model, task, pairs, groups, relations=DONORS, on_pass=progress.advance)
    summary.update({"groups": len(groups), "forward_passes": table.attrs["forward_passes"]})
    if plan.attribution:
        progress.begin("attribution")
        metrics = counterfactual_metrics(pairs, task.objective, output_position(task, pairs.prediction))
        attribution = attribution_patching(model, pairs.base.torch().x, pairs.donors["different"].torch().x,
                                           metrics["logit_difference"], sites="*:*:*")
        estimate = attribution.for_groups(groups)
        exact = per_example(table, "different", "logit_difference") - table["logit_difference (unpatched)"].iloc[0]
        table["logit_difference effect"] = exact.mean(1)
        table["attribution estimate"] = estimate.mean(1)
        summary["attribution_vs_exact"] = _correlations(exact.mean(1), estimate.mean(1))
    return (table,)


def _search(plan, model, task, pairs, progress, summary):
    from latentcode.intervention.patching.search import site_search

    confirmation = task.counterfactual_pairs(plan.confirm_n, plan.split, seed=plan.seed + 1, variant=plan.variant,
                                             prediction=plan.prediction)
    result = site_search(model, task, pairs, confirmation, layers=list(plan.layers), tolerance=plan.tolerance,
                         on_pass=progress.advance, say=progress.begin)
    summary.update({"search": result.settings, "confirmation_pairs": confirmation.counts,
                    "found": result.found.name, "examples": result.examples,
                    "route": result.confirmed.drop(columns=["group"]).to_dict("records")})
    return result.confirmed, result.candidates
