"""latentcode: mechanistic interpretability of attention latent codes.

The public API is importable from here; each name loads its stage on first use, so that
`import latentcode.analysis` (probes and plots on HDF5 files) never pays for torch.
"""

from __future__ import annotations

from latentcode.lazy import lazy_exports

__version__ = "0.1.0"

# Each public name and the module that defines it; loaded on first use.
_WHERE = {
    "ModelConfig": "latentcode.models",
    "build_model": "latentcode.models",
    "load_model": "latentcode.models",
    "value_network_view": "latentcode.models",
    "ATTENTION_PRESETS": "latentcode.models",
    "get_task": "latentcode.tasks",
    "train": "latentcode.training.trainer",
    "TrainConfig": "latentcode.training.config",
    "build_train_config": "latentcode.training.presets",
    "Run": "latentcode.training.run",
    "extract": "latentcode.extraction.pipeline",
    "Recorder": "latentcode.extraction.recorder",
    "Intervention": "latentcode.intervention.intervener",
    "qk_attribution": "latentcode.intervention.qk.report",
    "CodeFile": "latentcode.store",
    "CodeWriter": "latentcode.store",
    "Site": "latentcode.store",
    "LatentcodeError": "latentcode.errors",
    "load_pretrained": "latentcode.pretrained",
}
__all__ = ["__version__", *_WHERE]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
