"""Training with accelerate: the paper's recipe, presets, resumable runs and sweeps.

`latentcode.train(config, out)` is `latentcode.training.trainer.train`: `plan_train` checks its
arguments without torch (as `latentcode train` does), `run_training` trains the plan. Names load on first use (see
`latentcode.lazy`), so the preset table and configs stay light.
"""

from latentcode.lazy import lazy_exports

_WHERE = {
    "TrainConfig": "latentcode.training.config",
    "presets": "latentcode.training.presets",
    "SCALES": "latentcode.training.presets",
    "build_train_config": "latentcode.training.presets",
    "describe_presets": "latentcode.training.presets",
    "Run": "latentcode.training.run",
    "RunDirectory": "latentcode.rundir",
    "RunDirectoryError": "latentcode.rundir",
    "CheckpointError": "latentcode.training.trainer",
    "TrainingDiverged": "latentcode.training.trainer",
    "train": "latentcode.training.trainer",
    "plan_train": "latentcode.training.plan",
    "TrainPlan": "latentcode.training.plan",
    "sweep": "latentcode.training.sweeps",
    "Job": "latentcode.training.sweeps",
    "run_jobs": "latentcode.training.sweeps",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

