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
    one_of,
    parse_assignments,
)
from latentcode.cli.checks import check_output, read_json_file
from latentcode.cli.command import Command
from latentcode.errors import UsageError
from latentcode.training.config import MIXED_PRECISION
from latentcode.validation import check_variant

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
                "\n\nexamples:\n  latentcode train --preset fuzzy_logic --attention hyla --scale cpu --out runs/fuzzy-hyla"
                "\n  latentcode train --resume runs/fuzzy-hyla")

    parser = subparsers.add_parser(
        "train",
        help="train a model on a task (presets from the paper)",
        description="Train a hooked transformer with the paper's recipe (AdamW, linear warmup, cosine decay to "
        "0.1x, weight decay on matrices only, attention dropout 0.1). Runs on CPU, one GPU, several GPUs with "
        "`accelerate launch -m latentcode.cli train ...`, or several CPU processes with "
        "`torchrun --nproc_per_node 2 -m latentcode.cli train ...`. Writes a run directory with config.json, "
        "metrics.jsonl, checkpoints/, model/ and summary.json.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", help="the task to train on, by name (every task's preset is listed below)")
    parser.add_argument("--attention", default="softmax",
                        help="attention preset (softmax, linear, hyla, ... or NORMALIZATION+VALUE_NETWORK; default softmax)")
    parser.add_argument("--scale", default="cpu", help="tiny, demo, cpu or paper (default cpu)")
    parser.add_argument("--out", help="run directory (default runs/PRESET-ATTENTION-SCALE-seedSEED)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    parser.add_argument("--config", metavar="JSON", help="a TrainConfig JSON file instead of a preset")
    for flag, field, kind, text in TRAIN_OVERRIDES:
        parser.add_argument(flag, dest=field, type=kind, help=text)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override any task, model or training field, e.g. --set frac_test=0.7 --set seq_len=16")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    parser.add_argument("--threads", type=POSITIVE_INTEGER,
                        help="CPU threads of this process (default: one per core, or the cores left free when other "
                        "processes keep some busy; give each of several jobs side by side its own, e.g. --threads 1 for "
                        "two jobs on 2 cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def _overrides(args: argparse.Namespace) -> dict:
    """The TrainConfig fields the override flags (--seed, --lr, ...) set."""
    return {field: getattr(args, field) for _, field, _, _ in TRAIN_OVERRIDES if getattr(args, field) is not None}


def check(args: argparse.Namespace) -> None:
    """What can be checked without the model modules (which import torch): flags that go
    together, the preset, scale, variant and --set fields, the --config file, where the run goes."""
    from latentcode.tasks import task_class
    from latentcode.training.presets import MODEL_FIELDS, SCALES, TRAIN_FIELDS, presets, task_fields

    overrides = _overrides(args)
    given = [flag for flag, field, _, _ in TRAIN_OVERRIDES if field in overrides]
    given += ["--set"] * bool(args.set) + ["--compile"] * args.compile
    if args.resume:
        if args.preset or args.config:
            raise UsageError("--resume continues a run with its own config; do not combine it with --preset or --config")
        if given or args.out:
            raise UsageError(f"--resume continues a run with its own config and directory; "
                             f"{', '.join(given + ['--out'] * bool(args.out))} cannot change them")
        from latentcode.rundir import RunDirectory

        directory = RunDirectory(args.resume)
        directory.read_raw_config()
        if not directory.checkpoints():  # said, not silent: nothing of the earlier session is kept
            print(f"note: {args.resume} has no checkpoint yet; --resume trains it again from step 0 (the model "
                  "initialized from the run's seed, as before)", flush=True)
        return
    if args.config:
        if args.preset:
            raise UsageError("give either --preset or --config, not both")
        if given:
            raise UsageError(f"--config takes every setting from its file; {', '.join(given)} cannot be combined "
                             "with it (edit the file, or use --preset)")
        from latentcode.models.config import ConfigError
        from latentcode.training.config import TrainConfig

        args.config_data = read_json_file(args.config, "--config")
        try:
            TrainConfig.check_fields(args.config_data)
        except ConfigError as error:  # it says what is wrong, not in which file
            raise UsageError(f"--config {args.config}: {error}") from None
    elif args.preset:
        if args.preset not in presets():
            raise UsageError(f"unknown preset {args.preset!r}; valid presets: {', '.join(presets())}")
        if args.scale not in SCALES:
            raise UsageError(f"--scale {args.scale}: unknown scale; valid scales: {', '.join(SCALES)}")
        if args.variant is not None:
            check_variant(args.variant, task_class(presets()[args.preset].task["name"]), "--variant")
        known = TRAIN_FIELDS | MODEL_FIELDS | task_fields()
        for key, value in parse_assignments(args.set, "--set").items():
            if key not in known:
                raise UsageError(f"--set {key}={value}: unknown field {key!r}; valid fields: {', '.join(sorted(known))}")
    else:
        raise UsageError(f"latentcode train needs --preset ({', '.join(presets())}), --config or --resume")
    if args.out:
        check_output(args.out, "--out", kind="directory")


def run(args: argparse.Namespace) -> None:
    from latentcode.models.config import ConfigError
    from latentcode.training import TrainConfig, build_train_config, train
    from latentcode.training.threads import choose_threads

    on_step = choose_threads(args.threads)

    if args.resume:
        run_record = train(resume=args.resume, progress=not args.quiet, on_step=on_step)
    else:
        if args.config:
            try:
                config = TrainConfig.from_dict(args.config_data)
            except ConfigError as error:  # it says what is wrong, not in which file
                raise UsageError(f"--config {args.config}: {error}") from None
        else:
            overrides = _overrides(args) | parse_assignments(args.set, "--set") | (
                {"compile": True} if args.compile else {})
            config = build_train_config(args.preset, args.scale, args.attention, **overrides)
        out = args.out or check_output(f"runs/{config.preset or config.task['name']}-"
                                       f"{config.model_config().attention_name}-{config.scale}-seed{config.seed}",
                                       "--out", kind="directory")
        run_record = train(config, out, progress=not args.quiet, on_step=on_step)
    if int(os.environ.get("RANK", "0")) != 0:
        return  # one report per run, from the main process of a multi-process launch
    summary = run_record.summary or {}
    print(f"run finished: {run_record.path}  ({summary.get('steps')} steps, {summary.get('wall_seconds', 0):.0f} s)")
    for split, metrics in (summary.get("final_metrics") or {}).items():
        print(f"  {split:14s} " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))


COMMAND = Command(register, check, run, order=20)
