"""latentcode: mechanistic interpretability of attention latent codes.

The public API is importable from here; each name loads its stage on first use, so that
`import latentcode.analysis` (probes and plots on HDF5 files) never pays for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "ModelConfig": "latentcode.models",
    "build_model": "latentcode.models",
    "load_model": "latentcode.models",
    "value_network_view": "latentcode.models",
    "ATTENTION_PRESETS": "latentcode.models",
    "get_task": "latentcode.tasks",
    "train": "latentcode.train",
    "TrainConfig": "latentcode.train",
    "build_train_config": "latentcode.train",
    "Run": "latentcode.train",
    "extract": "latentcode.extract",
    "Recorder": "latentcode.extract",
    "CodeFile": "latentcode.store",
    "CodeWriter": "latentcode.store",
    "Site": "latentcode.store",
}
# Subpackages that are themselves the public callable (see latentcode.callable_module).
_CALLABLE_SUBPACKAGES = {"train", "extract"}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _CALLABLE_SUBPACKAGES:
        return importlib.import_module(f"latentcode.{name}")
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'latentcode' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
