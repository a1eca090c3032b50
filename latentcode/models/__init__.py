"""Hooked transformers with softmax, linear and HYLA attention, and the hypernetwork view."""

from latentcode.models.config import (
    ATTENTION_PRESETS,
    SCORE_NORMALIZATIONS,
    VALUE_NETWORKS,
    ConfigError,
    ModelConfig,
    resolve_attention,
)
from latentcode.models.hypernetwork import GeneratedValueNetwork, value_network_view
from latentcode.models.persistence import ModelFileError, load_model, save_model
from latentcode.models.transformer import InputShapeError, Transformer, build_model

__all__ = [
    "ATTENTION_PRESETS",
    "SCORE_NORMALIZATIONS",
    "VALUE_NETWORKS",
    "ConfigError",
    "GeneratedValueNetwork",
    "InputShapeError",
    "ModelConfig",
    "ModelFileError",
    "Transformer",
    "build_model",
    "load_model",
    "resolve_attention",
    "save_model",
    "value_network_view",
]
