"""Every figure is written, non-empty, at the size asked for, in the formats asked for."""

import matplotlib
import numpy as np
import pytest
from matplotlib.image import imread

from latentcode.analysis import decode, write_table
from latentcode.analysis.embed import embed
from latentcode.analysis.plots import (
    plot_code_samples,
    plot_embedding,
    plot_probe_scores,
    plot_similarity,
)
from tests.analysis.synthetic import make_labels, write_codes

FIGSIZE, DPI = (7.0, 3.5), 80  # -> 560 x 280 pixels


@pytest.fixture(scope="module")
def codes_path(tmp_path_factory):
    return write_codes(tmp_path_factory.mktemp("plots") / "hyla.h5", n_per_split={"train": 150, "ood": 60},
                       planted=("rule",))


def assert_png(path, figsize=FIGSIZE, dpi=DPI):
    assert path.suffix == ".png" and path.stat().st_size > 1000
    image = imread(path)
    assert image.shape[:2] == (round(figsize[1] * dpi), round(figsize[0] * dpi))
    assert image[..., :3].std() > 0.05, "not a blank image"


def test_embedding_plots_categorical_and_continuous(tmp_path, codes_path):
    embedding = embed(codes_path, "tsne", split="train", max_points=60, seed=0)
    paths = plot_embedding(codes_path, "rule", tmp_path / "tsne_rule", embedding=embedding,
                           formats=("png", "svg", "pdf"), figsize=FIGSIZE, dpi=DPI)
    assert [path.name for path in paths] == ["tsne_rule.png", "tsne_rule.svg", "tsne_rule.pdf"]
    assert_png(paths[0])
    assert paths[1].read_text()[:200].lstrip().startswith("<?xml") and "<svg" in paths[1].read_text()
    assert paths[2].read_bytes()[:5] == b"%PDF-"
    # a continuous label gets a colour bar; the embedding is computed when none is given
    (path,) = plot_embedding(codes_path, "target", tmp_path / "sub" / "tsne_target", split="ood", layers=[1],
                             max_points=40, figsize=FIGSIZE, dpi=DPI)
    assert path.parent.name == "sub"
    assert_png(path)


def test_similarity_heatmap_names_the_rules(tmp_path, codes_path):
    (path,) = plot_similarity(codes_path, "rule", tmp_path / "similarity", split="train", figsize=FIGSIZE, dpi=DPI)
    assert_png(path)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, so it can be searched
        (svg,) = plot_similarity(codes_path, "query_rule[-1]", tmp_path / "similarity", layers=[1],
                                 formats=("svg",), figsize=FIGSIZE, dpi=DPI)
    text = svg.read_text()
    assert "distribute_three" in text and "progression+1" in text and "layer 1" in text and "hyla" in text
    assert "1.00" in text, "the values are annotated"


def test_code_samples_grid(tmp_path, codes_path):
    (path,) = plot_code_samples(codes_path, "rule", tmp_path / "samples", layer=1, split="train", n_samples=5,
                                figsize=(8.0, 6.0), dpi=DPI)
    assert_png(path, figsize=(8.0, 6.0))
    with pytest.raises(ValueError, match=r"label 'target' is not integer-valued"):
        plot_code_samples(codes_path, "target", tmp_path / "x")
    with pytest.raises(ValueError, match=r"label 'query_rule' has shape \[N, 4\]: .* pick a column"):
        plot_code_samples(codes_path, "query_rule", tmp_path / "x")


def test_probe_score_plot_from_a_table_and_from_its_files(tmp_path, codes_path):
    other = write_codes(tmp_path / "softmax.h5", n_per_split={"train": 150, "ood": 60}, model_name="softmax",
                        signal_layers=(0, 1), planted=("rule",), seed=2)
    table = decode([codes_path, other], "rule", layers=[0, 1])
    (path,) = plot_probe_scores(table, tmp_path / "probe", figsize=FIGSIZE, dpi=DPI)
    assert_png(path)
    csv_path, json_path = write_table(table, tmp_path / "table")
    for source in (csv_path, json_path):
        (path,) = plot_probe_scores(source, tmp_path / f"probe_{source.suffix[1:]}", metric="macro_f1",
                                    formats=("pdf",), figsize=FIGSIZE, dpi=DPI)
        assert path.suffix == ".pdf" and path.stat().st_size > 1000
    with pytest.raises(ValueError, match=r"no rows with metric 'r2'; it has \['accuracy', 'balanced_accuracy', 'macro_f1'\]"):
        plot_probe_scores(table, tmp_path / "x", metric="r2")


def test_bad_format_and_no_figure_left_open(tmp_path, codes_path):
    with pytest.raises(ValueError, match=r"formats \['jpg'\]: expected one or more of \('png', 'svg', 'pdf'\)"):
        plot_similarity(codes_path, "rule", tmp_path / "x", formats=("jpg",))
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == [], "figures are never registered with pyplot"


def test_similarity_heatmap_of_many_values_is_capped_and_not_annotated(tmp_path):
    labels = make_labels(np.random.default_rng(1), 600)
    labels["task_index"] = np.arange(600) % 30  # 30 values: more than can be annotated legibly
    many = write_codes(tmp_path / "many.h5", labels_of_split={"train": labels}, n_per_split={"train": 600})
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_similarity(many, "task_index", tmp_path / "many", layers=[1], formats=("svg",))
    assert ">29<" in svg.read_text() and ">1.00<" not in svg.read_text(), "ticks named, no unreadable cell numbers"
    (png,) = plot_similarity(many, "task_index", tmp_path / "many", layers=[1], dpi=50)
    assert_png(png, figsize=(12.0 + 1.2, 12.0 + 0.8), dpi=50)
