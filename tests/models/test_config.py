import json

import pytest

from latentcode import ATTENTION_PRESETS, ModelConfig
from latentcode.models import ConfigError, resolve_attention


def test_paper_presets_are_the_ablation_rows():
    assert ATTENTION_PRESETS["softmax"] == ("softmax", "linear")
    assert ATTENTION_PRESETS["linear"] == ("identity", "linear")
    assert ATTENTION_PRESETS["hyla"] == ("rms_head", "hyper_relu")
    assert ATTENTION_PRESETS["hyla_softmax"] == ("softmax_rms_head", "hyper_relu")
    assert len(ATTENTION_PRESETS) == 11


def test_any_pair_is_accepted_by_name_or_tuple():
    assert resolve_attention("softmax_rms_head+linear") == ("softmax_rms_head", "linear")
    config = ModelConfig(attention=("softmax_rms_head", "relu_linear"), d_in=3, d_out=1)
    assert config.score_normalization == "softmax_rms_head" and config.value_network == "relu_linear"
    assert ModelConfig(attention=("rms_head", "hyper_relu"), d_in=3, d_out=1).attention_name == "hyla"


def test_json_round_trip():
    config = ModelConfig(attention=("identity", "hyper_deep"), ffn="moe", width_factor=2, d_in=3, d_out=1)
    again = ModelConfig.from_json(config.to_json())
    assert again == config
    assert json.loads(config.to_json())["attention"] == ["identity", "hyper_deep"]


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(kqv_dim=30, n_heads=8), r"kqv_dim=30 is not divisible by n_heads=8"),
        (dict(v_dim=10, n_heads=8), r"v_dim=10 is not divisible by n_heads=8"),
        (dict(attention="hyper"), r"unknown attention preset 'hyper'; valid presets: softmax, linear, hyla"),
        (dict(attention=("softmax", "mlp")), r"unknown value network 'mlp'"),
        (dict(ffn="swiglu"), r"unknown ffn 'swiglu'; expected one of \('mlp', 'moe'\)"),
        (dict(positions="absolute"), r"unknown positions 'absolute'"),
        (dict(n_layers=0), r"n_layers must be a positive integer, got 0"),
        (dict(attn_dropout=1.5), r"attn_dropout must be in \[0, 1\), got 1.5"),
        (dict(d_vocab=10), r"give exactly one of d_in .* and d_vocab"),
        (dict(ffn="moe", top_k_experts=6), r"top_k_experts=6 exceeds n_experts=5"),
        (dict(positions="rotary", kqv_dim=24, n_heads=8), r"rotary positions need an even head width, got d_head=3"),
    ],
)
def test_invalid_configs_say_what_is_wrong(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{"d_in": 3, "d_out": 1, **fields})


def test_unknown_fields_in_json_are_named():
    with pytest.raises(ConfigError, match=r"unknown ModelConfig field\(s\) \['n_layer'\]"):
        ModelConfig.from_dict({"n_layer": 2, "d_in": 3, "d_out": 1})
