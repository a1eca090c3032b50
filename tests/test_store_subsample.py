"""Issue 34: a codes file read in bounded memory: the split of each example as a small integer,
per-example arrays read a block of rows at a time, and a seeded view of at most N rows per split."""

import numpy as np
import pytest

import latentcode.store.reader as reader
from latentcode.store import CodeFile, CodeFileError, CodeWriter, Site

SITES = [Site(0, 3, 3), Site(1, 3, 2)]


@pytest.fixture
def codes_file(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "ROWS_PER_READ", 7)  # many blocks, and rows that straddle them
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    arrays = {"codes": [], "rule": [], "split": []}
    with CodeWriter(path, SITES, 3, {"model_name": "m"}) as writer:
        for split, n in (("train", 40), ("ood", 25), ("train", 9), ("test", 3)):
            codes = {site: rng.normal(size=(n, 3)).astype(np.float32) for site in SITES}
            rule = rng.integers(0, 5, (n, 2))
            writer.append(codes=codes, labels={"rule": rule}, split=split)
            arrays["codes"].append(codes[SITES[1]])
            arrays["rule"].append(rule)
            arrays["split"] += [split] * n
    return path, {key: np.concatenate(value) if key != "split" else np.array(value) for key, value in arrays.items()}


def test_reads_in_blocks_equal_numpy_indexing(codes_file):
    path, expected = codes_file
    codes = CodeFile(path)
    assert codes.split_of_examples().tolist() == expected["split"].tolist()
    for split in ("train", "ood", "test", ("ood", "test"), None):
        rows = np.ones(len(expected["split"]), bool) if split is None else np.isin(expected["split"], split)
        np.testing.assert_array_equal(codes.codes(SITES[1], split), expected["codes"][rows])
        np.testing.assert_array_equal(codes.labels("rule", split), expected["rule"][rows])


def test_a_view_reads_at_most_max_rows_of_each_split_drawn_with_its_seed(codes_file):
    path, expected = codes_file
    codes = CodeFile(path)
    view = codes.subsample(10, seed=3)
    assert view.subsampled == {"train": (49, 10), "ood": (25, 10)}  # test (3 examples) is read whole
    assert len(view) == 23 and len(codes) == 77 and codes.subsampled == {}
    assert (view.split_of_examples() == "test").sum() == 3
    for split in ("train", "ood"):
        kept = view.codes(SITES[1], split)
        pool = expected["codes"][expected["split"] == split]
        # every row read is a row of that split, each at most once, in file order
        positions = [int(np.flatnonzero((pool == row).all(axis=1))[0]) for row in kept]
        assert len(set(positions)) == 10 and positions == sorted(positions)
        # labels of the view stay aligned with its codes
        rows = np.flatnonzero(expected["split"] == split)[positions]
        np.testing.assert_array_equal(view.labels("rule", split), expected["rule"][rows])
    np.testing.assert_array_equal(view.codes(SITES[0]), codes.subsample(10, seed=3).codes(SITES[0]))
    assert not np.array_equal(view.codes(SITES[1], "train"), codes.subsample(10, seed=4).codes(SITES[1], "train"))
    assert len(codes.subsample(1000)) == 77
    with pytest.raises(CodeFileError, match="max_rows must be a positive number of examples, got 0"):
        codes.subsample(0)
