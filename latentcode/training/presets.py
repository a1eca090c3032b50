"""Training presets named after the paper's table of hyperparameters, and scales.

A preset fixes the task, the model and the optimizer as in the paper (its default point of the
paper's grid); its `paper_grid` lists the values the paper searched, which `latentcode sweep --grid
paper` runs. A scale sets the number of training instances (and the evaluation and checkpoint
cadence to match):

- `tiny`: a few dozen steps of a small model (d_model 32; each task's `TrainingSetup.scales`),
  for tests and smoke runs, a step well under a second on one thread;
- `demo`: a few minutes per model on 2 CPU cores (`latentcode demo --train`);
- `cpu`: a meaningful result in under an hour on 2 CPU cores;
- `paper`: the paper's full budget (fuzzy logic 50,000 steps of 128; SRAVEN 20 million instances).

Warmup is the preset's, capped at a tenth of the steps (the run's config notes when it was).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from latentcode.errors import about
from latentcode.models.config import ConfigError, ModelConfig
from latentcode.tasks import get_task, task_class, task_names
from latentcode.tasks.base import TrainingSetup
from latentcode.training.config import TrainConfig
from latentcode.validation import check_variant

SCALES = ("tiny", "demo", "cpu", "paper")


def presets() -> dict[str, TrainingSetup]:
    """The presets: every registered task with a `training_setup`, by task name."""
    return {name: task_class(name).training_setup for name in task_names()
            if task_class(name).training_setup is not None}


def task_fields() -> set[str]:
    """Task parameters a user may override by name (`task_seed` sets the task's own seed)."""
    return {name for task in task_names() for name in task_class(task).parameter_names() if name != "seed"} | {
        "task_seed"}


# ModelConfig fields a user may override by name; the task fixes the input, output and context sizes.
MODEL_FIELDS = {field.name for field in dataclasses.fields(ModelConfig)} - {"d_in", "d_vocab", "d_out", "n_ctx"}
# TrainConfig fields a user may override by name; the preset sets the task, model and identity.
TRAIN_FIELDS = {field.name for field in dataclasses.fields(TrainConfig)} - {"task", "model", "preset", "scale", "notes"}


def describe_presets() -> str:
    """The preset table of `latentcode train --help`: each task's setup, grid, scales and variants."""
    lines = []
    for name, preset in presets().items():
        grid = ", ".join(f"{key} in {values}" for key, values in preset.paper_grid.items())
        scales = ", ".join(f"{scale}={count:,}" for scale, count in preset.train_instances.items())
        variants = ", ".join(task_class(name).variants)
        lines.append(f"  {name}: {preset.description}\n      paper grid: {grid}\n      training instances: {scales}"
                     f"\n      variants (--variant; the first is the default): {variants}")
    return "\n".join(lines)


def build_train_config(preset: str, scale: str = "cpu", attention: str = "softmax", **overrides: Any) -> TrainConfig:
    """The TrainConfig of `preset` at `scale` with `attention`, and any field overridden by name.

    Overrides may name TrainConfig fields (`learning_rate`, `seed`, `n_train_instances`, ...), model
    fields (`n_layers`, `width_factor`, ...) or task fields (`seq_len`, `frac_test`, `task_seed`, ...).
    The preset's own overrides for `scale` (`TrainingSetup.scales`) come first, the given ones after.
    """
    check_preset(preset, scale, overrides)
    spec = presets()[preset]
    task = dict(spec.task)
    model = {**spec.model, "attention": attention}
    train_fields: dict[str, Any] = dict(spec.optimizer)
    for key, value in {**spec.scales.get(scale, {}), **overrides}.items():
        if value is None:
            continue
        if key in task_fields():
            task["seed" if key == "task_seed" else key] = value
        elif key in MODEL_FIELDS:
            model[key] = value
        else:
            train_fields[key] = value

    task_object = get_task(**task)
    model.update(d_in=task_object.d_in, d_vocab=task_object.d_vocab, d_out=task_object.d_out, n_ctx=task_object.seq_len)

    n_train = train_fields.pop("n_train_instances", spec.train_instances[scale])
    batch_size = train_fields.get("batch_size", 128)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    steps = n_train // batch_size
    notes = {"scale": f"{scale}: {n_train:,} training instances ({steps:,} steps of {batch_size})"}
    if "warmup_steps" not in overrides and train_fields["warmup_steps"] > steps // 10:
        notes["warmup"] = (f"the preset's warmup of {train_fields['warmup_steps']} steps was capped at a tenth "
                           f"of the {steps} steps: {steps // 10}")
        train_fields["warmup_steps"] = steps // 10
    cadence = {"tiny": max(steps // 2, 1), "demo": max(steps // 5, 1), "cpu": max(steps // 10, 1),
               "paper": 10_000}[scale]
    defaults = {
        "eval_every": cadence,
        "checkpoint_every": cadence if scale != "paper" else 5_000,
        "eval_instances": spec.eval_instances[scale],
        "log_every": {"tiny": 5, "demo": 25, "cpu": 50, "paper": 500}[scale],
    }
    train_fields = {**defaults, **train_fields}
    return TrainConfig(task=task, model=model, n_train_instances=n_train, preset=preset, scale=scale,
                       notes=notes, **train_fields)


def check_preset(preset: str, scale: str, overrides: dict[str, Any] | None = None) -> None:
    """The preset, the scale, the variant and the names of the overridden fields, checked without torch:
    `build_train_config` and `latentcode.training.plan.plan_train` refuse a mistake here with one message
    (`errors.about` names the argument: preset, scale, variant or overrides)."""
    known = presets()
    if preset not in known:
        raise ConfigError(f"unknown preset {preset!r}; valid presets: {', '.join(known)}")
    if scale not in SCALES:
        with about("scale"):
            raise ConfigError(f"unknown scale {scale!r}; valid scales: {', '.join(SCALES)}")
    task = known[preset].task
    overrides = overrides or {}
    if overrides.get("variant") is not None:
        with about("variant"):
            check_variant(overrides["variant"], task_class(task["name"]), error=ConfigError)
    with about("overrides"):
        for key, value in overrides.items():
            if value is None:  # left at the preset's
                continue
            if key in task_fields():
                # a parameter the preset leaves at its default (SRAVEN's hold_out) may be set too
                if key != "task_seed" and key not in task and key not in task_class(task["name"]).parameter_names():
                    raise ConfigError(f"the {preset} task has no parameter {key!r}; its parameters: {sorted(task)}")
            elif key not in MODEL_FIELDS and key not in TRAIN_FIELDS:
                raise ConfigError(
                    f"unknown field {key!r}; valid fields: training {sorted(TRAIN_FIELDS)}, model "
                    f"{sorted(MODEL_FIELDS)}, task {sorted(task_fields())}")
