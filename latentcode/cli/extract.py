"""`latentcode extract`: record the latent codes of a trained model into an HDF5 codes file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from latentcode.cli.arguments import (
    NON_NEGATIVE_NUMBER,
    POSITIVE_INTEGER,
    add_instance_arguments,
    parse_assignments,
)
from latentcode.cli.checks import (
    check_fits_in_memory,
    check_fits_on_disk,
    check_output,
    forward_pass_bytes,
    model_config_of,
    open_codes_files,
)
from latentcode.cli.command import Command
from latentcode.errors import UsageError
from latentcode.validation import check_split, check_variant


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "extract",
        help="record latent codes of a trained model into an HDF5 file",
        description="Run a trained model on task instances and record the latent codes a[:, q, k] at the selected "
        "sites, with every task label, the prediction and the target, into a self-describing HDF5 file (schema: "
        "latentcode/store/schema.py). Written atomically: an interrupted extraction leaves no file behind.",
        epilog="site selectors: last-self (every layer, last token to itself), sraven-rule (every layer, last query "
        "token to the same feature in the last row's context panels; unpermuted instances), all-pairs:LAYER, or "
        "LAYER:QUERY:KEY[,...] (negative positions count from the end, * as LAYER is every layer)\n\nexample:\n"
        "  latentcode extract runs/sraven-hyla --split ood --n 8192 --sites sraven-rule --out codes.h5\n\n"
        "sharded, one shard per process (codes.shard-RANK-of-2.h5), codes.h5 presenting them as one file:\n"
        "  torchrun --standalone --nproc_per_node 2 -m latentcode.cli -- extract runs/sraven-hyla --n 8192 --out codes.h5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN_DIR", help="a run directory (or a saved model directory with --task), or a "
                        "pretrained causal LM: a Hugging Face directory, a .gguf file or smollm2 (windows of the "
                        "language corpus, --task seq_len=T, default 512; every pair of every layer kept in a compact "
                        "store)")
    parser.add_argument("--split", help="task split (default: the task's held-out split, ood; validation for "
                        "language)")
    parser.add_argument("--n", type=POSITIVE_INTEGER, default=8192, help="instances (default 8192)")
    parser.add_argument("--sites", default="last-self", help="site selector (default last-self)")
    parser.add_argument("--out", required=True, help="the HDF5 file to write")
    parser.add_argument("--score", choices=("pattern", "scores"), default="pattern",
                        help="pattern: normalized latent codes (default); scores: raw scores before normalization")
    add_instance_arguments(parser)
    parser.add_argument("--append", action="store_true", help="add examples to an existing file with the same schema")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    parser.add_argument("--compression", choices=("gzip", "lzf", "none"), default=None,
                        help="of a new file: gzip (default; h5dump and every HDF5 tool read it), lzf (h5py only), none "
                        "(the default for a pretrained model's compact store: queries and keys barely compress)")
    parser.add_argument("--wait-for-lock", type=NON_NEGATIVE_NUMBER, default=0.0, metavar="SECONDS",
                        help="wait this long while another process writes --out (default: refuse at once)")
    parser.add_argument("--quiet", action="store_true", help="no progress (default: the work, then a bar on a "
                        "terminal, a line every few seconds in a log)")
    return parser


def check(args: argparse.Namespace) -> None:
    """The model, its task, the split, the variant, the sites, memory, disk and the output, before torch."""
    from latentcode.pretrained import is_pretrained
    from latentcode.rundir import WEIGHTS_FILE, RunDirectory, RunRecord

    if is_pretrained(args.run):
        check_pretrained(args)
        return
    args.compression = args.compression or "gzip"
    run_dir = Path(args.run)
    task = parse_assignments(args.task, "--task")
    if RunDirectory(run_dir).looks_like_a_run():
        task = task or RunRecord.read(run_dir).task_config
    elif not (run_dir / WEIGHTS_FILE).is_file():
        raise UsageError(f"RUN_DIR {run_dir} is neither a finished run directory (with model/{WEIGHTS_FILE}) nor a "
                         f"model directory (with {WEIGHTS_FILE}){'' if run_dir.exists() else ': it does not exist'}")
    elif not task:
        raise UsageError(f"{run_dir} is a model directory without its run: give its task with --task, "
                         "e.g. --task name=sraven")
    from latentcode.tasks import get_task

    task_object = get_task(**task)
    args.split = check_split(args.split or task_object.analysis.held_out_split, task_object, "--split")
    if args.variant is not None:
        check_variant(args.variant, task_object, "--variant")
    from latentcode.sources.sites import MAX_ALL_PAIRS, parse_selector

    model_config = model_config_of(run_dir)
    selector = parse_selector(args.sites, task_object)
    if args.variant is not None:
        selector.check_variant(args.variant, task_object, "--variant")
    sites = selector.resolve(model_config["n_layers"], task_object.seq_len)
    if len(sites) > MAX_ALL_PAIRS:
        raise UsageError(f"--sites {args.sites!r} selects {len(sites)} sites; a codes file holds one dataset per site, "
                         f"at most {MAX_ALL_PAIRS}: select fewer (a layer, a row, a block), or sweep them with "
                         "latentcode patch")
    batch = min(args.batch_size, args.n)
    n_heads = int(model_config.get("n_heads") or 1)
    check_fits_in_memory(forward_pass_bytes(batch, task_object.seq_len, model_config) + 4 * batch * len(sites) * n_heads,
                         f"a forward pass of {batch} sequences of {task_object.seq_len} (the smaller of --n and "
                         "--batch-size)")
    out = check_output(args.out, "--out")
    check_fits_on_disk(4 * args.n * len(sites) * n_heads, out, args.compression,
                       f"--n {args.n} x {len(sites)} sites x {n_heads} heads of float32 codes")
    if args.append and args.overwrite:
        raise UsageError("--append adds to --out and --overwrite replaces it: give one of them")
    if out.exists() and not (args.append or args.overwrite):
        raise FileExistsError(f"--out {out} already exists; add --append to add examples to it, --overwrite to "
                              "replace it, or choose another --out")
    if out.exists() and args.append:
        open_codes_files([out], "--out")  # a damaged file or one that is no codes file is refused now


def check_pretrained(args: argparse.Namespace) -> None:
    """A pretrained model: its file or package, the split, the window length, the sites and the output."""
    from latentcode.extraction.pipeline import pretrained_seq_len
    from latentcode.pretrained import SMOLLM2_PACKAGE, resolve
    from latentcode.sources.sites import parse_selector

    path = resolve(args.run)  # a missing SmolLM2 package is one line here
    if not path.exists():
        raise UsageError(f"RUN_DIR {path} does not exist; expected a run directory, a model directory or a .gguf file")
    args.split = args.split or "validation"
    if args.split not in ("train", "validation"):
        raise UsageError(f"--split {args.split!r}: a pretrained model reads the language corpus's train or validation "
                         "split")
    seq_len = pretrained_seq_len(parse_assignments(args.task, "--task") or None)
    if seq_len < 1:
        raise UsageError(f"--task seq_len={seq_len}: expected a positive number of tokens")
    config_file = path / "config.json" if path.is_dir() else None
    n_ctx = 8192 if SMOLLM2_PACKAGE.replace("-", "_") in str(path) else None
    if config_file is not None and config_file.is_file():
        import json

        n_ctx = json.loads(config_file.read_text()).get("max_position_embeddings")
    if n_ctx and seq_len > n_ctx:
        raise UsageError(f"--task seq_len={seq_len} is beyond the context of {args.run} ({n_ctx} positions); "
                         f"expected <= {n_ctx}")
    parse_selector(args.sites)
    args.compression = args.compression or "none"
    out = check_output(args.out, "--out")
    if args.append and args.overwrite:
        raise UsageError("--append adds to --out and --overwrite replaces it: give one of them")
    if out.exists() and not (args.append or args.overwrite):
        raise FileExistsError(f"--out {out} already exists; add --append to add examples to it, --overwrite to "
                              "replace it, or choose another --out")


def run(args: argparse.Namespace) -> None:
    from latentcode.extraction import extract
    from latentcode.store import CodeFile

    task = parse_assignments(args.task, "--task") or None
    path = extract(args.run, task, args.sites, args.split, args.n, args.out, variant=args.variant, score=args.score,
                   batch_size=args.batch_size, seed=args.seed, append=args.append, overwrite=args.overwrite,
                   progress=not args.quiet, compression=args.compression, wait_for_lock=args.wait_for_lock)
    if os.environ.get("RANK", "0") != "0":  # a sharded extraction (torchrun, accelerate launch): rank 0 says it
        return
    codes = CodeFile(path)
    print(f"wrote {path}: {len(codes)} examples (splits {codes.splits}), {len(codes.sites)} sites, "
          f"{codes.n_heads} heads, labels {codes.label_names}"
          + (f", rows in {len(codes.shards)} shards beside it" if codes.shards else ""))


COMMAND = Command(register, check, run, order=40)
