"""Head ablation at inference: OOD performance as heads lose their latent codes.

For each finished model (not retrained: `heads_ablation.py` trains one-head models instead), the
latent codes of a head are zero-ablated (a[h, q, k] = 0) or mean-ablated (a[h, q, k] = its mean
over training instances, per (q, k)) at every (query, key) pair of its layer:

- one at a time: each (layer, head) alone; the change of the OOD headline metric (SRAVEN accuracy,
  all M values right; fuzzy-logic per-sequence R²) and of the in-distribution loss;
- cumulatively: k heads ablated in every layer at once, k = 0 .. H (H - 1 leaves one head per
  layer, the within-model analogue of the paper's single-head model, Fig. 5C). Heads are ablated
  in the order of their one-at-a-time damage to the loss on fresh TRAINING-split instances (least
  damaging first), so the order never looks at the OOD split; a random order is the control.

Beside them: the unpatched model, every head ablated (k = H), and the strongest trivial predictor
we have without a model: SRAVEN, the best single rule applied to every feature (chosen on the
training instances); fuzzy logic, the target of the nearest context input (1-NN), and the mean
context target. Each model's rows are kept in `per_model/` and reused.
Writes `head_ablation.csv/.json/.md`, `head_ablation_single_<task>.png`,
`head_ablation_cumulative_<task>.png` and `head_ablation.html` under --out.

    python analyses/head_ablation.py --runs-from models --task sraven --attention hyla
"""

from __future__ import annotations

from pathlib import Path

import common
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from latentcode.store import Site

HEADLINE = {"sraven": "accuracy", "fuzzy_logic": "r2"}
MODEL_COLORS = {"softmax": "tab:blue", "linear": "tab:orange", "hyla": "tab:green"}
KINDS = ("zero", "mean")


def loss(task, prediction: np.ndarray, batch) -> float:
    """Cross-entropy (SRAVEN, all query positions) or mean squared error (fuzzy logic)."""
    if task.objective == "regression":
        return float(((prediction[:, :, 0] - batch.y) ** 2).mean())
    shifted = prediction - prediction.max(-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-np.take_along_axis(log_probabilities, batch.y[..., None], -1).mean())


def trivial_baselines(task, ood, training) -> dict[str, float]:
    """The headline metric on `ood` of predictors that use no model (see the module docstring)."""
    if task.name == "sraven":
        def accuracy(batch, rule) -> float:
            correct = []
            for position in range(task.n_features):
                feature = batch.labels["column_permutations"][:, -1, position]
                answers, _ = task.counterfactual_answer(batch, feature, rule)
                correct.append(answers == batch.y[:, position])
            return float(np.all(correct, axis=0).mean())

        from latentcode.tasks import RULES

        best = max(range(len(RULES)), key=lambda rule: accuracy(training, rule))
        return {f"best single rule ({RULES[best]}, chosen on train)": accuracy(ood, best),
                "chance": 1 / task.n_values**task.n_features}
    n_variables = task.n_variables
    context, targets = ood.x[:, :-1, :n_variables], ood.x[:, :-1, n_variables]
    query = ood.x[:, -1:, :n_variables]
    nearest = ((context - query) ** 2).sum(-1).argmin(1)
    one_nn = targets[np.arange(len(ood)), nearest]
    return {"1-NN in context": task.evaluate(one_nn[:, None, None], ood)["r2"],
            "mean context target": task.evaluate(targets.mean(1)[:, None, None], ood)["r2"]}


def run_model(name: str, run: Path, args) -> list[dict]:
    from latentcode.intervention import (  # torch: only when measuring
        MeanAblate,
        ZeroAblate,
    )

    model, task, variant = common.load_run(run)
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    headline = HEADLINE[task.name]
    layer_sites = {layer: [Site(layer, query, key) for query in range(task.seq_len) for key in range(task.seq_len)]
                   for layer in range(n_layers)}
    every_site = [site for sites in layer_sites.values() for site in sites]
    means_batch = common.sample(task, args.n_means, "train", variant, seed=common.EXPERIMENT_SEED + 1)
    means = common.record_codes(model, means_batch.x, every_site, batch_size=args.batch_size, mean=True)
    order_batch = common.sample(task, args.n_order, "train", variant, seed=common.EXPERIMENT_SEED + 2)
    ood = common.sample(task, args.n, "ood", variant)
    ood_single = common.subset(ood, np.arange(len(ood)) < args.n_single)

    def measure(batch, ablated: dict[int, list[int]], kind: str) -> dict[str, float]:
        edits = [ZeroAblate(heads=heads, sites=layer_sites[layer]) if kind == "zero"
                 else MeanAblate(means, heads=heads, sites=layer_sites[layer])
                 for layer, heads in ablated.items() if len(heads)]
        edits_for = (lambda start, stop: edits) if edits else None
        prediction = common.predict(model, batch.x, task.n_predictions, edits_for, every_site[:1],
                                    task.config(), args.batch_size)
        return {headline: task.evaluate(prediction, batch)[headline], "loss": loss(task, prediction, batch)}

    base = {"model": name, "task": task.name, "variant": variant, "metric": headline}
    rows = []
    before_id, before_ood = measure(order_batch, {}, "zero"), measure(ood, {}, "zero")
    before_single = measure(ood_single, {}, "zero")
    rows.append({**base, "experiment": "unpatched", "kind": "none", "layer": None, "head": None, "k": 0,
                 "order": None, "split": "ood", "n": len(ood), "value": before_ood[headline],
                 "train_loss": before_id["loss"]})
    for baseline, value in trivial_baselines(task, ood, order_batch).items():
        rows.append({**base, "experiment": "trivial baseline", "kind": baseline, "layer": None, "head": None,
                     "k": None, "order": None, "split": "ood", "n": len(ood), "value": value})
    damage = {}
    for kind in KINDS:
        for layer in range(n_layers):
            for head in range(n_heads):
                in_distribution = measure(order_batch, {layer: [head]}, kind)
                out_of_distribution = measure(ood_single, {layer: [head]}, kind)
                damage[kind, layer, head] = in_distribution["loss"] - before_id["loss"]
                rows.append({**base, "experiment": "single head", "kind": kind, "layer": layer, "head": head,
                             "k": 1, "order": None, "split": "ood", "n": len(ood_single),
                             "value": out_of_distribution[headline],
                             "change": out_of_distribution[headline] - before_single[headline],
                             "train_loss": in_distribution["loss"], "train_loss_change": damage[kind, layer, head]})
            if not args.quiet:
                print(f"{name}: {kind} single heads of layer {layer} done", flush=True)
    rng = np.random.default_rng([args.seed, 3])
    ks = args.ablated_per_layer or (list(range(n_heads + 1)) if n_heads <= 8 else
                                    sorted({0, 1, 2, n_heads // 4, n_heads // 2, 3 * n_heads // 4,
                                            n_heads - 2, n_heads - 1, n_heads}))
    for kind in KINDS:
        orders = {
            "least train damage first": {layer: sorted(range(n_heads),
                                                       key=lambda head, at=layer: damage[kind, at, head])
                                         for layer in range(n_layers)},
            "random (control)": {layer: rng.permutation(n_heads).tolist() for layer in range(n_layers)},
        }
        for order_name, order in orders.items():
            for k in ks:
                ablated = {layer: order[layer][:k] for layer in range(n_layers)}
                result = measure(ood, ablated, kind)
                rows.append({**base, "experiment": "cumulative", "kind": kind, "layer": None, "head": None, "k": k,
                             "order": order_name, "split": "ood", "n": len(ood), "value": result[headline],
                             "change": result[headline] - before_ood[headline],
                             "heads_left": ";".join(f"L{layer}:" + ",".join(map(str, order[layer][k:]))
                                                    for layer in range(n_layers))})
        if not args.quiet:
            print(f"{name}: {kind} cumulative done", flush=True)
    return rows


def plot_single(table: pd.DataFrame, task: str, models: list[str]) -> Figure:
    rows = table[(table["task"] == task) & (table["experiment"] == "single head")]
    limit = float(np.nanmax(np.abs(rows["change"]))) or 1.0
    figure = Figure(figsize=(4.6 * len(models) + 1, 2.0 + 1.6 * len(KINDS) * max(1, rows["layer"].max() + 1) / 4),
                    dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(KINDS), len(models), squeeze=False)
    image = None
    for column, model in enumerate(models):
        for row_index, kind in enumerate(KINDS):
            cells = rows[(rows["model"] == model) & (rows["kind"] == kind)]
            grid = cells.pivot(index="layer", columns="head", values="change").to_numpy()
            axis = axes[row_index, column]
            image = axis.imshow(grid, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
            axis.set(xlabel="head", ylabel="layer", title=f"{model}: {kind}-ablated, one head at a time")
            axis.set_yticks(range(grid.shape[0]))
            axis.title.set_fontsize(9)
    metric = rows["metric"].iloc[0]
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label=f"change of OOD {metric}")
    figure.suptitle(f"{task}: change of OOD {metric} when one head's codes are ablated at every (query, key) pair "
                    f"of its layer\n({rows['variant'].iloc[0]} variant, n={int(rows['n'].iloc[0])} per cell; one "
                    "colour scale for all models, centred at 0)", fontsize=10)
    return figure


def plot_cumulative(table: pd.DataFrame, task: str, models: list[str]) -> Figure:
    rows = table[table["task"] == task]
    metric = rows["metric"].iloc[0]
    figure = Figure(figsize=(11, 5.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(KINDS), sharey=True)
    for axis, kind in zip(axes, KINDS, strict=True):
        for model in models:
            for order, style in (("least train damage first", "-"), ("random (control)", ":")):
                curve = rows[(rows["model"] == model) & (rows["experiment"] == "cumulative") & (rows["kind"] == kind)
                             & (rows["order"] == order)]
                axis.plot(curve["k"], curve["value"], style, marker="o", markersize=3,
                          color=MODEL_COLORS.get(model), label=f"{model}, {order}")
        baselines = rows[(rows["experiment"] == "trivial baseline") & (rows["model"] == models[0])]
        for (_, baseline), color in zip(baselines.iterrows(), ("black", "gray"), strict=False):
            axis.axhline(baseline["value"], color=color, linestyle="--", linewidth=1, label=baseline["kind"])
        axis.set(xlabel="heads ablated in every layer (H - 1: one head left per layer)", ylabel=f"OOD {metric}",
                 title=f"{kind}-ablation", ylim=(-1.0, 1.0) if metric == "r2" else (0.0, 1.0))
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=7)
    clipped = " (R² below -1 is off the axis: see the table)" if metric == "r2" else ""
    figure.suptitle(f"{task}: OOD {metric} as heads are ablated cumulatively ({rows['variant'].iloc[0]} variant, "
                    f"n={int(rows[rows['experiment'] == 'cumulative']['n'].iloc[0])}){clipped}", fontsize=10)
    return figure


def main() -> None:
    from latentcode.intervention import checkpoint_sha256_of

    parser = common.add_intervention_arguments(common.parser(__doc__, "head_ablation"), n=1024)
    parser.add_argument("--task", nargs="+", choices=tuple(HEADLINE), default=list(HEADLINE))
    parser.add_argument("--n-single", type=int, default=512, help="OOD instances per one-head ablation")
    parser.add_argument("--n-order", type=int, default=512, help="training instances that order the heads")
    parser.add_argument("--n-means", type=int, default=512, help="training instances of the mean codes")
    parser.add_argument("--ablated-per-layer", type=int, nargs="+", help="the k of the cumulative curve")
    args = parser.parse_args()
    rows, models_of = [], {}
    for task in args.task:
        runs = common.model_runs(args, task)
        models_of[task] = list(runs)
        for name, run in runs.items():
            key = (f"{task}-{name}-{checkpoint_sha256_of(run)[:12]}-n{args.n}-{args.n_single}-{args.n_order}-"
                   f"{args.n_means}-seed{args.seed}-k{'_'.join(map(str, args.ablated_per_layer or []))}")
            rows += common.cached(Path(args.out) / "per_model" / f"{key}.json",
                                  lambda name=name, run=run: run_model(name, run, args))
    out = Path(args.out)
    table = pd.DataFrame(rows)
    summary = table[table["experiment"] != "single head"][["task", "model", "experiment", "kind", "order", "k", "n",
                                                          "value"]]
    summary = summary.astype({"k": "Int64"}).fillna({"order": ""})
    singles = table[table["experiment"] == "single head"]
    worst = singles.loc[singles.groupby(["task", "model", "kind"])["change"].idxmin(),
                        ["task", "model", "kind", "layer", "head", "value", "change"]]
    figures = []
    with common.output_set(out / "head_ablation") as outputs:
        common.write_tables(outputs, table, out / "head_ablation", summary)
        for task in args.task:
            figures += [out / f"head_ablation_single_{task}.png", out / f"head_ablation_cumulative_{task}.png"]
            outputs.write_figure(figures[-2].with_suffix(""), plot_single(table, task, models_of[task]))
            outputs.write_figure(figures[-1].with_suffix(""), plot_cumulative(table, task, models_of[task]))
        common.write_html(outputs, out / "head_ablation.html", "Head ablation", [
            __doc__.split("\n\n    python")[0], "## Unpatched, baselines and cumulative ablation", summary,
            "## The most damaging single head per model", worst, "## Figures", *figures])
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print(worst.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {out / 'head_ablation.csv'}, {out / 'head_ablation.html'} and {len(figures)} figures")


if __name__ == "__main__":
    main()
