"""Record latent codes with hooks: sites and selectors, sources, the recorder, and `extract`.

The package is callable: `latentcode.extract(...)` is `latentcode.extract.extract(...)`.
"""

from latentcode.callable_module import make_callable
from latentcode.extract.adapter import AdapterSource
from latentcode.extract.bridge import BridgeSource, is_transformer_bridge
from latentcode.extract.pipeline import extract
from latentcode.extract.recorder import Recorder
from latentcode.extract.sites import PRESETS, Selector, SiteError, parse_selector
from latentcode.extract.source import (
    AttentionSource,
    HookPointSource,
    NoAttentionCaptured,
    detect_source,
)
from latentcode.extract.torch_attention import TorchAttentionSource
from latentcode.store import Site

__all__ = [
    "PRESETS",
    "AdapterSource",
    "AttentionSource",
    "BridgeSource",
    "HookPointSource",
    "NoAttentionCaptured",
    "Recorder",
    "Selector",
    "Site",
    "SiteError",
    "TorchAttentionSource",
    "detect_source",
    "extract",
    "is_transformer_bridge",
    "parse_selector",
]

make_callable(__name__, extract)
