"""Subsampling with a cap, and tSNE / UMAP embeddings of each layer."""

import re

import numpy as np
import pytest

from latentcode.analysis.embed import embed, subsample
from latentcode.store import CodeFile
from tests.analysis.synthetic import write_codes


@pytest.fixture(scope="module")
def codes_path(tmp_path_factory):
    # Only the rule is planted (in layer 1), so that its clusters are what an embedding shows.
    return write_codes(tmp_path_factory.mktemp("embed") / "codes.h5", n_per_split={"train": 300, "ood": 80},
                       planted=("rule",))


def test_subsample_uniform_and_stratified():
    assert (subsample(50, 100) == np.arange(50)).all() and (subsample(50, None) == np.arange(50)).all()
    chosen = subsample(1000, 100, seed=3)
    assert len(chosen) == 100 and len(np.unique(chosen)) == 100 and (np.diff(chosen) > 0).all()
    assert (subsample(1000, 100, seed=3) == chosen).all() and not (subsample(1000, 100, seed=4) == chosen).all()
    strata = np.repeat([0, 1, 2], [700, 250, 50])
    stratified = subsample(1000, 101, seed=0, strata=strata)
    counts = np.bincount(strata[stratified], minlength=3)
    assert counts.sum() == 101 and np.all(np.abs(counts - np.array([70.7, 25.25, 5.05])) < 1)
    with pytest.raises(ValueError, match=r"strata has shape \[3\]; expected \[1000\]"):
        subsample(1000, 10, strata=np.zeros(3))


def _neighbour_agreement(xy, labels, k=5):
    distances = ((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(distances, np.inf)
    neighbours = np.argsort(distances, axis=1)[:, :k]
    return np.mean(labels[neighbours] == labels[:, None])


def test_tsne_of_each_layer_on_a_capped_subsample(codes_path):
    result = embed(codes_path, "tsne", split="train", max_points=80, seed=0, stratify="rule")
    assert (result.n_used, result.n_total, result.layers) == (80, 300, [0, 1])
    assert result.describe() == "80 of 300 examples (cap 80, stratified by rule, seed 0)"
    rule = CodeFile(codes_path).labels("rule", "train")[result.indices]
    for layer in (0, 1):
        assert result.coordinates[layer].shape == (80, 2) and np.isfinite(result.coordinates[layer]).all()
    # the rule is planted in layer 1 only: its clusters show in that embedding, not in layer 0's
    assert _neighbour_agreement(result.coordinates[1], rule) > 0.9
    assert _neighbour_agreement(result.coordinates[0], rule) < 0.4
    again = embed(codes_path, "tsne", split="train", layers=[1], max_points=80, seed=0, stratify="rule")
    np.testing.assert_array_equal(again.coordinates[1], result.coordinates[1])


@pytest.mark.slow  # numba compiles UMAP on first use: about 10 s of one core
def test_umap_embedding(codes_path):
    result = embed(codes_path, "umap", split="ood", layers=[1], max_points=None, seed=0)
    assert (result.n_used, result.n_total) == (80, 80) and result.describe() == "80 of 80 examples"
    assert result.coordinates[1].shape == (80, 2)
    rule = CodeFile(codes_path).labels("rule", "ood")
    assert _neighbour_agreement(result.coordinates[1], rule) > 0.9


def test_embed_errors(codes_path):
    with pytest.raises(ValueError, match=r"method 'pca' is not one of \('tsne', 'umap'\)"):
        embed(codes_path, "pca")
    with pytest.raises(ValueError, match=r"stratify needs one value per example; label 'query_rule' has shape \[300, 4\]"):
        embed(codes_path, split="train", stratify="query_rule")


def test_progress_is_a_line_per_layer_on_stderr_off_a_terminal(codes_path, capsys):
    embed(codes_path, "tsne", split="ood", max_points=40)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "tSNE of 40 hyla codes: layer 0 (1 of 2) ..." and lines[2].startswith("tSNE of 40 hyla codes: layer 1 (2 of 2)")
    assert re.fullmatch(r"tSNE of 40 hyla codes: layer 1 done in \d+\.\d s", lines[3]) and len(lines) == 4
    assert "\r" not in err and "\x1b" not in err, "plain lines: no carriage returns or escape codes in a log"
    embed(codes_path, "tsne", split="ood", max_points=40, progress=False)
    assert capsys.readouterr().err == "", "progress=False (the CLI's --quiet, the report's own bar): nothing"


def test_progress_is_a_bar_on_a_terminal(codes_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    embed(codes_path, "tsne", split="ood", max_points=40)
    err = capsys.readouterr().err
    assert "tSNE of 40 hyla codes" in err and "2/2" in err and "done in" not in err, "a bar over the two layers"
