"""The `latentcode` command line: thin wrappers that parse arguments and call the public API.

Every subcommand imports what it needs when it runs, so `latentcode --help` and the analysis
commands stay fast. Errors the user can fix (bad arguments, files that do not match) are printed
as one line, `error: ...`, with exit status 2; set LATENTCODE_DEBUG=1 for the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

USER_ERRORS = (ValueError, FileExistsError, FileNotFoundError, IndexError, MemoryError, KeyError)

Handler = Callable[[argparse.Namespace], int | None]
_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def subcommand(register: Callable[[argparse._SubParsersAction], None]):
    """Decorator: `register(subparsers)` adds one subcommand (with `set_defaults(handler=...)`)."""
    _SUBCOMMANDS.append(register)
    return register


# -- latentcode tasks ------------------------------------------------------------------------------
@subcommand
def _tasks(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tasks", help="inspect the tasks (SRAVEN ambiguity, counts)")
    commands = parser.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")
    ambiguity = commands.add_parser(
        "ambiguity",
        help="Monte Carlo estimate of the fraction of ambiguous SRAVEN instances",
        description="Estimate the fraction of SRAVEN instances whose 8 context panels admit "
        "another rule assignment with a different answer (see latentcode.tasks.ambiguity).",
    )
    ambiguity.add_argument("--features", type=int, default=4, help="M, features per panel (default 4)")
    ambiguity.add_argument("--values", type=int, default=8, help="K, values per feature (default 8)")
    ambiguity.add_argument("--n", type=int, default=4096, help="instances to check (default 4096)")
    ambiguity.add_argument("--seed", type=int, default=0)
    ambiguity.add_argument(
        "--criterion", choices=("all_features", "any_feature"), default="all_features",
        help="all_features: the authors' estimator (default); any_feature: the paper's wording",
    )
    ambiguity.set_defaults(handler=_run_ambiguity)

    counts = commands.add_parser("count", help="number of possible SRAVEN tasks and instances")
    counts.add_argument("--features", type=int, default=4)
    counts.add_argument("--values", type=int, default=8)
    counts.set_defaults(handler=_run_counts)


def _run_ambiguity(args: argparse.Namespace) -> None:
    import time

    from latentcode.tasks.sraven import estimate_ambiguity

    start = time.perf_counter()
    fraction, standard_error = estimate_ambiguity(args.features, args.values, args.n, args.seed, args.criterion)
    seconds = time.perf_counter() - start
    print(
        f"M={args.features} K={args.values} n={args.n} criterion={args.criterion}: "
        f"ambiguous fraction {fraction:.4f} ± {standard_error:.4f} (standard error), {seconds:.2f} s"
    )


def _run_counts(args: argparse.Namespace) -> None:
    from latentcode.tasks.sraven import count_instances, count_tasks

    print(f"SRAVEN M={args.features} K={args.values}: {count_tasks(args.features):,} tasks, "
          f"{count_instances(args.features, args.values):.3e} labelled instances")


# -- latentcode demo -------------------------------------------------------------------------------
@subcommand
def _demo(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="the main job on an embedded default")
    parser.add_argument("--attention", default="hyla", help="attention preset (default hyla)")
    parser.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> None:
    import torch

    from latentcode import ModelConfig, build_model
    from latentcode.tasks import get_task

    task = get_task("sraven")
    batch = task.sample(4, "ood", seed=0)
    config = ModelConfig(attention=args.attention, n_layers=4, d_model=128, n_heads=16, kqv_dim=64,
                         d_mlp=256, n_ctx=task.seq_len, d_in=task.d_in, d_out=task.d_out)
    model = build_model(config, seed=0).eval()
    _, cache = model.run_with_cache(torch.from_numpy(batch.x))
    print(f"untrained {config.attention_name} model, SRAVEN ood instance 0: latent code a[:, q, k] "
          f"of the last query attending to itself")
    for layer in range(config.n_layers):
        code = cache[f"blocks.{layer}.attn.hook_pattern"][0, :, -1, -1]
        print(f"layer {layer}: " + " ".join(f"{value:+.2f}" for value in code.tolist()))


# -- entry point ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from latentcode import __version__

    parser = argparse.ArgumentParser(
        prog="latentcode",
        description="Mechanistic interpretability of attention latent codes: train softmax, linear "
        "and HYLA transformers on compositional tasks, extract latent codes with hooks into HDF5, "
        "decode them with probes and draw them.",
    )
    parser.add_argument("--version", action="version", version=f"latentcode {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.handler(args)
    except USER_ERRORS as error:
        if os.environ.get("LATENTCODE_DEBUG"):
            raise
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
