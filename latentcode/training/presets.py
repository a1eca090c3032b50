"""Training presets named after the paper's table of hyperparameters, and scales.

A preset fixes the task, the model and the optimizer as in the paper (its default point of the
paper's grid); `PAPER_GRIDS` lists the values the paper searched, which `latentcode sweep --grid
paper` runs. A scale sets the number of training instances (and the evaluation and checkpoint
cadence to match):

- `tiny`: a few dozen steps, for tests and smoke runs;
- `demo`: a few minutes per model on 2 CPU cores (`latentcode demo --train`);
- `cpu`: a meaningful result in under an hour on 2 CPU cores;
- `paper`: the paper's full budget (fuzzy logic 50,000 steps of 128; SRAVEN 20 million instances).

Warmup is the preset's, capped at a tenth of the steps (the run's config notes when it was).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from latentcode.models.config import ConfigError
from latentcode.training.config import TrainConfig

SCALES = ("tiny", "demo", "cpu", "paper")


@dataclass(frozen=True)
class Preset:
    description: str
    task: dict[str, Any]
    model: dict[str, Any]
    optimizer: dict[str, Any]
    train_instances: dict[str, int]  # per scale
    eval_instances: dict[str, int]  # per scale and split
    paper_grid: dict[str, list]


PRESETS: dict[str, Preset] = {
    "fuzzy_logic": Preset(
        description="fuzzy logic, L=4 variables, K=2 terms, N=32 examples (paper Table: 2 layers, d_model 128, "
        "8 heads, kqv 16, d_mlp 256, batch 128, warmup 100, 50,000 steps)",
        task={"name": "fuzzy_logic", "n_variables": 4, "n_terms": 2, "seq_len": 32, "frac_test": 0.5,
              "frac_unseen_terms": 0.25, "seed": 0},
        model={"n_layers": 2, "d_model": 128, "n_heads": 8, "kqv_dim": 16, "d_mlp": 256, "positions": "relative",
               "causal": False, "attn_dropout": 0.1},
        optimizer={"batch_size": 128, "learning_rate": 1e-3, "weight_decay": 0.1, "warmup_steps": 100},
        train_instances={"tiny": 24 * 128, "demo": 1_500 * 128, "cpu": 8_000 * 128, "paper": 50_000 * 128},
        eval_instances={"tiny": 256, "demo": 1024, "cpu": 4096, "paper": 16_000},
        paper_grid={"learning_rate": [1e-3, 3e-3], "weight_decay": [0.03, 0.1], "warmup_steps": [100]},
    ),
    "sraven": Preset(
        description="SRAVEN, M=4 features, K=8 values, 25% of rule multisets held out (paper Table: 4/8/16 layers, "
        "width factor 1/2/4, d_model 128, 16 heads, kqv 64, d_mlp 256, batch 128, 20M instances)",
        task={"name": "sraven", "n_features": 4, "n_values": 8, "frac_ood": 0.25, "seed": 0},
        model={"n_layers": 4, "d_model": 128, "n_heads": 16, "kqv_dim": 64, "d_mlp": 256, "positions": "relative",
               "causal": False, "attn_dropout": 0.1, "width_factor": 1},
        optimizer={"batch_size": 128, "learning_rate": 1e-3, "weight_decay": 0.1, "warmup_steps": 1000},
        train_instances={"tiny": 24 * 128, "demo": 600 * 128, "cpu": 8_000 * 128, "paper": 20_000_000},
        eval_instances={"tiny": 256, "demo": 1024, "cpu": 4096, "paper": 51_200},
        paper_grid={"learning_rate": [3e-4, 1e-3], "weight_decay": [0.1, 0.3], "warmup_steps": [1000, 3000],
                    "n_layers": [4, 8, 16], "width_factor": [1, 2, 4]},
    ),
}

# Fields a user may override by name; which part of the config each belongs to.
TASK_FIELDS = {"n_variables", "n_terms", "seq_len", "frac_test", "frac_unseen_terms", "n_features", "n_values",
               "frac_ood", "task_seed"}
MODEL_FIELDS = {"n_layers", "d_model", "n_heads", "kqv_dim", "v_dim", "d_mlp", "attention", "ffn", "n_experts",
                "top_k_experts", "positions", "causal", "attn_dropout", "width_factor"}


def describe_presets() -> str:
    lines = []
    for name, preset in PRESETS.items():
        grid = ", ".join(f"{key} in {values}" for key, values in preset.paper_grid.items())
        scales = ", ".join(f"{scale}={count:,}" for scale, count in preset.train_instances.items())
        lines.append(f"  {name}: {preset.description}\n      paper grid: {grid}\n      training instances: {scales}")
    return "\n".join(lines)


def build_train_config(preset: str, scale: str = "cpu", attention: str = "softmax", **overrides: Any) -> TrainConfig:
    """The TrainConfig of `preset` at `scale` with `attention`, and any field overridden by name.

    Overrides may name TrainConfig fields (`learning_rate`, `seed`, `n_train_instances`, ...), model
    fields (`n_layers`, `width_factor`, ...) or task fields (`seq_len`, `frac_test`, `task_seed`, ...).
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r}; valid scales: {', '.join(SCALES)}")
    spec = PRESETS[preset]
    task = dict(spec.task)
    model = {**spec.model, "attention": attention}
    train_fields: dict[str, Any] = dict(spec.optimizer)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in TASK_FIELDS:
            if key != "task_seed" and key not in task:
                raise ConfigError(f"the {preset} task has no parameter {key!r}; its parameters: {sorted(task)}")
            task["seed" if key == "task_seed" else key] = value
        elif key in MODEL_FIELDS:
            model[key] = value
        else:
            train_fields[key] = value

    from latentcode.tasks import get_task

    task_object = get_task(**task)
    model.update(d_in=task_object.d_in, d_out=task_object.d_out, n_ctx=task_object.seq_len)

    n_train = train_fields.pop("n_train_instances", spec.train_instances[scale])
    batch_size = train_fields.get("batch_size", 128)
    steps = n_train // batch_size
    notes = {"scale": f"{scale}: {n_train:,} training instances ({steps:,} steps of {batch_size})"}
    if "warmup_steps" not in overrides and train_fields["warmup_steps"] > steps // 10:
        notes["warmup"] = (f"the preset's warmup of {train_fields['warmup_steps']} steps was capped at a tenth "
                           f"of the {steps} steps: {steps // 10}")
        train_fields["warmup_steps"] = steps // 10
    cadence = {"tiny": max(steps // 2, 1), "demo": max(steps // 5, 1), "cpu": max(steps // 10, 1), "paper": 10_000}[scale]
    defaults = {
        "eval_every": cadence,
        "checkpoint_every": cadence if scale != "paper" else 5_000,
        "eval_instances": spec.eval_instances[scale],
        "log_every": {"tiny": 5, "demo": 25, "cpu": 50, "paper": 500}[scale],
    }
    train_fields = {**defaults, **train_fields}
    return TrainConfig(task=task, model=model, n_train_instances=n_train, preset=preset, scale=scale,
                       notes=notes, **train_fields)
