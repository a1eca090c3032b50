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


def test_config_validates_against_the_value_network_registry(monkeypatch):
    """ModelConfig and build_model read the names from VALUE_NETWORKS, nowhere else."""
    import torch

    from latentcode import build_model
    from latentcode.models.value_network import VALUE_NETWORKS, LinearValueNetwork

    class DoubledValueNetwork(LinearValueNetwork):
        config_name = "doubled"

        def forward(self, latent_codes, values):
            return 2 * super().forward(latent_codes, values)

    fields = dict(n_layers=1, d_model=4, n_heads=2, kqv_dim=4, d_mlp=4, n_ctx=3, d_in=2, d_out=1)
    with pytest.raises(ConfigError, match=r"unknown value network 'doubled'"):
        ModelConfig(attention=("softmax", "doubled"), **fields)
    monkeypatch.setitem(VALUE_NETWORKS, "doubled", DoubledValueNetwork)
    model = build_model(ModelConfig(attention=("softmax", "doubled"), **fields), seed=0).eval()
    assert type(model.blocks[0].attn.value_network) is DoubledValueNetwork
    reference = build_model(ModelConfig(attention="softmax", **fields), seed=0).eval()
    x = torch.randn(2, 3, 2)
    _, doubled = model.run_with_cache(x, names_filter="blocks.0.attn.hook_z")
    _, single = reference.run_with_cache(x, names_filter="blocks.0.attn.hook_z")
    torch.testing.assert_close(doubled["blocks.0.attn.hook_z"], 2 * single["blocks.0.attn.hook_z"])


def test_importing_the_config_leaves_torch_unimported():
    """The command line imports the config to build its help; the torch tables load on validation."""
    import subprocess
    import sys

    code = (
        "import sys, latentcode.models.config, latentcode.training.presets; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
