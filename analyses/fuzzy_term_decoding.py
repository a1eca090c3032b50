"""Fuzzy logic: decoding each term of the function from the latent codes, per layer.

As the paper (and the authors' analysis): the latent code of the last token attending to itself
(`last-self`, every layer) on the fixed-query variant; one logistic regression per term, fitted on
in-distribution functions (`train`) and scored on unseen combinations (`ood`); F1, balanced
accuracy and AUROC per term and their means, beside baselines (majority, prevalence-matched
random, all terms present, shuffled labels), the layer chosen by cross-validation on `train`.
Also the ridge R² from the codes to the negation bits (the authors' summary). Writes
`term_decoding.csv`/`.json`, `negation_bits_r2.csv` and `term_decoding.png`.

    python analyses/fuzzy_term_decoding.py --scale cpu --set frac_test=0.7
"""

from __future__ import annotations

from pathlib import Path

import common

from latentcode.analysis import (
    decode,
    headline_lines,
    plot_probe_scores,
    regress,
    summary_rows,
    write_table,
)


def main() -> None:
    args = common.parser(__doc__, "fuzzy_term_decoding").parse_args()
    runs = common.model_runs(args, "fuzzy_logic")
    files = [common.codes_of(run, "last-self", "fixed_query", args.n_codes, args.out, quiet=args.quiet)
             for run in runs.values()]
    out = Path(args.out)
    table = decode(files, "term_present", fit_split="train", test_split="ood")
    write_table(table, out / "term_decoding")
    plot_probe_scores(table, out / "term_decoding", metric="mean_balanced_accuracy")
    ridge = regress(files, "negation_bits", fit_split="train", test_split="ood")
    write_table(ridge, out / "negation_bits_r2")
    columns = ["model", "layer", "metric", "value", "validation", "selected", "strongest_baseline",
               "strongest_baseline_value"]
    print(summary_rows(table)[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\n".join(headline_lines(table)))
    print(ridge[ridge["metric"] == "mean_r2"][["model", "layer", "value", "shuffled_labels"]].to_string(index=False))
    print(f"wrote {out / 'term_decoding.csv'} and {out / 'term_decoding.png'}")


if __name__ == "__main__":
    main()
