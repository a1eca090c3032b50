"""The run directory: what a training run leaves behind; its one reader and writer (JSON only, no torch).

    RUN_DIR/
      config.json        the full resolved config: the TrainConfig (task, model, optimizer, seeds,
                         scale) under "train", the resolved ModelConfig, the task's analysis
                         defaults (`task_analysis`), latentcode and torch versions, creation time
      metrics.jsonl      one JSON object per logging step ({"event": "train", ...}) and per
                         evaluation ({"event": "eval", "step": ..., "splits": {split: metrics}})
      checkpoints/       step_XXXXXXXX/: model and optimizer tensors (safetensors) and
                         trainer_state.json (training/checkpoint.py), the last few kept
      model/             the final model (config.json + model.safetensors, see models.persistence)
      summary.json       final metrics per split, steps, wall time; present once the run finished

A directory is never reused for a different run, and nothing in it is overwritten except by
`--resume` of the same run. Training writes it (`latentcode.training`); extraction, the report and
`models/ship.py` read it through `RunRecord`, which needs neither torch nor the trainer.

One writer at a time: `train` and `train --resume` hold `RunDirectory.lock()` for the whole run, the
lock file `.RUN_DIR.lock` beside the directory, so that a fresh directory stays empty until the run writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError
from latentcode.files import ExclusiveLock, atomic_write_text, open_for_append, write_error

RUN_FORMAT = "latentcode-run/1"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_DIR = "model"
WEIGHTS_FILE = "model.safetensors"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "step_"


class RunDirectoryError(LatentcodeError, ValueError):
    """A run directory that cannot be used as asked; says why and what to do."""


def write_json_atomically(path: Path, data: Any) -> None:
    """Through a random temporary and a rename: never through a planted link (latentcode.files)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


# A config.json temporary left by a creation killed before its rename (fixed name before random ones).
_CONFIG_LEFTOVER = re.compile(rf"^\.{re.escape(CONFIG_FILE)}(\.[^./]+)?\.tmp$")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_metrics_record(path: Path, number: int, record: Any) -> None:
    """One metrics.jsonl record has the structure its readers use; else one line naming the line."""
    problem = None
    if not isinstance(record, dict):
        problem = f"holds a JSON {type(record).__name__}; expected an object"
    elif "step" in record and not _is_number(record["step"]):
        problem = f"has step {record['step']!r}; expected a number"
    elif record.get("event") == "train" and not (_is_number(record.get("step")) and _is_number(record.get("loss"))):
        problem = "is a train record without a numeric step and loss"
    elif record.get("event") == "eval" and not (
        _is_number(record.get("step")) and isinstance(record.get("splits"), dict)
        and all(isinstance(metrics, dict) for metrics in record["splits"].values())
    ):
        problem = "is an eval record without a numeric step and an object of metrics per split"
    if problem:
        raise RunDirectoryError(f"{path} line {number} {problem}")


class RunDirectory:
    """The files of one run directory, read and written as plain JSON."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config_path = self.path / CONFIG_FILE
        self.metrics_path = self.path / METRICS_FILE
        self.summary_path = self.path / SUMMARY_FILE
        self.model_path = self.path / MODEL_DIR
        self.weights_path = self.model_path / WEIGHTS_FILE
        self.checkpoints_path = self.path / CHECKPOINT_DIR

    @property
    def is_finished(self) -> bool:
        return self.summary_path.is_file()

    def looks_like_a_run(self) -> bool:
        """A config.json and final weights: a finished (or at least saved) run directory."""
        return self.config_path.is_file() and self.weights_path.is_file()

    def lock(self, wait: float | None = 0.0, *, new: bool = False) -> ExclusiveLock:
        """The run's writer lock, a context manager: `with directory.lock(): ...train...`.
        Raises `latentcode.files.LockHeld` if another process holds it for more than `wait`
        seconds (None: wait as long as it takes). `new`: the run is to be created here, so its
        parent directory is made if missing; otherwise the directory must exist."""
        if new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.is_dir():
            raise RunDirectoryError(f"{self.path} is not a latentcode run directory (it does not exist)")
        # resolved: `runs/x/`, `./runs/x` and a symlink to it are one directory, one lock
        return ExclusiveLock(self.path.resolve(), wait=wait, purpose="training",
                             hint="wait until that run stops, or train into another directory")

    # -- creating and reopening --------------------------------------------------------------------
    def create(self, record: dict[str, Any]) -> None:
        """Make a fresh run directory whose config.json is `record` (its "train" section is the
        run's identity), refusing a directory that holds anything else."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(f"{self.path} exists and is not a directory")
        if self.config_path.exists():
            existing = self.read_raw_config()["train"]
            wanted = json.loads(json.dumps(record["train"], sort_keys=True, default=str))  # as stored
            if existing == wanted:
                state, resume = ("finished", "") if self.is_finished else (
                    "unfinished", f"continue it with `latentcode train --resume {self.path}` or ")
                raise RunDirectoryError(f"{self.path} already holds this run, {state}; {resume}choose another output "
                                        "directory")
            differences = [
                f"{key}: {value!r} there, {wanted.get(key)!r} here"
                for key, value in existing.items()
                if wanted.get(key) != value and key != "notes"
            ]
            raise RunDirectoryError(
                f"{self.path} already holds a different run ({'; '.join(differences) or 'configs differ'}); "
                "choose another output directory"
            )
        # a config temporary from a creation killed before its rename: not a run yet
        if self.path.is_dir() and any(not _CONFIG_LEFTOVER.match(path.name) for path in self.path.iterdir()):
            raise RunDirectoryError(
                f"{self.path} is not empty and holds no latentcode run; choose another output directory"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomically(self.config_path, {"format": RUN_FORMAT, **record})

    def read_raw_config(self) -> dict[str, Any]:
        if not self.config_path.is_file():
            raise RunDirectoryError(f"{self.path} is not a latentcode run directory ({CONFIG_FILE} is missing)")
        try:
            data = json.loads(self.config_path.read_text())
        except json.JSONDecodeError as error:
            raise RunDirectoryError(f"{self.config_path} is not valid JSON ({error})") from None
        if not isinstance(data, dict) or data.get("format") != RUN_FORMAT or "train" not in data:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise RunDirectoryError(
                f"{self.config_path} is not a latentcode run config (format {found!r}, expected {RUN_FORMAT!r})"
            )
        train = data["train"]
        wrong = [] if isinstance(train, dict) else [f"'train' is a JSON {type(train).__name__}; expected an object"]
        if isinstance(train, dict):
            wrong += [f"'train.{key}' is {type(train.get(key)).__name__ if key in train else 'missing'}; expected an "
                      "object" for key in ("task", "model") if not isinstance(train.get(key), dict)]
            if isinstance(train.get("task"), dict) and not isinstance(train["task"].get("name"), str):
                wrong.append("'train.task.name' is not a string")
        wrong += [f"{key!r} is a JSON {type(data[key]).__name__}; expected an object"
                  for key in ("resolved_model_config", "task_analysis") if key in data
                  and not isinstance(data[key], dict)]
        if wrong:
            raise RunDirectoryError(f"{self.config_path} is not a well-formed run config: {'; '.join(wrong)}")
        return data

    # -- metrics -----------------------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one line; on a failed write (a full disk) the file is cut back to its earlier lines
        and the one-line WriteError raised, so no torn line is left."""
        line = (json.dumps(record, sort_keys=True, default=float) + "\n").encode()
        with open_for_append(self.metrics_path) as file:
            size = os.fstat(file.fileno()).st_size
            try:
                written = 0
                while written < len(line):  # unbuffered: nothing is left for close() to flush
                    written += os.write(file.fileno(), line[written:])
            except OSError as error:
                with contextlib.suppress(OSError):
                    os.ftruncate(file.fileno(), size)
                raise write_error(error, self.metrics_path) from None

    def read_metrics(self, drop_torn_last_line: bool = False) -> list[dict[str, Any]]:
        """The records of metrics.jsonl; a line that is not JSON raises RunDirectoryError naming the
        file and line, except, with `drop_torn_last_line`, an unterminated last line (a run killed
        while appending it)."""
        if not self.metrics_path.exists():
            return []
        text = self.metrics_path.read_text()
        lines = text.splitlines()
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                if drop_torn_last_line and number == len(lines) and not text.endswith("\n"):
                    continue
                raise RunDirectoryError(
                    f"{self.metrics_path} line {number} is not valid JSON ({error.msg}): {line[:80]!r}"
                ) from None
            _check_metrics_record(self.metrics_path, number, record)
            records.append(record)
        return records

    def truncate_metrics(self, last_step: int) -> None:
        """Drop records after `last_step` (left by a run killed after its last checkpoint) and a
        torn last line (left by a kill while appending)."""
        kept = [record for record in self.read_metrics(drop_torn_last_line=True)
                if record.get("step", 0) <= last_step]
        atomic_write_text(self.metrics_path, "".join(json.dumps(record, sort_keys=True) + "\n" for record in kept))

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomically(self.summary_path, summary)

    def read_summary(self) -> dict[str, Any] | None:
        if not self.summary_path.is_file():
            return None
        try:
            summary = json.loads(self.summary_path.read_text())
        except json.JSONDecodeError as error:
            raise RunDirectoryError(f"{self.summary_path} is not valid JSON ({error})") from None
        final = summary.get("final_metrics", {}) if isinstance(summary, dict) else None
        if not isinstance(summary, dict) or not isinstance(final, dict) or not all(
                isinstance(metrics, dict) for metrics in final.values()):
            what = (f"a JSON {type(summary).__name__}" if not isinstance(summary, dict)
                    else "an object whose final_metrics is not an object of metrics per split")
            raise RunDirectoryError(f"{self.summary_path} is {what}; expected an object with final_metrics "
                                    "{split: {metric: value}}")
        return summary

    # -- checkpoints -------------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (temporary directories are ignored)."""
        if not self.checkpoints_path.is_dir():
            return []
        return sorted(
            path for path in self.checkpoints_path.iterdir()
            if path.is_dir() and path.name.startswith(CHECKPOINT_PREFIX) and (path / "trainer_state.json").is_file()
        )

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints_path / f"{CHECKPOINT_PREFIX}{step:08d}"

    def prune_checkpoints(self, keep: int) -> None:
        for path in self.checkpoints()[:-keep]:
            shutil.rmtree(path, ignore_errors=True)


@dataclass
class RunRecord:
    """What later stages read from a run directory: its config, metrics and summary, as JSON.

    `name` is the model's attention (e.g. "hyla" or "rms_head+hyper_relu"); `task_analysis` the
    task's analysis defaults written at training time (selector, variant, probe label, picture
    label, headline metric; empty for runs written before they were recorded).
    """

    path: Path
    name: str
    task_config: dict[str, Any]
    task_analysis: dict[str, str]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None

    @classmethod
    def read(cls, path: str | Path) -> RunRecord:
        directory = RunDirectory(path)
        config = directory.read_raw_config()
        attention = config.get("resolved_model_config", {}).get("attention", config["train"]["model"].get("attention"))
        if isinstance(attention, list):
            attention = "+".join(attention)
        return cls(directory.path, str(attention), config["train"]["task"], config.get("task_analysis", {}),
                   config, directory.read_metrics(), directory.read_summary())

    @property
    def task(self) -> str:
        """The task's name."""
        return str(self.task_config.get("name"))

    @property
    def headline_metric(self) -> str:
        return self.task_analysis.get("headline_metric", "loss")

    def final_metrics(self) -> dict[str, dict[str, float]]:
        """The summary's final metrics per split; for an unfinished run, its last evaluation."""
        if self.summary:
            return self.summary.get("final_metrics", {})
        evaluations = [record for record in self.metrics if record.get("event") == "eval"]
        return evaluations[-1]["splits"] if evaluations else {}


# -- the one loader of what a user names as a model ----------------------------------------------------
PRETRAINED_NAMES = ("smollm2",)  # names that resolve to a causal LM a package ships (latentcode.pretrained)


@dataclass(frozen=True)
class ModelSource:
    """Where a model given by path or name comes from, read from JSON alone (no torch): `path` as given
    (None for a model object handed over in Python); `model_path` the directory
    `latentcode.models.load_model` reads (a run's `model/`, a saved model directory itself; None for a
    causal LM, which `latentcode.pretrained` loads); `task_config` the run's task (None without a run);
    `model_config` the model's config as JSON (None for a causal LM). What kind of model it is, and so
    what it reads, is `latentcode.subject.subject_of`'s to say.
    """

    path: Path | None
    model_path: Path | None = None
    task_config: dict[str, Any] | None = None
    model_config: Any = None

    @property
    def weights_path(self) -> Path | None:
        return None if self.model_path is None else self.model_path / WEIGHTS_FILE


def is_pretrained(path_or_name: str | Path) -> bool:
    """Whether `path_or_name` names a pretrained model rather than a run or saved-model directory: a
    known name, a `.gguf` file, or a directory whose config.json is a Hugging Face config (it has
    `model_type` or `architectures`, which latentcode's run and model configs do not)."""
    if str(path_or_name) in PRETRAINED_NAMES:
        return True
    path = Path(path_or_name)
    if path.suffix == ".gguf":
        return True
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and ("model_type" in config or "architectures" in config)


def not_a_model(path: Path) -> str:
    """The one message for a path that is neither a run directory nor a model directory."""
    return (f"{path} is neither a finished run directory (with {MODEL_DIR}/{WEIGHTS_FILE}) nor a model directory "
            f"(with {WEIGHTS_FILE}){'' if path.exists() else ': it does not exist'}")


def locate_model(path_or_name: str | Path) -> ModelSource:
    """The run directory, saved model directory or pretrained model that `path_or_name` names; a
    RunDirectoryError (the one message, `not_a_model`) for anything else. A model directory's
    config.json is read as JSON (`model_config`; what it holds is checked by whoever builds from it)."""
    path = Path(path_or_name)
    if is_pretrained(path_or_name):
        return ModelSource(path)
    run = RunDirectory(path)
    if path.is_dir() and run.looks_like_a_run():
        record = RunRecord.read(path)
        return ModelSource(path, run.model_path, dict(record.task_config),
                           record.config.get("resolved_model_config") or record.config["train"]["model"])
    if (path / WEIGHTS_FILE).is_file():
        return ModelSource(path, path, None, _read_model_config(path / CONFIG_FILE))
    raise RunDirectoryError(not_a_model(path))


def _read_model_config(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RunDirectoryError(f"{path.parent} has {WEIGHTS_FILE} but no {CONFIG_FILE}; expected the model "
                                "directory latentcode saves (models.save_model)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunDirectoryError(f"{path.parent}: its {CONFIG_FILE} is not a JSON file ({error})") from None
