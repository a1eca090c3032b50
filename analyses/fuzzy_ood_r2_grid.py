"""Fuzzy logic: OOD R² over sequence length and held-out fraction, for softmax, linear and HYLA.

The paper (Figure 2) trains on fuzzy-logic functions with N examples in context and a fraction
`frac_test` of the term combinations held out, and reports R² on the held-out combinations.
This script trains that grid and writes `ood_r2.csv`/`.json` (one row per run, mean over seeds
in `ood_r2_mean.csv`) and `ood_r2.png` (one panel per held-out fraction, R² against N).

    python analyses/fuzzy_ood_r2_grid.py --scale cpu --seq-lens 16 32 64 96 --fracs 0.3 0.5 0.7
"""

from __future__ import annotations

from pathlib import Path

import common
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def main() -> None:
    parser = common.parser(__doc__, "fuzzy_ood_r2_grid")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[16, 32, 64, 96])
    parser.add_argument("--fracs", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    args = parser.parse_args()
    rows = common.train_grid(args, "fuzzy_logic", {"attention": list(args.attention), "seq_len": args.seq_lens,
                                                   "frac_test": args.fracs})
    table = pd.DataFrame([{key: row.get(key) for key in ("attention", "seq_len", "frac_test", "seed", "status",
                                                          "ood.r2", "test.r2", "unseen_terms.r2", "wall_seconds")}
                          for row in rows])
    out = Path(args.out)
    mean = table.groupby(["attention", "frac_test", "seq_len"], as_index=False)[["ood.r2", "test.r2"]].mean()

    figure = Figure(figsize=(4.2 * len(args.fracs), 3.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(args.fracs), squeeze=False)[0]
    for axis, frac in zip(axes, args.fracs, strict=True):
        for attention in args.attention:
            points = mean[(mean["attention"] == attention) & (mean["frac_test"] == frac)].sort_values("seq_len")
            axis.plot(points["seq_len"], points["ood.r2"], marker="o", label=attention)
        axis.set(title=f"{frac:.0%} of combinations held out", xlabel="examples in context N", ylabel="OOD R²")
        axis.set_xticks(args.seq_lens)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(f"Fuzzy logic (L=4, K=2): R² on unseen term combinations, scale {args.scale}")
    figure.tight_layout()
    # The JSON keeps its indent of 2 and the mean has no JSON, so the tables are not write_table's.
    with common.output_set(out / "ood_r2") as outputs:
        outputs.write_text(out / "ood_r2.csv", table.to_csv(index=False))
        outputs.write_text(out / "ood_r2.json", table.to_json(orient="records", indent=2))
        outputs.write_text(out / "ood_r2_mean.csv", mean.to_csv(index=False))
        outputs.write_figure(out / "ood_r2", figure)
    print(mean.to_string(index=False))
    print(f"wrote {out / 'ood_r2.csv'} and {out / 'ood_r2.png'}")


if __name__ == "__main__":
    main()
