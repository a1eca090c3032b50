"""Fuzzy logic term swap: does the last token's latent code carry the function the model computes?

On fresh OOD instances, the codes of the LAST token (the query) are replaced by the mean code of a
training task that differs from the instance's task by one term (`FuzzyLogic.tasks_differing_by_one_term`;
one such task drawn per instance), at two site sets:

- `last-self`: the last token attending to itself (the paper's fuzzy-logic site);
- `last-row`: the last token's whole row of keys (every key position);

in one layer at a time and in all layers at once. Then R² of the predictions against the
counterfactual function (the swapped task's disjunction, `FuzzyLogic.counterfactual_target`, on the
instance's query) and against the original one, pooled over instances:
R² = 1 - sum (prediction - f)² / sum (f - mean f)². As the two functions agree wherever the
swapped terms are not the maximum, also `shift`: the least-squares slope of (prediction - original)
on (counterfactual - original), 0 when the prediction keeps the original function and 1 when it
moves all the way to the counterfactual one, and both R² on the instances where the functions
differ by more than 0.1 (`*_differ`).

Variant (default: the run's training variant, `uniform`), for both the edited instances and the
mean codes: the model is measured on the inputs it was trained on, and its query inputs vary, so
R² against a function speaks of the function over the input space. On `fixed_query` (`--variant
fixed_query`, the probes' analysis variant) every instance shares one query input, so R² there
only compares tasks at that one point; its codes, though, separate tasks far better (see the
`task_share_of_code_variance` column: the share of the codes' variance the task explains, beside
its chance level for as many tasks), so both are worth running.

Beside the swap, on the same instances and swaps:

    unpatched                 the model as it is
    own-task mean             the mean code of the instance's own (OOD) task, from other OOD
                              instances (the eval set, disjoint from the edited ones); should keep
    all-tasks mean            the mean code over all training instances (the function averaged out)
    random instance           the codes of a random other OOD instance
    original function         no model: predicting the original function exactly (the strongest
                              trivial baseline for R² against the counterfactual function)

Bootstrap standard errors over instances (500 resamples). Each model's rows are kept in
`per_model/` and reused. Writes `term_swap.csv/.json/.md`, `term_swap_<site set>.png` and
`term_swap.html` under --out.

    python analyses/term_swap.py --runs-from models
    python analyses/term_swap.py --runs-from models --variant fixed_query --out analyses/output/term_swap_fixed_query
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import common
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import latentcode
from latentcode.store import Site

SITE_SETS = ("last-self", "last-row")
SWAP = "swap: mean code of a one-term neighbour"
MODEL_CONDITIONS = ("unpatched", SWAP, "control: own-task mean", "baseline: all-tasks mean", "control: random instance")
REFERENCES = ("reference: original function", "reference: counterfactual function")
COLORS = dict(zip(MODEL_CONDITIONS, ("tab:gray", "tab:red", "tab:blue", "tab:orange", "tab:green"), strict=True))
DIFFER = 0.1


def scopes(task, n_layers: int) -> dict[str, dict[str, list[Site]]]:
    """`{site set: {scope: sites}}`, scopes `layer 0`.. and `all layers`."""
    last = task.seq_len - 1
    keys = {"last-self": (last,), "last-row": tuple(range(task.seq_len))}
    result = {}
    for site_set, set_keys in keys.items():
        per_layer = {f"layer {layer}": [Site(layer, last, key) for key in set_keys] for layer in range(n_layers)}
        result[site_set] = {**per_layer, "all layers": [site for sites in per_layer.values() for site in sites]}
    return result


def r2(prediction: np.ndarray, target: np.ndarray) -> float:
    """Pooled R² of `prediction` against `target` (1 - SSE / SST)."""
    total = ((target - target.mean()) ** 2).sum()
    return float(1.0 - ((prediction - target) ** 2).sum() / total) if total > 0 else float("nan")


def shift(prediction, original, counterfactual) -> float:
    """Slope of (prediction - original) on (counterfactual - original), through the origin."""
    difference = counterfactual - original
    denominator = (difference**2).sum()
    return float(((prediction - original) * difference).sum() / denominator) if denominator > 0 else float("nan")


def scores(prediction, original, counterfactual, seed: int) -> dict[str, float]:
    differ = np.abs(counterfactual - original) > DIFFER
    statistics = {
        "r2_counterfactual": lambda i: r2(prediction[i], counterfactual[i]),
        "r2_original": lambda i: r2(prediction[i], original[i]),
        "shift": lambda i: shift(prediction[i], original[i], counterfactual[i]),
    }
    row = {"n": len(prediction), "n_differ": int(differ.sum())}
    for name, statistic in statistics.items():
        row[name] = statistic(np.arange(len(prediction)))
        row[f"{name}_se"] = common.bootstrap_se(statistic, len(prediction), seed=seed)
    row["r2_counterfactual_differ"] = r2(prediction[differ], counterfactual[differ])
    row["r2_original_differ"] = r2(prediction[differ], original[differ])
    row["mse_counterfactual"] = float(((prediction - counterfactual) ** 2).mean())
    row["mse_original"] = float(((prediction - original) ** 2).mean())
    return row


def run_model(name: str, run: Path, args) -> list[dict]:
    from latentcode.intervention import (  # torch: only when measuring
        Interchange,
        MeanAblate,
    )

    model, task, variant = common.load_run(run)
    variant = args.variant or variant
    all_scopes = scopes(task, model.config.n_layers)
    row_sites = all_scopes["last-row"]["all layers"]
    row_spec = ",".join(f"*:{site.query}:{site.key}" for site in all_scopes["last-row"]["layer 0"])
    codes = common.codes_of(run, row_spec, variant, args.n_codes, args.out, splits=("train", "ood"),
                            quiet=args.quiet, name="last-row")
    by_training_task = MeanAblate.from_codes(codes, by="task_index", split="train", model=run)
    by_ood_task = MeanAblate.from_codes(codes, by="task_index", split="ood", model=run)
    overall = MeanAblate.from_codes(codes, split="train", model=run)

    batch = common.sample(task, args.n, "ood", variant)
    rng = np.random.default_rng([args.seed, 2])
    task_index = batch.labels["task_index"]
    with_training_mean = set(by_training_task.label_values.tolist())
    neighbour = np.full(args.n, -1)
    for index in np.unique(task_index):
        candidates = [t for t in task.tasks_differing_by_one_term(task.all_combinations[index], split="train")
                      if t in with_training_mean]
        members = np.flatnonzero(task_index == index)
        if candidates and index in set(by_ood_task.label_values.tolist()):
            neighbour[members] = rng.choice(candidates, size=len(members))
    kept = neighbour >= 0
    if not kept.any():
        raise SystemExit(f"{name}: no OOD instance has a one-term neighbour among the training tasks")
    batch = common.subset(batch, kept)
    x, task_index, neighbour = batch.x, task_index[kept], neighbour[kept]
    original = batch.y[:, 0].astype(np.float64)
    counterfactual = task.counterfactual_target(batch, task.all_combinations[neighbour]).astype(np.float64)
    donor = (np.arange(len(x)) + rng.integers(1, len(x), size=len(x))) % len(x)
    donor_codes = {site: values[donor] for site, values in
                   common.record_codes(model, x, row_sites, batch_size=args.batch_size).items()}

    def predicted(edits_for=None, sites=None) -> np.ndarray:
        output = common.predict(model, x, task.n_predictions, edits_for, sites, task.config(), args.batch_size)
        return output[:, 0, 0].astype(np.float64)

    edits = {
        SWAP: lambda start, stop: by_training_task.with_labels(neighbour[start:stop]),
        "control: own-task mean": lambda start, stop: by_ood_task.with_labels(task_index[start:stop]),
        "baseline: all-tasks mean": lambda start, stop: overall,
        "control: random instance": lambda start, stop: Interchange(
            {site: values[start:stop] for site, values in donor_codes.items()}),
    }
    base = {"model": name, "split": "ood", "variant": variant, "n_ood_instances": args.n}
    unpatched = predicted()
    rows = []
    for site_set, set_scopes in all_scopes.items():
        for scope, sites in set_scopes.items():
            for condition in MODEL_CONDITIONS:
                if condition == "unpatched":
                    prediction = unpatched
                else:
                    prediction = predicted(lambda start, stop, c=condition: [
                        dataclasses.replace(edits[c](start, stop), sites=None)], sites)
                rows.append({**base, "site_set": site_set, "scope": scope, "n_sites": len(sites),
                             "condition": condition, **scores(prediction, original, counterfactual, args.seed)})
            for condition, prediction in zip(REFERENCES, (original, counterfactual), strict=True):
                rows.append({**base, "site_set": site_set, "scope": scope, "n_sites": 0, "condition": condition,
                             **scores(prediction, original, counterfactual, args.seed)})
        if not args.quiet:
            print(f"{name} {site_set}: done", flush=True)
    return rows


def plot(table: pd.DataFrame, site_set: str, models: list[str], n: int) -> Figure:
    scopes_order = list(dict.fromkeys(table["scope"]))
    metrics = (("r2_counterfactual", "R² vs counterfactual function"), ("r2_original", "R² vs original function"),
               ("shift", "shift toward counterfactual (0 keep, 1 follow)"))
    figure = Figure(figsize=(4.2 * len(models), 8.6), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(metrics), len(models), squeeze=False, sharey="row")
    width = 0.8 / len(MODEL_CONDITIONS)
    for column, model in enumerate(models):
        rows = table[(table["model"] == model) & (table["site_set"] == site_set)]
        for row_index, (metric, label) in enumerate(metrics):
            axis = axes[row_index, column]
            for index, condition in enumerate(MODEL_CONDITIONS):
                values = rows[rows["condition"] == condition].set_index("scope").loc[scopes_order]
                axis.bar(np.arange(len(scopes_order)) + (index - 2) * width, values[metric], width,
                         yerr=values[f"{metric}_se"], color=COLORS[condition], label=condition)
            reference = rows[rows["condition"] == REFERENCES[0]][metric].iloc[0]
            axis.axhline(reference, color="black", linestyle="--", linewidth=1,
                         label="original function itself (no model)")
            axis.axhline(0, color="black", linewidth=0.5)
            axis.set_xticks(range(len(scopes_order)), scopes_order, fontsize=8)
            axis.set_title(f"{model}: {label}", fontsize=9)
            if column == 0:
                axis.set_ylabel(label, fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8)
    figure.suptitle(f"Fuzzy-logic term swap at the last token: site set {site_set}, OOD split, "
                    f"{table['variant'].iloc[0]} variant\n(n={n} instances per model; ±1 bootstrap s.e.)", fontsize=10)
    return figure


def main() -> None:
    from latentcode.intervention import checkpoint_sha256_of

    parser = common.add_intervention_arguments(common.parser(__doc__, "term_swap"))
    parser.add_argument("--variant", default=None, help="fuzzy-logic variant (default: the run's training variant)")
    args = parser.parse_args()
    runs = common.model_runs(args, "fuzzy_logic")
    rows = []
    for name, run in runs.items():
        key = f"{name}-{checkpoint_sha256_of(run)[:12]}-n{args.n}-seed{args.seed}-{args.variant}-codes{args.n_codes}"
        model_rows = common.cached(Path(args.out) / "per_model" / f"{key}.json",
                                   lambda name=name, run=run: run_model(name, run, args))
        task = latentcode.Run(run).task()
        site_scopes = scopes(task, latentcode.Run(run).config.model_config().n_layers)
        row_spec = ",".join(f"*:{site.query}:{site.key}" for site in site_scopes["last-row"]["layer 0"])
        codes = common.codes_of(run, row_spec, model_rows[0]["variant"], args.n_codes, args.out,
                                splits=("train", "ood"), quiet=args.quiet, name="last-row")
        shares = common.share_of_code_variance(codes, site_scopes, "task_index")
        for row in model_rows:
            row["task_share_of_code_variance"] = shares[row["site_set"], row["scope"]]
            row["task_share_of_code_variance_chance"] = shares["chance"]
        rows += model_rows
    out = Path(args.out)
    table = pd.DataFrame(rows)
    summary = table[["model", "site_set", "scope", "condition", "n", "r2_counterfactual", "r2_counterfactual_se",
                     "r2_original", "r2_original_se", "shift", "shift_se", "r2_counterfactual_differ",
                     "r2_original_differ", "n_differ", "task_share_of_code_variance"]]
    figures = [out / f"term_swap_{site_set}.png" for site_set in SITE_SETS]
    with common.output_set(out / "term_swap") as outputs:
        common.write_tables(outputs, table, out / "term_swap", summary)
        for site_set, path in zip(SITE_SETS, figures, strict=True):
            outputs.write_figure(path.with_suffix(""), plot(table, site_set, list(runs), int(table["n"].iloc[0])))
        common.write_html(outputs, out / "term_swap.html", "Fuzzy-logic term swap", [
            __doc__.split("\n\n    python")[0], "## Table", summary, "## Figures", *figures])
    with pd.option_context("display.width", 250):
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {out / 'term_swap.csv'}, {out / 'term_swap.html'} and {len(figures)} figures")


if __name__ == "__main__":
    main()
