"""Training with accelerate: the paper's recipe, presets, resumable runs and sweeps."""

from latentcode.train.config import TrainConfig
from latentcode.train.presets import PRESETS, SCALES, build_train_config, describe_presets
from latentcode.train.run import Run, RunDirectory, RunDirectoryError
from latentcode.train.trainer import CheckpointError, TrainingDiverged, train

__all__ = [
    "PRESETS",
    "SCALES",
    "CheckpointError",
    "Run",
    "RunDirectory",
    "RunDirectoryError",
    "TrainConfig",
    "TrainingDiverged",
    "build_train_config",
    "describe_presets",
    "train",
]
