"""`Run`: the Python handle of a training run's directory (layout and files: `latentcode.rundir`)."""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latentcode.rundir import SUMMARY_FILE, RunDirectory, RunDirectoryError
from latentcode.tasks import get_task
from latentcode.training.config import TrainConfig

if TYPE_CHECKING:
    from latentcode.models.transformer import Transformer
    from latentcode.tasks import Task


def run_record(config: TrainConfig) -> dict[str, Any]:
    """What config.json holds for a new run of `config` (see `latentcode.rundir`)."""
    import torch

    from latentcode import __version__

    return {
        "latentcode_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "steps": config.steps,
        "resolved_model_config": config.model_config().to_dict(),
        "task_analysis": get_task(**config.task).analysis.to_dict(),
        "train": config.to_dict(),
    }


def read_train_config(directory: RunDirectory) -> TrainConfig:
    return TrainConfig.from_dict(directory.read_raw_config()["train"])


class Run:
    """A finished (or resumable) training run, read from its directory."""

    def __init__(self, path: str | Path):
        self.directory = RunDirectory(path)
        self.path = self.directory.path
        self.config = read_train_config(self.directory)

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

    def task(self) -> Task:
        return get_task(**self.config.task)

    def load_model(self, device: str = "cpu") -> Transformer:
        from latentcode.models import load_model

        if not self.directory.model_path.is_dir():
            raise RunDirectoryError(f"{self.path} has no final model yet "
                                    f"({self.directory.model_path.name}/ is missing)")
        return load_model(self.directory.model_path, device=device)
