"""latentcode: mechanistic interpretability of attention latent codes.

The public API is importable from here:

    import latentcode
    codes = latentcode.extract("models/sraven-hyla", sites="sraven-rule", split="train", n=512)  # in memory
    codes = latentcode.extract("models/sraven-hyla", sites="sraven-rule", split="ood", n=512, out=codes,
                               append=True)
    latentcode.decode(codes, "rule")          # a probe table
    latentcode.build_viewer(codes)            # the viewer (inline in a notebook)

Every name is listed in `__all__` and imported explicitly under `TYPE_CHECKING`, so type checkers and
IDEs see each one with its signature; at run time each name loads its module on first use, so that
`import latentcode` (and `import latentcode.analysis`, which imports this package first) never pays
for torch. `tests/test_public_api.py` keeps the two lists equal and checks the API with `mypy --strict`.
"""

from __future__ import annotations

import os as _os
import sys as _sys

try:  # signal's C module, loaded by the interpreter before site: signal.py would first build its enums
    import _signal  # (a few ms under load, during which a Ctrl-C was still Python's traceback)
except ImportError:  # another interpreter
    import signal as _signal  # type: ignore[no-redef]


def _interrupted_while_starting(signum: int, frame: object) -> None:  # noqa: ARG001 - a signal handler's signature
    """Ctrl-C before a command has started (or after it has ended): one line and exit 130. Nothing is
    written before a command runs (and after, its outputs are complete), so there is nothing to clean
    up; a KeyboardInterrupt raised inside an import would print the import's traceback instead (or,
    raised in a weakref callback of the import system, be ignored). What the command printed is
    flushed first (a piped stdout holds it in a buffer that _exit would drop)."""
    for stream in (_sys.stdout, _sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a stream closed, or being written when the signal came
            pass
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

from typing import TYPE_CHECKING  # noqa: E402 - after the handler, on purpose

from latentcode.lazy import lazy_exports  # noqa: E402

if TYPE_CHECKING:
    from latentcode.allocator import keep_freed_memory
    from latentcode.analysis.embed import Embedding, embed
    from latentcode.analysis.probes.decoding import decode
    from latentcode.analysis.viewer.page import Viewer, build_viewer
    from latentcode.errors import LatentcodeError
    from latentcode.extraction.pipeline import extract
    from latentcode.extraction.recorder import Recorder
    from latentcode.intervention.effects import intervention_effects
    from latentcode.intervention.intervener import Intervention
    from latentcode.intervention.patching.run import PatchResult, patch
    from latentcode.intervention.qk.report import qk_attribution
    from latentcode.models import ATTENTION_PRESETS, ModelConfig, build_model, load_model, value_network_view
    from latentcode.pretrained import Pretrained, load_pretrained
    from latentcode.store import CodeFile, CodeWriter, InMemoryCodes, Site
    from latentcode.subject import Subject, subject_of
    from latentcode.tasks import get_task
    from latentcode.training.config import TrainConfig
    from latentcode.training.presets import build_train_config
    from latentcode.training.run import Run
    from latentcode.training.trainer import train

__version__ = "0.1.0"

# Each public name and the module that defines it; loaded on first use (the same names as above).
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
    "intervention_effects": "latentcode.intervention.effects",
    "patch": "latentcode.intervention.patching.run",
    "PatchResult": "latentcode.intervention.patching.run",
    "qk_attribution": "latentcode.intervention.qk.report",
    "CodeFile": "latentcode.store",
    "CodeWriter": "latentcode.store",
    "InMemoryCodes": "latentcode.store",
    "Site": "latentcode.store",
    "decode": "latentcode.analysis.probes.decoding",
    "embed": "latentcode.analysis.embed",
    "Embedding": "latentcode.analysis.embed",
    "build_viewer": "latentcode.analysis.viewer.page",
    "Viewer": "latentcode.analysis.viewer.page",
    "LatentcodeError": "latentcode.errors",
    "load_pretrained": "latentcode.pretrained",
    "Pretrained": "latentcode.pretrained",
    "keep_freed_memory": "latentcode.allocator",
    "Subject": "latentcode.subject",
    "subject_of": "latentcode.subject",
}
__all__ = [
    "ATTENTION_PRESETS",
    "CodeFile",
    "CodeWriter",
    "Embedding",
    "InMemoryCodes",
    "Intervention",
    "LatentcodeError",
    "ModelConfig",
    "PatchResult",
    "Pretrained",
    "Recorder",
    "Run",
    "Site",
    "Subject",
    "TrainConfig",
    "Viewer",
    "__version__",
    "build_model",
    "build_train_config",
    "build_viewer",
    "decode",
    "embed",
    "extract",
    "get_task",
    "intervention_effects",
    "keep_freed_memory",
    "load_model",
    "load_pretrained",
    "patch",
    "qk_attribution",
    "subject_of",
    "train",
    "value_network_view",
]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
