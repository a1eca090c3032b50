"""`latentcode report`: one offline HTML page for one or several runs and their codes files."""

from __future__ import annotations

import argparse
from pathlib import Path

from latentcode.cli.arguments import POSITIVE_INTEGER, add_max_rows_argument, progress_bars
from latentcode.cli.checks import (
    capped,
    check_input_file,
    check_label,
    check_output,
    default_label,
    note_in_sample,
    open_codes_files,
)
from latentcode.cli.command import Command
from latentcode.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report", help="one offline HTML page: training curves, metrics, probe tables and plots",
        description="Write one self-contained HTML page (no JavaScript) for one or several runs: training curves, "
        "final metrics per split, probe tables and figures for their codes files (RUN_DIR/codes/*.h5, or --codes).",
    )
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR")
    parser.add_argument("--codes", action="append", metavar="CODES.h5", help="codes files (default: RUN_DIR/codes/*.h5)")
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
    """Runs and codes files that belong together, a label they all have, an output to write."""
    if not args.runs and not args.codes:
        raise UsageError("latentcode report needs RUN_DIR arguments, --codes files, or both")
    for run_dir in args.runs:
        if not Path(run_dir).exists():
            raise FileNotFoundError(f"RUN_DIR {run_dir} does not exist")
    for path in args.codes or ():
        check_input_file(path, "--codes")
    for stem in args.patch or ():
        for suffix in (".csv", ".json"):
            check_input_file(f"{stem}{suffix}", "--patch")
    from latentcode.provenance import check_codes_from_runs, check_one_task, codes_of_runs
    from latentcode.rundir import RunRecord

    runs = [RunRecord.read(run_dir) for run_dir in args.runs]
    code_files = open_codes_files(args.codes, "--codes") if args.codes else open_codes_files(codes_of_runs(runs))
    code_files = capped(code_files, args.max_rows, 0, "report")  # build_report draws the same rows (seed 0)
    check_one_task(code_files, runs)
    check_codes_from_runs(runs, code_files)
    from latentcode.analysis.patch_outputs import check_patch_provenance, read_patch_output

    for stem in args.patch or ():  # damaged, or of another task or model: refused before any work
        check_patch_provenance(read_patch_output(stem, "--patch"), code_files, runs, "--patch")
    if code_files:
        label = default_label(code_files, args.label)
        for code_file in code_files:
            check_label(code_file, label, "--label")
    note_in_sample(args.fit_split, args.test_split)
    if Path(args.out).suffix.lower() not in (".html", ".htm") and not Path(args.out).is_dir():
        args.out += ".html"  # as build_report names it: a page a browser opens
    out = check_output(args.out, "--out")
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"--out {out} already exists; add --overwrite to replace it, or choose another --out")
    files_dir = out.with_name(f"{out.stem}_files")  # the report's figures and tables
    from latentcode.files import check_replaceable

    for stem in args.patch or ():  # where the map's copy goes: never through a planted link
        check_replaceable(files_dir / f"patch_{Path(stem).name}.png", "--patch map's copy")
    if files_dir.is_dir() and any(files_dir.iterdir()) and not args.overwrite:
        raise FileExistsError(f"--out {out}: {files_dir} already holds files; add --overwrite to replace the "
                              "report's files in it, or choose another --out")


def run(args: argparse.Namespace) -> None:
    from latentcode.analysis.report import build_report

    report = build_report(args.runs, args.codes or (), args.out, label=args.label, fit_split=args.fit_split,
                          test_split=args.test_split, methods=tuple(args.method or ["tsne"]),
                          max_points=args.max_points, title=args.title, overwrite=args.overwrite,
                          progress=progress_bars(args), patches=args.patch or (), max_rows=args.max_rows)
    print(f"report: {report.path.resolve()}")
    for line in report.headline():
        print("  " + line)


COMMAND = Command(register, check, run, order=110)
