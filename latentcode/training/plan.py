"""`plan_train`: everything a training run needs, resolved and checked before torch is imported.

    plan = plan_train(preset="fuzzy_logic", scale="tiny", attention="hyla", out="runs/fuzzy-hyla")
    plan.source, plan.out, plan.resume            # where the config comes from, where the run goes
    latentcode.training.trainer.run_training(plan)  # builds the TrainConfig and trains (torch)

The command line's check (`latentcode train`) builds this plan and its run executes it;
`latentcode.train(config, out, resume=...)` builds the same plan, so a mistake gets the same message
from both (`errors.about` names the argument; the command line shows its flag). Checked here: what
the run starts from (a preset, a config, or a run to resume: one of them), the preset, scale,
variant and overridden field names (`presets.check_preset`, which `build_train_config` calls too),
a config file's or dict's fields and values (`TrainConfig.check_fields`), the output directory, and
the state of a run to resume. What needs the model modules (building the TrainConfig: the attention
names, the model's sizes) is left to `TrainPlan.train_config`. JSON only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latentcode.errors import UsageError, about
from latentcode.models.config import ConfigError
from latentcode.rundir import RunDirectory, RunDirectoryError
from latentcode.training.config import TrainConfig
from latentcode.training.presets import check_preset, presets
from latentcode.validation import check_output, check_placement


@dataclass(frozen=True)
class TrainPlan:
    """One training run, resolved: from `preset` (at `scale`, with `attention` and `overrides`), from
    `config` (a TrainConfig or its fields), or continuing the run at `resume`; into `out` (None: the
    default directory of the config, `default_run_directory`)."""

    source: str  # "preset", "config" or "resume"
    out: Path | None = None
    resume: Path | None = None
    preset: str | None = None
    scale: str = "cpu"
    attention: str = "softmax"
    overrides: Mapping[str, Any] = field(default_factory=dict)
    config: TrainConfig | Mapping[str, Any] | None = None
    config_name: str | None = None  # the file the config was read from, for messages
    threads: int | None = None
    checkpoints: int = 0  # of the run to resume: none means it trains again from step 0
    device: str | None = None  # None: accelerate's choice (a GPU where there is one, else the CPU)
    dtype: str | None = None  # as given; the config's mixed_precision says it (AUTOCAST_OF)

    def train_config(self) -> TrainConfig | None:
        """The TrainConfig this plan trains (the model modules load, with torch); None for a resume,
        which continues with the run's own."""
        if self.source == "resume":
            return None
        if self.source == "preset":
            from latentcode.training.presets import build_train_config

            config = build_train_config(self.preset, self.scale, self.attention, **self.overrides)
        elif isinstance(self.config, TrainConfig):
            config = self.config
        else:
            try:
                config = TrainConfig.from_dict(dict(self.config))
            except ConfigError as error:  # it says what is wrong, not in which file
                if self.config_name is None:
                    raise
                with about("config"):
                    raise UsageError(f"{self.config_name}: {error}") from None
        if self.dtype is not None:  # autocast to it (AUTOCAST_OF), recorded in the config
            config = dataclasses.replace(config, mixed_precision=AUTOCAST_OF[self.dtype])
        return config


def default_run_directory(config: TrainConfig) -> Path:
    """runs/PRESET-ATTENTION-SCALE-seedSEED: where a run goes when no directory is given."""
    return Path(f"runs/{config.preset or config.task['name']}-{config.model_config().attention_name}-"
                f"{config.scale}-seed{config.seed}")


def plan_train(
    config: TrainConfig | Mapping[str, Any] | str | Path | None = None,
    out: str | Path | None = None,
    *,
    preset: str | None = None,
    scale: str = "cpu",
    attention: str = "softmax",
    overrides: Mapping[str, Any] | None = None,
    resume: str | Path | None = None,
    threads: int | None = None,
    named: Sequence[str] | None = None,
    device: str | None = None,
    dtype: str | None = None,
) -> TrainPlan:
    """The plan of `latentcode.train` with these arguments, or the first mistake in them.

    config: a TrainConfig, a dict of its fields, or the path of a JSON file of them; or `preset` (a
    task's name) at `scale` with `attention` and `overrides` (TrainConfig, model and task fields by
    name, as `build_train_config` takes them); or `resume`, a run directory to continue. out: the run
    directory (None: `default_run_directory`). threads: this process's CPU threads (None: chosen at
    run time, `training.threads.choose_threads`). named: how the caller names the overrides it gave,
    for messages (the command line: its flags); default their field names.
    device: where the model trains ("cpu", "cuda"; None: accelerate's choice, a GPU where there is
    one). dtype: what it computes in: "bfloat16" or "float16" by autocast (accelerate's
    mixed_precision "bf16"/"fp16": parameters and optimizer state stay float32, the products run in
    the low precision, so no small update is rounded away), "float32" without; it sets the config's
    `mixed_precision`, and is refused where the config sets another one."""
    overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
    named = list(named) if named is not None else sorted(overrides)
    device, dtype = check_placement(device, dtype)
    if device is not None and device.partition(":")[2] not in ("", "0"):
        with about("device"):
            raise UsageError(f"device {device!r}: training places the model through accelerate, which gives each "
                             f"process its GPU; expected cpu or {device.partition(':')[0]} (CUDA_VISIBLE_DEVICES="
                             f"{device.partition(':')[2]} makes that GPU the one it sees)")
    if resume is not None:
        if dtype is not None:
            with about("dtype"):
                raise UsageError(f"dtype {dtype!r}: resume continues a run in the precision of its own config")
        return dataclasses.replace(_plan_resume(resume, config, preset, named, out, threads), device=device)
    if config is not None:
        if preset is not None:
            raise UsageError("give either --preset or --config, not both")
        if named:
            raise UsageError(f"--config takes every setting from its file; {', '.join(named)} cannot be combined "
                             "with it (edit the file, or use --preset)")
        with about("config"):
            config, config_name = _config_fields(config)
    elif preset is not None:
        check_preset(preset, scale, overrides)
        config_name = None
    else:
        raise UsageError(f"latentcode train needs --preset ({', '.join(presets())}), --config or --resume "
                         "(in Python: train(build_train_config(PRESET), out), train(CONFIG, out) or "
                         "train(resume=RUN_DIR))")
    if dtype is not None:
        _check_dtype_agrees(dtype, config, overrides)
    if out is not None:
        with about("out"):
            out = check_output(out, kind="directory")
    return TrainPlan("config" if config is not None else "preset", out, None, preset, scale, attention,
                     dict(overrides), config, config_name, threads, device=device, dtype=dtype)


AUTOCAST_OF = {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}  # dtype -> accelerate's mixed_precision


def _check_dtype_agrees(dtype: str, config: Any, overrides: Mapping[str, Any]) -> None:
    """Refuse `dtype` where the config (or the preset's overrides) sets another mixed_precision ("auto",
    the default, gives way to it)."""
    wanted = AUTOCAST_OF[dtype]
    if config is None:
        given = overrides.get("mixed_precision")
    elif isinstance(config, TrainConfig):
        given = config.mixed_precision
    else:
        given = dict(config).get("mixed_precision")
    if given not in (None, "auto", wanted):
        with about("dtype"):
            raise UsageError(f"dtype {dtype!r} computes with mixed_precision {wanted!r}, but the config sets "
                             f"mixed_precision {given!r}; give one of them")


def _plan_resume(resume, config, preset, named, out, threads) -> TrainPlan:
    """A killed run to continue with its own config and directory: it is one, and not finished."""
    with about("resume"):
        if preset is not None or config is not None:
            raise UsageError("resume continues a run with its own config; do not combine it with --preset or "
                             "--config (a preset or config in Python)")
        if named or out is not None:
            raise UsageError(f"resume continues a run with its own config and directory; "
                             f"{', '.join([*named, *['--out'] * (out is not None)])} cannot change them")
        directory = RunDirectory(resume)
        if not directory.path.exists():
            raise RunDirectoryError(f"{directory.path} is not a latentcode run directory (it does not exist)")
        directory.read_raw_config()
        if directory.is_finished:
            raise RunDirectoryError(f"{resume} has already finished; nothing to resume")
    return TrainPlan("resume", None, directory.path, threads=threads, checkpoints=len(directory.checkpoints()))


def _config_fields(config: TrainConfig | Mapping[str, Any] | str | Path) -> tuple[Any, str | None]:
    """A TrainConfig as given, or the fields of one (from a dict or a JSON file) checked as far as
    they can be without torch; and the file's name, if read from one."""
    if isinstance(config, TrainConfig):
        return config, None
    name = None
    if isinstance(config, (str, Path)):
        name, config = str(config), _read_json_object(config)
    if not isinstance(config, Mapping):
        raise UsageError(f"config is a {type(config).__name__}; expected a TrainConfig, a dict of its fields or "
                         "the path of a JSON file of them")
    try:
        TrainConfig.check_fields(dict(config))
    except ConfigError as error:  # it says what is wrong, not in which file
        if name is None:
            raise
        raise UsageError(f"{name}: {error}") from None
    return dict(config), name


def _read_json_object(path: str | Path) -> dict:
    """The JSON object in the file at `path`, refused in one line naming the file otherwise."""
    if not os.path.exists(path):
        raise UsageError(f"{path} does not exist; expected a JSON file of TrainConfig fields")
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory; expected a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{path} cannot be read (no read permission)")
    try:
        data = json.loads(Path(path).read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{path} is not a JSON file ({error})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}; expected an object of TrainConfig fields")
    return data
