"""The synthetic codes files of `tests/analysis/synthetic.py` carry the layout they promise."""

import numpy as np

from latentcode.store import CodeFile
from tests.analysis.synthetic import write_codes


def test_synthetic_file_has_the_planted_layout(tmp_path):
    path = write_codes(tmp_path / "codes.h5", n_per_split={"train": 50, "ood": 30}, sites_per_layer=2,
                       absent_terms_in={"train": (7,)})
    code_file = CodeFile(path)
    assert code_file.splits == ["train", "ood"] and len(code_file) == 80
    assert code_file.layers == [0, 1] and len(code_file.sites_of_layer(1)) == 2
    np.testing.assert_array_equal(code_file.labels("query_rule")[:, -1], code_file.labels("rule"))
    assert (code_file.labels("term_present").sum(axis=1) == 2).all()
    assert code_file.labels("term_present", "train")[:, 7].sum() == 0
