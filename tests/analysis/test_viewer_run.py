"""`latentcode view RUN_DIR`: a run's codes are extracted first (latentcode.extract with the extract
command's defaults) into a temporary or a named codes file, then the page is built from them; a
directory that is neither a run nor a model directory is refused in one line."""

import json
import re

import numpy as np
import pytest

from latentcode.cli import main
from latentcode.store import CodeFile
from latentcode.training import build_train_config, train


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny fuzzy-logic run (as tests/training builds one: a few seconds)."""
    config = build_train_config("fuzzy_logic", "tiny", "hyla", n_layers=1, d_model=32, d_mlp=64, n_heads=4,
                                kqv_dim=8)
    return train(config, tmp_path_factory.mktemp("runs") / "fuzzy", progress=False).path


def page_data(path) -> dict:
    text = path.read_text()
    block = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', text, re.S).group(1)
    return json.loads(block.replace("<\\/", "</"))


def test_a_run_directory_is_extracted_into_the_named_codes_file_then_viewed(tiny_run, tmp_path, capsys):
    codes, page = tmp_path / "codes.h5", tmp_path / "run.html"
    assert main(["view", str(tiny_run), "--n", "300", "--codes", str(codes), "--out", str(page)]) == 0
    assert "extracting the codes of" in capsys.readouterr().out
    code_file = CodeFile(codes)
    # The extract command's defaults: the task's held-out split and the last token to itself.
    assert code_file.splits == ["ood"] and len(code_file) == 300
    assert code_file.selector["spec"] == "last-self" and code_file.selector["variant"] == "uniform"
    data = page_data(page)
    assert (data["file"], data["split"], data["n_total"], data["n_shown"]) == ("codes.h5", "ood", 300, 300)
    site = code_file.sites[0]
    shown = np.array(data["codes"])[:, : code_file.heads_of[site]]
    np.testing.assert_allclose(shown, code_file.codes(site), atol=0.0005 + 1e-9)


def test_without_codes_the_extraction_is_temporary_and_the_page_is_named_after_the_run(tiny_run, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    assert main(["view", str(tiny_run), "--n", "64", "--sites", "*:-1:*"]) == 0
    page = tmp_path / f"{tiny_run.name}.html"
    data = page_data(page)
    assert data["n_total"] == 64 and len({site["key"] for site in data["sites"]}) == 32  # the last query, every key
    assert list((tmp_path / "tmp").iterdir()) == [], "the temporary codes file is removed"


@pytest.mark.parametrize("make, expected", [
    (lambda d: d, "is a directory but neither a codes file (.h5) nor a run or model directory"),
    (lambda d: (d / "notes.txt").write_text("x") and d / "notes.txt", "is not an HDF5 file"),
])
def test_neither_a_run_nor_a_codes_file_is_refused_in_one_line(tmp_path, capsys, make, expected):
    path = make(tmp_path)
    assert main(["view", str(path), "--out", str(tmp_path / "v.html")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and expected in error and str(path) in error


def test_run_only_flags_with_a_codes_file_are_refused(tiny_run, tmp_path, capsys):
    codes = tmp_path / "c.h5"
    assert main(["view", str(tiny_run), "--n", "20", "--codes", str(codes), "--out", str(tmp_path / "a.html")]) == 0
    assert main(["view", str(codes), "--n", "20", "--out", str(tmp_path / "b.html")]) == 2
    assert "--n apply to a RUN_DIR" in capsys.readouterr().err
