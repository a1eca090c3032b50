"""`latentcode view`: one self-contained, offline HTML page to explore the latent codes of a codes file."""

from __future__ import annotations

import argparse
from pathlib import Path

from latentcode.cli.arguments import POSITIVE_INTEGER, SEED
from latentcode.cli.checks import (
    check_input_file,
    check_label,
    check_output,
    check_splits,
    label_name,
    open_codes_files,
)
from latentcode.cli.command import Command
from latentcode.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "view", help="an interactive offline HTML page of the latent codes of a codes file",
        description="Write one self-contained HTML page (plotly.js inline, no network request) that links: the "
        "PCA (or tSNE/UMAP) embedding of each layer's codes, hovered for an instance's labels and the model's "
        "answer, filtered by any label; the selected instance's codes as a layer x head grid and its attention from "
        "the query to every recorded key, per head; probe tables and patching maps when given. At most "
        "--max-instances instances, drawn with --seed; codes rounded for display.",
        epilog="example:\n  latentcode view codes.h5 --probes results/rule.csv --patching results/patch.csv --out codes.html",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="CODES.h5")
    parser.add_argument("--split", help="only this split (default: all)")
    parser.add_argument("--max-instances", type=POSITIVE_INTEGER, default=1000,
                        help="cap on the instances shown, drawn uniformly with --seed (default 1000)")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--color", dest="label", help="label to colour by first (default: the task's picture label)")
    parser.add_argument("--embedding", action="append", choices=("tsne", "umap"), default=[],
                        help="also compute this embedding of the same instances (tens of seconds a layer); repeatable")
    parser.add_argument("--probes", action="append", default=[], metavar="CSV",
                        help="a latentcode probe table (.csv) to show; repeatable")
    parser.add_argument("--patching", action="append", default=[], metavar="CSV",
                        help="a latentcode patch table (.csv) to show as a map; repeatable")
    parser.add_argument("--out", help="the HTML file (default: beside the codes file, CODES.html)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    return parser


def check(args: argparse.Namespace) -> None:
    [code_file] = open_codes_files([args.file])
    check_splits(code_file, {"--split": args.split})
    if args.label is not None:
        check_label(code_file, args.label, "--color")
    for flag, paths in (("--probes", args.probes), ("--patching", args.patching)):
        for path in paths:
            if Path(path).suffix.lower() != ".csv":
                raise UsageError(f"{flag} {path} is not a .csv file; expected the table latentcode "
                                 f"{flag.strip('-').replace('patching', 'patch').rstrip('s')} wrote (STEM.csv)")
            check_input_file(path, flag)
    args.out = args.out or str(Path(args.file).with_suffix(".html"))
    if Path(args.out).suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--out {args.out} does not end in .html; expected the name of the HTML page to write")
    check_output(args.out, "--out", kind="file")
    if Path(args.out).exists() and not args.overwrite:
        raise FileExistsError(f"--out {args.out} already exists; add --overwrite to replace it, or choose another --out")


def run(args: argparse.Namespace) -> None:
    from latentcode.analysis import embed
    from latentcode.analysis.viewer import build_viewer

    embeddings = [embed(args.file, method, split=args.split, max_points=args.max_instances, seed=args.seed)
                  for method in args.embedding]
    viewer = build_viewer(args.file, split=args.split, max_instances=args.max_instances, seed=args.seed,
                          embeddings=embeddings, probe_tables=args.probes, patching=args.patching,
                          label=args.label and label_name(args.label))
    path = viewer.save(args.out, overwrite=args.overwrite)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; {viewer.title})")


COMMAND = Command(register, check, run, order=95)
