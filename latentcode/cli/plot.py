"""`latentcode plot`: tSNE or UMAP of the latent codes of a codes file, one panel per layer."""

from __future__ import annotations

import argparse

from latentcode.cli.arguments import POSITIVE_INTEGER, SEED
from latentcode.cli.command import Command
from latentcode.cli.pictures import add_picture_arguments, check_picture, draw


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plot", help="tSNE or UMAP of latent codes, one panel per layer, coloured by a label",
        description="Embed the latent codes of each layer with tSNE or UMAP (fixed seed; at most --max-points "
        "examples, subsampled with the seed) and colour them by a label.",
    )
    add_picture_arguments(parser)
    parser.add_argument("--method", choices=("tsne", "umap"), default="tsne")
    parser.add_argument("--color", dest="label", help="label to colour by (default: the task's sub-task label)")
    parser.add_argument("--max-points", type=POSITIVE_INTEGER, default=2000, help="subsampling cap (default 2000)")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--quiet", action="store_true",
                        help="no progress (by default a bar on a terminal, else a line per layer on stderr)")
    return parser


def check(args: argparse.Namespace) -> None:
    check_picture(args, "--color", args.method)


def run(args: argparse.Namespace) -> None:
    draw(args, "plot_embedding", method=args.method, max_points=args.max_points, seed=args.seed,
         progress=not args.quiet)


COMMAND = Command(register, check, run, order=80)
