"""`latentcode heatmap`: cosine similarity between the mean latent code of each value of a label."""

from __future__ import annotations

import argparse

from latentcode.cli.command import Command
from latentcode.cli.pictures import add_picture_arguments, check_picture, draw


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "heatmap", help="cosine similarity between the mean latent code of each label value",
        description="Cosine similarity between the mean latent code of each value of a label (the paper's "
        "rule-by-rule heatmap), rows ordered by hierarchical clustering, values annotated; one panel per layer.",
    )
    add_picture_arguments(parser)
    parser.add_argument("--label", help="categorical label (default: rule for SRAVEN)")
    parser.add_argument("--centre", choices=("auto", "yes", "no"), default="auto",
                        help="subtract the grand mean code before the cosine (diverging scale -1..1); auto (default): "
                        "where the plain cosines of most panels all lie close to 1, and the title says so")
    return parser


def check(args: argparse.Namespace) -> None:
    check_picture(args, "--label", "similarity")


def run(args: argparse.Namespace) -> None:
    draw(args, "plot_similarity", centre={"auto": None, "yes": True, "no": False}[args.centre])


COMMAND = Command(register, check, run, order=90)
