"""Topographic similarity: do tasks composed alike get alike latent codes? (a reviewer's request)

Per model, layer and split: the Spearman correlation, over pairs of tasks, between the distance of
their compositions (the L1 distance of rule counts of SRAVEN rule multisets, twice the number of
rules swapped; the Hamming distance of fuzzy-logic term sets) and the cosine distance of their mean
latent codes, with a permutation (Mantel) p-value (`latentcode.analysis.topography`). Codes are
the paper's sites on the task's analysis variant (SRAVEN `sraven-rule` on `unpermuted`: the last
query token, so the code speaks mainly of ONE rule of the multiset, the queried feature's; fuzzy
logic `last-self` on `fixed_query`), the mean code of a task taken over its instances in the
extracted set, per split: `train` (in-distribution tasks) and `ood` (held-out compositions).
`all layers` concatenates the layers' codes.

Beside each rho: the 95th percentile of its permutation null (what chance reaches), and the same
statistic computed from the mean raw inputs of each task (one-hot panels, or inputs and targets),
a baseline that needs no model: if the inputs alone are topographic, the codes' rho says little.
Writes `topographic_similarity.csv/.json/.md`, `topographic_similarity_<task>.png` and
`topographic_similarity.html` under --out.

    python analyses/topographic_similarity.py --runs-from models --n-codes 4096
"""

from __future__ import annotations

from pathlib import Path

import common
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import latentcode
from latentcode.analysis import (
    composition_counts,
    mean_codes_by_task,
    topographic_similarity,
)

PRESETS = ("sraven", "fuzzy_logic")
SPLITS = ("train", "ood")
MODEL_COLORS = {"softmax": "tab:blue", "linear": "tab:orange", "hyla": "tab:green"}


PARTS = {"sraven": "rule", "fuzzy_logic": "terms"}  # the label whose value names are the parts


def n_parts(task) -> int:
    """How many parts compositions are made of: 8 SRAVEN rules, 2**L fuzzy-logic terms."""
    return len(task.value_names()[PARTS[task.name]])


def row_of(topography, **columns) -> dict:
    return {**columns, "rho": topography.rho, "p_value": topography.p_value,
            "null_95": float(np.quantile(topography.null_rhos, 0.95)), "n_tasks": topography.n_tasks,
            "n_permutations": topography.n_permutations, "code_metric": topography.code_metric}


def measure(task_object, codes_by_layer: dict, task_index: np.ndarray, args, **columns) -> list[dict]:
    rows = []
    for layer, codes in codes_by_layer.items():
        tasks, means = mean_codes_by_task(codes, task_index)
        compositions = composition_counts(task_object.all_combinations[tasks], n_parts(task_object))
        topography = topographic_similarity(means, compositions, n_permutations=args.permutations, seed=args.seed)
        rows.append(row_of(topography, layer=layer, **columns))
    return rows


def run_model(preset: str, name: str, run: Path, args) -> list[dict]:
    task = latentcode.Run(run).task()
    selector, variant = task.analysis.selector, task.analysis.variant
    path = common.codes_of(run, selector, variant, args.n_codes, args.out, splits=SPLITS, quiet=args.quiet)
    codes_file = latentcode.CodeFile(path)
    rows = []
    for split in SPLITS:
        per_layer = {f"layer {layer}": codes_file.layer_codes(layer, split) for layer in codes_file.layers}
        per_layer["all layers"] = np.concatenate(list(per_layer.values()), axis=1)
        rows += measure(task, per_layer, codes_file.labels("task_index", split), args, task=preset, model=name,
                        split=split, site_set=selector, variant=variant,
                        n_instances=int(codes_file.split_mask(split).sum()))
    return rows


def input_baseline(preset: str, task, args) -> list[dict]:
    """The same statistic from each task's mean input (no model)."""
    variant = task.analysis.variant
    rows = []
    for split in SPLITS:
        batch = common.sample(task, args.n_codes, split, variant)
        rows += measure(task, {"inputs": batch.x.reshape(len(batch), -1)}, batch.labels["task_index"], args,
                        task=preset, model="raw inputs (no model)", split=split, site_set="inputs", variant=variant,
                        n_instances=len(batch))
    return rows


def plot(table: pd.DataFrame, preset: str, models: list[str]) -> Figure:
    rows = table[table["task"] == preset]
    model_rows = rows[rows["model"].isin(models)]
    layers = list(dict.fromkeys(model_rows["layer"]))
    figure = Figure(figsize=(5.2 * len(SPLITS), 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(SPLITS), sharey=True)
    width = 0.8 / len(models)
    for axis, split in zip(axes, SPLITS, strict=True):
        for index, model in enumerate(models):
            values = model_rows[(model_rows["model"] == model)
                                & (model_rows["split"] == split)].set_index("layer").loc[layers]
            positions = np.arange(len(layers)) + (index - (len(models) - 1) / 2) * width
            axis.bar(positions, values["rho"], width, color=MODEL_COLORS.get(model), label=model)
            axis.scatter(positions, values["null_95"], marker="_", s=120, color="black",
                         label="95th percentile of the permutation null" if index == 0 else None, zorder=3)
        baseline = rows[(rows["site_set"] == "inputs") & (rows["split"] == split)]
        if len(baseline):
            axis.axhline(baseline["rho"].iloc[0], color="gray", linestyle="--", linewidth=1,
                         label="raw inputs (no model)")
        axis.axhline(0, color="black", linewidth=0.5)
        n_tasks = int(values["n_tasks"].iloc[0])
        axis.set_xticks(range(len(layers)), layers, fontsize=8)
        axis.set(ylabel="Spearman rho (composition vs code distance)",
                 title=f"{split} split ({'held-out' if split == 'ood' else 'training'} tasks, {n_tasks} tasks)")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    first = model_rows.iloc[0]
    figure.suptitle(f"{preset}: topographic similarity of mean latent codes, site set {first['site_set']}, "
                    f"{first['variant']} variant, cosine code distance (no bar: the codes do not vary)", fontsize=10)
    return figure


def main() -> None:
    parser = common.parser(__doc__, "topographic_similarity")
    parser.add_argument("--task", nargs="+", choices=PRESETS, default=list(PRESETS))
    parser.add_argument("--permutations", type=int, default=1000, help="permutations of the Mantel test")
    parser.add_argument("--seed", type=int, default=0, help="seeds the permutations")
    args = parser.parse_args()
    rows = []
    out = Path(args.out)
    models_of = {}
    for preset in args.task:
        runs = common.model_runs(args, preset)
        models_of[preset] = list(runs)
        for name, run in runs.items():
            rows += run_model(preset, name, run, args)
        rows += input_baseline(preset, latentcode.Run(next(iter(runs.values()))).task(), args)
    table = pd.DataFrame(rows)
    summary = table[["task", "split", "layer", "model", "rho", "p_value", "null_95", "n_tasks"]]
    figures = [out / f"topographic_similarity_{preset}.png" for preset in args.task]
    with common.output_set(out / "topographic_similarity") as outputs:
        common.write_tables(outputs, table, out / "topographic_similarity", summary)
        for preset, path in zip(args.task, figures, strict=True):
            outputs.write_figure(path.with_suffix(""), plot(table, preset, models_of[preset]))
        common.write_html(outputs, out / "topographic_similarity.html", "Topographic similarity of latent codes", [
            __doc__.split("\n\n    python")[0], "## Table", summary, "## Figures", *figures])
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {out / 'topographic_similarity.csv'}, "
          f"{out / 'topographic_similarity.html'} and {len(figures)} figures")


if __name__ == "__main__":
    main()
