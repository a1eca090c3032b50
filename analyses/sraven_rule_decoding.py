"""SRAVEN: decoding the rule of the query position from the latent codes, per layer.

As the paper (and the authors' analysis): the codes of the last query token attending to the same
feature in the last row's two context panels (`sraven-rule`, every layer), on unpermuted
instances; a logistic regression fitted on in-distribution rule combinations (`train`) and scored
on held-out ones (`ood`): accuracy, balanced accuracy and macro-F1 beside baselines (majority
class, prevalence-matched random, shuffled-label probe), the layer chosen by cross-validation on
`train`. Writes `rule_decoding.csv`/`.json` and `rule_decoding.png` (one line per model).

    python analyses/sraven_rule_decoding.py --scale cpu
    python analyses/sraven_rule_decoding.py --runs-from models      # the shipped checkpoints
"""

from __future__ import annotations

from pathlib import Path

import common

from latentcode.analysis import decode, headline_lines, plot_probe_scores, write_table


def trained_on(runs) -> str:
    """What the models were trained on, for the figure's title: the codes are read on unpermuted
    instances whatever the training variant."""
    import latentcode

    tasks = {(run.config.variant or run.task().variants[0], run.task().n_features)
             for run in map(latentcode.Run, runs)}
    return "models trained on " + "; ".join(f"the {variant} variant, M = {features}"
                                            for variant, features in sorted(tasks))


def main() -> None:
    args = common.parser(__doc__, "sraven_rule_decoding").parse_args()
    runs = common.model_runs(args, "sraven")
    files = [common.codes_of(run, "sraven-rule", "unpermuted", args.n_codes, args.out, quiet=args.quiet)
             for run in runs.values()]
    out = Path(args.out)
    table = decode(files, "rule", fit_split="train", test_split="ood")
    write_table(table, out / "rule_decoding")
    plot_probe_scores(table, out / "rule_decoding", metric="accuracy", models_note=trained_on(runs.values()))
    print(table[["model", "layer", "metric", "value", "validation", "selected", "strongest_baseline",
                 "strongest_baseline_value"]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\n".join(headline_lines(table)))
    print(f"wrote {out / 'rule_decoding.csv'} and {out / 'rule_decoding.png'}")


if __name__ == "__main__":
    main()
