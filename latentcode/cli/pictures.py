"""What the picture commands (plot, heatmap, samples) share: their flags, their check and the drawing
of one figure per command with a `latentcode.analysis` function."""

from __future__ import annotations

import argparse

from latentcode.cli.arguments import FIGURE_FORMATS, add_max_rows_argument, formats
from latentcode.cli.checks import command_outputs, note_caps


def add_picture_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="CODES.h5")
    parser.add_argument("--split", help="only this split (default: all)")
    parser.add_argument("--out", help="path stem of the figure (default: next to the file)")
    parser.add_argument("--format", action="append", choices=FIGURE_FORMATS, help="default png; repeatable")
    parser.add_argument("--overwrite", action="store_true", help="replace the figure if it exists")
    add_max_rows_argument(parser)


def check_picture(args: argparse.Namespace, flag: str, kind: str) -> None:
    """The file, the label (`args.label`; `flag` is the command's name for it), the split, the layer and
    the figure's path (`kind` names it: FILE_<kind>_<label>), by the plan the plotting functions make
    too (`plan_picture`); fills in the defaults."""
    from latentcode.analysis.picture_plan import plan_picture

    seed = getattr(args, "seed", 0)
    plan = plan_picture(args.file, args.label, args.out, kind=kind, split=args.split,
                        layer=getattr(args, "layer", None),
                        max_rows=args.max_rows, seed=seed, formats=formats(args), overwrite=args.overwrite)
    [args.code_file] = note_caps(plan.code_files, seed, args.command)  # what draw reads: the same view
    args.label, args.out = plan.label, str(plan.out)


def draw(args: argparse.Namespace, function: str, **options) -> None:
    """Draw with `latentcode.analysis.<function>(file, label, path_stem, split, formats, **options)`."""
    import importlib

    draw_figure = getattr(importlib.import_module("latentcode.analysis"), function)
    with command_outputs(args.out, tuple(f".{fmt}" for fmt in formats(args)), args.overwrite,
                         f"latentcode {args.command}") as outputs:
        draw_figure(args.code_file, args.label, args.out, split=args.split, formats=formats(args), **options)
    print("wrote " + ", ".join(map(str, outputs.written)))
