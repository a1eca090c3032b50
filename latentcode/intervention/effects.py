"""What an edit does to a trained model's task performance: the task metric without and with the
edit, at all selected sites together and at each site alone. `latentcode intervene` calls this.

    table = intervention_effects("runs/sraven-hyla", MeanAblate.from_codes("codes.h5", model="runs/sraven-hyla"),
                                 sites="sraven-rule", split="ood", n=1024)
    write_effects(table, "results/mean-ablate")        # .csv, .json and .png

The table is tidy: one row per (scope, metric) with the columns `model`, `task`, `split`,
`variant`, `n`, `edit`, `scope` ("all sites", or one site as `l{layer}_q{query}_k{key}`), `metric`,
`before`, `after` and `change` (after - before), `device` and `model_dtype` (where and in what the
model ran), and their standard errors `before se`, `after se` and `change se` (a bootstrap over the `n` instances, BOOTSTRAP_RESAMPLES resamples of seed 0,
the same resample for before and after, so `change se` is the paired one). Metrics are the task's
own (`task.evaluate`) on the same `n` instances (the split's evaluation seed unless `seed` is given). A `MeanAblate` with
per-label means gets each batch's labels (task labels, and SRAVEN's `rule` of the sites' query).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from latentcode.errors import UsageError
from latentcode.files import AtomicOutputs
from latentcode.intervention.edits import Edit
from latentcode.intervention.intervener import Intervention
from latentcode.intervention.language_plan import LanguageInterventionPlan
from latentcode.intervention.patching.inputs import placement
from latentcode.intervention.plan import InterventionPlan, plan_intervention
from latentcode.progress import Progress
from latentcode.validation import place

if TYPE_CHECKING:
    import pandas as pd

ALL_SITES = "all sites"
BOOTSTRAP_RESAMPLES = 200


def _plan_of(run_or_model, **arguments) -> InterventionPlan | LanguageInterventionPlan:
    """`run_or_model` if it is a plan already, else `plan_intervention`'s plan of it (a model object
    stands as a source of kind "object" with its own config)."""
    from latentcode.rundir import ModelSource
    from latentcode.subject import resolve_model

    if isinstance(run_or_model, (InterventionPlan, LanguageInterventionPlan)):
        return run_or_model
    if isinstance(run_or_model, nn.Module):
        run_or_model = ModelSource("object", None, model_config=resolve_model(run_or_model)[1]["model_config"])
    return plan_intervention(run_or_model, **arguments)


def intervention_effects(
    run_or_model: str | Path | nn.Module | InterventionPlan,
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
    control: bool = True,
    progress: bool = False,
    device: str | Any | None = None,
    dtype: str | Any | None = None,
) -> pd.DataFrame:
    """The task metrics of `n` instances of `split` (None: the task's held-out split, `ood` or
    language's `validation`) without and with `edits` at `sites` (all at once,
    and with `per_site` each site alone); returns the tidy pandas table described in the module
    docstring. The edits' own `sites` are replaced by each scope. Everything is checked first by
    `latentcode.intervention.plan.plan_intervention`; `run_or_model` may be such a plan (the command
    line's), and then the other arguments are the plan's. A pretrained causal LM ("smollm2", a Hugging
    Face directory, a .gguf file) is edited on windows of the language corpus and read on its next-token
    predictions, beside a `control` edit of as many random heads (`latentcode.intervention.language`).
    device, dtype: where and in what the model runs ("cpu", "cuda", "cuda:1"; "float32", "bfloat16",
    "float16"); None: a model loaded here on the CPU in float32, a model object where and as it is
    (given, the object is moved and cast, as `nn.Module.to` does). The inputs follow the model's device;
    the metrics are computed from its outputs in float32."""
    import pandas as pd

    from latentcode.subject import resolve_model
    from latentcode.tasks import Batch, eval_seed

    edits = (edits,) if isinstance(edits, Edit) else tuple(edits)
    if not edits:
        raise UsageError("give at least one edit")
    model_object = run_or_model if isinstance(run_or_model, nn.Module) else None
    plan = _plan_of(run_or_model, task=task, sites=sites, split=split, n=n, variant=variant, batch_size=batch_size,
                    seed=seed, per_site=per_site, control=control, device=device, dtype=dtype)
    if isinstance(plan, LanguageInterventionPlan):
        from latentcode.intervention.language import language_model_effects

        return language_model_effects(plan, edits, progress=progress)
    model, info = resolve_model(model_object if plan.source.kind == "object" else plan.source)
    model = place(model, plan.device, plan.dtype)
    on = next(model.parameters()).device  # the inputs follow the model
    task, split, variant, resolved = plan.task, plan.split, plan.variant, list(plan.sites)
    n, batch_size, per_site = plan.n, plan.batch_size, plan.per_site
    seed = eval_seed(split) if plan.seed is None else plan.seed
    model.eval()

    batches = [task.sample(min(batch_size, n - start), split, seed=(seed, index), variant=variant)
               for index, start in enumerate(range(0, n, batch_size))]  # fmt: skip
    everything = Batch(
        x=np.concatenate([batch.x for batch in batches]),
        y=np.concatenate([batch.y for batch in batches]),
        labels={name: np.concatenate([batch.labels[name] for batch in batches]) for name in batches[0].labels},
        split=split,
        variant=variant,
    )

    def predict(scope_sites: list | None, scope: str) -> np.ndarray:
        """`[n, n_predictions, d_out]` outputs at the prediction positions, with the edit at `scope_sites`."""
        predictions = []
        for batch in batches:
            labels = {**batch.labels, **task.derived_labels(batch, resolved)}
            with torch.no_grad():
                if scope_sites is None:
                    output = model(torch.from_numpy(batch.x).to(on))
                else:
                    scoped = [dataclasses.replace(edit, sites=scope_sites).for_batch(labels) for edit in edits]
                    with Intervention(model, scoped, sites=scope_sites):
                        output = model(torch.from_numpy(batch.x).to(on))
            predictions.append(output[:, -task.n_predictions :, :].float().cpu().numpy())
            tracker.advance(note=scope)
        return np.concatenate(predictions)

    def resample(indices: np.ndarray) -> Batch:
        return Batch(x=everything.x[indices], y=everything.y[indices],
                     labels={name: values[indices] for name, values in everything.labels.items()},
                     split=split, variant=variant)

    resamples = np.random.default_rng(0).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    resampled = [resample(indices) for indices in resamples]

    def metrics(predictions: np.ndarray) -> tuple[dict[str, float], list[dict[str, float]]]:
        """The task's metrics on all `n` instances, and on each bootstrap resample of them."""
        return (task.evaluate(predictions, everything),
                [task.evaluate(predictions[indices], batch) for indices, batch in zip(resamples, resampled, strict=True)])

    scopes = [(ALL_SITES, resolved)]
    if per_site and len(resolved) > 1:
        scopes += [(site.name, [site]) for site in resolved]
    description = "; ".join(edit.describe() for edit in edits)
    tracker = Progress((1 + len(scopes)) * len(batches), "intervene", unit="batch", enabled=progress)
    tracker.announce(f"{description} on {n} {split} instances ({variant}) in {len(batches)} batches of up to "
                     f"{batch_size}: {1 + len(scopes)} passes over them (without the edit, all {len(resolved)} sites"
                     + (", each site alone" if len(scopes) > 1 else "") + f"), {(1 + len(scopes)) * len(batches)} "
                     "forward passes")
    tracker.start()
    try:
        before, before_resampled = metrics(predict(None, "without the edit"))
        afters = [(scope, *metrics(predict(scope_sites, scope))) for scope, scope_sites in scopes]
    finally:
        tracker.close()
    ran_on = placement(model)  # device and model_dtype: where and in what the model ran
    rows = []
    for scope, after, after_resampled in afters:
        for metric, value in before.items():
            was = np.array([resample_metrics[metric] for resample_metrics in before_resampled], dtype=float)
            now = np.array([resample_metrics[metric] for resample_metrics in after_resampled], dtype=float)
            rows.append({
                "model": info["model_name"], "task": task.name, "split": split, "variant": variant, "n": n,
                "edit": description, "scope": scope, "metric": metric, "before": value, "after": after[metric],
                "change": after[metric] - value, "before se": was.std(ddof=1), "after se": now.std(ddof=1),
                "change se": (now - was).std(ddof=1), **ran_on,
            })  # fmt: skip
    return pd.DataFrame(rows)


def write_effects(table, path_stem: str | Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Write the table as `<stem>.csv` and `<stem>.json` and draw it (`<stem>.png`: one panel per
    metric, the metric after the edit per scope with its bootstrap s.e., all sites together in red and
    each site alone in orange, the metric before it as a dashed line in a ± s.e. band)."""
    stem = Path(path_stem)
    figure = draw_effects(table)
    # The table and its plots as one set: all or none, through temporaries, one writer of a stem at a time.
    with AtomicOutputs(lock=stem, purpose="writing intervention effects") as outputs:
        outputs.write_table(stem, table)
        outputs.write_figure(stem, figure, formats)
    return outputs.written


def draw_effects(table):
    """The plot of `write_effects`: one panel per metric, after the edit per scope (± s.e.), all sites
    together in red, each site alone in orange; before it, a dashed line in its ± s.e. band. A language
    model's table (a `role` column) shows the change per scope instead (± its paired s.e.; the
    changes are small beside the loss itself) and its controls in grey."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = list(dict.fromkeys(table["metric"]))
    scopes = list(dict.fromkeys(table["scope"]))
    relative = "role" in table
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
    windows = f", windows of {first['variant'][2:]} tokens" if relative else ""
    figure.suptitle(f"{first['model']} on {first['task']} {first['split']} (n={first['n']}{windows}): {first['edit']}",
                    fontsize=9)
    return figure
