"""Exact query-key attribution of latent codes: a head's score before sigma as a sum of
query-side x key-side terms over the residual stream's components (`decomposition`), checked by path
patching (`path_patching`), reported as a table and a figure (`report`).

    from latentcode.intervention.qk import qk_attribution
    terms = qk_attribution(model, tokens, layer=2, head=3, pairs="previous")

Names load their module on first use (torch is imported then).
"""

from latentcode.lazy import lazy_exports

_WHERE = {
    "CannotDecompose": "latentcode.intervention.qk.components",
    "HeadReading": "latentcode.intervention.qk.components",
    "QKTerms": "latentcode.intervention.qk.decomposition",
    "decompose": "latentcode.intervention.qk.decomposition",
    "PathPatch": "latentcode.intervention.qk.path_patching",
    "path_patch": "latentcode.intervention.qk.path_patching",
    "select_pairs": "latentcode.intervention.qk.pairs",
    "qk_attribution": "latentcode.intervention.qk.report",
    "qk_from_codes": "latentcode.intervention.qk.from_codes",
    "read_head": "latentcode.intervention.qk.reading",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
__all__ = sorted(_WHERE)
