"""`latentcode report`: one offline HTML page for one or several runs and their codes files."""

from __future__ import annotations

import argparse

from latentcode.cli.arguments import POSITIVE_INTEGER, add_max_rows_argument, progress_bars
from latentcode.cli.checks import note_caps, note_in_sample
from latentcode.cli.command import Command


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report", help="one offline HTML page: training curves, metrics, probe tables and plots",
        description="Write one self-contained HTML page (no JavaScript) for one or several runs: training curves, "
        "final metrics per split, probe tables and figures for their codes files (RUN_DIR/codes/*.h5, or --codes).",
    )
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR")
    parser.add_argument("--codes", action="append", metavar="CODES.h5",
                        help="codes files (default: RUN_DIR/codes/*.h5)")
    parser.add_argument("--label", help="label to decode and colour by (default: the task's sub-task label)")
    parser.add_argument("--fit-split", default="train")
    parser.add_argument("--test-split", default="ood")
    parser.add_argument("--method", action="append", choices=("tsne", "umap"), help="embeddings to draw (default tsne)")
    parser.add_argument("--max-points", type=POSITIVE_INTEGER, default=1000)
    parser.add_argument("--title", default="latentcode report")
    parser.add_argument("--patch", action="append", metavar="STEM", help="outputs of latentcode patch (STEM.csv, "
                        "STEM.json, STEM.png) to show in an Interventions section (repeatable)")
    parser.add_argument("--out", default="report.html", help="the HTML page to write (default report.html; a name "
                        "without .html gets it); its figures and tables go beside it, in NAME_files/")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    add_max_rows_argument(parser)
    return parser


def check(args: argparse.Namespace) -> None:
    """Runs and codes files that belong together, a label they all have, an output to write: the plan
    `build_report` makes too (`args.plan`)."""
    from latentcode.analysis.report_plan import SEED, plan_report

    args.plan = plan_report(args.runs, args.codes or (), args.out, label=args.label, fit_split=args.fit_split,
                            test_split=args.test_split, methods=tuple(args.method or ["tsne"]),
                            max_points=args.max_points, title=args.title, overwrite=args.overwrite,
                            patches=args.patch or (), max_rows=args.max_rows)
    note_caps(args.plan.code_files, SEED, "report")
    note_in_sample(args.fit_split, args.test_split)


def run(args: argparse.Namespace) -> None:
    from latentcode.analysis.report import run_report

    report = run_report(args.plan, progress=progress_bars(args))
    print(f"report: {report.path.resolve()}")
    for line in report.headline():
        print("  " + line)


COMMAND = Command(register, check, run, order=110,
                  parameters={"run_dirs": "runs", "codes_files": "codes", "patches": "patch"})
