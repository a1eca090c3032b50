"""Codes in memory (issue 47): `extract(..., out=None)` returns an `InMemoryCodes` read through the
same interface as a codes file; every analysis function takes it and gives what the file gives."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import latentcode
from latentcode.analysis.embed import embed
from latentcode.analysis.probes import decode
from latentcode.analysis.viewer.data import viewer_data
from latentcode.errors import OutputExistsError, UsageError
from latentcode.store import CodeFile, InMemoryCodes, InMemoryCodesError

MODEL = Path(__file__).resolve().parents[2] / "models" / "sraven-hyla"
N = 128


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The same instances extracted in memory and into a file: train, then ood appended."""
    path = tmp_path_factory.mktemp("codes") / "codes.h5"
    options = {"sites": "sraven-rule", "n": N, "batch_size": 64, "progress": False}
    train_only = latentcode.extract(MODEL, split="train", **options)
    memory = latentcode.extract(MODEL, split="ood", out=train_only, append=True, **options)
    latentcode.extract(MODEL, split="train", out=path, **options)
    latentcode.extract(MODEL, split="ood", out=path, append=True, **options)
    return train_only, memory, CodeFile(path)


def test_memory_and_file_hold_the_same_arrays(both):
    train_only, memory, file = both
    assert isinstance(memory, InMemoryCodes) and isinstance(memory, CodeFile)
    assert len(train_only) == N and train_only.splits == ["train"], "appending makes a new object"
    assert len(memory) == len(file) == 2 * N and memory.splits == file.splits == ["train", "ood"]
    assert memory.sites == file.sites and memory.label_names == file.label_names
    assert memory.extra_names == file.extra_names and memory.model_config == file.model_config
    for site in file.sites:
        np.testing.assert_array_equal(memory.codes(site, "ood"), file.codes(site, "ood"))
    for name in file.label_names:
        np.testing.assert_array_equal(memory.labels(name), file.labels(name))
    for name in file.extra_names:
        np.testing.assert_array_equal(memory.extra(name), file.extra(name))
    np.testing.assert_array_equal(memory.prediction(), file.prediction())
    np.testing.assert_array_equal(memory.subsample(50, seed=1).codes(file.sites[0]),
                                  file.subsample(50, seed=1).codes(file.sites[0]))


def test_probe_tables_embeddings_and_viewer_data_are_identical(both):
    _, memory, file = both
    tables = [decode(codes, "rule", progress=False) for codes in (memory, file)]
    assert set(tables[0]["file"]) == {"<codes in memory>"} and set(tables[1]["file"]) == {str(file.path)}
    pd.testing.assert_frame_equal(tables[0].drop(columns="file"), tables[1].drop(columns="file"))
    embeddings = [embed(codes, "tsne", split="ood", max_points=64, progress=False) for codes in (memory, file)]
    np.testing.assert_array_equal(embeddings[0].indices, embeddings[1].indices)
    for layer in file.layers:
        np.testing.assert_array_equal(embeddings[0].coordinates[layer], embeddings[1].coordinates[layer])
    views = [viewer_data(codes, "ood", 64, 0, [embedding]) for codes, embedding in zip((memory, file), embeddings, strict=True)]
    assert views[0].pop("file") == "<codes in memory>" and views[1].pop("file") == "codes.h5"
    assert views[0] == views[1]


def test_save_writes_the_codes_file_and_never_overwrites_unasked(both, tmp_path):
    _, memory, file = both
    saved = memory.save(tmp_path / "saved.h5")
    assert isinstance(saved, CodeFile) and not isinstance(saved, InMemoryCodes)
    for site in file.sites:
        np.testing.assert_array_equal(saved.codes(site), file.codes(site))
    before = (tmp_path / "saved.h5").read_bytes()
    with pytest.raises(OutputExistsError, match="saved.h5 already exists; pass overwrite=True"):
        memory.save(tmp_path / "saved.h5")
    assert (tmp_path / "saved.h5").read_bytes() == before
    memory.save(tmp_path / "saved.h5", overwrite=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["saved.h5"], "no temporary or lock file left"


def test_codes_in_memory_where_a_file_is_needed_is_one_line(both, capsys):
    _, memory, _ = both
    with pytest.raises(InMemoryCodesError, match=r"got codes in memory \(256 examples, 8 sites\) where a codes "
                                                 r"file's path is needed; save them first") as raised:
        os.fspath(memory)
    assert "\n" not in str(raised.value)
    from latentcode.cli import main

    assert main(["probe", memory, "--label", "rule"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: got codes in memory") and error.count("\n") == 1
    with pytest.raises(InMemoryCodesError):  # a command line in a subprocess: refused before it starts
        subprocess.run([sys.executable, "-m", "latentcode.cli", "probe", memory], check=False)


def test_append_and_out_mistakes_are_one_line(both):
    train_only, memory, _ = both
    with pytest.raises(UsageError, match="append=True adds to codes, but out=None starts new codes in memory"):
        latentcode.extract(MODEL, split="ood", n=4, append=True, progress=False)
    with pytest.raises(UsageError, match=r"out is InMemoryCodes\(.*\); pass append=True to add to them"):
        latentcode.extract(MODEL, split="ood", n=4, out=train_only, progress=False)
    assert len(train_only) == N


def test_code_reuse_reads_codes_in_memory_as_it_reads_their_file(tmp_path):
    from latentcode.reuse import CodeReuseError, code_reuse

    model = MODEL.parent / "fuzzy_logic-hyla"
    options = {"sites": "last-self", "variant": "fixed_query", "n": 96, "progress": False}
    train_only = latentcode.extract(model, split="train", **options)
    with pytest.raises(CodeReuseError, match=r"<codes in memory> holds splits \['train'\]; the score reads train "
                                             "and ood codes"):
        code_reuse(model, codes=train_only)
    memory = latentcode.extract(model, split="ood", out=train_only, append=True, **options)
    from_memory = code_reuse(model, codes=memory, n_pairs=8)
    from_file = code_reuse(model, codes=memory.save(tmp_path / "codes.h5").path, n_pairs=8)
    pd.testing.assert_frame_equal(from_memory, from_file)
