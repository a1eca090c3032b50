"""The run directory: what a training run leaves behind, and `Run`, its Python handle.

    RUN_DIR/
      config.json        the full resolved config: TrainConfig (task, model, optimizer, seeds, scale),
                         the resolved ModelConfig, latentcode and torch versions, creation time
      metrics.jsonl      one JSON object per logging step ({"event": "train", ...}) and per
                         evaluation ({"event": "eval", "step": ..., "splits": {split: metrics}})
      checkpoints/       step_XXXXXXXX/: model, optimizer, scheduler and RNG states (accelerate's
                         save_state) plus trainer_state.json (step = data-stream position); each
                         written to a temporary directory and renamed, the last few kept
      model/             the final model (config.json + model.safetensors, see models.persistence)
      summary.json       final metrics per split, steps, wall time; present once the run finished

A directory is never reused for a different run, and nothing in it is overwritten except by
`--resume` of the same run.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError
from latentcode.training.config import TrainConfig

RUN_FORMAT = "latentcode-run/1"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_DIR = "model"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "step_"


class RunDirectoryError(LatentcodeError, ValueError):
    """A run directory that cannot be used as asked; says why and what to do."""


def _write_json_atomically(path: Path, data: Any) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(temporary, path)


class RunDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    # -- files -----------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def model_path(self) -> Path:
        return self.path / MODEL_DIR

    @property
    def checkpoints_path(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def is_finished(self) -> bool:
        return (self.path / SUMMARY_FILE).is_file()

    # -- creating and reopening --------------------------------------------------------------------
    def create(self, config: TrainConfig) -> None:
        """Make a fresh run directory for `config`, refusing one that holds anything else."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(f"{self.path} exists and is not a directory")
        if self.config_path.exists():
            existing = self.read_config()
            if existing == config:
                if self.is_finished:
                    raise RunDirectoryError(
                        f"{self.path} already holds this run, finished; choose another output directory"
                    )
                raise RunDirectoryError(
                    f"{self.path} already holds this run, unfinished; continue it with "
                    f"`latentcode train --resume {self.path}` or choose another output directory"
                )
            differences = [
                f"{key}: {value!r} there, {config.to_dict()[key]!r} here"
                for key, value in existing.to_dict().items()
                if config.to_dict().get(key) != value and key != "notes"
            ]
            raise RunDirectoryError(
                f"{self.path} already holds a different run ({'; '.join(differences) or 'configs differ'}); "
                "choose another output directory"
            )
        if self.path.is_dir() and any(self.path.iterdir()):
            raise RunDirectoryError(
                f"{self.path} is not empty and holds no latentcode run; choose another output directory"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        import torch

        from latentcode import __version__

        _write_json_atomically(
            self.config_path,
            {
                "format": RUN_FORMAT,
                "latentcode_version": __version__,
                "torch_version": torch.__version__,
                "python_version": platform.python_version(),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "steps": config.steps,
                "resolved_model_config": config.model_config().to_dict(),
                "train": config.to_dict(),
            },
        )

    def read_raw_config(self) -> dict[str, Any]:
        if not self.config_path.is_file():
            raise RunDirectoryError(
                f"{self.path} is not a latentcode run directory ({CONFIG_FILE} is missing)"
            )
        data = json.loads(self.config_path.read_text())
        if data.get("format") != RUN_FORMAT:
            raise RunDirectoryError(f"{self.config_path} is not a latentcode run config (format {data.get('format')!r})")
        return data

    def read_config(self) -> TrainConfig:
        return TrainConfig.from_dict(self.read_raw_config()["train"])

    # -- metrics -----------------------------------------------------------------------------------
    def append_metrics(self, record: dict[str, Any]) -> None:
        with self.metrics_path.open("a") as file:
            file.write(json.dumps(record, sort_keys=True, default=float) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def truncate_metrics(self, last_step: int) -> None:
        """Drop records after `last_step` (left by a run killed after its last checkpoint)."""
        kept = [record for record in self.read_metrics() if record.get("step", 0) <= last_step]
        temporary = self.metrics_path.with_name(f".{METRICS_FILE}.tmp")
        temporary.write_text("".join(json.dumps(record, sort_keys=True) + "\n" for record in kept))
        os.replace(temporary, self.metrics_path)

    def write_summary(self, summary: dict[str, Any]) -> None:
        _write_json_atomically(self.path / SUMMARY_FILE, summary)

    def read_summary(self) -> dict[str, Any] | None:
        path = self.path / SUMMARY_FILE
        return json.loads(path.read_text()) if path.is_file() else None

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


class Run:
    """A finished (or resumable) training run, read from its directory."""

    def __init__(self, path: str | Path):
        self.directory = RunDirectory(path)
        self.path = self.directory.path
        self.config = self.directory.read_config()

    def __repr__(self) -> str:
        state = "finished" if self.directory.is_finished else "unfinished"
        return f"Run({str(self.path)!r}, {self.config.preset or self.config.task['name']}, {self.attention}, {state})"

    @property
    def attention(self) -> str:
        return self.config.model_config().attention_name

    @property
    def summary(self) -> dict[str, Any] | None:
        return self.directory.read_summary()

    @property
    def final_metrics(self) -> dict[str, dict[str, float]]:
        summary = self.summary
        if summary is None:
            raise RunDirectoryError(f"{self.path} has not finished: no {SUMMARY_FILE}")
        return summary["final_metrics"]

    def metrics(self, event: str | None = None) -> list[dict[str, Any]]:
        records = self.directory.read_metrics()
        return [record for record in records if event is None or record.get("event") == event]

    def eval_records(self) -> Iterator[dict[str, Any]]:
        yield from self.metrics("eval")

    def task(self):
        from latentcode.tasks import get_task

        return get_task(**self.config.task)

    def load_model(self, device: str = "cpu"):
        from latentcode.models import load_model

        if not self.directory.model_path.is_dir():
            raise RunDirectoryError(f"{self.path} has no final model yet ({MODEL_DIR}/ is missing)")
        return load_model(self.directory.model_path, device=device)
