import json

import pytest
import torch

from latentcode import ModelConfig, build_model, load_model
from latentcode.models import ModelFileError

CONFIG = ModelConfig(attention="hyla_deep", n_layers=2, d_model=8, n_heads=2, kqv_dim=4, d_mlp=8, n_ctx=6, d_in=3, d_out=2)


def test_save_and_load_round_trip(tmp_path):
    model = build_model(CONFIG, seed=3)
    path = model.save(tmp_path / "model")
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_model(path)
    assert loaded.config == CONFIG and not loaded.training
    x = torch.rand(2, 6, 3)
    torch.testing.assert_close(loaded(x), model.eval()(x))


def test_save_refuses_to_overwrite(tmp_path):
    model = build_model(CONFIG, seed=3)
    model.save(tmp_path / "model")
    before = (tmp_path / "model" / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="already exists and is not empty"):
        build_model(CONFIG, seed=4).save(tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").read_bytes() == before
    build_model(CONFIG, seed=4).save(tmp_path / "model", overwrite=True)
    assert (tmp_path / "model" / "model.safetensors").read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], "no staging directories left behind"


def test_load_names_what_differs(tmp_path):
    build_model(CONFIG).save(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config["d_mlp"] = 16
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=r"shapes differ: blocks.0.mlp.W_in: file \[8, 8\], config \[8, 16\]"):
        load_model(tmp_path / "model")
    config["d_mlp"], config["attention"] = 8, "softmax"
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=r"weights the config does not have \['blocks.0.attn.value_network.W_value2'"):
        load_model(tmp_path / "model")


def test_load_errors_for_missing_or_corrupt_files(tmp_path):
    with pytest.raises(ModelFileError, match="config.json is missing"):
        load_model(tmp_path)
    build_model(CONFIG).save(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelFileError, match="cannot read"):
        load_model(tmp_path / "model")


def test_weights_can_be_stored_in_half_precision(tmp_path):
    model = build_model(CONFIG, seed=3)
    path = model.save(tmp_path / "half", dtype=torch.float16)
    full = model.save(tmp_path / "full")
    saved_bytes = (full / "model.safetensors").stat().st_size - (path / "model.safetensors").stat().st_size
    assert saved_bytes >= 2 * sum(p.numel() for p in model.parameters()), "two bytes fewer per weight"
    loaded = load_model(path)
    assert loaded.blocks[0].attn.W_Q.dtype == torch.float32
    torch.testing.assert_close(loaded.blocks[0].attn.W_Q, model.blocks[0].attn.W_Q.half().float())
