"""latentcode: mechanistic interpretability of attention latent codes.

The public API is importable from here; each name loads its stage on first use, so that
`import latentcode.analysis` (probes and plots on HDF5 files) never pays for torch.
"""

from __future__ import annotations

import os as _os
import signal as _signal
import sys as _sys


def _interrupted_while_starting(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    """Ctrl-C before a command has started: one line and exit 130. Nothing is written before a command
    runs, so there is nothing to clean up; a KeyboardInterrupt raised inside an import would print the
    import's traceback instead (or, raised in a weakref callback of the import system, be ignored)."""
    _os.write(2, b"interrupted\n")
    _os._exit(130)


def _started_as_the_command() -> bool:
    """Whether this process is the `latentcode` command: its console script, or `python -m
    latentcode.cli` (sys.orig_argv), not a program that imports the library."""
    original = list(getattr(_sys, "orig_argv", []))
    as_module = any(a == "-m" and b == "latentcode.cli" for a, b in zip(original, original[1:], strict=False))
    return as_module or bool(_sys.argv and _os.path.basename(_sys.argv[0]) == "latentcode")


# The first instruction of the package: the command's Ctrl-C is one line and exit 130 from here on, through
# the imports of the command line and its modules (the first ~0.5-1.6 s); `latentcode.cli.main` hands it
# back to KeyboardInterrupt once the command starts, so that outputs being written are discarded as it
# unwinds. A program importing the library keeps Python's own handling.
if _started_as_the_command() and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)

from latentcode.lazy import lazy_exports  # noqa: E402 - after the handler, on purpose

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
    "CodeFile": "latentcode.store",
    "CodeWriter": "latentcode.store",
    "Site": "latentcode.store",
    "LatentcodeError": "latentcode.errors",
    "load_pretrained": "latentcode.pretrained",
}
__all__ = ["__version__", *_WHERE]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
