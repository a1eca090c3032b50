"""Titles say where codes come from: the site set, the variant and what the split holds."""

from latentcode.analysis.captions import (
    codes_context,
    site_set,
    split_phrase,
    variant_of,
    wrap_lines,
)
from latentcode.store import CodeFile
from latentcode.tasks.sraven import SRaven
from tests.analysis.synthetic import write_codes


def test_site_set_variant_and_split_of_a_file(tmp_path):
    path = write_codes(tmp_path / "codes.h5", n_per_split={"train": 20, "ood": 10}, sites_per_layer=2,
                       selector={"name": "sraven-rule", "variant": "unpermuted"})
    code_file = CodeFile(path)
    # write_codes places the sites of every layer at queries 10 and 11, key 5.
    assert site_set(code_file) == "sraven-rule sites (q10→k5, q11→k5, every layer)"
    assert site_set(code_file, layer=1) == "sraven-rule sites (q10→k5, q11→k5 in layer 1)"
    assert variant_of(code_file) == "unpermuted"
    assert code_file.split_descriptions == SRaven.split_descriptions, "recorded as extraction records it"
    assert split_phrase(code_file, "ood") == f"split ood ({SRaven.split_descriptions['ood']})"
    assert split_phrase(code_file, None) == "all splits (train, ood)"
    assert codes_context(code_file, "ood") == " · ".join(
        [site_set(code_file), "unpermuted variant", split_phrase(code_file, "ood")])


def test_one_query_many_keys_and_files_that_record_little(tmp_path):
    path = write_codes(tmp_path / "bare.h5", n_per_split={"train": 12}, layers=(2,), task="not_a_task")
    code_file = CodeFile(path)
    assert site_set(code_file) == "sites (query 10 → key 5, layer 2)", "no selector name: just the positions"
    assert variant_of(code_file) is None and split_phrase(code_file, "train") == "split train"
    assert codes_context(code_file, "train") == "sites (query 10 → key 5, layer 2) · split train"


def test_wrap_lines_fits_the_figure_and_drops_empty_lines():
    text = wrap_lines(["a " * 100, "", "short"], width_inches=4.0, fontsize_points=10)
    lines = text.split("\n")
    assert lines[-1] == "short" and all(len(line) <= int(4.0 * 72 / 5.5) for line in lines)


def test_many_positions_are_summarised_as_ranges():
    """The language demo's titles listed all 128 keys, "keys 384, 385, …" (issue 24)."""
    from types import SimpleNamespace

    from latentcode.analysis.captions import position_ranges

    assert position_ranges(range(384, 512)) == "384–511"
    assert position_ranges([10, 1, 2, 3, 7, 9, 3]) == "1–3, 7, 9, 10", "runs of three or more; sorted, unique"
    assert position_ranges([5]) == "5" and position_ranges([]) == ""

    def fake_file(pairs_of_layer, name="last-recent"):
        sites = {layer: [SimpleNamespace(query=q, key=k) for q, k in pairs] for layer, pairs in pairs_of_layer.items()}
        return SimpleNamespace(selector={"name": name}, layers=sorted(sites), sites_of_layer=sites.__getitem__)

    recent = [(511, key) for key in range(384, 512)]
    assert site_set(fake_file({0: recent, 1: recent})) == "last-recent sites (query 511 → keys 384–511, every layer)"
    assert site_set(fake_file({0: recent}), layer=0) == "last-recent sites (query 511 → keys 384–511 in layer 0)"
    square = [(q, k) for q in range(64) for k in range(64)]
    assert site_set(fake_file({2: square}, "all-pairs:2")) == "all-pairs:2 sites (queries 0–63 × keys 0–63, layer 2)"
    causal = [(q, k) for q in range(8) for k in range(q + 1)]
    assert site_set(fake_file({0: causal}, "")) == "sites (36 pairs: queries 0–7 → keys 0–7, layer 0)"
