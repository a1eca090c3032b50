"""`latentcode demo`: the whole pipeline on an embedded default, in a few minutes on 2 CPU cores.

1. models: softmax, linear and HYLA models for the task, from the checkpoints shipped in
   `models/` (trained on CPU, see their model cards; found after any install, or in `models_dir`,
   see `latentcode.shipped`), or trained here with `train=True`;
2. extraction: their latent codes on in-distribution (`train`) and held-out instances (the task's
   `held_out_split`: `ood` for the compositional tasks, `validation` bytes for language), at the
   paper's sites (SRAVEN: `sraven-rule` on unpermuted instances; fuzzy logic: `last-self` on the
   fixed-query variant, as the authors' analysis; language: `last-recent`);
3. analysis: decode the sub-task (SRAVEN: the rule of the query position; fuzzy logic: each term)
   from the codes, fitted in distribution and scored OOD; tSNE plots and the mean-code heatmap;
4. the report: one HTML page, and the headline numbers printed.

Everything goes into a new directory (an existing one is never overwritten: `latentcode-demo-1`,
`-2`, ... are used instead).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from latentcode.analysis.report import Report, build_report
from latentcode.errors import UsageError
from latentcode.files import write_error
from latentcode.shipped import SHIPPED_ATTENTIONS, shipped_run
from latentcode.tasks import DEMO_TASK, task_class, task_names

ATTENTIONS = SHIPPED_ATTENTIONS
# Why 128 is exact: the note below (tests/test_demo.py checks it); extraction takes 0.7-0.9 CPU-s per 128
# windows instead of 2.6-4.5 at 512, with the same 2,048 windows per split.
DEMO_MAX_SEQ_LEN = {"language": 128}
DEMO_MAX_SEQ_LEN_NOTE = {
    "language": "The codes were extracted on 128-byte windows (the models were trained on 512): with causal attention "
    "and rotary positions they are exactly the models' codes at query 127 of 512-byte windows, the last "
    "token with 127 bytes of context.",
}
# What the demo's pictures colour by, where the task's own label would leave most points grey: fuzzy logic's
# function takes 46 values on the held-out split (a legend of 9 left 75% grey), its first term 10 (as Fig. 3).
DEMO_PICTURE_LABEL = {"fuzzy_logic": "terms[0]"}
__all__ = ["ATTENTIONS", "demo_tasks", "fresh_directory", "run_demo", "shipped_run"]


def demo_tasks() -> list[str]:
    """The tasks the demo runs: those with a training setup (a `latentcode train` preset)."""
    return [name for name in task_names() if task_class(name).training_setup is not None]


def fresh_directory(path: str | Path) -> Path:
    """`path` if it does not exist or is empty, else the first free `path-1`, `path-2`, ...: a
    directory to write into that holds nothing already written (the demo's, the README's runs)."""
    path = Path(path)
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return path
    index = 1
    while path.with_name(f"{path.name}-{index}").exists():
        index += 1
    return path.with_name(f"{path.name}-{index}")


def make_fresh_directory(path: str | Path) -> Path:
    """Create and return `path`, or the first of `path-1`, `path-2`, ... that this process creates
    itself (an existing empty `path` is used as it is): two demos started together into one
    directory each get their own, where checking first and creating after let one of them fail."""
    path = Path(path)
    if path.is_dir() and not any(path.iterdir()):
        return path
    for index in range(10_000):
        candidate = path if index == 0 else path.with_name(f"{path.name}-{index}")
        try:
            candidate.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as error:
            raise write_error(error, candidate) from None
        return candidate
    raise UsageError(f"{path} and 10,000 numbered directories beside it exist; choose another out")


def run_demo(task: str = DEMO_TASK, out: str | Path = "latentcode-demo", train: bool = False, scale: str = "demo",
             attentions: Sequence[str] = ATTENTIONS, n_codes: int = 2048, max_points: int = 1000, progress: bool = True,
             model_overrides: dict | None = None, models_dir: str | Path | None = None,
             checkpoints: str | None = None) -> Report:
    """Run the demo (see the module docstring) and return its report.

    train: train the models here at `scale` instead of using the shipped checkpoints
        (`model_overrides`, e.g. {"n_layers": 1}, shrink them for tests).
    n_codes: instances per split whose latent codes are extracted.
    progress: say what is done; bars where stderr is a terminal, training's log lines elsewhere.
    models_dir: the directory of the shipped checkpoints (default: found, see `latentcode.shipped`).
    checkpoints: which shipped trio: None for the task's default one, "permuted" for SRAVEN's
        models trained on the permuted task (`models/sraven-permuted-*`).
    """
    import latentcode
    from latentcode.training import build_train_config

    if task not in demo_tasks():
        raise UsageError(f"unknown demo task {task!r}; choose one of {demo_tasks()}")
    # Find every shipped checkpoint before anything is written or trained.
    if train and checkpoints:
        raise UsageError(f"checkpoints={checkpoints!r} picks shipped models; train=True trains new ones: give one")
    shipped = {attention: shipped_run(task, attention, models_dir, checkpoints)
               for attention in attentions} if not train else {}
    # How the shipped checkpoints were trained (models/recreate.sh), and so how `train=True` trains;
    # the sites and input variant of the paper's latent-code analysis.
    shipped_training = task_class(task).training_setup.shipped
    analysis = task_class(task).analysis
    started = time.perf_counter()
    out = make_fresh_directory(out)
    say = print if progress else (lambda *args, **kwargs: None)
    say(f"latentcode demo: {task}, models {', '.join(attentions)} -> {out}")

    run_dirs = []
    for attention in attentions:
        destination = out / "runs" / attention
        if not train:
            say(f"  {attention}: shipped checkpoint {shipped[attention]}")
            shutil.copytree(shipped[attention], destination,
                            ignore=shutil.ignore_patterns("checkpoints", "*.md", "*.py"))
        else:
            config = build_train_config(task, scale, attention, **{**shipped_training, **(model_overrides or {})})
            say(f"  {attention}: training {config.steps} steps ({config.notes['scale']})")
            latentcode.train(config, destination, progress=progress)
        run_dirs.append(destination)

    selector, variant, held_out = analysis.selector, analysis.variant, analysis.held_out_split
    for attention, run_dir in zip(attentions, run_dirs, strict=True):
        codes = run_dir / "codes" / f"{attention}.h5"
        codes.parent.mkdir(parents=True, exist_ok=True)
        # In the batches the run evaluated in: a language model's long windows are slower in larger ones.
        run_config = latentcode.Run(run_dir).config
        task_config = dict(run_config.task)
        if task in DEMO_MAX_SEQ_LEN:
            task_config["seq_len"] = min(task_config["seq_len"], DEMO_MAX_SEQ_LEN[task])
        for index, split in enumerate(("train", held_out)):
            latentcode.extract(run_dir, task_config, sites=selector, split=split, n=n_codes, out=codes, variant=variant,
                               batch_size=run_config.eval_batch_size, append=index > 0, progress=progress)
        say(f"  {attention}: latent codes of {n_codes} train + {n_codes} {held_out} instances -> {codes}")

    first_run = latentcode.Run(run_dirs[0])  # the variant the models were trained on (None: the task's default)
    trained_variant = first_run.config.variant or first_run.task().variants[0]
    title = f"latentcode demo: {task}, " + (f"{variant} variant" if trained_variant == variant
                                             else f"codes on the {variant} variant")
    notes = [f"The models were trained by this demo (scale {scale!r})." if train else
             "The models are the checkpoints shipped with latentcode (see their model cards): the Training section "
             "describes their original training, not this demo, which extracted their latent codes and computed "
             "everything else."]
    if task in DEMO_MAX_SEQ_LEN and first_run.task().seq_len > DEMO_MAX_SEQ_LEN[task]:
        notes.append(DEMO_MAX_SEQ_LEN_NOTE[task])
    report = build_report(run_dirs, out=out / "report.html", fit_split="train", test_split=held_out,
                          max_points=max_points, title=title, progress=progress, notes=notes,
                          picture_label=DEMO_PICTURE_LABEL.get(task))
    minutes = (time.perf_counter() - started) / 60
    print(f"\nreport: {report.path.resolve()}  ({minutes:.1f} min)")
    print(f"  {report.context}")
    for line in report.headline():
        print("  " + line)
    return report
