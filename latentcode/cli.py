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


def parse_value(text: str):
    """A command-line value: JSON (numbers, true/false/null, lists) where it parses, else the string."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: Sequence[str] | None, what: str) -> dict:
    values = {}
    for item in items or []:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"{what} expects KEY=VALUE, got {item!r}")
        values[key.strip().replace("-", "_")] = parse_value(value)
    return values


# -- latentcode train -------------------------------------------------------------------------------
TRAIN_OVERRIDES = (
    # flag, field, type, help
    ("--seed", "seed", int, "training seed: initialization, data stream and dropout (default 0)"),
    ("--lr", "learning_rate", float, "peak learning rate"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay (matrices only)"),
    ("--warmup-steps", "warmup_steps", int, "linear warmup steps"),
    ("--batch-size", "batch_size", int, "global batch size"),
    ("--instances", "n_train_instances", int, "training instances (overrides the scale)"),
    ("--n-layers", "n_layers", int, "transformer blocks"),
    ("--width-factor", "width_factor", int, "multiplies d_model, kqv_dim, v_dim, d_mlp and n_heads"),
    ("--n-heads", "n_heads", int, "attention heads"),
    ("--grad-clip", "grad_clip_norm", float, "clip gradients to this global norm"),
    ("--mixed-precision", "mixed_precision", str, "auto (bf16 where supported), no, bf16 or fp16"),
    ("--gradient-accumulation-steps", "gradient_accumulation_steps", int, "micro-batches per update"),
    ("--eval-every", "eval_every", int, "steps between evaluations"),
    ("--eval-instances", "eval_instances", int, "instances per evaluation split"),
    ("--checkpoint-every", "checkpoint_every", int, "steps between checkpoints"),
    ("--log-every", "log_every", int, "steps between log lines"),
)


@subcommand
def _train(subparsers: argparse._SubParsersAction) -> None:
    from latentcode.train.presets import describe_presets

    parser = subparsers.add_parser(
        "train",
        help="train a model on a task (presets from the paper)",
        description="Train a hooked transformer with the paper's recipe (AdamW, linear warmup, cosine decay to "
        "0.1x, weight decay on matrices only, attention dropout 0.1). Runs on CPU, one GPU, or several with "
        "`accelerate launch -m latentcode.cli train ...`. Writes a run directory with config.json, "
        "metrics.jsonl, checkpoints/, model/ and summary.json.",
        epilog="presets:\n" + describe_presets() + "\n\nscales: tiny (smoke test), cpu (under an hour on 2 CPU cores), "
        "paper (the paper's budget)\n\nexamples:\n  latentcode train --preset fuzzy_logic --attention hyla --scale cpu "
        "--out runs/fuzzy-hyla\n  latentcode train --resume runs/fuzzy-hyla",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", help="fuzzy_logic or sraven (see below)")
    parser.add_argument("--attention", default="softmax",
                        help="attention preset (softmax, linear, hyla, ... or NORMALIZATION+VALUE_NETWORK; default softmax)")
    parser.add_argument("--scale", default="cpu", help="tiny, cpu or paper (default cpu)")
    parser.add_argument("--out", help="run directory (default runs/PRESET-ATTENTION-SCALE-seedSEED)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    parser.add_argument("--config", metavar="JSON", help="a TrainConfig JSON file instead of a preset")
    for flag, field, kind, text in TRAIN_OVERRIDES:
        parser.add_argument(flag, dest=field, type=kind, help=text)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override any task, model or training field, e.g. --set frac_test=0.7 --set seq_len=16")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.set_defaults(handler=_run_train)


def _run_train(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    from latentcode.train import TrainConfig, build_train_config, train

    if args.resume:
        if args.preset or args.config:
            raise ValueError("--resume continues a run with its own config; do not combine it with --preset or --config")
        run = train(resume=args.resume, progress=not args.quiet)
    else:
        overrides = {field: getattr(args, field) for _, field, _, _ in TRAIN_OVERRIDES if getattr(args, field) is not None}
        overrides |= parse_assignments(args.set, "--set")
        if args.compile:
            overrides["compile"] = True
        if args.config:
            if args.preset:
                raise ValueError("give either --preset or --config, not both")
            config = TrainConfig.from_dict(json.loads(Path(args.config).read_text()))
        elif args.preset:
            config = build_train_config(args.preset, args.scale, args.attention, **overrides)
            overrides = {}
        else:
            raise ValueError("latentcode train needs --preset (fuzzy_logic or sraven), --config or --resume")
        out = args.out or f"runs/{config.preset or config.task['name']}-{config.model_config().attention_name}-{config.scale}-seed{config.seed}"
        run = train(config, out, progress=not args.quiet)
    summary = run.summary or {}
    print(f"run finished: {run.path}  ({summary.get('steps')} steps, {summary.get('wall_seconds', 0):.0f} s)")
    for split, metrics in (summary.get("final_metrics") or {}).items():
        print(f"  {split:14s} " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))


# -- latentcode sweep -------------------------------------------------------------------------------
@subcommand
def _sweep(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="train a grid of runs and tabulate them",
        description="Run a grid of training runs (learning rate, weight decay, warmup, seeds, attention presets, "
        "depth, width, data size, ...) sequentially or as independent processes; write results.csv/json and "
        "best.json (chosen on the in-distribution test split, never on OOD).",
        epilog="example:\n  latentcode sweep --preset fuzzy_logic --scale tiny --grid attention=softmax,linear,hyla "
        "--grid learning_rate=1e-3,3e-3 --seeds 0,1 --out sweeps/fuzzy\n  latentcode sweep --preset sraven --grid paper "
        "--out sweeps/sraven-paper",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", required=True)
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--out", required=True, help="sweep directory (one run directory per grid point)")
    parser.add_argument("--grid", action="append", metavar="FIELD=V1,V2,...",
                        help="values of one field (any train/model/task field, or attention); 'paper' adds the "
                        "paper's grid for the preset")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (default 0)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, each in its own process (default 1)")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> None:
    from latentcode.train.presets import PRESETS
    from latentcode.train.sweep import best_runs, paper_grid, sweep

    grid: dict = {}
    for item in args.grid or []:
        if item == "paper":
            if args.preset not in PRESETS:
                raise ValueError(f"unknown preset {args.preset!r}; valid presets: {', '.join(PRESETS)}")
            grid |= paper_grid(args.preset)
            continue
        key, separator, values = item.partition("=")
        if not separator:
            raise ValueError(f"--grid expects FIELD=V1,V2,... or 'paper', got {item!r}")
        grid[key.strip().replace("-", "_")] = [parse_value(value) for value in values.split(",") if value]
    seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    rows = sweep(args.preset, args.scale, grid, args.out, seeds=seeds, jobs=args.jobs, progress=not args.quiet)
    print(f"{len(rows)} runs; table: {args.out}/results.csv")
    for attention, row in best_runs(rows, args.preset).items():
        params = {k: v for k, v in row.items() if k in grid or k == "seed"}
        print(f"  best {attention}: {params}  " + "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k.startswith(("test.", "ood.")) and isinstance(v, float)))


# -- latentcode extract -----------------------------------------------------------------------------
@subcommand
def _extract(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "extract",
        help="record latent codes of a trained model into an HDF5 file",
        description="Run a trained model on task instances and record the latent codes a[:, q, k] at the selected "
        "sites, with every task label, the prediction and the target, into a self-describing HDF5 file (schema: "
        "latentcode/store.py). Written atomically: an interrupted extraction leaves no file behind.",
        epilog="site selectors: last-self (every layer, last token to itself), sraven-rule (every layer, last query "
        "token to the same feature in the last row's context panels; unpermuted instances), all-pairs:LAYER, or "
        "LAYER:QUERY:KEY[,...] (negative positions count from the end, * as LAYER is every layer)\n\nexample:\n"
        "  latentcode extract runs/sraven-hyla --split ood --n 8192 --sites sraven-rule --out codes.h5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN_DIR", help="a run directory (or a saved model directory with --task)")
    parser.add_argument("--split", default="ood", help="task split (default ood)")
    parser.add_argument("--n", type=int, default=8192, help="instances (default 8192)")
    parser.add_argument("--sites", default="last-self", help="site selector (default last-self)")
    parser.add_argument("--out", required=True, help="the HDF5 file to write")
    parser.add_argument("--variant", help="task variant (default: the selector's, else the task's default)")
    parser.add_argument("--score", choices=("pattern", "scores"), default="pattern",
                        help="pattern: normalized latent codes (default); scores: raw scores before normalization")
    parser.add_argument("--batch-size", type=int, default=256, help="instances per forward pass (default 256)")
    parser.add_argument("--seed", type=int, help="sample seed (default: the split's evaluation seed)")
    parser.add_argument("--task", metavar="KEY=VALUE", action="append",
                        help="task config for a model directory, e.g. --task name=sraven --task n_features=4")
    parser.add_argument("--append", action="store_true", help="add examples to an existing file with the same schema")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_extract)


def _run_extract(args: argparse.Namespace) -> None:
    from latentcode.extract import extract
    from latentcode.store import CodeFile

    task = parse_assignments(args.task, "--task") or None
    path = extract(args.run, task, args.sites, args.split, args.n, args.out, variant=args.variant, score=args.score,
                   batch_size=args.batch_size, seed=args.seed, append=args.append, overwrite=args.overwrite,
                   progress=not args.quiet)
    codes = CodeFile(path)
    print(f"wrote {path}: {len(codes)} examples (splits {codes.splits}), {len(codes.sites)} sites, "
          f"{codes.n_heads} heads, labels {codes.label_names}")


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
