"""`latentcode train`: train a model on a task, from a preset, a config file, or a killed run."""

from __future__ import annotations

import argparse
import os

from latentcode.cli.arguments import (
    NON_NEGATIVE_INTEGER,
    NON_NEGATIVE_NUMBER,
    POSITIVE_INTEGER,
    POSITIVE_NUMBER,
    SEED,
    add_placement_arguments,
    one_of,
    parse_assignments,
)
from latentcode.cli.command import Command, command_parser
from latentcode.training.config import MIXED_PRECISION

TRAIN_OVERRIDES = (
    # flag, field, type, help
    ("--seed", "seed", SEED, "training seed: initialization, data stream and dropout (default 0)"),
    ("--lr", "learning_rate", POSITIVE_NUMBER, "peak learning rate"),
    ("--weight-decay", "weight_decay", NON_NEGATIVE_NUMBER, "AdamW weight decay (matrices only)"),
    ("--warmup-steps", "warmup_steps", NON_NEGATIVE_INTEGER, "linear warmup steps"),
    ("--batch-size", "batch_size", POSITIVE_INTEGER, "global batch size"),
    ("--instances", "n_train_instances", POSITIVE_INTEGER, "training instances (overrides the scale)"),
    ("--n-layers", "n_layers", POSITIVE_INTEGER, "transformer blocks"),
    ("--width-factor", "width_factor", POSITIVE_INTEGER, "multiplies d_model, kqv_dim, v_dim, d_mlp and n_heads"),
    ("--n-heads", "n_heads", POSITIVE_INTEGER, "attention heads"),
    ("--grad-clip", "grad_clip_norm", POSITIVE_NUMBER, "clip gradients to this global norm"),
    ("--mixed-precision", "mixed_precision", one_of(MIXED_PRECISION),
     "auto (bf16 where supported), no, bf16 or fp16"),
    ("--gradient-accumulation-steps", "gradient_accumulation_steps", POSITIVE_INTEGER, "micro-batches per update"),
    ("--eval-every", "eval_every", POSITIVE_INTEGER, "steps between evaluations"),
    ("--eval-instances", "eval_instances", POSITIVE_INTEGER, "instances per evaluation split"),
    ("--checkpoint-every", "checkpoint_every", POSITIVE_INTEGER, "steps between checkpoints"),
    ("--log-every", "log_every", POSITIVE_INTEGER, "steps between log lines"),
    ("--variant", "variant", str, "task input variant to train and evaluate on (default the task's first; each "
     "preset's variants are listed below)"),
)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    def epilog() -> str:  # built when help is printed: the preset table imports the tasks
        from latentcode.training.presets import describe_presets

        return ("presets:\n" + describe_presets() + "\n\nscales: tiny (smoke test: a small model, a few dozen steps, "
                "seconds), demo (a few minutes), cpu (under an hour on 2 CPU cores), paper (the paper's budget)"
                "\n\nexamples:\n  latentcode train --preset fuzzy_logic --attention hyla --scale cpu --out "
                "runs/fuzzy-hyla\n  latentcode train --resume runs/fuzzy-hyla")

    parser = command_parser(
        subparsers, "train", help="train a model on a task (presets from the paper)",
        description="Train a hooked transformer with the paper's recipe (AdamW, linear warmup, cosine decay to "
        "0.1x, weight decay on matrices only, attention dropout 0.1). Runs on CPU, one GPU, several GPUs with "
        "`accelerate launch -m latentcode.cli train ...`, or several CPU processes with "
        "`torchrun --nproc_per_node 2 -m latentcode.cli train ...`. Writes a run directory with config.json, "
        "metrics.jsonl, checkpoints/, model/ and summary.json.",
        epilog=epilog)
    parser.add_argument("--preset", help="the task to train on, by name (every task's preset is listed below)")
    parser.add_argument("--attention", default="softmax",
                        help="attention preset (softmax, linear, hyla, ... or NORMALIZATION+VALUE_NETWORK; "
                             "default softmax)")
    parser.add_argument("--scale", default="cpu", help="tiny, demo, cpu or paper (default cpu)")
    parser.add_argument("--out", help="run directory (default runs/PRESET-ATTENTION-SCALE-seedSEED)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    parser.add_argument("--config", metavar="JSON", help="a TrainConfig JSON file instead of a preset")
    for flag, field, kind, text in TRAIN_OVERRIDES:
        parser.add_argument(flag, dest=field, type=kind, help=text)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override any task, model or training field, e.g. --set frac_test=0.7 --set seq_len=16")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    add_placement_arguments(parser, "accelerate's choice: a GPU where there is one, else cpu", "the config's "
                            "mixed_precision; bfloat16 or float16: autocast (mixed_precision bf16 or fp16, parameters "
                            "and optimizer state float32), float32: none")
    parser.add_argument("--threads", type=POSITIVE_INTEGER,
                        help="CPU threads of this process (default: one per core, or the cores left free when other "
                        "processes keep some busy; give each of several jobs side by side its own, e.g. --threads 1 "
                        "for two jobs on 2 cores)")
    parser.add_argument("--mkl-on-amd", action="store_true",
                        help="on an AMD CPU, answer MKL's Intel-only CPU check so that its fast matrix products run "
                        "(rewrites one offset-table slot of libtorch in this process; results change by float "
                        "rounding; the run records it). Same as LATENTCODE_MKL_ON_AMD=1. Off by default")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def check(args: argparse.Namespace) -> None:
    """What can be checked without the model modules (which import torch): flags that go together,
    the preset, scale, variant and --set fields, the --config file, where the run goes, the run to
    resume: the plan `latentcode.train` makes too (`args.plan`)."""
    from latentcode.training.plan import plan_train

    overrides = {field: getattr(args, field) for _, field, _, _ in TRAIN_OVERRIDES if getattr(args, field) is not None}
    named = [flag for flag, field, _, _ in TRAIN_OVERRIDES if field in overrides]
    named += ["--set"] * bool(args.set) + ["--compile"] * args.compile
    overrides |= parse_assignments(args.set, "--set") | ({"compile": True} if args.compile else {})
    args.plan = plan_train(args.config, args.out, preset=args.preset, scale=args.scale, attention=args.attention,
                           overrides=overrides, resume=args.resume, threads=args.threads, named=named,
                           device=args.device, dtype=args.dtype)
    if args.plan.resume is not None and not args.plan.checkpoints:  # said, not silent: nothing earlier is kept
        print(f"note: {args.resume} has no checkpoint yet; --resume trains it again from step 0 (the model "
              "initialized from the run's seed, as before)", flush=True)


def run(args: argparse.Namespace) -> None:
    from latentcode.allocator import keep_freed_memory
    from latentcode.models import mkl_on_amd
    from latentcode.training.threads import choose_threads
    from latentcode.training.trainer import run_training

    keep_freed_memory()  # every step reuses the last one's pages: this process's choice, made here, not in train()
    if args.mkl_on_amd:  # before the first product (MKL keeps the path it chose then)
        mkl_on_amd.use_mkl_fast_paths()
    on_step = choose_threads(args.plan.threads)
    run_record = run_training(args.plan, progress=not args.quiet, on_step=on_step)
    if int(os.environ.get("RANK", "0")) != 0:
        return  # one report per run, from the main process of a multi-process launch
    summary = run_record.summary or {}
    print(f"run finished: {run_record.path}  ({summary.get('steps')} steps, {summary.get('wall_seconds', 0):.0f} s)")
    for split, metrics in (summary.get("final_metrics") or {}).items():
        print(f"  {split:14s} " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))


COMMAND = Command(register, check, run, order=20, parameters={"overrides": "set"})
