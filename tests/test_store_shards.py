"""Sharded codes files: one file of virtual datasets over shard files beside it (issue 26)."""

import json
import os
import shutil

import h5py
import numpy as np
import pytest

from latentcode.store import (
    CodeFile,
    CodeFileError,
    CodeWriter,
    Site,
    shard_path,
    write_sharded_file,
)

SITES = [Site(0, 35, 35), Site(1, 35, 27)]
METADATA = {
    "model_name": "hyla", "model_config": {"attention": "hyla", "n_layers": 2}, "checkpoint_sha256": "ab" * 32,
    "task_config": {"name": "sraven"}, "selector": {"name": "explicit"}, "source": "latentcode", "seed": 7,
}


def write(path, rng, rows, split="ood", metadata=METADATA):
    batch = dict(
        codes={site: rng.normal(size=(rows, 4)).astype(np.float32) for site in SITES},
        labels={"rule": rng.integers(0, 8, rows), "query_rule": rng.integers(0, 8, (rows, 4))},
        prediction=rng.normal(size=(rows, 4, 8)), target=rng.integers(0, 8, (rows, 4)), split=split,
        extra={"loss": rng.random(rows)},
    )
    with CodeWriter(path, SITES, 4, {**metadata, "value_names": {"rule": [f"r{i}" for i in range(8)]}}) as writer:
        writer.append(**batch)
    return batch


@pytest.fixture
def sharded(tmp_path):
    rng = np.random.default_rng(0)
    out = tmp_path / "codes.h5"
    shards = [shard_path(out, rank, 3) for rank in range(3)]
    batches = [write(shard, rng, rows, split) for shard, rows, split in zip(shards, (5, 4, 3), ("ood", "ood", "test"), strict=True)]
    write_sharded_file(out, shards)
    return out, shards, batches


def test_shard_names():
    assert shard_path("runs/codes.h5", 1, 2).as_posix() == "runs/codes.shard-1-of-2.h5"
    assert shard_path("codes", 0, 4).name == "codes.shard-0-of-4.h5"


def test_the_sharded_file_reads_as_the_shards_concatenated(sharded):
    out, shards, batches = sharded
    codes = CodeFile(out)  # virtual datasets over its own shards: no allow_external needed
    assert len(codes) == 12 and codes.splits == ["ood", "test"] and codes.sites == SITES
    assert [entry["rows"] for entry in codes.shards] == [[0, 5], [5, 9], [9, 12]]
    for site in SITES:
        np.testing.assert_array_equal(codes.codes(site), np.concatenate([b["codes"][site] for b in batches]))
    np.testing.assert_array_equal(codes.labels("query_rule", split="ood"),
                                  np.concatenate([b["labels"]["query_rule"] for b in batches[:2]]))
    np.testing.assert_array_equal(codes.prediction(), np.concatenate([b["prediction"] for b in batches]).astype(np.float32))
    np.testing.assert_array_equal(codes.extra("loss"), np.concatenate([b["extra"]["loss"] for b in batches]))
    assert codes.value_names["rule"][3] == "r3"
    one = CodeFile(shards[0])
    assert {key: value for key, value in codes.attrs.items() if key not in ("created", "splits", "shards", "file_id")} == {
        key: value for key, value in one.attrs.items() if key not in ("created", "splits", "file_id")}
    assert len(codes.writes) == 1 and codes.writes[0]["rows"] == [0, 12] and codes.split_seeds == {"ood": [7], "test": [7]}
    with h5py.File(out, "r") as file:
        assert file["codes/l0_q35_k35"].is_virtual and file["codes/l0_q35_k35"].attrs["layer"] == 0


def test_the_pair_moves_together(sharded, tmp_path):
    out, shards, _ = sharded
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for path in (out, *shards):
        shutil.move(path, moved / path.name)
    assert len(CodeFile(moved / out.name)) == 12


def test_a_missing_or_replaced_shard_is_refused_at_open(sharded, tmp_path):
    out, shards, _ = sharded
    shards[1].rename(tmp_path / "kept.h5")
    with pytest.raises(CodeFileError, match=r"shard .*codes.shard-1-of-3.h5 is missing.*move them with it"):
        CodeFile(out)  # HDF5 would read the missing rows as zeros
    os.symlink(tmp_path / "kept.h5", shards[1])
    with pytest.raises(CodeFileError, match="is a symbolic link; expected a regular file"):
        CodeFile(out)
    shards[1].unlink()
    write(shards[1], np.random.default_rng(1), 2)
    with pytest.raises(CodeFileError, match="holds 2 rows; the file expects 4"):
        CodeFile(out)


def test_sources_outside_the_listed_shards_are_still_refused(sharded, tmp_path):
    out, _, _ = sharded
    with h5py.File(out, "r+") as file:
        shards = json.loads(file.attrs["shards"])
        file.attrs["shards"] = json.dumps(shards[:2] + [{"file": "../codes.h5", "rows": [9, 12]}])
    with pytest.raises(CodeFileError, match="refers to other files"):
        CodeFile(out)
    with pytest.raises(CodeFileError, match="shard '../codes.h5' is not a file name"):
        CodeFile(out, allow_external=True)


def test_a_sharded_file_is_not_appended_to_and_not_replaced_unasked(sharded):
    out, shards, _ = sharded
    with pytest.raises(CodeFileError, match="cannot append to .*: it is a sharded file"):
        CodeWriter(out, SITES, 4, METADATA, append=True)
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        write_sharded_file(out, shards)
    write_sharded_file(out, shards[:2], overwrite=True)
    assert len(CodeFile(out)) == 9


def test_shards_of_different_extractions_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    write(tmp_path / "a.h5", rng, 2)
    write(tmp_path / "b.h5", rng, 2, metadata={**METADATA, "seed": 8})
    with pytest.raises(CodeFileError, match=r"differ in \['seed'\]"):
        write_sharded_file(tmp_path / "codes.h5", [tmp_path / "a.h5", tmp_path / "b.h5"])
    assert not (tmp_path / "codes.h5").exists()


# -- issue 34: a shard is what the file says it is, or it is refused ----------------------------------
def test_a_shard_replaced_by_another_extraction_of_the_same_rows_is_refused(sharded, tmp_path):
    """The same model's shard of another seed, with the same row count, used to be read silently."""
    out, shards, batches = sharded
    shards[1].unlink()
    write(shards[1], np.random.default_rng(99), 4, metadata={**METADATA, "seed": 8})
    with pytest.raises(CodeFileError, match=r"shard .*codes.shard-1-of-3.h5 has file_id '[0-9a-f]{12}'; the file "
                                            r"was written over shard '[0-9a-f]{12}' \(a shard replaced"):
        CodeFile(out)
    # the same extraction written again (a new file, a new id) is another file too
    shards[1].unlink()
    write(shards[1], np.random.default_rng(0), 4)
    with pytest.raises(CodeFileError, match="has file_id"):
        CodeFile(out)


@pytest.mark.parametrize("dataset", ["codes/l1_q35_k27", "labels/rule", "split", "prediction", "extra/loss"])
def test_a_dataset_deleted_from_a_shard_is_refused_not_read_as_zeros(sharded, dataset):
    """HDF5 fills a missing virtual source with zeros: 4 of 12 rows silently 0 before."""
    out, shards, _ = sharded
    with h5py.File(out, "r") as file:
        assert file[dataset].is_virtual
    with h5py.File(shards[1], "r+") as file:
        del file[dataset]
    with pytest.raises(CodeFileError, match="codes.shard-1-of-3.h5 (lacks the dataset /|holds None rows)"):
        CodeFile(out)


def test_a_shard_with_fewer_heads_is_refused(sharded):
    out, shards, _ = sharded
    with h5py.File(shards[2], "r+") as file:
        del file["codes/l0_q35_k35"]
        file["codes/l0_q35_k35"] = np.ones((3, 2), dtype=np.float32)
    with pytest.raises(CodeFileError, match=r"has /codes/l0_q35_k35 of shape \[3, 2\]; the file expects \[3, 4\]"):
        CodeFile(out)


def test_a_sharded_file_without_shard_identities_is_refused(sharded):
    """A file whose entries record only file and rows (written before identities) cannot tell a
    replaced shard, so it is refused with how to write it again."""
    out, shards, _ = sharded
    with h5py.File(out, "r+") as file:
        entries = json.loads(file.attrs["shards"])
        file.attrs["shards"] = json.dumps([{"file": e["file"], "rows": e["rows"]} for e in entries])
    with pytest.raises(CodeFileError, match="records no identity .* write the sharded file again"):
        CodeFile(out)
    write_sharded_file(out, shards, overwrite=True)
    assert len(CodeFile(out)) == 12


def test_every_dataset_of_the_file_is_recorded_in_each_shards_entry(sharded):
    out, shards, _ = sharded
    with h5py.File(out, "r") as file:
        virtual = []
        file.visititems(lambda name, item: virtual.append(name) if isinstance(item, h5py.Dataset)
                        and item.is_virtual else None)
        entries = json.loads(file.attrs["shards"])
    for entry, shard in zip(entries, shards, strict=True):
        assert sorted(entry["datasets"]) == sorted(virtual)
        with h5py.File(shard, "r") as source:
            assert entry["id"] == source.attrs["file_id"] and len(entry["id"]) == 32
