"""Does code reuse predict compositional generalization? The code-reuse score of every recorded
fuzzy-logic run that keeps its weights, against its OOD R² (issue 36).

For each run (analyses/results/runs/fuzzy-*/ with model/): `latentcode.reuse.code_reuse` — (a)
decodability of the terms on unseen compositions, (b) reconstruction of their codes from the training
compositions' codes, (c) transplant of a one-term training neighbour's codes, each beside its
strongest trivial baseline, and the combined score (mean excess over the baselines;
`latentcode.analysis.reuse`). Then Spearman correlations over the runs between OOD R² (the run's final
metric on its fixed OOD evaluation set) and the score, each part's value and excess, and probe accuracy
alone (part (a)'s value), with n and two-sided p (scipy; small n: read the p-values as rough). OOD R²
is never used to compute any score.

Each run's parts are stored in OUT/per_model/ and reused (a run is measured once; delete its file to
measure again). Writes OUT/code_reuse.csv/.md (one row per run), OUT/correlations.csv/.md and the
scatter OUT/code_reuse_scatter.png.

    python analyses/code_reuse.py                       # every recorded fuzzy run with weights
    python analyses/code_reuse.py --out analyses/results/code_reuse
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import common
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

RECORDED = Path(__file__).resolve().parent / "results" / "runs"
PARTS = ("decodability", "reconstruction", "transplant")


def runs_with_weights(recorded: Path) -> list[Path]:
    return sorted(path.parent.parent for path in recorded.glob("fuzzy-*/model/model.safetensors")
                  if (path.parent.parent / "summary.json").is_file())


def describe(run: Path) -> dict:
    config = json.loads((run / "config.json").read_text())
    train = config["train"]
    summary = json.loads((run / "summary.json").read_text())
    return {"model": run.name, "attention": config["resolved_model_config"]["attention"],
            "heads": config["resolved_model_config"]["n_heads"], "frac_test": train["task"]["frac_test"],
            "steps": train["n_train_instances"] // train["batch_size"], "seed": train["seed"],
            "ood_r2": summary["final_metrics"]["ood"]["r2"], "test_r2": summary["final_metrics"]["test"]["r2"]}


def measure(run: Path, args) -> dict:
    from latentcode.reuse import code_reuse

    table = code_reuse(run, codes=Path(args.codes) / f"{run.name}-reuse-{args.n_codes}.h5", n_codes=args.n_codes,
                       n_pairs=args.n_pairs, seed=args.seed, progress=not args.quiet)
    return {"parts": table.drop(columns=["model"]).to_dict("records"), "score": table.attrs["score"],
            "pairs": table.attrs["pairs"]}


def row_of(run: Path, measured: dict) -> dict:
    row = describe(run)
    for part in measured["parts"]:
        name = part["part"]
        row |= {f"{name}": part["value"], f"{name}_baseline": part["baseline"],
                f"{name}_baseline_name": part["baseline_name"], f"{name}_excess": part["excess"]}
    row["score"] = measured["score"]
    return row


def correlations(table: pd.DataFrame) -> pd.DataFrame:
    from scipy.stats import spearmanr

    predictors = {"score (combined)": "score", "probe accuracy alone (a, value)": "decodability",
                  **{f"{part} excess": f"{part}_excess" for part in PARTS},
                  "reconstruction R² (b, value)": "reconstruction", "transplant follow (c, value)": "transplant"}
    rows = []
    for label, column in predictors.items():
        finite = table[[column, "ood_r2"]].dropna()
        rho, p = spearmanr(finite[column], finite["ood_r2"]) if len(finite) > 2 else (np.nan, np.nan)
        rows.append({"predictor": label, "spearman_rho_vs_ood_r2": float(rho), "p_two_sided": float(p),
                     "n_models": len(finite)})
    return pd.DataFrame(rows)


def marker_size(steps: int) -> float:
    return 30 + 50 * (steps >= 3000) + 40 * (steps >= 8000)


def scatter(table: pd.DataFrame, rho: float) -> Figure:
    figure = Figure(figsize=(11, 4.4), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 3, sharey=True)
    colors = dict(zip(sorted(table["attention"].unique()), [f"C{i}" for i in range(10)], strict=False))
    markers = {0.3: "s", 0.5: "D", 0.7: "o"}
    panels = (("score", "score (mean excess over baselines)", 0.0),
              ("decodability", "(a) probe balanced accuracy, OOD", 0.5),
              ("reconstruction", "(b) reconstruction R², OOD compositions", 0.0))
    for axis, (column, label, baseline) in zip(axes, panels, strict=True):
        axis.axvline(baseline, color="gray", linestyle="--", linewidth=1)
        for _, row in table.iterrows():
            size = marker_size(row["steps"])
            axis.scatter(row[column], 100 * row["ood_r2"], color=colors[row["attention"]],
                         marker=markers.get(row["frac_test"], "^"), s=size, edgecolor="black", linewidth=0.5)
        axis.set_xlabel(label, fontsize=8)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("OOD R² (%), final, fixed evaluation set")
    handles = [axes[0].scatter([], [], color=color, label=name) for name, color in colors.items()]
    handles += [axes[0].scatter([], [], color="white", edgecolor="black", marker=marker,
                                label=f"{int(100 * f)}% held out")
                for f, marker in markers.items() if f in set(table["frac_test"])]
    handles += [axes[0].scatter([], [], color="white", edgecolor="black", s=marker_size(steps),
                                label=f"{steps:,} steps")
                for steps in sorted(set(table["steps"]))]
    figure.legend(handles=handles, loc="outside right center", fontsize=7, title="attention / held out / steps",
                  title_fontsize=7)
    figure.suptitle(f"Fuzzy logic (L=4, K=2, T=32), {len(table)} models, seed 0: "
                    "code reuse on the ood split vs OOD R²\n"
                    f"codes: last-self, both layers, fixed_query variant; dashed: trivial level; Spearman ρ of the "
                    f"score {rho:.2f}", fontsize=9)
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-from", default=str(RECORDED), metavar="DIR",
                        help="finished fuzzy-logic runs with weights, DIR/fuzzy-*/model/ (default "
                             "analyses/results/runs)")
    parser.add_argument("--out", default="analyses/results/code_reuse", help="tables and figure (committed)")
    parser.add_argument("--codes", default="analyses/output/code_reuse/codes", help="extracted codes (not committed)")
    parser.add_argument("--n-codes", type=int, default=1024, help="instances per split (train, ood) for (a), (b)")
    parser.add_argument("--n-pairs", type=int, default=256, help="transplant pairs for (c)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="measure only these runs (names); the tables gather every "
                        "run measured so far")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    Path(args.codes).mkdir(parents=True, exist_ok=True)
    rows = []
    for run in runs_with_weights(Path(args.runs_from)):
        cache = out / "per_model" / f"{run.name}-n{args.n_codes}-pairs{args.n_pairs}-seed{args.seed}.json"
        if args.only is not None and run.name not in args.only and not cache.is_file():
            continue
        measured = common.cached(cache, lambda run=run: measure(run, args))
        rows.append(row_of(run, measured))
        if not args.quiet:
            print(f"{run.name}: score {measured['score']:.3f}", flush=True)
    table = pd.DataFrame(rows).sort_values(["attention", "frac_test", "steps", "heads"])
    correlation = correlations(table)
    rho = float(correlation.loc[correlation["predictor"] == "score (combined)", "spearman_rho_vs_ood_r2"].iloc[0])
    with common.output_set(out / "code_reuse") as outputs:
        common.write_tables(outputs, table, out / "code_reuse")
        common.write_tables(outputs, correlation, out / "correlations")
        outputs.write_figure(out / "code_reuse_scatter", scatter(table, rho))
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table.drop(columns=[c for c in table if c.endswith("_name")]).to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
        print(correlation.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {out / 'code_reuse.csv'}, {out / 'correlations.csv'}, {out / 'code_reuse_scatter.png'}")


if __name__ == "__main__":
    main()
