"""tSNE of the latent codes on unseen task compositions, coloured by the sub-task.

The paper (Figure 3) shows that HYLA's latent codes cluster by the rule a query position follows
(SRAVEN) or by the function's terms (fuzzy logic), even on OOD compositions. This script draws, for
each model, the tSNE of the codes of every layer on the OOD split: SRAVEN coloured by the rule of
the query position (`sraven-rule` sites, unpermuted), fuzzy logic by the first term of the function
(`last-self`, fixed query). Writes `<model>_tsne.png` per model.

    python analyses/latent_tsne.py --task sraven --scale cpu
"""

from __future__ import annotations

from pathlib import Path

import common

from latentcode.analysis import plot_embedding

SETTINGS = {"sraven": ("sraven-rule", "unpermuted", "rule"), "fuzzy_logic": ("last-self", "fixed_query", "terms[0]")}


def main() -> None:
    parser = common.parser(__doc__, "latent_tsne")
    parser.add_argument("--task", choices=tuple(SETTINGS), default="sraven")
    parser.add_argument("--max-points", type=int, default=2000)
    parser.add_argument("--method", choices=("tsne", "umap"), default="tsne")
    args = parser.parse_args()
    selector, variant, color = SETTINGS[args.task]
    runs = common.model_runs(args, args.task)
    out = Path(args.out)
    for attention, run in runs.items():
        codes = common.codes_of(run, selector, variant, args.n_codes, args.out, quiet=args.quiet)
        paths = plot_embedding(codes, color, out / f"{attention}_{args.method}", method=args.method, split="ood",
                               max_points=args.max_points)
        print(f"wrote {paths[0]}")


if __name__ == "__main__":
    main()
