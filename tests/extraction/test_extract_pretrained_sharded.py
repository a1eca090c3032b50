"""Sharded extraction of a pretrained causal LM (torchrun, gloo on CPU): each process records a
contiguous share of the windows, compact store included, and one file over the shards reads as the
one-process file (issue 35, item 3)."""

import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from latentcode.cli import main
from latentcode.errors import UsageError
from latentcode.extraction import plan_extract, run_extraction
from latentcode.store import CodeFile
from latentcode.store.schema import CodeFileError
from tests.pretrained_models import save_tiny_llama

# 10 windows in batches of 3: batches [0, 1] to process 0 (6 windows), [2, 3] to process 1 (4 windows).
ARGUMENTS = ["--task", "seq_len=32", "--n", "10", "--batch-size", "3", "--sites", "*:-1:-2..", "--quiet"]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny")


def torchrun(model, out, processes=2):
    # --standalone: a free port; "--" keeps torchrun from taking extract's --n for one of its options
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               "-m", "latentcode.cli", "--", "extract", str(model), *ARGUMENTS, "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two launches of two processes, each importing torch and transformers: 19.5 s for one (load 1.75)
def test_two_processes_write_the_compact_file_one_process_writes(tiny_llama, tmp_path):
    result = torchrun(tiny_llama, tmp_path / "sharded.h5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("wrote") == 1 and "rows in 2 shards beside it" in result.stdout
    assert main(["extract", str(tiny_llama), *ARGUMENTS, "--out", str(tmp_path / "single.h5")]) == 0
    one, two = CodeFile(tmp_path / "single.h5"), CodeFile(tmp_path / "sharded.h5")
    assert [entry["rows"] for entry in two.shards] == [[0, 6], [6, 10]]
    assert len(one) == len(two) == 10 and one.sites == two.sites and one.label_names == two.label_names
    # Bitwise: each window is read in the same batch of 3 by the same model on one thread (a share is
    # whole batches), so every float is computed by the same operations in both runs.
    for site in one.sites:
        np.testing.assert_array_equal(one.codes(site), two.codes(site))
    for label in one.label_names:
        np.testing.assert_array_equal(one.labels(label), two.labels(label))
    np.testing.assert_array_equal(one.extra("token_ids"), two.extra("token_ids"))
    np.testing.assert_array_equal(one.split_of_examples(), two.split_of_examples())
    with h5py.File(one.path, "r") as single, h5py.File(two.path, "r") as sharded:
        names = sorted(single["compact"])
        assert names == sorted(sharded["compact"]) == ["key_l0", "key_l1", "key_valid", "query_l0", "query_l1"]
        for name in names:
            stored, virtual = single["compact"][name], sharded["compact"][name]
            assert virtual.is_virtual and virtual.dtype == stored.dtype
            np.testing.assert_array_equal(stored[()], virtual[()])
            assert dict(stored.attrs) == dict(virtual.attrs)  # scale, causal, window, softcap, sinks
    assert two.compact.layers == one.compact.layers == [0, 1]
    np.testing.assert_array_equal(one.compact.rows(1, [0, 17, 31]), two.compact.rows(1, [0, 17, 31]))
    np.testing.assert_array_equal(one.compact.block(0, [20, 21], [3, 19, 20], examples=[1, 6, 9]),
                                  two.compact.block(0, [20, 21], [3, 19, 20], examples=[1, 6, 9]))
    # A rebuilt pair that is not stored as a site, read through CodeFile.codes
    np.testing.assert_array_equal(one.codes("l1_q20_k3"), two.codes("l1_q20_k3"))
    assert (one.codes("l1_q20_k3") > 0).all()  # a causal pair: not the zeros of a missing source

    # The shard identity check covers /compact: a shard whose keys changed shape is refused at open.
    two.compact.close()
    with h5py.File(tmp_path / "sharded.shard-1-of-2.h5", "r+") as shard:
        del shard["compact/key_l1"]
        shard["compact"].create_dataset("key_l1", data=np.zeros((4, 2, 16, 8), np.float32))
    with pytest.raises(CodeFileError, match=r"has /compact/key_l1 of shape \[4, 2, 16, 8\]; the file expects "
                                            r"\[4, 2, 32, 8\]"):
        CodeFile(tmp_path / "sharded.h5")

    # A process that fails (its shard's name is taken) fails the launch in every process; no file is written.
    (tmp_path / "again.shard-1-of-2.h5").write_text("taken")
    result = torchrun(tiny_llama, tmp_path / "again.h5")
    assert result.returncode != 0 and not (tmp_path / "again.h5").exists()
    assert "process 1 of 2 failed recording its shard: FileExistsError" in result.stderr
    assert (tmp_path / "again.shard-1-of-2.h5").read_text() == "taken"


def test_a_sharded_pretrained_extraction_refuses_before_the_model_loads(tiny_llama, monkeypatch, tmp_path, capsys):
    import latentcode.pretrained

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    out = tmp_path / "codes.h5"

    def never(*args, **kwargs):  # never loaded: the refusal comes first
        raise AssertionError("the model was loaded before the sharded output was refused")

    monkeypatch.setattr(latentcode.pretrained, "load_pretrained", never)
    with pytest.raises(UsageError, match="append=True .* with 2 processes: a sharded file cannot be appended to"):
        latentcode.extract(tiny_llama, {"seq_len": 32}, n=1, out=out, append=True, progress=False)
    plan = plan_extract(tiny_llama, {"seq_len": 32}, n=1, out=out)  # planned while `out` is free, run once it is taken
    out.write_bytes(b"kept")
    with pytest.raises(FileExistsError, match="codes.h5 already exists; pass overwrite=True"):
        run_extraction(plan, progress=False)
    assert out.read_bytes() == b"kept"


def test_the_command_line_refuses_a_sharded_append_or_an_existing_file_in_one_line(tiny_llama, monkeypatch,
                                                                                   tmp_path, capsys):
    out = tmp_path / "codes.h5"
    assert main(["extract", str(tiny_llama), *ARGUMENTS, "--out", str(out)]) == 0
    before = out.read_bytes()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    capsys.readouterr()
    for extra, says in ((["--append"], "a sharded file cannot be appended to"), ([], "already exists")):
        assert main(["extract", str(tiny_llama), *ARGUMENTS, "--out", str(out), *extra]) == 2
        error = capsys.readouterr().err.strip()
        assert says in error and "\n" not in error and "Traceback" not in error
    assert out.read_bytes() == before


def test_where_a_process_loaded_the_model_from_is_not_part_of_its_config(tiny_llama, tmp_path):
    # The ranks of one launch load a GGUF from the file or from its cache entry (whichever filled it):
    # transformers' `_name_or_path` differs, and the shards must still agree on model_config.
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama, copy)
    files = []
    for model in (tiny_llama, copy):
        files.append(tmp_path / f"{model.name}.h5")
        assert main(["extract", str(model), *ARGUMENTS, "--n", "1", "--out", str(files[-1])]) == 0
    first, second = (CodeFile(path) for path in files)
    assert first.model_config == second.model_config and "_name_or_path" not in first.model_config
    assert first.attrs["checkpoint_sha256"] == second.attrs["checkpoint_sha256"]  # the same weights
    assert first.attrs["model_path"] != second.attrs["model_path"]
