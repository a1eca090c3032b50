"""`latentcode view` of a pretrained model's codes file names keys by their tokens: the tokenizer of the
model the file names (its root attribute `model_path`), when that model is here and has the file's
checkpoint SHA-256; else keys by position, one line saying why, and the page is still written
(issue 35)."""

import shutil

import h5py
import pytest
import transformers

from latentcode.cli import main
from latentcode.store import CodeFile
from tests.analysis.test_viewer_run import page_data
from tests.pretrained_models import save_tiny_llama


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """A tiny random Llama directory (its tokenizer saved with it) and a codes file of it whose sites
    are the last query to every key."""
    root = tmp_path_factory.mktemp("viewer-pretrained")
    model = save_tiny_llama(root / "tiny")
    codes = root / "codes.h5"
    assert main(["extract", str(model), "--task", "seq_len=16", "--n", "5", "--sites", "*:-1:*", "--out", str(codes),
                 "--quiet"]) == 0
    return model, codes


def test_keys_are_named_by_the_tokens_of_the_model_the_file_names(extracted, tmp_path, capsys):
    model, codes = extracted
    code_file = CodeFile(codes)
    assert code_file.attrs["model_path"] == str(model.resolve()) and len(code_file.attrs["checkpoint_sha256"]) == 64
    page = tmp_path / "page.html"
    assert main(["view", str(codes), "--view", "codes", "--out", str(page)]) == 0
    assert "keys named by position" not in capsys.readouterr().out
    tokens = page_data(page)["tokens"]
    assert tokens is not None and tokens["positions"] == list(range(16))
    # Independently of the code: the tokenizer saved with the model decodes the file's token ids.
    tokenizer = transformers.AutoTokenizer.from_pretrained(model, local_files_only=True)
    ids = code_file.extra("token_ids")
    expected = [[tokenizer.decode([int(token)]) for token in row] for row in ids]
    assert tokens["texts"] == expected
    assert len({text for row in expected for text in row}) > 5  # names, not one placeholder


def test_another_model_at_the_path_or_none_keeps_positions_and_says_why(extracted, tmp_path, capsys):
    model, codes = extracted
    moved = tmp_path / "codes.h5"
    shutil.copy(codes, moved)
    with h5py.File(moved, "r+") as file:  # a file written before extractions kept the tokens' text
        file.attrs["token_names"] = "[]"
    saved = tmp_path / "saved"
    shutil.copytree(model, saved)
    try:
        save_tiny_llama(model, seed=1)  # other weights where the file's model was
        assert main(["view", str(moved), "--out", str(tmp_path / "other.html")]) == 0
        said = capsys.readouterr().out
        assert f"keys named by position, not by token: {moved}: {model.resolve()} has SHA-256" in said
        assert "not the" in said and said.count("keys named by position") == 1
        assert page_data(tmp_path / "other.html")["tokens"] is None
        shutil.rmtree(model)  # no model at the path at all
        assert main(["view", str(moved), "--out", str(tmp_path / "absent.html")]) == 0
        said = capsys.readouterr().out
        assert f"keys named by position, not by token: {moved}: its model {model.resolve()} is not here" in said
        assert page_data(tmp_path / "absent.html")["tokens"] is None
        assert len(page_data(tmp_path / "absent.html")["codes"]) == 5  # the page itself is whole
    finally:
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(saved, model)
