"""`latentcode samples`: a grid of raw latent-code samples per value of a label."""

from __future__ import annotations

import argparse

from latentcode.cli.command import Command
from latentcode.cli.pictures import add_picture_arguments, check_picture, draw


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("samples", help="a grid of raw latent-code samples per label value")
    add_picture_arguments(parser)
    parser.add_argument("--label", help="integer label (default: rule for SRAVEN)")
    parser.add_argument("--layer", type=int, help="layer (default: the last)")
    return parser


def check(args: argparse.Namespace) -> None:
    check_picture(args, "--label", "samples")


def run(args: argparse.Namespace) -> None:
    draw(args, "plot_code_samples", layer=args.layer)


COMMAND = Command(register, check, run, order=100)
