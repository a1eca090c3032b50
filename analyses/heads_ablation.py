"""One head versus many: OOD performance when attention has no latent code to speak of.

The paper (Section 5) finds that a single head, which removes the hypernetwork's low-dimensional
code (the code of a pair is one number), generalizes worse to unseen compositions than many heads.
This script trains each attention preset with `--heads` values (kqv_dim fixed, so one head is one
wide head) and writes `heads_ablation.csv`/`.json` and `heads_ablation.png` (OOD metric per
preset and head count, in-distribution test metric beside it).

    python analyses/heads_ablation.py --task sraven --scale cpu --heads 1 16
"""

from __future__ import annotations

from pathlib import Path

import common
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

METRIC = {"sraven": "accuracy", "fuzzy_logic": "r2"}


def main() -> None:
    parser = common.parser(__doc__, "heads_ablation")
    parser.add_argument("--task", choices=tuple(METRIC), default="sraven")
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    metric = METRIC[args.task]
    rows = common.train_grid(args, args.task, {"attention": list(args.attention), "n_heads": args.heads})
    table = pd.DataFrame([{"attention": r["attention"], "n_heads": r["n_heads"], "seed": r["seed"],
                           "status": r["status"], f"ood.{metric}": r.get(f"ood.{metric}"),
                           f"test.{metric}": r.get(f"test.{metric}")} for r in rows])
    out = Path(args.out)
    mean = table.groupby(["attention", "n_heads"], as_index=False)[[f"ood.{metric}", f"test.{metric}"]].mean()

    figure = Figure(figsize=(6.4, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    width = 0.8 / len(args.heads)
    positions = np.arange(len(args.attention))
    for index, heads in enumerate(args.heads):
        values = [mean[(mean["attention"] == a) & (mean["n_heads"] == heads)][f"ood.{metric}"].mean()
                  for a in args.attention]
        axis.bar(positions + index * width, values, width, label=f"{heads} head{'s' * (heads > 1)}")
    axis.set_xticks(positions + width * (len(args.heads) - 1) / 2, args.attention)
    axis.set(ylabel=f"OOD {metric}", title=f"{args.task}: one head vs many (scale {args.scale})")
    axis.legend()
    figure.tight_layout()
    # The JSON keeps its indent of 2, so the table is not write_table's (indent 1).
    with common.output_set(out / "heads_ablation") as outputs:
        outputs.write_text(out / "heads_ablation.csv", table.to_csv(index=False))
        outputs.write_text(out / "heads_ablation.json", table.to_json(orient="records", indent=2))
        outputs.write_figure(out / "heads_ablation", figure)
    print(mean.to_string(index=False))
    print(f"wrote {out / 'heads_ablation.csv'} and {out / 'heads_ablation.png'}")


if __name__ == "__main__":
    main()
