"""`latentcode extract`: record the latent codes of a model into an HDF5 codes file."""

from __future__ import annotations

import argparse
import os

from latentcode.cli.arguments import NON_NEGATIVE_NUMBER, add_instance_arguments, parse_assignments
from latentcode.cli.command import Command, command_parser


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(
        subparsers, "extract", help="record latent codes of a trained model into an HDF5 file",
        description="Run a trained model on task instances and record the latent codes a[:, q, k] at the selected "
        "sites, with every task label, the prediction and the target, into a self-describing HDF5 file (schema: "
        "latentcode/store/schema.py). Written atomically: an interrupted extraction leaves no file behind.",
        epilog="site selectors: last-self (every layer, last token to itself), sraven-rule (every layer, last query "
        "token to the same feature in the last row's context panels; unpermuted instances), all-pairs:LAYER, or "
        "LAYER:QUERY:KEY[,...] (negative positions count from the end, * as LAYER is every layer)\n\nexample:\n"
        "  latentcode extract runs/sraven-hyla --split ood --n 8192 --sites sraven-rule --out codes.h5\n\n"
        "sharded, one shard per process (codes.shard-RANK-of-2.h5), codes.h5 presenting them as one file:\n"
        "  torchrun --standalone --nproc_per_node 2 -m latentcode.cli -- extract runs/sraven-hyla --n 8192 "
        "--out codes.h5")
    add_instance_arguments(parser, 8192, "every pair of every layer kept in a compact store", batch_size=None,
                           batch_help="default 256; 1 window for a pretrained model")
    parser.add_argument("--out", required=True, help="the HDF5 file to write")
    parser.add_argument("--score", choices=("pattern", "scores"), default="pattern",
                        help="pattern: normalized latent codes (default); scores: raw scores before normalization")
    parser.add_argument("--append", action="store_true", help="add examples to an existing file with the same schema")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    parser.add_argument("--compression", choices=("gzip", "lzf", "none"), default=None,
                        help="of a new file: gzip (default; h5dump and every HDF5 tool read it), lzf (h5py only), none "
                        "(the default for a pretrained model's compact store: queries and keys barely compress)")
    parser.add_argument("--compact", action=argparse.BooleanOptionalAction, default=None,
                        help="keep every pair of every layer in a compact store (queries and keys) beside the sites "
                        "(default: for a pretrained causal LM, which has one; a latentcode model has none)")
    parser.add_argument("--wait-for-lock", type=NON_NEGATIVE_NUMBER, default=0.0, metavar="SECONDS",
                        help="wait this long while another process writes --out (default: refuse at once)")
    return parser


def check(args: argparse.Namespace) -> None:
    """The model, its task, the split, the variant, the sites, memory, disk and the output, before torch:
    the plan `latentcode.extract` makes too (`args.plan`)."""
    from latentcode.extraction.plan import plan_extract

    args.plan = plan_extract(args.run, parse_assignments(args.task, "--task") or None, args.sites, args.split, args.n,
                             args.out, variant=args.variant, score=args.score, batch_size=args.batch_size,
                             seed=args.seed, append=args.append, overwrite=args.overwrite,
                             compression=args.compression, compact=args.compact,
                             wait_for_lock=args.wait_for_lock, device=args.device,
                             dtype=args.dtype)


def run(args: argparse.Namespace) -> None:
    from latentcode.extraction.pipeline import run_extraction
    from latentcode.store import CodeFile

    path = run_extraction(args.plan, progress=not args.quiet)
    if os.environ.get("RANK", "0") != "0":  # a sharded extraction (torchrun, accelerate launch): rank 0 says it
        return
    codes = CodeFile(path)
    print(f"wrote {path}: {len(codes)} examples (splits {codes.splits}), {len(codes.sites)} sites, "
          f"{codes.n_heads} heads, labels {codes.label_names}"
          + (f", rows in {len(codes.shards)} shards beside it" if codes.shards else ""))


COMMAND = Command(register, check, run, order=40, parameters={"run_or_model": "run"})
