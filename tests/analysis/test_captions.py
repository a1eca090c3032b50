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
