"""What the picture commands (plot, heatmap, samples) share: their flags, their check and the drawing
of one figure per command with a `latentcode.analysis` function."""

from __future__ import annotations

import argparse
from pathlib import Path

from latentcode.cli.arguments import FIGURE_FORMATS, add_max_rows_argument, formats
from latentcode.cli.checks import (
    capped,
    check_label,
    check_one_column,
    check_output,
    check_splits,
    check_stem_free,
    command_outputs,
    default_label,
    label_name,
    open_codes_files,
)
from latentcode.errors import UsageError


def add_picture_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="CODES.h5")
    parser.add_argument("--split", help="only this split (default: all)")
    parser.add_argument("--out", help="path stem of the figure (default: next to the file)")
    parser.add_argument("--format", action="append", choices=FIGURE_FORMATS, help="default png; repeatable")
    parser.add_argument("--overwrite", action="store_true", help="replace the figure if it exists")
    add_max_rows_argument(parser)


def check_picture(args: argparse.Namespace, flag: str, kind: str) -> None:
    """The file, the label (`args.label`, flag `flag`), the split, the layer and the figure's path
    (`kind` names it: FILE_<kind>_<label>); fills in the defaults."""
    [code_file] = capped(open_codes_files([args.file]), args.max_rows, getattr(args, "seed", 0), args.command)
    args.code_file = code_file  # what draw reads: the same view
    args.label = default_label([code_file], args.label, flag, kind="picture_label")
    check_splits(code_file, {"--split": args.split})
    check_label(code_file, args.label, flag)
    if kind in ("tsne", "umap"):
        check_one_column(code_file, args.label, flag)
    if getattr(args, "layer", None) is not None and args.layer not in code_file.layers:
        raise UsageError(f"--layer {args.layer}: {args.file} has no layer {args.layer}; its layers are {code_file.layers}")
    args.out = args.out or str(Path(args.file).with_suffix("")) + f"_{kind}_{label_name(args.label)}"
    check_output(args.out, "--out", kind="stem")
    check_stem_free(args.out, tuple(f".{fmt}" for fmt in formats(args)), args.overwrite)


def draw(args: argparse.Namespace, function: str, **options) -> None:
    """Draw with `latentcode.analysis.<function>(file, label, path_stem, split, formats, **options)`."""
    import importlib

    draw_figure = getattr(importlib.import_module("latentcode.analysis"), function)
    with command_outputs(args.out, tuple(f".{fmt}" for fmt in formats(args)), args.overwrite,
                         f"latentcode {args.command}") as outputs:
        draw_figure(args.code_file, args.label, args.out, split=args.split, formats=formats(args), **options)
    print("wrote " + ", ".join(map(str, outputs.written)))
