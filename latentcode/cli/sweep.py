"""`latentcode sweep`: train a grid of runs and tabulate them."""

from __future__ import annotations

import argparse

from latentcode.cli.arguments import POSITIVE_INTEGER, parse_value
from latentcode.cli.command import Command, command_parser
from latentcode.errors import UsageError
from latentcode.validation import SEED_LIMIT, check_integer, check_output


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(
        subparsers, "sweep", help="train a grid of runs and tabulate them",
        description="Run a grid of training runs (learning rate, weight decay, warmup, seeds, attention presets, "
        "depth, width, data size, ...) sequentially or as independent processes; write results.csv/json and "
        "best.json (chosen on the in-distribution test split, never on OOD).",
        epilog="example:\n  latentcode sweep --preset fuzzy_logic --scale tiny --grid attention=softmax,linear,hyla "
        "--grid learning_rate=1e-3,3e-3 --seeds 0,1 --out sweeps/fuzzy\n  latentcode sweep --preset sraven --grid "
        "paper --out sweeps/sraven-paper")
    parser.add_argument("--preset", required=True)
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--out", required=True, help="sweep directory (one run directory per grid point)")
    parser.add_argument("--grid", action="append", metavar="FIELD=V1,V2,...",
                        help="values of one field (any train/model/task field, or attention); 'paper' adds the "
                        "paper's grid for the preset")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (default 0)")
    parser.add_argument("--jobs", type=POSITIVE_INTEGER, default=1,
                        help="runs at a time, each in its own process (default 1)")
    parser.add_argument("--quiet", action="store_true")
    return parser


def check(args: argparse.Namespace) -> None:
    """The preset, scale, grid and seeds (each grid value is checked by `sweep`, before any run)."""
    from latentcode.training.presets import MODEL_FIELDS, SCALES, TRAIN_FIELDS, presets, task_fields

    if args.preset not in presets():
        raise UsageError(f"--preset {args.preset}: unknown preset; valid presets: {', '.join(presets())}")
    if args.scale not in SCALES:
        raise UsageError(f"--scale {args.scale}: unknown scale; valid scales: {', '.join(SCALES)}")
    grid: dict = {}
    known = TRAIN_FIELDS | MODEL_FIELDS | task_fields()
    for item in args.grid or []:
        if item == "paper":
            grid |= {key: list(values) for key, values in presets()[args.preset].paper_grid.items()}
            continue
        key, separator, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not separator:
            raise UsageError(f"--grid expects FIELD=V1,V2,... or 'paper', got {item!r}")
        if key not in known:
            raise UsageError(f"--grid {item}: unknown field {key!r}; valid fields: {', '.join(sorted(known))}")
        grid[key] = [parse_value(value) for value in values.split(",") if value]
        if not grid[key]:
            raise UsageError(f"--grid {item}: no values after '='; expected FIELD=V1,V2,...")
        if key == "attention":  # preset names are known without torch (pairs are checked by sweep)
            from latentcode.models.config import ATTENTION_PRESETS

            unknown = [value for value in grid[key] if str(value) not in ATTENTION_PRESETS and "+" not in str(value)]
            if unknown:
                raise UsageError(f"--grid {item}: unknown attention {unknown[0]!r}; expected presets among "
                                 f"{', '.join(ATTENTION_PRESETS)}, or NORMALIZATION+VALUE_NETWORK")
    try:
        args.seed_list = [check_integer("seed", int(seed), 0, SEED_LIMIT - 1) for seed in args.seeds.split(",")
                          if seed.strip()]
    except ValueError:  # int() of a non-integer, or a UsageError: out of the range
        args.seed_list = []
    if not args.seed_list:
        raise UsageError(f"--seeds {args.seeds}: expected comma-separated non-negative integers below {SEED_LIMIT}, "
                         "e.g. 0,1,2")
    args.grid_values = grid
    check_output(args.out, "--out", kind="directory")


def run(args: argparse.Namespace) -> None:
    from latentcode.training.sweeps import best_runs, sweep

    grid = args.grid_values
    rows = sweep(args.preset, args.scale, grid, args.out, seeds=args.seed_list, jobs=args.jobs,
                 progress=not args.quiet)
    print(f"{len(rows)} runs; table: {args.out}/results.csv")
    for attention, row in best_runs(rows, args.preset).items():
        params = {k: v for k, v in row.items() if k in grid or k == "seed"}
        print(f"  best {attention}: {params}  " + "  ".join(f"{k} {v:.4f}" for k, v in row.items()
                                                            if k.startswith(("test.", "ood."))
                                                            and isinstance(v, float)))


COMMAND = Command(register, check, run, order=30)
