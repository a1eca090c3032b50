"""`ModelConfig`: the one description of a hooked transformer, with validation and JSON round trip.

Sizes follow the paper's convention: `kqv_dim` and `v_dim` are totals over heads, so
`d_head = kqv_dim / n_heads` (the fuzzy-logic model has 8 heads of width 2, the SRAVEN model 16
heads of width 4). `width_factor` multiplies `d_model, kqv_dim, v_dim, d_mlp` and `n_heads`
(head widths stay fixed), the paper's width scaling; `ModelConfig.sizes` gives the scaled sizes
that the modules are built with.

An attention layer is a score normalization sigma composed with a value network; `attention` is
a preset name (a row of the paper's ablation table) or a `(normalization, value_network)` pair.
The names are those of `normalization.SCORE_NORMALIZATIONS` and `value_network.VALUE_NETWORKS`,
the only tables of them; they hold torch code, so they load when a config is first validated and
importing this module stays free of torch (the command line imports it to build its help).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from latentcode.errors import LatentcodeError

# The rows of the paper's ablation table: preset name -> (score normalization, value network).
ATTENTION_PRESETS: dict[str, tuple[str, str]] = {
    "softmax": ("softmax", "linear"),
    "linear": ("identity", "linear"),
    "hyla": ("rms_head", "hyper_relu"),
    "linear_rmshead": ("rms_head", "linear"),
    "linear_rmshead_relu": ("rms_head", "relu_linear"),
    "hyla_no_rmshead": ("identity", "hyper_relu"),
    "hyla_no_relu": ("rms_head", "hyper_linear"),
    "hyla_no_relu_no_rmshead": ("identity", "hyper_linear"),
    "hyla_softmax_instead": ("softmax", "hyper_relu"),
    "hyla_deep": ("rms_head", "hyper_deep"),
    "hyla_softmax": ("softmax_rms_head", "hyper_relu"),
}

FEEDFORWARDS = ("mlp", "moe")
POSITIONS = ("relative", "rotary", "none")


class ConfigError(LatentcodeError, ValueError):
    """A model configuration that cannot be built; the message says what and what is expected."""


def attention_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the score normalizations and of the value networks, read from their tables."""
    from latentcode.models.normalization import SCORE_NORMALIZATIONS
    from latentcode.models.value_network import VALUE_NETWORKS

    return tuple(SCORE_NORMALIZATIONS), tuple(VALUE_NETWORKS)


def resolve_attention(attention: str | tuple[str, str] | list[str]) -> tuple[str, str]:
    """Return the `(normalization, value_network)` pair that a preset name or pair stands for.

    Besides the presets, any pair is accepted, as a tuple or as the string
    `"<normalization>+<value_network>"` (e.g. `"softmax_rms_head+linear"`).
    """
    normalizations, value_networks = attention_names()
    if isinstance(attention, str):
        if attention in ATTENTION_PRESETS:
            attention = ATTENTION_PRESETS[attention]
        elif "+" in attention:
            attention = tuple(attention.split("+", 1))
        else:
            raise ConfigError(f"unknown attention preset {attention!r}; valid presets: "
                              f"{', '.join(ATTENTION_PRESETS)}; or give a pair '<normalization>+<value_network>' "
                              f"with normalization in {normalizations} and value network in {value_networks}")
    if not isinstance(attention, (tuple, list)) or len(attention) != 2:
        raise ConfigError(
            f"attention must be a preset name or a (normalization, value_network) pair, got {attention!r}"
        )
    normalization, value_network = attention
    if normalization not in normalizations:
        raise ConfigError(f"unknown score normalization {normalization!r}; expected one of {normalizations}")
    if value_network not in value_networks:
        raise ConfigError(f"unknown value network {value_network!r}; expected one of {value_networks}")
    return normalization, value_network


@dataclass(frozen=True)
class ModelSizes:
    """The sizes the modules are built with, after width scaling."""

    d_model: int
    n_heads: int
    d_head: int  # query/key width per head
    d_head_v: int  # value width per head
    d_mlp: int


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a hooked decoder-style transformer (see module docstring).

    Exactly one of `d_in` (continuous or one-hot tokens of that width, linear embedding) and
    `d_vocab` (integer tokens, embedding table) is given. `n_ctx` is the longest sequence the
    model accepts; with relative positions it is also the number of buckets and the maximum
    distance (the paper's setting). `causal=False` is the paper's setting for both tasks.
    """

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 8
    kqv_dim: int = 16
    v_dim: int | None = None  # None: same as kqv_dim
    d_mlp: int = 256
    attention: str | tuple[str, str] = "softmax"
    ffn: str = "mlp"
    n_experts: int = 5
    top_k_experts: int = 2
    positions: str = "relative"
    n_ctx: int = 32
    causal: bool = False
    d_in: int | None = None
    d_vocab: int | None = None
    d_out: int | None = None  # None: d_vocab for token models
    attn_dropout: float = 0.1
    width_factor: int = 1
    layer_norm_eps: float = 1e-6
    rms_head_eps: float = 1e-6
    rotary_base: float = 10000.0

    def __post_init__(self) -> None:
        if isinstance(self.attention, list):
            object.__setattr__(self, "attention", tuple(self.attention))
        self.validate()

    # -- derived -----------------------------------------------------------------------------
    @property
    def score_normalization(self) -> str:
        return resolve_attention(self.attention)[0]

    @property
    def value_network(self) -> str:
        return resolve_attention(self.attention)[1]

    @property
    def attention_name(self) -> str:
        """The preset name of this attention if it has one, else `"<normalization>+<value_network>"`."""
        pair = resolve_attention(self.attention)
        return next((name for name, preset_pair in ATTENTION_PRESETS.items() if preset_pair == pair), "+".join(pair))

    @property
    def output_dim(self) -> int:
        return self.d_out if self.d_out is not None else self.d_vocab  # type: ignore[return-value]

    @property
    def sizes(self) -> ModelSizes:
        f = self.width_factor
        n_heads = self.n_heads * f
        v_dim = self.kqv_dim if self.v_dim is None else self.v_dim
        return ModelSizes(d_model=self.d_model * f, n_heads=n_heads, d_head=self.kqv_dim * f // n_heads,
                          d_head_v=v_dim * f // n_heads, d_mlp=self.d_mlp * f)

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> None:
        check_fields(self)
        resolve_attention(self.attention)

    # -- persistence ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if isinstance(data["attention"], tuple):
            data["attention"] = list(data["attention"])
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        check_field_names(cls, data)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str | Path) -> ModelConfig:
        """Build from a JSON string, or from the path of a JSON file."""
        if isinstance(text, Path) or (isinstance(text, str) and not text.lstrip().startswith("{")):
            text = Path(text).read_text()
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def check_field_names(cls: type, data: dict[str, Any]) -> None:
    """Refuse keys of `data` that are no field of the dataclass `cls`, and fields it requires that are missing."""
    fields = dataclasses.fields(cls)
    known = {field.name for field in fields}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} field(s) {unknown}; valid fields: {sorted(known)}")
    required = {field.name for field in fields
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING}
    if required - set(data):
        raise ConfigError(f"missing {cls.__name__} field(s) {sorted(required - set(data))}; required: "
                          f"{sorted(required)}")


def check_fields(config) -> None:
    """ModelConfig's checks of its fields, on any object with its attributes (no torch): all but the
    names of an attention pair, which `resolve_attention` checks against the modules' tables."""
    def positive_int(name: str) -> None:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")

    for name in ("n_layers", "d_model", "n_heads", "kqv_dim", "d_mlp", "n_ctx", "width_factor"):
        positive_int(name)
    if config.v_dim is not None:
        positive_int("v_dim")
    if config.ffn not in FEEDFORWARDS:
        raise ConfigError(f"unknown ffn {config.ffn!r}; expected one of {FEEDFORWARDS}")
    if config.ffn == "moe":
        positive_int("n_experts")
        positive_int("top_k_experts")
        if config.top_k_experts > config.n_experts:
            raise ConfigError(f"top_k_experts={config.top_k_experts} exceeds n_experts={config.n_experts}")
    if config.positions not in POSITIONS:
        raise ConfigError(f"unknown positions {config.positions!r}; expected one of {POSITIONS}")
    if (config.d_in is None) == (config.d_vocab is None):
        raise ConfigError(f"give exactly one of d_in (continuous or one-hot tokens) and d_vocab (integer "
                          f"tokens), got d_in={config.d_in!r}, d_vocab={config.d_vocab!r}")
    for name in ("d_in", "d_vocab", "d_out"):
        if getattr(config, name) is not None:
            positive_int(name)
    if config.d_out is None and config.d_vocab is None:
        raise ConfigError("d_out is required for models with continuous inputs (d_in)")
    if not isinstance(config.attn_dropout, (int, float)) or not 0.0 <= config.attn_dropout < 1.0:
        raise ConfigError(f"attn_dropout must be in [0, 1), got {config.attn_dropout!r}")

    _check_head_widths(config)


def _check_head_widths(config) -> None:
    """kqv_dim and v_dim split evenly over the heads (after width_factor), even for rotary positions."""
    scaled_heads = config.n_heads * config.width_factor
    v_dim = config.kqv_dim if config.v_dim is None else config.v_dim
    for name, total in (("kqv_dim", config.kqv_dim), ("v_dim", v_dim)):
        scaled = total * config.width_factor
        if scaled % scaled_heads:
            after = f" (after width_factor={config.width_factor}: {scaled} and {scaled_heads})"
            scaled_note = after if config.width_factor != 1 else ""
            raise ConfigError(f"{name}={total} is not divisible by n_heads={config.n_heads}{scaled_note}: "
                              f"{name} is the total width over heads")
    if config.positions == "rotary" and (config.kqv_dim // config.n_heads) % 2:
        raise ConfigError(f"rotary positions need an even head width, got d_head={config.kqv_dim // config.n_heads} "
                          f"(kqv_dim={config.kqv_dim} / n_heads={config.n_heads})")


def check_model_config(data: Any) -> None:
    """A model directory's `config.json` as ModelConfig would take it, checked without torch: an
    object of known fields, none missing, each as `check_fields` wants it; a preset's name known."""
    if not isinstance(data, dict):
        raise ConfigError(f"it holds a JSON {type(data).__name__}; expected an object of ModelConfig fields")
    check_field_names(ModelConfig, data)
    values = {field.name: data.get(field.name, field.default) for field in dataclasses.fields(ModelConfig)}
    check_fields(SimpleNamespace(**values))
    attention = values["attention"]
    if isinstance(attention, str) and "+" not in attention and attention not in ATTENTION_PRESETS:
        raise ConfigError(f"unknown attention {attention!r}; expected one of {sorted(ATTENTION_PRESETS)} or a pair")


def parameter_bytes(data: dict[str, Any]) -> int:
    """A lower bound on the float32 bytes of a model's parameters (projections and MLP of every layer)."""
    sizes = [data.get(name, 1) for name in ("n_layers", "d_model", "kqv_dim", "d_mlp", "width_factor")]
    if not all(isinstance(size, int) for size in sizes):
        return 0  # a partial config (a run's, completed by its preset): nothing to estimate
    n_layers, d_model, kqv, d_mlp, f = sizes
    return 4 * n_layers * f * f * (4 * d_model * kqv + 2 * d_model * d_mlp)
