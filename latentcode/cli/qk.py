"""`latentcode qk`: why does a head put its score on a key? One head's score before sigma, at selected
(query, key) pairs of one sequence, as exact query-side x key-side terms over the residual stream's
components (`latentcode.intervention.qk.qk_attribution`).

    latentcode qk smollm2 --layer 18 --head 6 --pairs induction --repeat --seq-len 256 --out results/qk-18.6
    latentcode qk models/sraven-hyla --layer 2 --head 3 --pairs 35:* --out results/qk-sraven
    latentcode qk codes.h5 --example 3 --layer 18 --head 6 --pairs induction --out results/qk-codes

A codes file with a compact store (its queries and keys) is decomposed by running the model it names
again on the example's stored token ids (the store holds no residual stream), after checking that the
recomputed queries and keys equal the stored ones (`latentcode.intervention.qk.from_codes`).

The arguments are checked with the standard library and JSON alone (the model's layers and heads from
its config, the pair selector's syntax, the outputs) before torch is imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from latentcode.cli.arguments import SEED, add_placement_arguments, integer
from latentcode.cli.command import Command
from latentcode.errors import UsageError

DEFAULT_SEQ_LEN = 256


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "qk",
        help="exact query-key attribution: which components write one head's score, query side x key side",
        description="Decompose one head's score before sigma (the softmax logit; HYLA's and linear attention's "
        "score before their normalisation) at selected (query, key) pairs of one sequence into terms T_ij, one per "
        "query-side component i and key-side component j of the residual stream (embed, position, L{l}.H{h}, "
        "L{l}.mlp, bias), with the normalisation's scale frozen per position: the terms sum to the score. Writes "
        "DIR/qk.csv (means and standard errors over the pairs) and DIR/qk.png (query x key heatmap with marginals).",
        epilog="pairs: previous (q, q-1), induction (keys after an earlier occurrence of the query's token; with "
        "--repeat the window's first half is repeated, so every second-half token has one), or Q:K pairs separated "
        "by commas, each side an integer, A..B or *.\n\nexamples:\n"
        "  latentcode qk smollm2 --layer 18 --head 6 --pairs induction --repeat --out results/qk-18.6\n"
        "  latentcode qk models/sraven-hyla --layer 2 --head 3 --pairs '35:*' --out results/qk-sraven",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", help="a run or model directory, a Hugging Face directory, a .gguf "
                        "file or 'smollm2'; or a codes file (.h5) with a compact store")
    parser.add_argument("--example", type=integer(0), default=None, help="a codes file's example (default 0)")
    parser.add_argument("--layer", type=integer(0), required=True, help="the layer of the head")
    parser.add_argument("--head", type=integer(0), required=True, help="the (query) head")
    parser.add_argument("--pairs", required=True, help="induction, previous, or Q:K[,Q:K...] (see below)")
    parser.add_argument("--top", type=integer(1), default=12, help="components shown per side; the rest as 'other' "
                        "(default 12)")
    parser.add_argument("--seq-len", type=integer(2), default=None, help=f"a language model's window length "
                        f"(default {DEFAULT_SEQ_LEN}); our models' sequences are their task's")
    parser.add_argument("--repeat", action="store_true", help="a language model: its window's first half, twice")
    parser.add_argument("--split", default=None, help="the split the sequence comes from (default: validation for a "
                        "language model, the task's held-out split otherwise)")
    parser.add_argument("--seed", type=SEED, default=0, help="which sequence (default 0)")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory of qk.csv and qk.png")
    parser.add_argument("--overwrite", action="store_true", help="replace qk.csv and qk.png if DIR has them")
    add_placement_arguments(parser)
    return parser


def is_codes_file(model: str) -> bool:
    return Path(model).suffix in (".h5", ".hdf5") and Path(model).is_file()


def _check_stored_head(args: argparse.Namespace) -> None:
    """A codes file's example, layer and head exist in its compact store, checked before torch loads."""
    from latentcode.store import CodeFile

    codes = CodeFile(args.model)
    compact = codes.compact
    if compact is None:
        raise UsageError(f"{args.model} has no compact store (no stored queries and keys); expected a file written "
                         "by latentcode extract of a pretrained model")
    example = args.example or 0
    if not example < len(codes):
        raise UsageError(f"--example {example} is outside the {len(codes)} examples of {args.model}; expected "
                         f"0..{len(codes) - 1}")
    if args.layer not in compact.layers:
        raise UsageError(f"--layer {args.layer}: {args.model} stores queries and keys of layers {compact.layers}")
    if args.head >= compact.n_heads:
        raise UsageError(f"--head {args.head} is outside the {compact.n_heads} heads of {args.model}; expected "
                         f"0..{compact.n_heads - 1}")


def check(args: argparse.Namespace) -> None:
    from latentcode.intervention.qk.pairs import check_selector
    from latentcode.intervention.qk.plan import check_outputs
    from latentcode.subject import subject_of
    from latentcode.validation import check_placement

    if is_codes_file(args.model):
        if args.seq_len is not None or args.repeat or args.split is not None:
            raise UsageError("--seq-len, --repeat and --split choose a sequence for a model; a codes file's sequence "
                             "is its example (--example)")
        try:
            check_selector(args.pairs)
        except UsageError as error:
            raise UsageError(f"--pairs: {error}") from None
        _check_stored_head(args)
        check_outputs(args.out, args.overwrite)
        args.source = None
        return
    if args.example is not None:
        raise UsageError(f"--example is for a codes file (.h5); {args.model} is a model")
    subject = subject_of(args.model)
    n_layers, n_heads, n_ctx = subject.n_layers, subject.n_heads, subject.n_ctx
    if args.layer >= n_layers:
        raise UsageError(f"--layer {args.layer} is outside the model's {n_layers} layers; expected 0..{n_layers - 1}")
    if args.head >= n_heads:
        raise UsageError(f"--head {args.head} is outside the model's {n_heads} heads; expected 0..{n_heads - 1}")
    try:
        check_selector(args.pairs)
    except UsageError as error:
        raise UsageError(f"--pairs: {error}") from None
    if subject.reads_text:
        args.seq_len = args.seq_len or DEFAULT_SEQ_LEN
        if n_ctx and args.seq_len > n_ctx:
            raise UsageError(f"--seq-len {args.seq_len} is beyond the model's context of {n_ctx} positions")
    else:
        if args.seq_len is not None or args.repeat:
            raise UsageError("--seq-len and --repeat are for a language model; our models read their task's sequences")
        if not subject.source.task_config:
            raise UsageError(f"{args.model} is a model directory without its run: its task is unknown; give the run "
                             "directory")
    check_outputs(args.out, args.overwrite)
    args.source = subject
    args.device, args.dtype = check_placement(args.device, args.dtype)


def sequence(args: argparse.Namespace):
    """(model, tokens `[1, pos]` or `[1, pos, d_in]`, its name) for the command's arguments."""
    import torch

    subject = args.source
    loaded = subject.load(args.device, args.dtype)
    if subject.reads_text:
        length = args.seq_len // 2 if args.repeat else args.seq_len
        windows = subject.task({"seq_len": length})
        tokens = torch.as_tensor(windows.draw(loaded, args.split or "validation", 1, args.seed, extra=0))
        if args.repeat:
            tokens = torch.cat([tokens, tokens], dim=1)
        return loaded.model, tokens, loaded.name
    task = subject.task(None)
    batch = task.sample(1, args.split or task.analysis.held_out_split, seed=args.seed)
    return loaded.model, torch.as_tensor(batch.x[:1]), Path(args.model).name


def run(args: argparse.Namespace) -> None:
    from latentcode.intervention.qk import qk_attribution, qk_from_codes

    if args.source is None:
        terms = qk_from_codes(args.model, args.layer, args.head, args.pairs, example=args.example or 0, top=args.top,
                              out=args.out, overwrite=args.overwrite)
        name = (f"{args.model} example {args.example or 0} "
                f"(recomputed queries/keys within {terms.stored_gap:.1e} of the stored)")
    else:
        model, tokens, name = sequence(args)
        terms = qk_attribution(model, tokens, args.layer, args.head, args.pairs, top=args.top, out=args.out,
                               overwrite=args.overwrite, name=name)
    key_side = terms.key_marginal.double().mean(0)
    query_side = terms.query_marginal.double().mean(0)
    strongest_key = terms.names[int(key_side.abs().argmax())]
    strongest_query = terms.names[int(query_side.abs().argmax())]
    print(f"{name} L{args.layer}.H{args.head}, {len(terms.pairs)} pairs ({args.pairs}): mean score "
          f"{float(terms.scores.double().mean()):.4f}, terms sum to it within {terms.relative_error():.1e} (relative); "
          f"largest key side {strongest_key} {float(key_side.abs().max()):.4f}, query side {strongest_query} "
          f"{float(query_side.abs().max()):.4f}; wrote {Path(args.out) / 'qk.csv'}, {Path(args.out) / 'qk.png'}")


COMMAND = Command(register, check, run, order=65)
