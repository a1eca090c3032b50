"""What an edit does to a model's outputs: its metrics without and with the edit, at all selected
sites together, at each site (or head) alone, and beside each a control edit at random heads, for any
model (`latentcode.subject`). `latentcode intervene` calls this.

    table = intervention_effects("runs/sraven-hyla", MeanAblate.from_codes("codes.h5", model="runs/sraven-hyla"),
                                 sites="sraven-rule", split="ood", n=1024)
    table = intervention_effects("smollm2", ZeroAblate(heads=[3]), sites="10:*:*", task={"seq_len": 64}, n=32)
    write_effects(table, "results/mean-ablate")        # .csv, .json and .png

A trained model is read on its task's metrics (`task.evaluate`), a causal LM on the next-token loss,
probability and accuracy of `n` corpus windows from the first query an edit can change
(`latentcode.inputs`). Scopes: "all sites", and with `per_site` each site (`l{layer}_q{query}_k{key}`)
or, with `alone="heads"`, each (layer, head) alone ("l10.h3"); with `control`, beside each the same
edit at as many random heads of the same layers that the scope leaves alone (docs/how-to/intervene.md).

The table is tidy: one row per (scope, metric) with the columns `model`, `task`, `split`,
`variant`, `n`, `edit`, `scope`, `role` ("edit" or "control"), `metric`, `before`, `after` and
`change` (after - before), their standard errors `before se`, `after se` and `change se` (a
bootstrap over the `n` instances, BOOTSTRAP_RESAMPLES resamples of seed 0, the same resample for
before and after, so `change se` is the paired one), `positions` (the positions whose outputs are
read), `device` and `model_dtype` (where and in what the model ran).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from latentcode.errors import UsageError
from latentcode.files import AtomicOutputs
from latentcode.intervention.edits import Edit
from latentcode.intervention.intervener import Intervention
from latentcode.intervention.patching.sweep import placement
from latentcode.intervention.plan import InterventionPlan, Unit, plan_intervention
from latentcode.progress import Progress

if TYPE_CHECKING:
    import pandas as pd

ALL_SITES = "all sites"
BOOTSTRAP_RESAMPLES = 200


@dataclass(frozen=True)
class Scope:
    """Where one pass edits: `units` as (unit, the unit it stands for: itself, or the edited unit a
    control unit replaces), at `sites[layer]` in each layer (a selector or a list of sites)."""

    name: str
    role: str  # "edit" or "control"
    units: tuple[tuple[Unit, Unit], ...]
    sites: dict[int, Any]

    def edits(self, edits: Sequence[Edit]) -> list[Edit]:
        """Each edit at the scope: per layer, the heads of `units` there whose stand-in it writes."""
        placed = []
        for edit in edits:
            writes = None if edit.heads is None else {int(head) for head in edit.heads}
            for layer in sorted({layer for (layer, _), _ in self.units}):
                heads = sorted(head for (unit_layer, head), (_, original) in self.units
                               if unit_layer == layer and (writes is None or original in writes))
                if heads:
                    placed.append(dataclasses.replace(edit, heads=heads, sites=self.sites[layer]))
        return placed

    def key(self, edits: Sequence[Edit]) -> tuple:
        """What the scope writes: two scopes with one key (a control drawn as another scope's heads) run once."""
        return tuple((edit.heads and tuple(edit.heads), repr(edit.sites)) for edit in self.edits(edits))


def unit_name(units: Sequence[Unit]) -> str:
    return ",".join(f"l{layer}.h{head}" for layer, head in units)


def control_units(units: Sequence[Unit], n_heads: int, rng: np.random.Generator) -> list[tuple[Unit, Unit]] | None:
    """As many (layer, head)s as `units`, each in the layer of the unit it stands for, drawn at random
    among the heads `units` leave alone, as (control unit, the unit it stands for); None where a layer
    has too few of them."""
    edited = set(units)
    chosen: list[tuple[Unit, Unit]] = []
    for layer, head in units:
        taken = {control for control, _ in chosen}
        free = [other for other in range(n_heads) if (layer, other) not in edited and (layer, other) not in taken]
        if not free:
            return None
        chosen.append(((layer, int(rng.choice(free))), (layer, head)))
    return sorted(chosen)


def scopes_of(plan: InterventionPlan, edits: Sequence[Edit]) -> list[Scope]:
    """The edit's scopes (all sites, then each unit alone) and, with `plan.control`, a control beside each."""
    units = sorted({unit for edit in edits for unit in plan.units(edit.heads)})
    every_layer = {layer: plan.layer_sites(layer) for layer in plan.layers}
    scopes = [Scope(ALL_SITES, "edit", tuple((unit, unit) for unit in units), every_layer)]
    if plan.per_site and plan.alone == "sites" and len(plan.sites) > 1:
        scopes += [Scope(site.name, "edit", tuple((unit, unit) for unit in units if unit[0] == site.layer),
                         {site.layer: [site]}) for site in plan.sites]
    elif plan.per_site and plan.alone == "heads" and len(units) > 1:
        scopes += [Scope(unit_name([unit]), "edit", ((unit, unit),), every_layer) for unit in units]
    if not plan.control:
        return scopes
    rng = np.random.default_rng(0 if plan.seed is None else plan.seed)
    measured = []
    for scope in scopes:
        measured.append(scope)
        control = control_units([unit for unit, _ in scope.units], plan.subject.n_heads, rng)
        if control is not None:
            name = f"control for {scope.name}: {unit_name([unit for unit, _ in control])}"
            measured.append(Scope(name, "control", tuple(control), scope.sites))
    return measured


def intervention_effects(
    run_or_model: Any,
    edits: Edit | Sequence[Edit],
    *,
    task: Any = None,
    sites: str | Sequence = "last-self",
    split: str | None = None,
    n: int = 1024,
    variant: str | None = None,
    batch_size: int = 256,
    seed: int | None = None,
    per_site: bool = True,
    alone: str | None = None,
    control: bool = True,
    progress: bool = False,
    device: str | Any | None = None,
    dtype: str | Any | None = None,
) -> pd.DataFrame:
    """The metrics of `n` instances of `split` (None: the task's held-out split, `ood`, or a causal
    LM's `validation` windows) without and with `edits` at `sites`, per scope (`InterventionPlan`; the
    edits' own `sites` are replaced by each scope's); returns the tidy pandas table of the module
    docstring. Everything is checked first by `plan_intervention`; `run_or_model` may be such a plan,
    and then the other arguments are the plan's; else anything `latentcode.subject.subject_of` takes.
    device, dtype: where and in what the model runs ("cpu", "cuda:1"; "float32", "bfloat16",
    "float16"); None: a model loaded here on the CPU in float32, a model object where and as it is
    (given, the object is moved and cast as `nn.Module.to` does). Metrics are computed in float32."""
    import pandas as pd

    edits = (edits,) if isinstance(edits, Edit) else tuple(edits)
    if not edits:
        raise UsageError("give at least one edit")
    plan = run_or_model if isinstance(run_or_model, InterventionPlan) else plan_intervention(
        run_or_model, task=task, sites=sites, split=split, n=n, variant=variant, batch_size=batch_size, seed=seed,
        per_site=per_site, alone=alone, control=control, device=device, dtype=dtype)
    scopes = scopes_of(plan, edits)
    loaded = plan.subject.load(plan.device, plan.dtype, progress)
    inputs, batch_size = plan.inputs, plan.batch_size
    seed = inputs.default_seed(plan.split) if plan.seed is None else plan.seed
    n_batches = math.ceil(plan.n / batch_size)
    label_sites = plan.sites if inputs.labels_from_sites else ()  # (a long window's every pair is not listed)
    drawn = list(inputs.batches(loaded, plan.split, plan.n, seed, plan.variant, batch_size, range(n_batches),
                                label_sites, targets=True))
    everything = inputs.gathered(drawn, plan.split, plan.variant)
    description = "; ".join(edit.describe() for edit in edits) + f" at {plan.selector.spec()}"
    tracker = Progress((1 + len(scopes)) * len(drawn), "intervene", unit="batch", enabled=progress)
    tracker.announce(f"{description} on {plan.n} {plan.split} instances ({plan.variant}) in {len(drawn)} "
                     f"passes of up to {plan.batch_size}: without the edit, then {len(scopes)} scopes "
                     f"({sum(scope.role == 'control' for scope in scopes)} controls), "
                     f"{(1 + len(scopes)) * len(drawn)} forward passes")
    measured: dict[tuple, np.ndarray] = {}

    def outputs(scope: Scope | None) -> np.ndarray:
        """What the metrics need of each instance, with the edits at `scope` (None: unedited)."""
        key = None if scope is None else scope.key(edits)
        if key in measured:
            tracker.advance(len(drawn), note=scope.name)
            return measured[key]
        kept = []
        for x, rows in drawn:
            x = torch.from_numpy(x).to(loaded.device)
            with torch.no_grad():
                if scope is None:
                    logits = loaded.logits(x)
                else:
                    placed = [edit.for_batch(rows["labels"]) for edit in scope.edits(edits)]
                    with Intervention(loaded.model, placed, sites=plan.selector):
                        logits = loaded.logits(x)
            kept.append(inputs.scores(logits, rows["target"], plan.first_query))
            tracker.advance(note="without the edit" if scope is None else scope.name)
        measured[key] = np.concatenate(kept)
        return measured[key]

    tracker.start()
    try:
        before = outputs(None)
        afters = [(scope, outputs(scope)) for scope in scopes]
    finally:
        tracker.close()
    resamples = np.random.default_rng(0).integers(0, plan.n, size=(BOOTSTRAP_RESAMPLES, plan.n))
    resampled = [inputs.subset(everything, indices) for indices in resamples]

    def evaluate(kept: np.ndarray) -> tuple[dict[str, float], list[dict[str, float]]]:
        """The metrics of all instances, and of each bootstrap resample of them."""
        return inputs.evaluate(kept, everything), [inputs.evaluate(kept[indices], batch) for indices, batch in
                                                   zip(resamples, resampled, strict=True)]

    was, was_resampled = evaluate(before)
    common = {"model": loaded.name, "task": plan.task.name, "split": plan.split, "variant": plan.variant, "n": plan.n,
              "edit": description}
    rows = []
    for scope, after in afters:
        now, now_resampled = evaluate(after)
        for metric, value in was.items():
            before_r = np.array([values[metric] for values in was_resampled], dtype=float)
            after_r = np.array([values[metric] for values in now_resampled], dtype=float)
            rows.append({
                **common, "scope": scope.name, "role": scope.role, "metric": metric, "before": value,
                "after": now[metric], "change": now[metric] - value, "before se": before_r.std(ddof=1),
                "after se": after_r.std(ddof=1), "change se": (after_r - before_r).std(ddof=1),
                "positions": inputs.positions(plan.first_query), **placement(loaded.model),
            })  # fmt: skip
    return pd.DataFrame(rows)


def write_effects(table, path_stem: str | Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Write the table as `<stem>.csv` and `<stem>.json` and draw it (`<stem>.png`, `draw_effects`)."""
    stem = Path(path_stem)
    figure = draw_effects(table)
    # The table and its plots as one set: all or none, through temporaries, one writer of a stem at a time.
    with AtomicOutputs(lock=stem, purpose="writing intervention effects") as outputs:
        outputs.write_table(stem, table)
        outputs.write_figure(stem, figure, formats)
    return outputs.written


def draw_effects(table):
    """The plot of `write_effects`: one panel per metric, after the edit per scope (± s.e.), all sites
    together in red, each site alone in orange; before it, a dashed line in its ± s.e. band. A table
    with controls shows the change per scope instead (± its paired s.e., so that an edit and its
    control compare at a glance; a change is small beside a loss) and its controls in grey."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = list(dict.fromkeys(table["metric"]))
    scopes = list(dict.fromkeys(table["scope"]))
    relative = "role" in table and bool((table["role"] == "control").any())
    value, error = ("change", "change se") if relative else ("after", "after se")
    columns = min(3 if len(scopes) <= 8 else 1, len(metrics))  # many scopes: panels one above the other
    n_rows = math.ceil(len(metrics) / columns)
    figure = Figure(figsize=(max(4.0, 0.5 * len(scopes) + 2) * columns, 3.2 * n_rows + (1.2 if columns == 1 else 0)),
                    dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(n_rows, columns, squeeze=False).ravel()
    for axis, metric in zip(axes, metrics, strict=False):
        rows = table[table["metric"] == metric].set_index("scope").loc[scopes]
        controls = (rows["role"] == "control").to_numpy() if relative else np.zeros(len(rows), bool)
        alone = ~controls & (np.arange(len(rows)) > 0)
        for chosen, colour, label in ((np.arange(len(rows)) == 0, "tab:red", "with the edit, all sites together"),
                                      (alone, "tab:orange", "with the edit, each site alone"),
                                      (controls, "tab:gray", "control: the edit at as many random heads")):
            if chosen.any():
                axis.bar(np.flatnonzero(chosen), rows[value].to_numpy()[chosen], yerr=rows[error].to_numpy()[chosen],
                         capsize=3, color=colour, label=label)
        if relative:
            axis.axhline(0, color="black", linestyle="--", linewidth=1, label="without the edit")
            axis.set_ylabel("after - before (± paired s.e.)", fontsize=8)
            axis.set_title(f"change in {metric}\n({rows['before'].iloc[0]:.4g} without the edit)", fontsize=9)
        else:
            before, before_se = rows["before"].iloc[0], rows["before se"].iloc[0]
            axis.axhspan(before - before_se, before + before_se, color="0.8", zorder=0)
            axis.axhline(before, color="black", linestyle="--", linewidth=1, label="without the edit (band: ± s.e.)")
            axis.set_ylabel(f"{metric} (± s.e.)")
            axis.set_title(f"{metric} with the edit", fontsize=9)
        axis.set_xticks(range(len(scopes)), scopes, rotation=45, ha="right", fontsize=7)
    for axis in axes[len(metrics) :]:
        axis.set_visible(False)
    # one legend for every panel (the same colours in each), below them where it covers no bar
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    first = table.iloc[0]
    figure.suptitle(f"{first['model']} on {first['task']} {first['split']} ({first['variant']}, n={first['n']}): "
                    f"{first['edit']}", fontsize=9)
    return figure
