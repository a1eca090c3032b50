"""Where latent codes come from: sites and selectors, and the sources that read (and, under an
intervention, edit) the attention of any model, with the detection that picks one.

Both `latentcode.extraction` (the Recorder and `extract`) and `latentcode.intervention` (the
Intervention, its twin) build on this stage. Names load their module on first use, so that
`latentcode.sources.sites` (selectors, no torch) can check a command line's sites before torch is
imported.
"""

from latentcode.lazy import lazy_exports

_WHERE = {
    "AdapterSource": "latentcode.sources.adapter",
    "BridgeSource": "latentcode.sources.bridge",
    "is_transformer_bridge": "latentcode.sources.bridge",
    "detect_source": "latentcode.sources.detect",
    "PRESETS": "latentcode.sources.sites",
    "Positions": "latentcode.sources.sites",
    "Selector": "latentcode.sources.sites",
    "SiteError": "latentcode.sources.sites",
    "parse_selector": "latentcode.sources.sites",
    "block": "latentcode.sources.sites",
    "SoftmaxCaptureError": "latentcode.sources.softmax_capture",
    "SoftmaxSource": "latentcode.sources.softmax_capture",
    "AttentionSource": "latentcode.sources.source",
    "HookPointSource": "latentcode.sources.source",
    "NoAttentionCaptured": "latentcode.sources.source",
    "TorchAttentionSource": "latentcode.sources.torch_attention",
    "Site": "latentcode.store",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
