"""Every figure is written, non-empty, at the size asked for, in the formats asked for; categorical
labels get a palette and a legend, signed codes and centred similarities a diverging scale centred at
0, a comparison one colour scale, constant layers a sentence, and titles name sites, variant and split."""

import re

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
from latentcode.analysis.plots.colours import OTHER_COLOUR, category_groups, colour_scale
from latentcode.analysis.plots.heatmap import _similarity_scale
from latentcode.analysis.similarity import Similarity
from latentcode.tasks.sraven import SRaven
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
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, so it can be searched
        (svg,) = plot_probe_scores(table, tmp_path / "noted", formats=("svg",), figsize=FIGSIZE, dpi=DPI,
                                   models_note="models trained on the permuted variant")
    assert "models trained on the permuted variant" in svg.read_text()


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
    numbers = re.findall(r">-?\d\.\d\d<", svg.read_text())
    name = SRaven().value_names()["task_index"][29]  # a task is its rule multiset
    assert f">{name}<" in svg.read_text() and len(numbers) < 20, "ticks named; only the colour bar's numbers, no cells'"
    (png,) = plot_similarity(many, "task_index", tmp_path / "many", layers=[1], dpi=50)
    # the panel at its largest, 7 inches, and room beside it for names longer than 18 characters
    room = min(2.5, 0.055 * (max(len(name) for name in SRaven().value_names()["task_index"][:30]) - 18))
    height, width = imread(png).shape[:2]
    assert abs(width - (7.0 + room + 1.4) * 50) <= 1 and abs(height - (7.0 + room + 1.3) * 50) <= 1


def _svg_text(path):
    return path.read_text()


def test_titles_name_the_model_sites_variant_and_split(tmp_path):
    path = write_codes(tmp_path / "hyla.h5", n_per_split={"train": 80, "ood": 40}, planted=("rule",),
                       selector={"name": "sraven-rule", "variant": "unpermuted"})
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        written = [
            plot_embedding(path, "rule", tmp_path / "tsne", split="ood", layers=[1], formats=("svg",)),
            plot_similarity(path, "rule", tmp_path / "similarity", split="ood", formats=("svg",)),
            plot_code_samples(path, "rule", tmp_path / "samples", split="ood", formats=("svg",)),
        ]
    for (svg,) in written:
        text = _svg_text(svg)
        assert "hyla" in text and "sraven-rule sites" in text and "unpermuted variant" in text, svg.name
        assert "split ood" in text and SRaven.split_descriptions["ood"].split()[0] in text, svg.name


def test_integer_labels_with_many_values_show_the_most_frequent_in_colour_and_the_rest_grey(tmp_path):
    labels = make_labels(np.random.default_rng(2), 300)
    labels["task_index"] = np.r_[np.zeros(60, int), np.arange(240) % 30 + 1]  # value 0 the most frequent
    path = write_codes(tmp_path / "many.h5", labels_of_split={"train": labels}, n_per_split={"train": 300})
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_embedding(path, "task_index", tmp_path / "tsne", layers=[1], max_points=None, formats=("svg",))
    text = _svg_text(svg)
    # value 0 (60 points) and 8 of the 30 values of 8 points in colour; 22 x 8 = 176 of 300 points grey
    assert "other (22 values, 59% of points)" in text, "31 values: 9 in colour, 22 grey"
    assert "the 9 most frequent of 31 values of task_index in colour" in text
    assert f">{SRaven().value_names()['task_index'][0]}</text>" in text, "the most frequent value has its own colour"
    assert "colorbar" not in text.lower() and "task_index" in text


def test_constant_layers_are_a_sentence_not_an_empty_panel(tmp_path):
    path = write_codes(tmp_path / "codes.h5", n_per_split={"train": 120}, constant_layers=(0,), planted=("rule",))
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (tsne,) = plot_embedding(path, "rule", tmp_path / "tsne", formats=("svg",))
        (heatmap,) = plot_similarity(path, "rule", tmp_path / "similarity", formats=("svg",))
    text = _svg_text(tsne)
    assert "Layer 0 is not drawn: its codes are the same for every example" in text
    assert ">layer 1<" in text and ">layer 0<" not in text, "only the layer with something to embed has a panel"
    assert "layer 0: the codes are the same" in _svg_text(heatmap), "a sentence, not a uniform square"


def test_similarity_centres_where_plain_cosines_are_all_near_one_and_shares_one_scale(tmp_path):
    offset = write_codes(tmp_path / "offset.h5", n_per_split={"train": 200}, planted=("rule",))
    import h5py

    with h5py.File(offset, "r+") as file:  # a large code every example shares: plain cosines near 1
        for name in file["codes"]:
            file["codes"][name][...] = file["codes"][name][...] + 30.0
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (centred,) = plot_similarity(offset, "rule", tmp_path / "centred", formats=("svg",))
        (plain,) = plot_similarity(offset, "rule", tmp_path / "plain", centre=False, formats=("svg",))
    assert "centred cosine similarity (grand mean code subtracted)" in _svg_text(centred)
    assert "centred because the plain cosine similarities" in _svg_text(centred)
    assert "centred" not in _svg_text(plain)
    # A comparison: one row per file, one colour scale for every panel.
    other = write_codes(tmp_path / "other.h5", n_per_split={"train": 200}, planted=("rule",), strength=2.0, seed=5)
    (both,) = plot_similarity([offset, other], "rule", tmp_path / "both", centre=False, dpi=50)
    assert_png(both, figsize=(2 * (0.42 * 8 + 2.0) + 1.4, 2 * (0.42 * 8 + 2.0) + 1.3), dpi=50)


def _panel(matrix, constant=False):
    return Similarity(np.asarray(matrix, float), np.arange(len(matrix)), np.arange(len(matrix)),
                      np.ones(len(matrix)), np.eye(len(matrix)), constant=constant)


def test_one_colour_scale_spans_every_panel():
    panels = [_panel([[1, 0.5], [0.5, 1]]), _panel([[1, 0.8], [0.8, 1]]), _panel([[1, 1], [1, 1]], constant=True)]
    norm, colours = _similarity_scale(panels, centre=False)
    assert (norm.vmin, norm.vmax, colours.name) == (0.5, 1.0, "viridis"), "the lowest value of any panel to 1"
    norm, colours = _similarity_scale([*panels, _panel([[1, -0.2], [-0.2, 1]])], centre=False)
    assert (norm.vmin, norm.vmax, colours.name) == (-1, 1, "RdBu_r"), "a negative value: diverging, white at 0"
    norm, colours = _similarity_scale(panels, centre=True)
    assert (norm.vmin, norm.vmax, colours.name) == (-1, 1, "RdBu_r"), "centred: diverging, white at 0"
    norm, _ = _similarity_scale([_panel([[1, 0.999], [0.999, 1]])], centre=False)
    assert norm.vmin == 0.99, "a scale at least 0.01 wide"


def test_signed_codes_get_a_diverging_scale_centred_at_zero():
    norm, colours = colour_scale(np.array([[-0.5, 2.0], [1.0, 0.0]]), "magma", from_zero=True)
    assert (norm.vmin, norm.vmax, colours) == (-2.0, 2.0, "RdBu_r") and norm(0.0) == 0.5
    norm, colours = colour_scale(np.array([[0.1, 0.7], [0.2, 0.0]]), "magma", from_zero=True)
    assert (norm.vmin, norm.vmax, colours) == (0.0, pytest.approx(0.7), "magma")
    norm, colours = colour_scale(np.array([0.2, 0.7, 0.5]))
    assert (norm.vmin, norm.vmax, colours) == (pytest.approx(0.2), pytest.approx(0.7), "viridis"), "a label's own range"


def test_no_value_in_colour_looks_like_the_grey_of_other():
    values = np.arange(400) % 40  # 40 values of 10 points each: 9 in colour, 31 'other'
    groups, _ = category_groups(values, None)
    assert groups[0][2] == OTHER_COLOUR and groups[0][0] == "other (31 values, 78% of points)"
    colours = [np.asarray(colour[:3]) for _, _, colour in groups[1:]]
    assert len(colours) == 9 and all(np.ptp(colour) > 0.1 for colour in colours), "no grey among the values shown"
    assert len({tuple(colour) for colour in colours}) == 9, "each value its own colour"


def test_a_signed_continuous_label_is_drawn_diverging_about_zero(tmp_path):
    labels = make_labels(np.random.default_rng(3), 200)
    labels["target"] = (labels["target"] - 0.3).astype(np.float32)  # from -0.3 to 0.7
    path = write_codes(tmp_path / "signed.h5", labels_of_split={"train": labels}, n_per_split={"train": 200})
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_embedding(path, "target", tmp_path / "tsne", layers=[1], max_points=None, formats=("svg",))
    assert "target (signed: 0 is white)" in _svg_text(svg)


def test_probe_plot_has_a_chance_line_a_legend_of_what_is_drawn_and_a_short_title(tmp_path, codes_path):
    """The fuzzy demo's probe plot had a 'strongest baseline' legend entry that drew nothing (the
    strongest baseline was the control or majority, under other lines), no chance line and a
    four-line title (issue 24)."""
    table = decode(codes_path, "rule", layers=[0, 1], progress=False)
    table["strongest_baseline"], table["strongest_baseline_value"] = "majority", table["majority"]
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_probe_scores(table, tmp_path / "probe", formats=("svg",))
        table.loc[table["layer"] == 1, ["strongest_baseline", "strongest_baseline_value"]] = "prevalence_random", 0.3
        (other,) = plot_probe_scores(table, tmp_path / "other", formats=("svg",))
    text = _svg_text(svg)
    assert "chance (majority)" in text and "shuffled-label control" in text
    assert "strongest" not in text, "no entry for a line that is not drawn: the majority baseline is chance's"
    assert "strongest other baseline" in _svg_text(other)
    title = re.search(r"decoding rule: fit on train, scored on ood", text)
    assert title, "one short title line"
    assert "sites" not in text[: title.start()], "the sites are a caption under the axes, not in the title"


def test_similarity_panels_share_one_order_and_are_marked_weak_where_the_label_explains_little(tmp_path):
    """Each panel was clustered in its own order, and a label that explained 0.2% of the variance
    was drawn centred at full saturation (issue 24); then faded, off its colour bar (issue 32)."""
    from latentcode.analysis.plots.heatmap import _in_order, _is_weak, _should_centre

    panel = Similarity(np.array([[1, 0.2, 0.5], [0.2, 1, 0.1], [0.5, 0.1, 1]]), np.array([7, 3, 5]),
                       np.array([2, 0, 1]), np.array([10, 20, 30]), np.eye(3), explained_variance=0.002)
    reordered = _in_order(panel, np.array([3, 5, 7]))
    assert reordered.values.tolist() == [3, 5, 7] and reordered.counts.tolist() == [20, 30, 10]
    assert reordered.matrix[0, 1] == 0.1 and reordered.matrix[1, 2] == 0.5, "the same pairs, moved"
    assert _is_weak(panel) and not _is_weak(
        Similarity(panel.matrix, panel.values, panel.order, panel.counts, panel.mean_codes, explained_variance=0.4))
    near_one = Similarity(np.array([[1, 0.99], [0.99, 1]]), np.arange(2), np.arange(2), np.ones(2), np.eye(2),
                          explained_variance=0.002)
    centre, reason = _should_centre([near_one])
    assert not centre and "not centred" in reason, "centring would magnify 0.2% of the variance"
    # Noise codes: rule explains about nothing; the heatmap is not centred and says its panels are weak.
    noise = write_codes(tmp_path / "noise.h5", n_per_split={"train": 400}, planted=(), strength=0.0)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_similarity(noise, "rule", tmp_path / "noise", formats=("svg",))
    text = _svg_text(svg)
    assert "weak (dashed frame): rule explains under 10% of the code variance" in text
    assert "weak: layer" in text
    assert "in every panel" in text, "one order named for all panels"


def test_code_samples_of_many_sites_show_a_named_window_grouped_by_head(tmp_path):
    from latentcode.analysis.plots.samples import _site_window
    from latentcode.store import Site

    sites = [Site(1, 511, key) for key in range(384, 512)]  # a query over its 128 recent keys
    window = _site_window(sites, max_sites=16)
    assert [site.key for site in window.shown] == list(range(496, 512)), "the last 16 sites: keys nearest the query"
    assert "keys 496–511 shown, the last 16 of the layer's 128 sites (keys 384–495 not shown" in window.description
    codes = np.array([[site * 10 + head for site in range(128) for head in range(4)]])  # [1, site * head]
    columns = window.columns(codes, n_heads=4)[0]
    assert list(columns[:16]) == [site * 10 for site in range(112, 128)], "head 0 of each shown site first"
    assert list(columns[16:18]) == [1121, 1131] and len(columns) == 64
    few = _site_window(sites[:3], max_sites=16)
    assert few.description == "" and list(few.columns(codes[:, :12], n_heads=4)[0]) == list(codes[0, :12])

    # 40 sites of 24 heads (the synthetic layout's minimum): 960 columns, a window of 16 sites
    path = write_codes(tmp_path / "many_sites.h5", n_per_split={"train": 80}, sites_per_layer=40)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_code_samples(path, "rule", tmp_path / "samples", formats=("svg",))
    text = _svg_text(svg)
    assert "the last 16 of the layer's 40 sites (24 sites not shown" in text and "head; in each, 16 sites" in text


def test_panel_grid_keeps_a_few_layers_on_one_row_and_wraps_many_evenly():
    from latentcode.analysis.plots.figure import MAX_COLUMNS, panel_grid

    assert MAX_COLUMNS == 6
    assert panel_grid(1) == (1, 1) and panel_grid(2) == (1, 2) and panel_grid(6) == (1, 6)
    assert panel_grid(7) == (2, 4)  # 4 + 3, not 6 + 1
    assert panel_grid(30) == (5, 6)  # SmolLM2's 30 layers
    assert panel_grid(0) == (1, 1)  # the panel that holds the sentence when no layer is drawn


def _random_embedding(code_file, layers, n_used=40):
    from latentcode.analysis.embed import Embedding

    rng = np.random.default_rng(0)
    return Embedding("tsne", "hyla", "train", list(layers), {layer: rng.normal(size=(n_used, 2)) for layer in layers},
                     np.arange(n_used), n_used, None, 0)


def test_a_figure_of_thirty_layers_wraps_onto_rows_of_at_most_six_panels(tmp_path):
    # Each layer used to add a panel to one row: a 30-layer model drew an 11,060 x 490 px tSNE.
    layers = range(30)
    path = write_codes(tmp_path / "deep.h5", n_per_split={"train": 40}, layers=layers, signal_layers=layers,
                       planted=("rule",))
    dpi = 10
    (tsne,) = plot_embedding(path, "rule", tmp_path / "tsne", embedding=_random_embedding(path, layers), dpi=dpi)
    height, width = imread(tsne).shape[:2]
    # Six 3.6-inch panels and the legend's 2.6 inches at most; five rows of panels, each 3.6 inches.
    assert width / dpi <= 6 * 3.6 + 2.6 + 0.1
    assert height / dpi >= 5 * 3.6
    (heatmap,) = plot_similarity(path, "rule", tmp_path / "heatmap", split="train", centre=False, dpi=dpi)
    height, width = imread(heatmap).shape[:2]
    side = 0.42 * 8 + 2.0  # eight rules: the side of one panel
    assert width / dpi <= 6 * side + 1.4 + 0.1
    assert height / dpi >= 5 * side


def test_a_figure_of_two_layers_keeps_its_one_row(tmp_path, codes_path):
    (tsne,) = plot_embedding(codes_path, "rule", tmp_path / "tsne", embedding=_random_embedding(codes_path, [0, 1]),
                             dpi=20)
    assert_png(tsne, figsize=(3.6 * 2 + 2.6, 4.9), dpi=20)  # the size it had before rows of panels


def _probe_table(values, baselines):
    """A probe table of three models over layers 0 and 1: `values[model][layer]`, each scored
    against `baselines[model][layer]` = (name, value); majority 0.75 throughout."""
    import pandas as pd

    rows = []
    for model in values:
        for layer in (0, 1):
            name, baseline = baselines[model][layer]
            rows.append({"model": model, "file": f"{model}.h5", "site": "last-recent", "label": "query_class",
                         "metric": "accuracy", "layer": layer, "value": values[model][layer], "majority": 0.75,
                         "shuffled_labels": 0.7, "strongest_baseline": name, "strongest_baseline_value": baseline,
                         "fit_split": "train", "test_split": "validation"})
    return pd.DataFrame(rows)


def test_scores_crowded_at_the_top_get_a_panel_of_gaps_and_near_trivial_ones_are_named(tmp_path):
    """The language demo's three models overlapped at 0.99 (issue 32): the plot then says so and
    shows each score's gap to its strongest baseline; a score barely above it is called near-trivial."""
    majority = {layer: ("majority", 0.75) for layer in (0, 1)}
    crowded = _probe_table({"softmax": [0.97, 0.99], "linear": [0.98, 0.985], "hyla": [0.975, 0.99]},
                           {"softmax": {0: ("majority", 0.75), 1: ("shuffled_labels", 0.8)}, "linear": majority,
                            "hyla": majority})
    spread = _probe_table({"softmax": [0.8, 0.9], "linear": [0.76, 0.8], "hyla": [0.85, 0.88]},
                          {"softmax": majority, "linear": majority, "hyla": majority})
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_probe_scores(crowded, tmp_path / "crowded", formats=("svg",))
        (other,) = plot_probe_scores(spread, tmp_path / "spread", formats=("svg",))
    text = re.sub(r"\s+", " ", _svg_text(svg))
    assert "every score is within 0.05 of 1 (0.970–0.990)" in text and "lower panel" in text
    assert "gap to majority" in text and "gap to shuffled labels" in text  # softmax's layer 1: 0.99 - 0.8
    assert "near-trivial" not in text
    text = re.sub(r"\s+", " ", _svg_text(other))
    assert "lower panel" not in text and "gap to" not in text
    # linear at layer 0 is 0.76 against 0.75: less than 0.02 above its strongest baseline.
    assert "1 of 6 scores are near-trivial (hollow)" in text and "near-trivial: &lt; 0.02 above" in text


def test_sample_grid_names_the_key_of_each_block_beside_a_divider(tmp_path):
    """SRAVEN's grid showed two blocks of heads split by a line without saying which key each was
    (issue 32): each block is now named under it, by the file's name of its key position."""
    from latentcode.store import CodeWriter, Site

    names = [f"p{position}" for position in range(36)]
    names[27], names[31] = "left panel", "right panel"
    sites = [Site(1, 35, 31), Site(1, 35, 27)]  # sorted by key in the file: 27 is drawn first (left)
    with CodeWriter(tmp_path / "c.h5", sites, n_heads=4, metadata={"position_names": names}) as writer:
        writer.append(codes={Site(1, 35, 27): -np.ones((20, 4), np.float32), Site(1, 35, 31): np.ones((20, 4), np.float32)},
                      labels={"rule": np.arange(20) % 2}, split="ood")
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        (svg,) = plot_code_samples(tmp_path / "c.h5", "rule", tmp_path / "grid", formats=("svg",))
        (png,) = plot_code_samples(tmp_path / "c.h5", "rule", tmp_path / "grid", formats=("png",))
    text = _svg_text(svg)
    assert text.index("left panel") < text.index("(key 27)") < text.index("right panel") < text.index("(key 31)")
    assert text.count("key (heads 0–3 in each block)") == 2  # one per panel (rule 0 and 1)
    # The block named key 27 holds its codes (-1: blue), key 31's (+1: red): across the middle of the
    # figure, blue then red in each of the two panels.
    row = imread(png)[..., :3][imread(png).shape[0] // 2]
    colours = ["B" if pixel[2] > pixel[0] else "R" for pixel in row if abs(pixel[2] - pixel[0]) > 0.2]
    runs = "".join(colour for index, colour in enumerate(colours) if index == 0 or colour != colours[index - 1])
    assert runs.startswith("BRBR"), runs
