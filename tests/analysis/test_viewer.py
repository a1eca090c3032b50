"""The viewer's data and page without a browser (test_viewer_browser.py opens the page): the sample
and its cap, rounding, labels with the file's names, one self-contained file that refuses to
overwrite, and one-line errors for tables and embeddings that do not fit."""

import re

import numpy as np
import pandas as pd
import pytest

from latentcode.analysis.embed import Embedding
from latentcode.analysis.viewer import build_viewer, viewer_data
from latentcode.errors import AnalysisError
from latentcode.store import CodeFile
from tests.analysis.synthetic import write_codes


@pytest.fixture(scope="module")
def codes(tmp_path_factory):
    return write_codes(tmp_path_factory.mktemp("viewer") / "codes.h5", n_per_split={"train": 50, "ood": 30},
                       sites_per_layer=2)


def test_the_sample_is_capped_drawn_with_the_seed_and_rounded(codes):
    data = viewer_data(codes, max_instances=20, seed=3, decimals=3)
    assert (data["n_shown"], data["n_total"], data["cap"]) == (20, 80, 20)
    rows = data["instances"]["row"]
    assert rows == sorted(rows) and len(set(rows)) == 20
    assert viewer_data(codes, max_instances=20, seed=4)["instances"]["row"] != rows
    code_file = CodeFile(codes)
    site = code_file.sites[0]
    exact = code_file.codes(site)[rows]  # [20, H]; the page's codes are [n][site * H + head]
    shown = np.array(data["codes"])[:, : code_file.heads_of[site]]
    assert np.abs(shown - exact).max() <= 0.0005 + 1e-9
    assert np.array_equal(shown, np.round(shown, 3))


def test_labels_are_named_as_the_file_names_them_and_the_split_is_a_filter(codes):
    data = viewer_data(codes, max_instances=None)
    code_file = CodeFile(codes)
    rule = data["labels"]["rule"]
    names = code_file.value_names["rule"]
    assert [rule["values"][i] for i in rule["index"]] == [names[value] for value in code_file.labels("rule")]
    assert data["labels"]["split"]["values"] == ["ood", "train"] and data["labels"]["split"]["filter"]
    assert "target" not in data["labels"]  # shown beside the model's answer instead
    assert data["instances"]["target"] == [f"{value:.3g}" for value in code_file.target()]


def test_the_page_is_one_file_with_everything_inline_and_the_cap_and_size_in_its_footer(codes, tmp_path):
    viewer = build_viewer(codes, max_instances=25)
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", viewer.html)
    assert "Content-Security-Policy" in viewer.html and "default-src 'none'" in viewer.html
    footer = viewer.html.split("<footer>", 1)[1].split("</footer>", 1)[0]
    assert "25 of 80 instances shown (cap 25" in footer
    size = float(re.search(r"this file ([0-9.]+) MB", footer).group(1))
    path = viewer.save(tmp_path / "page.html")
    assert abs(path.stat().st_size / 1e6 - size) < 0.051
    with pytest.raises(FileExistsError, match="exists; pass overwrite=True"):
        viewer.save(path)
    assert 'srcdoc="' in viewer._repr_html_()


def test_an_embedding_of_other_instances_and_a_table_that_is_not_a_patch_table_are_refused(codes, tmp_path):
    embedding = Embedding("tsne", "hyla", None, [0, 1], {0: np.zeros((5, 2)), 1: np.zeros((5, 2))},
                          np.arange(5), 80, 5, 0)
    with pytest.raises(AnalysisError, match="same split, max_points and seed"):
        viewer_data(codes, max_instances=10, embeddings=[embedding])
    table = tmp_path / "probe.csv"
    pd.DataFrame({"layer": [0], "accuracy": [0.5]}).to_csv(table, index=False)
    with pytest.raises(AnalysisError, match="no column"):
        build_viewer(codes, patching=[table])
    assert '"accuracy"' in build_viewer(codes, probe_tables=[table]).html


def test_keys_are_named_by_the_tokens_the_file_keeps(tmp_path):
    from latentcode.store import CodeWriter, Site

    sites = [Site(0, 3, key) for key in (0, 2)]
    ids = np.array([[0, 1, 2, 1], [2, 2, 0, 0], [1, 0, 1, 2]])  # [N=3, T=4]

    def write(path, metadata):
        with CodeWriter(path, sites, n_heads=2, metadata=metadata) as writer:
            writer.append(codes={site: np.zeros((3, 2), np.float32) for site in sites}, labels={"a": np.arange(3)},
                          split="train", extra={"token_ids": ids})
        return path

    named = write(tmp_path / "named.h5", {"token_names": ["x", "y", "<z>"]})
    tokens = viewer_data(named, max_instances=None)["tokens"]  # positions: the keys 0, 2 and the query 3
    assert tokens == {"positions": [0, 2, 3], "texts": [["x", "<z>", "y"], ["<z>", "x", "x"], ["y", "y", "<z>"]]}
    unnamed = write(tmp_path / "unnamed.h5", {})  # a pretrained model's file: its tokenizer names the ids
    assert viewer_data(unnamed, max_instances=None)["tokens"] is None
    assert viewer_data(unnamed, max_instances=None, token_names=["p", "q", "r"])["tokens"]["texts"][1] == ["r", "p", "p"]
    with pytest.raises(AnalysisError, match="token ids from 0 to 2, but 2 token names"):
        viewer_data(unnamed, token_names=["p", "q"])
    assert "token_ids" not in viewer_data(named, max_instances=None)["labels"], "the window's tokens are no label"


def test_a_language_answer_is_the_argmax_token_and_its_target_the_last_position(tmp_path):
    """A language file keeps the logits of the last position only ([N, 1, vocabulary]) and the target
    of every position ([N, T]): the answer is the argmax's token, the target the last position's."""
    from latentcode.store import CodeWriter, Site

    logits = np.zeros((2, 1, 3), np.float32)
    logits[0, 0, 2] = logits[1, 0, 0] = 5.0  # answers: "<z>", "x"
    target = np.array([[0, 0, 0, 2], [1, 1, 1, 1]])  # last position: "<z>", "y"
    metadata = {"token_names": ["x", "y", "<z>"], "prediction_kind": "logits of the byte after the last token"}
    with CodeWriter(tmp_path / "c.h5", [Site(0, 3, 3)], n_heads=2, metadata=metadata) as writer:
        writer.append(codes={Site(0, 3, 3): np.zeros((2, 2), np.float32)}, labels={"a": np.arange(2)}, split="train",
                      prediction=logits, target=target, extra={"token_ids": target})
    instances = viewer_data(tmp_path / "c.h5", max_instances=None)["instances"]
    assert (instances["answer"], instances["target"]) == (["<z>", "x"], ["<z>", "y"])
