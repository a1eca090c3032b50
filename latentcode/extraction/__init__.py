"""Record latent codes with hooks: sites and selectors, sources, the recorder, and `extract`.

`latentcode.extract(...)` is `latentcode.extraction.pipeline.extract`.
"""

from latentcode.extraction.adapter import AdapterSource
from latentcode.extraction.bridge import BridgeSource, is_transformer_bridge
from latentcode.extraction.detect import detect_source
from latentcode.extraction.pipeline import extract
from latentcode.extraction.recorder import Recorder
from latentcode.extraction.sites import PRESETS, Selector, SiteError, parse_selector
from latentcode.extraction.softmax_capture import SoftmaxCaptureError, SoftmaxSource
from latentcode.extraction.source import (
    AttentionSource,
    HookPointSource,
    NoAttentionCaptured,
)
from latentcode.extraction.torch_attention import TorchAttentionSource
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
    "SoftmaxCaptureError",
    "SoftmaxSource",
    "TorchAttentionSource",
    "detect_source",
    "extract",
    "is_transformer_bridge",
    "parse_selector",
]
