"""`latentcode extract` and the codes file it writes: compression, lock refusal, per-write seeds."""

import h5py
import pytest

import latentcode
from latentcode.cli import main
from latentcode.files import ExclusiveLock
from latentcode.models import ModelConfig, build_model
from latentcode.models.persistence import save_model
from latentcode.store import CodeFile
from latentcode.tasks import eval_seed, get_task


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An untrained SRAVEN-shaped model saved as a model directory (no training needed)."""
    task = get_task("sraven")
    config = ModelConfig(attention="hyla", n_layers=1, d_model=16, n_heads=2, kqv_dim=4, d_mlp=16,
                         n_ctx=task.seq_len, d_in=task.d_in, d_out=task.d_out)
    return save_model(build_model(config, seed=0), tmp_path_factory.mktemp("models") / "sraven")


def extract_cli(model_dir, out, *options):
    return main(["extract", str(model_dir), "--task", "name=sraven", "--n", "20", "--batch-size", "8",
                 "--out", str(out), "--quiet", *options])


def test_compression_flag_and_default(model_dir, tmp_path, capsys):
    assert extract_cli(model_dir, tmp_path / "default.h5") == 0
    assert extract_cli(model_dir, tmp_path / "lzf.h5", "--compression", "lzf") == 0
    assert extract_cli(model_dir, tmp_path / "none.h5", "--compression", "none") == 0
    for name, expected in (("default", "gzip"), ("lzf", "lzf"), ("none", None)):
        with h5py.File(tmp_path / f"{name}.h5", "r") as file:
            assert file["codes"]["l0_q35_k35"].compression == expected
            assert file["prediction"].attrs["kind"] == "logits"
    with pytest.raises(SystemExit):
        extract_cli(model_dir, tmp_path / "zstd.h5", "--compression", "zstd")
    assert "invalid choice: 'zstd'" in capsys.readouterr().err


def test_a_file_being_written_is_refused_in_one_line(model_dir, tmp_path, capsys):
    out = tmp_path / "codes.h5"
    with ExclusiveLock(out, purpose="a test"):
        assert extract_cli(model_dir, out) == 2
        assert extract_cli(model_dir, out, "--wait-for-lock", "0.3") == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all(line.startswith(f"error: {out} is being written by pid ") for line in errors)
    assert "(a test)" in errors[0] and "(waited 0.3 s)" in errors[1]
    assert not out.exists()


def test_appended_splits_keep_their_seeds(model_dir, tmp_path):
    out = tmp_path / "codes.h5"
    task = {"name": "sraven"}
    latentcode.extract(model_dir, task, split="ood", n=10, out=out, progress=False)
    latentcode.extract(model_dir, task, split="test", n=10, out=out, append=True, progress=False)
    latentcode.extract(model_dir, task, split="ood", n=10, out=out, append=True, seed=5, progress=False)
    codes = CodeFile(out)
    assert codes.split_seeds == {"ood": [eval_seed("ood"), 5], "test": [eval_seed("test")]}
    assert [write["selector"]["variant"] for write in codes.writes] == [get_task("sraven").variants[0]] * 3
