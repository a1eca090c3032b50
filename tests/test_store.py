"""The HDF5 codes file: round trip, atomic writes, appends, refusals."""

import json
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from latentcode.store import CodeFile, CodeFileError, CodeWriter, Site

SITES = [Site(0, 35, 35), Site(1, 35, 27)]
METADATA = {
    "model_name": "hyla", "model_config": {"attention": "hyla", "n_layers": 2}, "checkpoint_sha256": "ab" * 32,
    "task_config": {"name": "sraven", "n_features": 4}, "selector": {"name": "explicit"}, "source": "latentcode", "seed": 7,
}


def batch(rng, n, split):
    return dict(
        codes={site: rng.normal(size=(n, 4)).astype(np.float32) for site in SITES},
        labels={"rule": rng.integers(0, 8, n), "query_rule": rng.integers(0, 8, (n, 4))},
        prediction=rng.normal(size=(n, 4, 8)),
        target=rng.integers(0, 8, (n, 4)),
        split=split,
        extra={"loss": rng.random(n)},
    )


def test_round_trip_of_codes_labels_and_attributes(tmp_path):
    rng = np.random.default_rng(0)
    batches = [batch(rng, 5, "train"), batch(rng, 3, "ood"), batch(rng, 4, "train")]
    with CodeWriter(tmp_path / "codes.h5", SITES, n_heads=4, metadata=METADATA) as writer:
        for b in batches:
            writer.append(**b)
    codes = CodeFile(tmp_path / "codes.h5")
    assert len(codes) == 12 and codes.splits == ["train", "ood"] and codes.sites == SITES
    assert codes.label_names == ["query_rule", "rule"] and codes.n_heads == 4
    expected_ood = batches[1]["codes"][Site(1, 35, 27)]
    np.testing.assert_array_equal(codes.codes(Site(1, 35, 27), split="ood"), expected_ood)
    np.testing.assert_array_equal(codes.codes("l0_q35_k35", split="train"),
                                  np.concatenate([batches[0]["codes"][SITES[0]], batches[2]["codes"][SITES[0]]]))
    np.testing.assert_array_equal(codes.labels("query_rule"), np.concatenate([b["labels"]["query_rule"] for b in batches]))
    assert codes.layer_codes(1).shape == (12, 4)
    assert codes.prediction().dtype == np.float32 and codes.prediction().shape == (12, 4, 8)
    assert codes.model_config == METADATA["model_config"] and codes.task_config == METADATA["task_config"]
    assert codes.attrs["checkpoint_sha256"] == "ab" * 32 and codes.attrs["score"] == "pattern"
    frame = codes.to_dataframe(split="ood")
    assert len(frame) == 3 and "query_rule[2]" in frame and "l1_q35_k27.h3" in frame
    # readable with h5py alone
    with h5py.File(tmp_path / "codes.h5", "r") as file:
        assert file["codes/l0_q35_k35"].dtype == np.float32 and file["codes/l0_q35_k35"].compression == "gzip"
        assert json.loads(file.attrs["model_config"])["attention"] == "hyla"
        assert file.attrs["schema_version"] == 1 and file.attrs["latentcode_version"]


def test_interrupted_write_leaves_no_file_and_keeps_the_previous_one(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    with pytest.raises(RuntimeError), CodeWriter(path, SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 5, "train"))
        raise RuntimeError("killed")
    assert not path.exists() and list(tmp_path.iterdir()) == []

    with CodeWriter(path, SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 5, "train"))
    before = path.read_bytes()
    with pytest.raises(RuntimeError), CodeWriter(path, SITES, 4, METADATA, append=True) as writer:
        writer.append(**batch(rng, 5, "ood"))
        raise RuntimeError("killed")
    assert path.read_bytes() == before and len(CodeFile(path)) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["codes.h5"]


def test_existing_file_is_never_overwritten_by_default(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    with CodeWriter(path, SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 2, "train"))
    with pytest.raises(FileExistsError, match="already exists; pass append=True"):
        CodeWriter(path, SITES, 4, METADATA)


def test_append_extends_and_refuses_incompatible_schema(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    with CodeWriter(path, SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 5, "train"))
    with CodeWriter(path, SITES, 4, METADATA, append=True) as writer:
        writer.append(**batch(rng, 3, "ood"))
    codes = CodeFile(path)
    assert len(codes) == 8 and codes.splits == ["train", "ood"] and len(codes.labels("rule", "ood")) == 3

    with pytest.raises(CodeFileError, match=r"sites differ"):
        CodeWriter(path, SITES[:1], 4, METADATA, append=True)
    with pytest.raises(CodeFileError, match=r"n_heads: file 4, new data 8"):
        CodeWriter(path, SITES, 8, METADATA, append=True)
    with pytest.raises(CodeFileError, match=r"checkpoint_sha256"):
        CodeWriter(path, SITES, 4, {**METADATA, "checkpoint_sha256": "cd" * 32}, append=True)
    with CodeWriter(path, SITES, 4, METADATA, append=True) as writer, pytest.raises(CodeFileError, match="every batch needs the same labels"):
        b = batch(rng, 2, "ood")
        del b["labels"]["rule"]
        writer.append(**b)
    assert len(CodeFile(path)) == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codes.h5"]


def test_bad_batches_are_refused_with_the_reason(tmp_path):
    rng = np.random.default_rng(0)
    with CodeWriter(tmp_path / "c.h5", SITES, 4, METADATA) as writer:
        b = batch(rng, 5, "train")
        b["labels"]["rule"] = b["labels"]["rule"][:4]
        with pytest.raises(CodeFileError, match="labels/rule has 4 rows but the codes have 5"):
            writer.append(**b)
        b = batch(rng, 5, "train")
        b["codes"][SITES[0]] = b["codes"][SITES[0]][:, :3]
        with pytest.raises(CodeFileError, match=r"shape \[5, 3\]; expected \[5, 4\]"):
            writer.append(**b)
        b = batch(rng, 5, "train")
        b["codes"][SITES[0]][2, 1] = np.nan
        with pytest.warns(RuntimeWarning, match=r"1 of 5 latent codes at site l0_q35_k35 contain NaN or inf"):
            writer.append(**b)
    assert np.isnan(CodeFile(tmp_path / "c.h5").codes(SITES[0])[2, 1]), "the data is kept"


def test_reader_refuses_other_files(tmp_path):
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(CodeFileError, match="is not an HDF5 file"):
        CodeFile(tmp_path / "text.h5")
    with h5py.File(tmp_path / "other.h5", "w") as file:
        file["x"] = np.zeros(3)
    with pytest.raises(CodeFileError, match="not a latentcode codes file"):
        CodeFile(tmp_path / "other.h5")
    rng = np.random.default_rng(0)
    with CodeWriter(tmp_path / "c.h5", SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 2, "train"))
    with h5py.File(tmp_path / "c.h5", "r+") as file:
        file.attrs["schema_version"] = 99
    with pytest.raises(CodeFileError, match="schema version 99; this latentcode reads version 1"):
        CodeFile(tmp_path / "c.h5")
    with pytest.raises(FileNotFoundError):
        CodeFile(tmp_path / "missing.h5")


def test_reader_errors_name_what_exists(tmp_path):
    rng = np.random.default_rng(0)
    with CodeWriter(tmp_path / "c.h5", SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 2, "train"))
    codes = CodeFile(tmp_path / "c.h5")
    with pytest.raises(CodeFileError, match=r"no label 'term'; its labels are \['query_rule', 'rule'\]"):
        codes.labels("term")
    with pytest.raises(CodeFileError, match=r"no split 'ood'; its splits are \['train'\]"):
        codes.codes(SITES[0], split="ood")
    with pytest.raises(CodeFileError, match=r"no sites in layer 3; its layers are \[0, 1\]"):
        codes.layer_codes(3)


def test_sites_may_have_different_head_counts(tmp_path):
    """Layers of models read through SDPA interception can have different numbers of heads."""
    heads = {SITES[0]: 4, SITES[1]: 2}
    with CodeWriter(tmp_path / "c.h5", SITES, heads, METADATA) as writer:
        writer.append(codes={SITES[0]: np.ones((3, 4)), SITES[1]: np.zeros((3, 2))}, split="train")
        with pytest.raises(CodeFileError, match=r"l1_q35_k27 have shape \[3, 4\]; expected \[3, 2\]"):
            writer.append(codes={SITES[0]: np.ones((3, 4)), SITES[1]: np.zeros((3, 4))}, split="train")
    codes = CodeFile(tmp_path / "c.h5")
    assert codes.n_heads == 0 and codes.heads_of == heads and codes.codes(SITES[1]).shape == (3, 2)


# -- portability: compression, what h5py alone (and h5dump) sees ---------------------------------------
@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump (apt-get install hdf5-tools) is not installed")
def test_h5dump_reads_the_default_compression(tmp_path):
    """h5dump is the HDF5 library's own reader, without h5py's LZF filter."""
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    b = batch(rng, 50, "train")
    with CodeWriter(path, SITES, 4, {**METADATA, "value_names": {"rule": [f"rule {i}" for i in range(8)]}}) as writer:
        writer.append(**b)
    dump = tmp_path / "codes.bin"
    subprocess.run(["h5dump", "-d", "/codes/l1_q35_k27", "-b", "LE", "-o", str(dump), str(path)],
                   check=True, capture_output=True)
    np.testing.assert_array_equal(np.fromfile(dump, dtype="<f4").reshape(50, 4), b["codes"][SITES[1]])
    attribute = subprocess.run(["h5dump", "-a", "/labels/rule/value_names", str(path)],
                               check=True, capture_output=True, text=True).stdout
    assert "rule 7" in attribute


def test_compression_is_chosen_for_new_files_and_kept_on_append(tmp_path):
    rng = np.random.default_rng(0)
    filters = {}
    for compression in ("gzip", "lzf", "none", None):
        path = tmp_path / f"{compression}.h5"
        b = batch(rng, 6, "train")
        with CodeWriter(path, SITES, 4, METADATA, compression=compression) as writer:
            writer.append(**b)
        with h5py.File(path, "r") as file:
            filters[compression] = {file[name].compression for name in ("codes/l0_q35_k35", "labels/rule", "split")}
        np.testing.assert_array_equal(CodeFile(path).codes(SITES[0]), b["codes"][SITES[0]])
    assert filters == {"gzip": {"gzip"}, "lzf": {"lzf"}, "none": {None}, None: {None}}
    with CodeWriter(tmp_path / "lzf.h5", SITES, 4, METADATA, append=True) as writer:  # default gzip asked
        writer.append(**batch(rng, 3, "ood"))
    with h5py.File(tmp_path / "lzf.h5", "r") as file:
        assert file["codes/l0_q35_k35"].compression == "lzf" and len(file["split"]) == 9
    with pytest.raises(CodeFileError, match=r"compression must be one of \['gzip', 'lzf', 'none'\], got 'zstd'"):
        CodeWriter(tmp_path / "z.h5", SITES, 4, METADATA, compression="zstd")
    assert not (tmp_path / "z.h5").exists()


def test_prediction_says_what_it_holds(tmp_path):
    rng = np.random.default_rng(0)
    with CodeWriter(tmp_path / "c.h5", SITES, 4, {**METADATA, "prediction_kind": "logits"}) as writer:
        writer.append(**batch(rng, 2, "train"))
    with h5py.File(tmp_path / "c.h5", "r") as file:
        assert file["prediction"].attrs["kind"] == "logits" and file.attrs["prediction_kind"] == "logits"


# -- provenance of each write ------------------------------------------------------------------------------
def test_every_write_records_its_rows_splits_and_seed(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    for seed, split, n, options in ((7, "train", 5, {}), (9, "ood", 3, {"append": True}),
                                    (np.int64(11), "train", 4, {"append": True})):
        with CodeWriter(path, SITES, 4, {**METADATA, "seed": seed, "selector": {"spec": "x", "sites": [[0, 1, 1]]}},
                        **options) as writer:
            writer.append(**batch(rng, n, split))
    codes = CodeFile(path)
    assert [(w["rows"], w["splits"], w["seed"], w["mode"]) for w in codes.writes] == [
        ([0, 5], ["train"], 7, "new"), ([5, 8], ["ood"], 9, "append"), ([8, 12], ["train"], 11, "append")]
    assert codes.writes[1]["selector"] == {"spec": "x"} and codes.writes[1]["source"] == "latentcode"
    assert codes.split_seeds == {"train": [7, 11], "ood": [9]} and codes.attrs["seed"] == "7"
    with h5py.File(path, "r") as file:  # h5py alone
        assert [json.loads(entry)["seed"] for entry in file["provenance"].asstr()[:]] == [7, 9, 11]
    with CodeWriter(path, SITES, 4, {**METADATA, "seed": 13}, overwrite=True) as writer:
        writer.append(**batch(rng, 2, "ood"))
    assert [(w["rows"], w["mode"]) for w in CodeFile(path).writes] == [([0, 2], "overwrite")]


def test_a_file_from_before_provenance_gets_its_first_write_reconstructed(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    with CodeWriter(path, SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 5, "train"))
    with h5py.File(path, "r+") as file:
        del file["provenance"]
    assert CodeFile(path).split_seeds == {"train": [7]}
    with CodeWriter(path, SITES, 4, {**METADATA, "seed": 8}, append=True) as writer:
        writer.append(**batch(rng, 2, "train"))
    writes = CodeFile(path).writes
    assert [(w["rows"], w["seed"], w.get("reconstructed", False)) for w in writes] == [
        ([0, 5], 7, True), ([5, 7], 8, False)]


# -- nothing outside the file ------------------------------------------------------------------------------
def outside_reference(kind, path, tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as file:
        file["secret"] = np.arange(2.0)
    with h5py.File(path, "r+") as file:
        if kind == "external link":
            file["extra/loss2"] = h5py.ExternalLink(str(other), "/secret")
        elif kind == "virtual dataset":
            layout = h5py.VirtualLayout(shape=(2,), dtype="f8")
            layout[:] = h5py.VirtualSource(str(other), "secret", shape=(2,))
            file["extra"].create_virtual_dataset("loss2", layout)
        else:
            file["extra"].create_dataset("loss2", shape=(2,), dtype="f8", external=[(str(tmp_path / "raw.bin"), 0, 16)])


@pytest.mark.parametrize("kind", ["external link", "virtual dataset", "external storage"])
def test_files_that_point_outside_themselves_are_refused(tmp_path, kind):
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    with CodeWriter(path, SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 2, "train"))
    outside_reference(kind, path, tmp_path)
    with pytest.raises(CodeFileError, match=r"codes.h5 refers to other files \(/extra/loss2 is .*allow_external=True"):
        CodeFile(path)
    assert "loss2" in CodeFile(path, allow_external=True).extra_names
    with pytest.raises(CodeFileError, match=r"cannot append to .*: it refers to other files \(/extra/loss2"):
        CodeWriter(path, SITES, 4, METADATA, append=True)


def test_links_inside_the_file_and_cycles_are_fine(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "codes.h5"
    with CodeWriter(path, SITES, 4, METADATA) as writer:
        writer.append(**batch(rng, 2, "train"))
    with h5py.File(path, "r+") as file:
        file["extra/loop"] = file["extra"]  # a hard link from a group to itself
        file["alias"] = h5py.SoftLink("/codes")
    assert len(CodeFile(path)) == 2


# -- structure checked at open (issue 23) -------------------------------------------------------------------
def _replace(name, data):
    def edit(file):
        del file[name]
        file[name] = data
    return edit


def _set_attribute(name, value, where="/"):
    return lambda file: file[where].attrs.__setitem__(name, value)


MALFORMED = [
    ("codes 1-D", _replace("codes/l0_q35_k35", np.zeros(4)), "/codes/l0_q35_k35 is a 1-D float64 dataset; expected a 2-D"),
    ("codes 3-D", _replace("codes/l0_q35_k35", np.zeros((4, 4, 2))), "/codes/l0_q35_k35 is a 3-D float64 dataset"),
    ("codes of integers", _replace("codes/l0_q35_k35", np.zeros((4, 4), dtype=np.int64)), "is a 2-D int64 dataset"),
    ("codes of strings", _replace("codes/l0_q35_k35", np.array([[b"a"] * 4] * 4)), "is a 2-D |S1 dataset"),
    ("codes of another width", _replace("codes/l0_q35_k35", np.zeros((4, 3), dtype=np.float32)),
     "/codes/l0_q35_k35 has 3 heads but the root attribute n_heads says 4"),
    ("a group for codes", lambda file: (file.__delitem__("codes/l0_q35_k35"), file.create_group("codes/l0_q35_k35")),
     "/codes/l0_q35_k35 is a group; expected a 2-D float dataset"),
    ("a dataset for /codes", _replace("codes", np.zeros(3)), "/codes is a 1-D float64 dataset; expected a group"),
    ("a group for a label", lambda file: (file.__delitem__("labels/rule"), file.create_group("labels/rule")),
     "/labels/rule is a group; expected a dataset"),
    ("a label of strings", _replace("labels/rule", np.array([b"x"] * 4)), "/labels/rule is a 1-D |S1 dataset; expected numbers"),
    ("a label too short", _replace("labels/rule", np.zeros(3, dtype=np.int64)), "/labels/rule has 3 rows but /split has 4"),
    ("codes too long", _replace("codes/l1_q35_k27", np.zeros((5, 4), dtype=np.float32)),
     "/codes/l1_q35_k27 has 5 rows but /split has 4"),
    ("a site name that is not one", lambda file: file.move("codes/l0_q35_k35", "codes/layer0"),
     "/codes/layer0: 'layer0' is not a site name"),
    ("split of numbers", _replace("split", np.zeros(4)), "/split is a 1-D float64 dataset; expected a 1-D dataset of strings"),
    ("a split the attribute does not list", _set_attribute("splits", '["train"]'),
     "/split names splits ['ood'] that the root attribute 'splits' (['train']) does not list"),
    ("task_config a list", _set_attribute("task_config", "[1]"), "root attribute 'task_config' holds a JSON list; expected a JSON object"),
    ("splits of numbers", _set_attribute("splits", "[1, 2]"), "root attribute 'splits' must be a JSON list of strings"),
    ("value_names an object", _set_attribute("value_names", '{"a": 1}', "labels/rule"),
     "attribute 'value_names' of /labels/rule holds a JSON dict; expected a JSON list"),
    ("schema version not a number", _set_attribute("schema_version", "one"), "has schema version 'one'"),
    ("provenance not JSON", _replace("provenance", np.array(["{"], dtype=h5py.string_dtype())),
     "/provenance entry 0 is not a JSON object with the splits and seed of a write"),
]


@pytest.mark.parametrize("edit, message", [row[1:] for row in MALFORMED], ids=[row[0] for row in MALFORMED])
def test_a_codes_file_of_the_wrong_structure_is_refused_at_open_naming_what_is_wrong(tmp_path, edit, message):
    """These gave IndexError, AttributeError ('Group' has no 'shape'), KeyError or silently wrong rows."""
    path = tmp_path / "codes.h5"
    rng = np.random.default_rng(0)
    with CodeWriter(path, SITES, n_heads=4, metadata={**METADATA, "value_names": {}}) as writer:
        writer.append(**batch(rng, 2, "train"))
        writer.append(**batch(rng, 2, "ood"))
    with h5py.File(path, "r+") as file:
        edit(file)
    with pytest.raises(CodeFileError) as refused:
        CodeFile(path)
    assert message in str(refused.value) and str(path) in str(refused.value)


def test_the_writer_refuses_sites_its_reader_could_not_open(tmp_path):
    with pytest.raises(CodeFileError, match=r"site \(layer -1, query 3, key 3\) has a negative layer or position"):
        CodeWriter(tmp_path / "codes.h5", [Site(-1, 3, 3)], n_heads=4)
    assert list(tmp_path.iterdir()) == []
