"""Training with accelerate: the paper's recipe, presets, resumable runs and sweeps.

The package is callable: `latentcode.train(config, out)` is `latentcode.train.train(config, out)`.
"""

from latentcode.callable_module import make_callable
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

make_callable(__name__, train)
