"""`latentcode intervene`: edit the latent codes of a trained model at some sites and measure the task
metrics before and after."""

from __future__ import annotations

import argparse
import math

from latentcode.cli.arguments import FIGURE_FORMATS, FINITE_NUMBER, add_instance_arguments, formats, parse_assignments
from latentcode.cli.checks import check_stem_free
from latentcode.cli.command import Command, command_parser
from latentcode.errors import UsageError
from latentcode.validation import check_output


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(
        subparsers, "intervene", help="edit latent codes of a trained model and measure the task metric before/after",
        description="Run a trained model on task instances with its latent codes a[:, q, k] edited at the selected "
        "sites (after the score normalization, before the value network), at all sites together and at each site "
        "alone, and write the task metrics without and with the edit as a tidy table (.csv, .json) and a plot.",
        epilog="operations (one of): --zero-ablate HEADS, --mean-ablate HEADS --codes FILE [--by LABEL], "
        "--set V1,V2,... / --add V1,V2,... (one value per head) or --scale FACTOR, optionally with --heads HEADS; "
        "HEADS is 'all' or a list such as 0,3,5\n\nexample:\n  latentcode extract runs/sraven-hyla --split train "
        "--n 4096 --sites sraven-rule --out codes.h5\n  latentcode intervene runs/sraven-hyla --sites sraven-rule "
        "--mean-ablate all --codes codes.h5 --by rule --out results/mean-ablate\n\na pretrained causal LM (head 3 "
        "of layer 10 zero-ablated on 32 windows of 64 tokens):\n  latentcode intervene smollm2 --sites '10:*:*' "
        "--zero-ablate 3 --task seq_len=64 --n 32 --out results/smollm2-l10h3")
    add_instance_arguments(parser, 1024, "read on its next-token loss, probability and accuracy beside a control "
                           "edit of as many random heads of the same layers", "site selector, as for extract")
    operation = parser.add_mutually_exclusive_group(required=True)
    operation.add_argument("--zero-ablate", metavar="HEADS", help="set the codes of these heads to zero")
    operation.add_argument("--mean-ablate", metavar="HEADS",
                           help="set the codes of these heads to their mean in --codes")
    operation.add_argument("--set", metavar="VECTOR", help="set the codes to this vector (one value per head)")
    operation.add_argument("--add", metavar="VECTOR", help="add this vector to the codes (steering)")
    operation.add_argument("--scale", type=FINITE_NUMBER, metavar="FACTOR", help="multiply the codes by FACTOR")
    parser.add_argument("--heads", metavar="HEADS", help="heads --set/--add/--scale change (default all)")
    parser.add_argument("--codes", metavar="CODES.h5", help="codes file of this model for --mean-ablate")
    parser.add_argument("--by", metavar="LABEL", help="--mean-ablate with one mean per value of this label")
    parser.add_argument("--codes-split", help="take the means over this split of --codes (default all examples)")
    parser.add_argument("--out", required=True, help="path stem of the table (.csv, .json) and the plot")
    parser.add_argument("--no-per-site", action="store_true", help="only all sites together, not each unit alone")
    parser.add_argument("--alone", choices=("sites", "heads"), help="the unit measured alone: each site, or each "
                        "(layer, head) at the sites of its layer (default: "
                        "sites where they are at most 64, else heads)")
    parser.add_argument("--no-control", action="store_true", help="no control edit beside each scope (the same edit "
                        "at as many heads drawn at random in the same layers)")
    parser.add_argument("--format", action="append", choices=FIGURE_FORMATS, help="plot formats (default png)")
    parser.add_argument("--overwrite", action="store_true", help="replace the table and plot if --out has them")
    return parser


def _parse_heads(text: str | None, flag: str) -> list[int] | None:
    """'all' (or nothing) -> None; '0,3,5' -> [0, 3, 5]."""
    if text is None or text.strip() == "all":
        return None
    try:
        heads = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} expects 'all' or head indices such as 0,3,5; got {text!r}") from None
    if not heads or min(heads) < 0:
        raise UsageError(f"{flag} expects 'all' or non-negative head indices such as 0,3,5; got {text!r}")
    return heads


def _parse_vector(text: str, flag: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} expects comma-separated numbers, one per head (e.g. 0.5,0,1.2); "
                         f"got {text!r}") from None
    if not all(math.isfinite(value) for value in values):
        raise UsageError(f"{flag} expects finite numbers, one per head (e.g. 0.5,0,1.2); got {text!r}")
    return values


def check(args: argparse.Namespace) -> None:
    """The model, its task, the split, the variant, the sites and memory: the plan `intervention_effects`
    makes too (`args.plan`; JSON and the task module, no torch, so a mistake is answered at once); then
    the outputs, the operation's flags, its heads and its vector (`args.edit_heads`, `args.edit_vector`)."""
    from latentcode.intervention.plan import plan_intervention
    from latentcode.token_windows import TokenWindows

    args.plan = plan_intervention(args.run, task=parse_assignments(args.task, "--task") or None, sites=args.sites,
                                  split=args.split, n=args.n, variant=args.variant, batch_size=args.batch_size,
                                  seed=args.seed, per_site=not args.no_per_site, alone=args.alone,
                                  control=not args.no_control,
                                  device=args.device, dtype=args.dtype)
    check_output(args.out, "--out", kind="stem")
    check_stem_free(args.out, (".csv", ".json", *(f".{fmt}" for fmt in formats(args))), args.overwrite)
    if args.mean_ablate is None and (args.codes or args.by or args.codes_split):
        raise UsageError("--codes, --by and --codes-split go with --mean-ablate")
    if args.mean_ablate is not None:
        from latentcode.analysis.checks import open_codes_files

        if not args.codes:
            raise UsageError("--mean-ablate needs --codes FILE: a codes file extracted from this model (latentcode "
                             "extract)")
        # Opened (and so validated: a damaged compact store's NaN keys or scale) before torch; the means
        # are read from this CodeFile in `run`.
        args.codes = open_codes_files([args.codes], "--codes")[0]
    if args.heads is not None and (args.zero_ablate is not None or args.mean_ablate is not None):
        raise UsageError("--zero-ablate and --mean-ablate name their heads themselves; --heads goes with "
                         "--set/--add/--scale")
    args.edit_heads = _parse_heads(args.heads, "--heads")
    if args.zero_ablate is not None:
        args.edit_heads = _parse_heads(args.zero_ablate, "--zero-ablate")
    elif args.mean_ablate is not None:
        args.edit_heads = _parse_heads(args.mean_ablate, "--mean-ablate")
    if args.by and isinstance(args.plan.task, TokenWindows):
        raise UsageError("--by: a pretrained model's windows carry no label to take one mean per value of; "
                         "mean-ablate without --by")
    args.plan.units(args.edit_heads)  # each head checked against the model's, and how many are measured alone
    args.edit_vector = None
    if args.set is not None or args.add is not None:
        args.edit_vector = _parse_vector(args.set if args.set is not None else args.add,
                                         "--set" if args.set is not None else "--add")


def run(args: argparse.Namespace) -> None:
    from latentcode.intervention import AddVector, ScaleHeads, SetCode, ZeroAblate, intervention_effects, write_effects
    from latentcode.intervention.plan import mean_ablation

    heads, vector = args.edit_heads, args.edit_vector
    if args.zero_ablate is not None:
        edit = ZeroAblate(heads=heads)
    elif args.mean_ablate is not None:
        edit = mean_ablation(args.plan, args.codes, heads, by=args.by, split=args.codes_split)
    elif args.set is not None:
        edit = SetCode(vector, heads=heads)
    elif args.add is not None:
        edit = AddVector(vector, heads=heads)
    else:
        edit = ScaleHeads(args.scale, heads=heads)
    table = intervention_effects(args.plan, edit, progress=not args.quiet)
    import pandas

    columns = ["scope", "metric", "before", "after", "change", "change se"]
    print(f"outputs read at positions {table['positions'].iloc[0]} ({table['variant'].iloc[0]})")
    with pandas.option_context("display.width", 200, "display.max_rows", 200):
        print(f"{table['model'].iloc[0]}, {table['edit'].iloc[0]}, {table['split'].iloc[0]} (n={args.n}):")
        print(table[columns].to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    written = write_effects(table, args.out, formats=formats(args))
    print("wrote " + ", ".join(map(str, written)))


COMMAND = Command(register, check, run, order=50, parameters={"run_or_model": "run"})
