"""`TrainConfig`: everything a training run needs, resolved, validated and JSON-serialisable.

`steps = n_train_instances // batch_size` optimizer updates; `batch_size` is the global batch
(split over processes and gradient-accumulation micro-batches).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from latentcode.models.config import ConfigError, ModelConfig, check_field_names, parameter_bytes
from latentcode.validation import check_variant, describe_bytes, machine_memory

MIXED_PRECISION = ("auto", "no", "bf16", "fp16")


@dataclass(frozen=True)
class TrainConfig:
    task: dict[str, Any]  # get_task(**task): the task name and its parameters
    model: dict[str, Any]  # ModelConfig fields; d_in, d_out and n_ctx are filled from the task
    n_train_instances: int
    learning_rate: float
    weight_decay: float
    warmup_steps: int
    batch_size: int = 128
    lr_final_fraction: float = 0.1
    grad_clip_norm: float | None = None
    seed: int = 0
    eval_every: int = 1000
    eval_instances: int = 2048
    eval_batch_size: int = 256
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 50
    mixed_precision: str = "auto"
    gradient_accumulation_steps: int = 1
    compile: bool = False
    # The task's input variant for training and evaluation (None: the task's default, its first),
    # e.g. SRAVEN "unpermuted": the same instances without the column permutations.
    variant: str | None = None
    preset: str | None = None
    scale: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def steps(self) -> int:
        return self.n_train_instances // self.batch_size

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.model)

    def validate(self) -> None:
        def check(condition: bool, message: str) -> None:
            if not condition:
                raise ConfigError(message)

        self.check_fields(dataclasses.asdict(self))  # the checks that need no torch
        check(isinstance(self.task, dict) and "name" in self.task,
              f"task must be a dict with a 'name', got {self.task!r}")
        for name in ("batch_size", "eval_every", "eval_instances", "eval_batch_size", "checkpoint_every",
                     "log_every", "gradient_accumulation_steps", "keep_checkpoints"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                  f"{name} must be a positive integer, got {value!r}")
        check(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
              f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")
        check(self.n_train_instances >= self.batch_size,
              f"n_train_instances={self.n_train_instances} is less than one batch of {self.batch_size}")
        check(self.warmup_steps < self.steps,
              f"warmup_steps={self.warmup_steps} is not less than the {self.steps} training steps "
              f"(n_train_instances={self.n_train_instances} / batch_size={self.batch_size})")
        check(self.learning_rate > 0, f"learning_rate must be positive, got {self.learning_rate!r}")
        check(self.weight_decay >= 0, f"weight_decay must be non-negative, got {self.weight_decay!r}")
        check(0 <= self.lr_final_fraction <= 1, f"lr_final_fraction must be in [0, 1], got {self.lr_final_fraction!r}")
        check(self.grad_clip_norm is None or self.grad_clip_norm > 0,
              f"grad_clip_norm must be positive or None, got {self.grad_clip_norm!r}")
        check(self.mixed_precision in MIXED_PRECISION,
              f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        check(self.batch_size % self.gradient_accumulation_steps == 0,
              f"batch_size={self.batch_size} is not divisible by gradient_accumulation_steps="
              f"{self.gradient_accumulation_steps}")
        self.model_config()  # raises ConfigError naming what is wrong with the model
        if self.variant is not None:
            from latentcode.tasks import get_task

            check_variant(self.variant, get_task(**self.task), "variant", error=ConfigError)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def check_fields(cls, data: dict[str, Any]) -> None:
        """Refuse unknown or missing fields, and values of the wrong type or a model too large for this
        machine: the checks that need no torch (the rest of `validate` needs the model modules)."""
        check_field_names(cls, data)
        seed = data.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:  # a traceback deep in numpy
            raise ConfigError(f"seed must be a non-negative integer below 2**32 (numpy and torch seeds are 32-bit), "
                              f"got {seed!r}")
        n_train_instances = data["n_train_instances"]
        if not isinstance(n_train_instances, int) or isinstance(n_train_instances, bool) or n_train_instances < 1:
            raise ConfigError(f"n_train_instances must be a positive integer, got {n_train_instances!r}")
        for name in ("learning_rate", "weight_decay", "lr_final_fraction", "grad_clip_norm"):
            value = data.get(name, 0.1)
            if name == "grad_clip_norm" and value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
        model = data["model"]
        if not isinstance(model, dict):
            raise ConfigError(f"model must be a dict of ModelConfig fields, got {model!r}")
        # Weights, their gradients and AdamW's two moments: a model of terabytes is refused here, not
        # killed by the kernel once its run directory exists.
        need, memory = 4 * parameter_bytes(model), machine_memory()
        if memory is not None and need > memory:
            raise ConfigError(
                f"the model (n_layers={model.get('n_layers')}, d_model={model.get('d_model')}, kqv_dim="
                f"{model.get('kqv_dim')}, d_mlp={model.get('d_mlp')}) needs at least {describe_bytes(need)} to train "
                f"(weights, gradients and two AdamW moments in float32); this machine has {describe_bytes(memory)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        cls.check_fields(data)
        return cls(**data)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)
