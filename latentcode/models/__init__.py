"""Hooked transformers with softmax, linear and HYLA attention, and the hypernetwork view.

Names load on first use (see `latentcode.lazy`): `latentcode.models.config` stays free of torch.
"""

from latentcode.lazy import lazy_exports

_WHERE = {
    "ATTENTION_PRESETS": "latentcode.models.config",
    "SCORE_NORMALIZATIONS": "latentcode.models.normalization",
    "VALUE_NETWORKS": "latentcode.models.value_network",
    "NoExactView": "latentcode.models.value_network",
    "ValueNetwork": "latentcode.models.value_network",
    "ConfigError": "latentcode.models.config",
    "ModelConfig": "latentcode.models.config",
    "resolve_attention": "latentcode.models.config",
    "GeneratedValueNetwork": "latentcode.models.hypernetwork",
    "ViewTooLarge": "latentcode.models.hypernetwork",
    "value_network_view": "latentcode.models.hypernetwork",
    "ModelFileError": "latentcode.models.persistence",
    "load_model": "latentcode.models.transformer",
    "save_model": "latentcode.models.persistence",
    "InputShapeError": "latentcode.models.attention",
    "AttentionPathError": "latentcode.models.path_policy",
    "attention_path": "latentcode.models.attention",
    "QueryBlockHook": "latentcode.models.query_block_hook",
    "Transformer": "latentcode.models.transformer",
    "build_model": "latentcode.models.transformer",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
