"""`latentcode probe`: decode a label from the latent codes of one or several codes files with linear
probes, beside baselines."""

from __future__ import annotations

import argparse

from latentcode.cli.arguments import FIGURE_FORMATS, SEED, add_max_rows_argument, formats, integer, progress_bars
from latentcode.cli.checks import command_outputs, note_caps, note_in_sample
from latentcode.cli.command import Command, command_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(
        subparsers, "probe", help="decode a label from latent codes with linear probes",
        description="Fit a logistic regression (categorical or multi-hot labels; --ridge: ridge regression R^2) per "
        "layer on one split and score it on another, beside baselines (majority, prevalence-matched random, "
        "all-present for multi-hot labels, label-shuffled probe); the best layer is chosen by cross-validation on the "
        "fit split, never on the test split. Several files are compared side by side (one model each).",
        epilog="example:\n  latentcode probe softmax.h5 linear.h5 hyla.h5 --label rule --fit-split train --test-split "
               "ood "
        "--out results/rule")
    parser.add_argument("files", nargs="+", metavar="CODES.h5")
    parser.add_argument("--label", help="label to decode; name, name[i] or name[-1] (default: rule for SRAVEN, "
                        "term_present for fuzzy logic)")
    parser.add_argument("--fit-split", default="train")
    parser.add_argument("--test-split", default="ood")
    parser.add_argument("--per-site", action="store_true", help="one probe per site instead of per layer")
    parser.add_argument("--ridge", action="store_true", help="ridge regression R^2 (continuous or multi-hot labels)")
    parser.add_argument("--cv", type=integer(2), default=3, help="cross-validation folds on the fit split (default 3)")
    parser.add_argument("--seed", type=SEED, default=0)
    add_max_rows_argument(parser)
    parser.add_argument("--out", help="path stem for the table (.csv, .json) and the plot (.png); default: print only")
    parser.add_argument("--format", action="append", choices=FIGURE_FORMATS, help="plot formats (default png)")
    parser.add_argument("--overwrite", action="store_true", help="replace the table and plot if --out has them")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def check(args: argparse.Namespace) -> None:
    """Codes files of one task, a label they all have and a probe can learn, splits, the outputs: the
    plan `decode` and `regress` make too (`plan_probe`)."""
    from latentcode.analysis.probe_plan import plan_probe

    plan = plan_probe(args.files, args.label, args.fit_split, args.test_split, cv=args.cv, seed=args.seed,
                      max_rows=args.max_rows, out=args.out, formats=formats(args), overwrite=args.overwrite)
    args.code_files, args.label = note_caps(plan.code_files, args.seed, "probe"), plan.label  # what run reads
    note_in_sample(args.fit_split, args.test_split)


def run(args: argparse.Namespace) -> None:
    from latentcode.analysis import decode, headline_lines, plot_probe_scores, regress, summary_rows, write_table

    label = args.label
    probe = regress if args.ridge else decode
    table = probe(args.code_files, label, fit_split=args.fit_split, test_split=args.test_split, per_site=args.per_site,
                  cv=args.cv, seed=args.seed, progress=progress_bars(args))
    columns = ["model", "layer", "site", "label", "metric", "value", "validation", "selected", "strongest_baseline",
               "strongest_baseline_value", "beats_baselines", "n_fit", "n_test"]
    import pandas

    with pandas.option_context("display.width", 250, "display.max_rows", 200):
        print(summary_rows(table)[columns].to_string(index=False, float_format=lambda value: f"{value:.3f}"))
    print("\n".join(headline_lines(table)))
    if args.out:
        suffixes = (".csv", ".json", *(f".{fmt}" for fmt in formats(args)))
        with command_outputs(args.out, suffixes, args.overwrite, "latentcode probe") as outputs:
            write_table(table, args.out)  # both join the command's set: the table and plot, or nothing
            plot_probe_scores(table, args.out, formats=formats(args))
        print("wrote " + ", ".join(map(str, outputs.written)))


COMMAND = Command(register, check, run, order=70, parameters={"code_files": "files"})
