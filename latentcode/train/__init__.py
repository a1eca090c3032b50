"""Training with accelerate: the paper's recipe, presets, resumable runs and sweeps.

The package is callable: `latentcode.train(config, out)` is `latentcode.train.trainer.train(config,
out)`. Names load on first use (see `latentcode.lazy`), so the preset table and configs stay light.
"""

from latentcode.callable_module import make_callable
from latentcode.lazy import lazy_exports

_WHERE = {
    "TrainConfig": "latentcode.train.config",
    "PRESETS": "latentcode.train.presets",
    "SCALES": "latentcode.train.presets",
    "build_train_config": "latentcode.train.presets",
    "describe_presets": "latentcode.train.presets",
    "Run": "latentcode.train.run",
    "RunDirectory": "latentcode.train.run",
    "RunDirectoryError": "latentcode.train.run",
    "CheckpointError": "latentcode.train.trainer",
    "TrainingDiverged": "latentcode.train.trainer",
    "train": "latentcode.train.trainer",
    "sweep": "latentcode.train.sweep",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


def _train(*args, **kwargs):
    from latentcode.train.trainer import train

    return train(*args, **kwargs)


make_callable(__name__, _train)
