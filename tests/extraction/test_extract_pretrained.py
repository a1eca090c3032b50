"""`latentcode extract` on a pretrained causal LM (a tiny random Llama saved as a Hugging Face
directory): a compact store the other commands read unchanged, and one-line refusals."""

import numpy as np
import pytest

from latentcode.cli import main
from latentcode.store import CodeFile, Site
from tests.pretrained_models import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny")


def test_extract_then_probe_plot_heatmap_and_report_on_a_compact_store(tiny_llama, tmp_path, capsys):
    out = tmp_path / "codes.h5"
    common = ["extract", str(tiny_llama), "--n", "48", "--batch-size", "24", "--task", "seq_len=32",
              "--sites", "*:-1:-4..", "--out", str(out), "--quiet"]
    assert main([*common, "--split", "train"]) == 0
    assert main([*common, "--split", "validation", "--append"]) == 0
    codes = CodeFile(out)
    assert codes.splits == ["train", "validation"] and len(codes) == 96 and codes.compact.layers == [0, 1]
    assert len(codes.sites) == 8  # 2 layers x the last query to its 4 latest keys, stored as [N, H]
    # A stored site and the same pair rebuilt from /compact agree (the store holds both)
    site = Site(1, 31, 29)
    rebuilt = codes.compact.codes(1, 31, 29)
    assert np.abs(codes.codes(site) - rebuilt).max() <= 1e-5
    label = "last_token_starts_word"
    assert main(["probe", str(out), "--label", label, "--fit-split", "train", "--test-split", "validation",
                 "--out", str(tmp_path / "probe"), "--quiet"]) == 0
    assert main(["plot", str(out), "--method", "tsne", "--color", label, "--out", str(tmp_path / "tsne"),
                 "--quiet"]) == 0
    assert main(["heatmap", str(out), "--label", label, "--out", str(tmp_path / "heat")]) == 0
    assert main(["report", "--codes", str(out), "--label", label, "--fit-split", "train", "--test-split",
                 "validation", "--out", str(tmp_path / "report.html"), "--quiet"]) == 0
    for name in ("probe.csv", "tsne.png", "heat.png", "report.html"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.parametrize("arguments, says", [
    (["--task", "seq_len=65"], "--task seq_len=65 is beyond the context of"),
    (["--split", "ood", "--task", "seq_len=32"], "--split: unknown split 'ood' for a pretrained model: it reads the language corpus's train "
                         "or validation split"),
    (["--task", "name=sraven"], "a pretrained model reads windows of the language corpus"),
])
def test_bad_input_for_a_pretrained_model_is_one_line(tiny_llama, tmp_path, capsys, arguments, says):
    out = tmp_path / "codes.h5"
    assert main(["extract", str(tiny_llama), "--out", str(out), "--quiet", *arguments]) == 2
    error = capsys.readouterr().err.strip()
    assert says in error and "\n" not in error and "Traceback" not in error
    assert not out.exists()


def test_report_takes_the_pretrained_model_beside_its_codes_and_refuses_other_codes(tiny_llama, tmp_path, capsys):
    """`latentcode report MODEL --codes FILE` as for a run directory: the page says where the codes come
    from; the model alone, or codes of another model, is one line naming what to give."""
    out = tmp_path / "codes.h5"
    for split in ("train", "validation"):
        assert main(["extract", str(tiny_llama), "--n", "24", "--task", "seq_len=16", "--split", split, "--out",
                     str(out), "--quiet", *(["--append"] if split == "validation" else [])]) == 0
    label = ["--label", "last_token_starts_word", "--fit-split", "train", "--test-split", "validation"]
    page = tmp_path / "report.html"
    assert main(["report", str(tiny_llama), "--codes", str(out), *label, "--out", str(page), "--quiet"]) == 0
    assert f"pretrained model {tiny_llama}" in page.read_text()
    assert capsys.readouterr().err == ""  # --quiet: transformers' own loading bars too

    assert main(["report", str(tiny_llama), "--out", str(tmp_path / "alone.html")]) == 2
    error = capsys.readouterr().err.strip()
    assert "is a pretrained model" in error and "--codes CODES.h5" in error and "\n" not in error
    other = save_tiny_llama(tmp_path / "other")
    capsys.readouterr()
    assert main(["report", str(other), "--codes", str(out), *label, "--out", str(tmp_path / "other.html")]) == 2
    error = capsys.readouterr().err.strip()
    assert f"not of the pretrained model {other}" in error and "\n" not in error
    assert not (tmp_path / "alone.html").exists() and not (tmp_path / "other.html").exists()
