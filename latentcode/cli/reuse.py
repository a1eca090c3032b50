"""`latentcode reuse`: the code-reuse score of a trained fuzzy-logic model: decodability of the
constituents on unseen compositions, reconstruction of their codes from the training compositions'
and transplant of a training composition's codes, each beside its baseline (`latentcode.reuse`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from latentcode.cli.arguments import POSITIVE_INTEGER, integer, progress_bars
from latentcode.cli.checks import command_outputs
from latentcode.cli.command import Command, command_parser
from latentcode.reuse import SUFFIXES  # torch-free: the table's files


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(
        subparsers, "reuse",
        help="code-reuse score of a trained model: are unseen compositions' codes built from training ones?",
        description="Measure how a trained model reuses its latent codes on unseen compositions (fuzzy logic): "
        "(a) a probe per term fitted on training compositions, scored on unseen ones; (b) the unseen compositions' "
        "mean codes predicted linearly from their terms, the map fitted on training compositions (R²); (c) a one-term "
        "training neighbour's codes patched into an unseen composition, how often the model computes the "
        "neighbour's function. Each beside its strongest trivial baseline; the score is their mean excess.",
        epilog="example:\n  latentcode reuse runs/fuzzy-hyla --out results/reuse-hyla")
    parser.add_argument("run", metavar="RUN_DIR", help="a finished fuzzy-logic run directory (with model/)")
    parser.add_argument("--out", required=True, help="path stem of the table (.csv, .json); the codes go to "
                        "OUT-codes.h5 (reused when it is there)")
    parser.add_argument("--n-codes", type=POSITIVE_INTEGER, default=1024,
                        help="instances per split (train, ood) whose codes are read (default 1024)")
    parser.add_argument("--n-pairs", type=POSITIVE_INTEGER, default=256, help="transplant pairs (default 256)")
    parser.add_argument("--seed", type=integer(0), default=0,
                        help="seeds the probes' folds, the shuffles and the pairs (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace the table if --out has one")
    parser.add_argument("--quiet", action="store_true")
    return parser


def check(args: argparse.Namespace) -> None:
    """The run (finished, with weights, a task the score applies to), the codes and the outputs, without
    torch: the plan `code_reuse` makes too (`plan_reuse`)."""
    from latentcode.reuse import plan_reuse

    args.plan = plan_reuse(args.run, codes=f"{args.out}-codes.h5", n_codes=args.n_codes, n_pairs=args.n_pairs,
                           seed=args.seed, out=args.out, overwrite=args.overwrite)


def run(args: argparse.Namespace) -> None:
    from latentcode.reuse import code_reuse

    plan = args.plan
    table = code_reuse(plan.run, codes=plan.codes, n_codes=plan.n_codes, n_pairs=plan.n_pairs, seed=plan.seed,
                       progress=progress_bars(args))
    with command_outputs(args.out, SUFFIXES, args.overwrite, "writing the code-reuse table") as outputs:
        outputs.write_table(Path(args.out), table)
    if not args.quiet:
        columns = ["part", "metric", "value", "baseline", "baseline_name", "excess", "n_test", "n_test_compositions"]
        print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print(f"code-reuse score (mean excess over the baselines): {table.attrs['score']:.3f}; "
              f"OOD R² of the run: {table.attrs['ood_r2']}")
        print(f"wrote {args.out}.csv, {args.out}.json")


COMMAND = Command(register, check, run, order=75)
