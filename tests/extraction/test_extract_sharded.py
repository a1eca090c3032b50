"""Sharded extraction: several processes (torchrun, gloo on CPU), one shard each, one file over them
(issue 26)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import latentcode
from latentcode.errors import UsageError
from latentcode.extraction.pipeline import distributed_position
from latentcode.store import CodeFile

MODEL = Path(__file__).resolve().parents[2] / "models" / "fuzzy_logic-hyla"


def test_the_launch_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert distributed_position() == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert distributed_position() == (1, 2)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(UsageError, match="RANK=2; expected 0 <= RANK < WORLD_SIZE"):
        distributed_position()


def test_a_sharded_extraction_refuses_before_any_process_waits(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    out = tmp_path / "codes.h5"
    with pytest.raises(UsageError, match="append=True .* with 2 processes: a sharded file cannot be appended to"):
        latentcode.extract(MODEL, n=8, out=out, append=True, progress=False)
    out.write_bytes(b"")
    with pytest.raises(FileExistsError, match="already exists; pass append=True .*overwrite=True"):
        latentcode.extract(MODEL, n=8, out=out, progress=False)


def torchrun(*arguments, processes=2):
    # --standalone: a free port, not the default 29500 that another launch on the machine may hold
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               # "--" keeps torchrun from taking extract's --n for an abbreviation of its own options
               "-m", "latentcode.cli", "--", "extract", str(MODEL), "--quiet", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_processes_write_the_file_one_process_writes(tmp_path):
    single = latentcode.extract(MODEL, n=64, out=tmp_path / "single.h5", batch_size=16, progress=False)
    result = torchrun("--n", "64", "--batch-size", "16", "--out", str(tmp_path / "sharded.h5"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("wrote") == 1 and "rows in 2 shards beside it" in result.stdout
    one, two = CodeFile(single), CodeFile(tmp_path / "sharded.h5")
    assert [entry["file"] for entry in two.shards] == ["sharded.shard-0-of-2.h5", "sharded.shard-1-of-2.h5"]
    assert [entry["rows"] for entry in two.shards] == [[0, 32], [32, 64]]
    assert len(one) == len(two) == 64 and one.sites == two.sites and one.label_names == two.label_names
    for site in one.sites:
        np.testing.assert_array_equal(one.codes(site), two.codes(site))
    for label in one.label_names:
        np.testing.assert_array_equal(one.labels(label), two.labels(label))
    np.testing.assert_array_equal(one.prediction(), two.prediction())
    np.testing.assert_array_equal(one.target(), two.target())
    np.testing.assert_array_equal(one.split_of_examples(), two.split_of_examples())
    assert one.split_seeds == two.split_seeds

    # A process that fails (its shard's name is taken) fails the launch, and no file is written.
    (tmp_path / "again.shard-1-of-2.h5").write_text("taken")
    result = torchrun("--n", "64", "--batch-size", "16", "--out", str(tmp_path / "again.h5"))
    assert result.returncode != 0 and not (tmp_path / "again.h5").exists()
    assert "process 1 of 2 failed recording its shard: FileExistsError" in result.stderr
