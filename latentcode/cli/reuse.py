"""`latentcode reuse`: the code-reuse score of a trained fuzzy-logic model (issue 36): decodability of the
constituents on unseen compositions, reconstruction of their codes from the training compositions'
and transplant of a training composition's codes, each beside its baseline (`latentcode.reuse`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from latentcode.cli.arguments import POSITIVE_INTEGER, integer, progress_bars
from latentcode.cli.checks import check_output, check_stem_free, command_outputs
from latentcode.cli.command import Command
from latentcode.errors import UsageError

SUFFIXES = (".csv", ".json")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "reuse",
        help="code-reuse score of a trained model: are unseen compositions' codes built from training ones?",
        description="Measure how a trained model reuses its latent codes on unseen compositions (fuzzy logic): "
        "(a) a probe per term fitted on training compositions, scored on unseen ones; (b) the unseen compositions' "
        "mean codes predicted linearly from their terms, the map fitted on training compositions (R²); (c) a one-term "
        "training neighbour's codes patched into an unseen composition, how often the model computes the "
        "neighbour's function. Each beside its strongest trivial baseline; the score is their mean excess.",
        epilog="example:\n  latentcode reuse runs/fuzzy-hyla --out results/reuse-hyla",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    """The run (finished, with weights, a task the score applies to) and the outputs, without torch."""
    from latentcode.reuse import reuse_task_problem
    from latentcode.rundir import RunDirectory, RunRecord
    from latentcode.tasks import get_task

    path = Path(args.run)
    if not (path.is_dir() and RunDirectory(path).looks_like_a_run()):
        raise UsageError(f"RUN_DIR {path} is not a run directory (config.json, model/); expected a finished run")
    if not (path / "model" / "model.safetensors").is_file():
        raise UsageError(f"RUN_DIR {path} has no final model (model/model.safetensors): the run has not finished, "
                         "or was recorded without weights")
    problem = reuse_task_problem(get_task(**RunRecord.read(path).task_config))
    if problem:
        raise UsageError(f"RUN_DIR {path}: {problem}")
    check_output(args.out, "--out", kind="stem")
    check_stem_free(args.out, SUFFIXES, args.overwrite)


def run(args: argparse.Namespace) -> None:
    from latentcode.reuse import code_reuse

    table = code_reuse(args.run, codes=f"{args.out}-codes.h5", n_codes=args.n_codes, n_pairs=args.n_pairs,
                       seed=args.seed, progress=progress_bars(args))
    with command_outputs(args.out, SUFFIXES, args.overwrite, "writing the code-reuse table") as outputs:
        outputs.write_table(Path(args.out), table)
    if not args.quiet:
        columns = ["part", "metric", "value", "baseline", "baseline_name", "excess", "n_test", "n_test_compositions"]
        print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print(f"code-reuse score (mean excess over the baselines): {table.attrs['score']:.3f}; "
              f"OOD R² of the run: {table.attrs['ood_r2']}")
        print(f"wrote {args.out}.csv, {args.out}.json")


COMMAND = Command(register, check, run, order=75)
