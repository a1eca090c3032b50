"""SRAVEN: cosine similarity between the mean latent code of each rule (the paper's Figure 4).

For each model, the mean latent code (`sraven-rule` sites, unpermuted instances, OOD split) of
every rule, their pairwise cosine similarity per layer, rows ordered by hierarchical clustering.
Writes `<model>_rule_similarity.png` and `<model>_rule_similarity.json` (matrices per layer), both
the paper's plain cosine; and `rule_similarity.png` / `rule_similarity_centred.png`, every model
and layer on one colour scale, plain and with the grand mean code subtracted (where the plain
cosines of softmax and linear attention all sit near 1).

    python analyses/sraven_rule_heatmap.py --scale cpu
"""

from __future__ import annotations

from pathlib import Path

import common

from latentcode.analysis import mean_code_similarity, plot_similarity
from latentcode.store import CodeFile
from latentcode.tasks import RULES


def main() -> None:
    args = common.parser(__doc__, "sraven_rule_heatmap").parse_args()
    runs = common.model_runs(args, "sraven")
    out = Path(args.out)
    all_codes = []
    for attention, run in runs.items():
        codes = common.codes_of(run, "sraven-rule", "unpermuted", args.n_codes, args.out, quiet=args.quiet)
        all_codes.append(codes)
        paths = plot_similarity(codes, "rule", out / f"{attention}_rule_similarity", split="ood", centre=False)
        matrices = {}
        for layer in CodeFile(codes).layers:
            similarity = mean_code_similarity(codes, "rule", layer=layer, split="ood")
            matrices[f"layer {layer}"] = {"rules": [RULES[int(v)] for v in similarity.values],
                                          "cosine": similarity.matrix.round(4).tolist()}
        common.write_json(out / f"{attention}_rule_similarity.json", matrices)
        print(f"wrote {paths[0]}")
    for centre, name in ((False, "rule_similarity"), (True, "rule_similarity_centred")):
        paths = plot_similarity(all_codes, "rule", out / name, split="ood", centre=centre)
        print(f"wrote {paths[0]}")


if __name__ == "__main__":
    main()
