"""Record latent codes with hooks: sites and selectors, sources, the recorder, and `extract`.

`latentcode.extract(...)` is `latentcode.extraction.pipeline.extract`. Names load their module on
first use, so that `latentcode.extraction.sites` (selectors, no torch) can check a command line's
sites before torch is imported.
"""

from latentcode.lazy import lazy_exports

_WHERE = {
    "AdapterSource": "latentcode.extraction.adapter",
    "BridgeSource": "latentcode.extraction.bridge",
    "is_transformer_bridge": "latentcode.extraction.bridge",
    "detect_source": "latentcode.extraction.detect",
    "extract": "latentcode.extraction.pipeline",
    "run_extraction": "latentcode.extraction.pipeline",
    "ExtractPlan": "latentcode.extraction.plan",
    "plan_extract": "latentcode.extraction.plan",
    "Recorder": "latentcode.extraction.recorder",
    "PRESETS": "latentcode.extraction.sites",
    "Selector": "latentcode.extraction.sites",
    "SiteError": "latentcode.extraction.sites",
    "parse_selector": "latentcode.extraction.sites",
    "block": "latentcode.extraction.sites",
    "SoftmaxCaptureError": "latentcode.extraction.softmax_capture",
    "SoftmaxSource": "latentcode.extraction.softmax_capture",
    "AttentionSource": "latentcode.extraction.source",
    "HookPointSource": "latentcode.extraction.source",
    "NoAttentionCaptured": "latentcode.extraction.source",
    "TorchAttentionSource": "latentcode.extraction.torch_attention",
    "Site": "latentcode.store",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
