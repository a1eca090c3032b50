"""The codes-file schema is declared once (latentcode/store/schema.py): the writer creates what it
lists, validation refuses a file that lacks or mistypes any entry of it, and the documentation is
made from it."""

import re

import h5py
import numpy as np
import pytest

import latentcode.store
from latentcode.store import (
    CodeFileError,
    CodeWriter,
    Site,
    schema,
    shard_path,
    validate,
    write_sharded_file,
)

SITES = [Site(0, 35, 35), Site(1, 35, 27)]
METADATA = {
    "model_name": "hyla", "model_config": {"attention": "hyla"}, "checkpoint_sha256": "ab" * 32,
    "task_config": {"name": "sraven"}, "selector": {"name": "explicit"}, "source": "latentcode", "seed": 7,
    "task_analysis": {"probe_label": "rule"}, "prediction_kind": "logits",
    "attention_layers": [{"name": "blocks.0.attn", "kind": "self", "queries": 36, "keys": 36}],
    "split_descriptions": {"train": "seen", "ood": "held out"}, "position_names": [f"p{i}" for i in range(36)],
    "value_names": {"rule": [f"rule {i}" for i in range(8)]}, "column_names": {"terms": ["a", "b", "c"]},
}


def write_full(path, rows=4, split="train"):
    """A codes file with every entry the writer can make: labels with both attributes, prediction,
    target and an extra array."""
    rng = np.random.default_rng(0)
    with CodeWriter(path, SITES, 4, METADATA) as writer:
        writer.append(codes={site: rng.normal(size=(rows, 4)) for site in SITES},
                      labels={"rule": rng.integers(0, 8, rows), "terms": rng.integers(0, 2, (rows, 3))},
                      prediction=rng.normal(size=(rows, 8)), target=rng.integers(0, 8, rows),
                      extra={"loss": rng.random(rows)}, split=split)
    return path


def write_compact_full(path, rows=4):
    """A codes file with a compact store (/compact: one layer of 4 heads, 2 key/value heads, 5 positions)."""
    rng = np.random.default_rng(0)
    compact = {"version": 1, "layers": [0], "n_heads": 4, "n_kv_heads": 2, "head_dim": 3, "seq_len": 5}
    with CodeWriter(path, SITES, 4, {**METADATA, "compact": compact}) as writer:
        writer.write_compact("query_l0", rng.normal(size=(rows, 4, 5, 3)).astype(np.float32),
                             {"scale": "0.5", "causal": 1, "window": 0, "softcap": "0", "sinks": "[]"})
        writer.write_compact("key_l0", rng.normal(size=(rows, 2, 5, 3)).astype(np.float32))
        writer.write_compact("key_valid", np.ones((rows, 5), dtype=bool))
        writer.append(codes={site: rng.normal(size=(rows, 4)) for site in SITES}, split="train")
    return path


@pytest.fixture
def sharded(tmp_path):
    out = tmp_path / "codes.h5"
    shards = [write_full(shard_path(out, rank, 2), rows=3 + rank) for rank in range(2)]
    return write_sharded_file(out, shards)


def entry_of(name):
    """The schema path of an HDF5 object name: "codes/l0_q35_k35" -> "/codes/<site>"."""
    group, _, leaf = name.rpartition("/")
    if not group:
        return f"/{leaf}"
    return {"codes": "/codes/<site>", "labels": "/labels/<name>", "extra": "/extra/<name>",
            "compact": "/compact/<name>"}[group]


def contents(path):
    """What a file holds, walked with h5py alone: root attribute names, and entry -> attribute names."""
    found = {}
    with h5py.File(path, "r") as file:
        def visit(name, item):
            found.setdefault(entry_of(name), set()).update(item.attrs)
        file.visititems(visit)
        return set(file.attrs), found


def test_the_writer_creates_exactly_what_the_schema_lists(tmp_path, sharded):
    declared = {entry.path: {a.name for a in getattr(entry, "attributes", ())} for entry in (*schema.GROUPS, *schema.DATASETS)
                if entry is not schema.COMPACT}  # only a compact extraction writes /compact: see test_store_compact
    roots, entries = contents(write_full(tmp_path / "plain.h5"))
    assert roots == {a.name for a in schema.ROOT_ATTRIBUTES} - set(schema.SHARDED_ONLY)
    assert entries == declared
    roots, entries = contents(sharded)
    assert roots == {a.name for a in schema.ROOT_ATTRIBUTES} and entries == declared
    with h5py.File(sharded, "r") as file:  # and of the declared element types
        assert file["codes/l0_q35_k35"].dtype == np.float32 and file["prediction"].dtype == np.float32
        assert h5py.check_string_dtype(file["split"].dtype).encoding == "utf-8"


def test_files_written_by_the_writer_validate(tmp_path, sharded):
    plain = validate(write_full(tmp_path / "plain.h5"))
    assert plain.sites == SITES and plain.label_names == ["rule", "terms"] and plain.extra_names == ["loss"]
    assert plain.values["splits"] == ["train"] and plain.values["n_heads"] == 4 and plain.has_prediction
    assert plain.value_names == {"rule": METADATA["value_names"]["rule"]} and plain.column_names == {"terms": ["a", "b", "c"]}
    assert plain.values["attention_layers"] == METADATA["attention_layers"] and plain.values["seed"] == 7
    assert len(plain.writes) == 1 and plain.shards == []
    assert [entry["rows"] for entry in validate(sharded).shards] == [[0, 3], [3, 7]]


# -- the documentation -------------------------------------------------------------------------------------
def documented_entries(text):
    """(root attributes, {dataset or group path: its attributes}) read off the schema section of `text`."""
    lines = text.split("Schema (version", 1)[1].split("\n\n", 2)[1].splitlines()
    roots, entries, current = set(), {}, None
    for line in lines:
        if match := re.match(r"^    (/\S*)\s", line):
            current = match.group(1)
            if current != "/":
                entries[current] = set()
        elif match := re.match(r"^        (@?)(\w+)\s", line):
            if match.group(1):
                entries[current].add(match.group(2))
            else:
                assert current == "/", line
                roots.add(match.group(2))
        else:
            assert re.match(r"^ {30}\S", line), f"not an entry nor its continuation: {line!r}"
    return roots, entries


def test_the_documentation_lists_exactly_the_schema_entries():
    roots, entries = documented_entries(latentcode.store.__doc__)
    assert roots == {attribute.name for attribute in schema.ROOT_ATTRIBUTES}
    assert entries == {entry.path: {a.name for a in getattr(entry, "attributes", ())}
                       for entry in (*schema.GROUPS, schema.COMPACT_GROUP, *schema.DATASETS)}
    # and nowhere else in the text: no entry written by hand beside the generated ones
    listed = re.findall(r"^ {4}(/\S*)\s|^ {8}@?(\w+)\s", latentcode.store.__doc__, re.MULTILINE)
    assert len(listed) == 1 + len(roots) + len(entries) + sum(map(len, entries.values()))
    for attribute in schema.ROOT_ATTRIBUTES:  # with its type and whether a reader needs it
        need = "required" if attribute.required else "optional"
        assert re.search(rf"^        {attribute.name}\s+{re.escape(attribute.type.words)}, {need}:",
                         latentcode.store.__doc__, re.MULTILINE), attribute.name


# -- refusals, parametrised over the schema ----------------------------------------------------------------
def without(entry):
    """An edit that removes `entry` (an attribute, a group or dataset, or every dataset of a `<name>` entry)."""
    def edit(file):
        if isinstance(entry, schema.Attribute):
            del file.attrs[entry.name]
        elif "<" in entry.path:
            group = file[entry.path.rpartition("/")[0]]
            for name in list(group):
                del group[name]
        else:
            del file[entry.path]
    return edit


REQUIRED = [entry for entry in (*schema.ROOT_ATTRIBUTES, *schema.GROUPS, *schema.DATASETS) if entry.required]


def label(entry):
    return entry.name if isinstance(entry, schema.Attribute) else entry.path


def named(entry):
    """How a refusal names the entry."""
    if isinstance(entry, schema.Attribute):
        return f"root attribute {entry.name!r}"
    return entry.path if "<" in entry.path else f"has no {entry.path};"


@pytest.mark.parametrize("entry", REQUIRED, ids=[label(entry) for entry in REQUIRED])
def test_a_file_without_a_required_entry_is_refused_naming_it(tmp_path, entry):
    path = write_full(tmp_path / "codes.h5")
    with h5py.File(path, "r+") as file:
        without(entry)(file)
    with pytest.raises(CodeFileError) as refused:
        validate(path)
    assert named(entry) in str(refused.value) and str(path) in str(refused.value)


def test_the_required_entries_are_the_ones_a_reader_needs():
    assert {label(entry) for entry in REQUIRED} == {
        "format", "schema_version", "model_config", "task_config", "selector", "splits", "n_heads",
        "/codes", "/labels", "/extra", "/split", "/codes/<site>"}


# A stored value of the wrong type for each type of attribute, and what the refusal says is expected.
WRONG = {"string": (np.int64(5), "5; expected a string"), "integer": ("five", "'five'; expected an integer"),
         "JSON object": ("[1]", "holds a JSON list; expected a JSON object"),
         "JSON list": ('{"a": 1}', "holds a JSON dict; expected a JSON list"),
         "JSON list of strings": ("[1]", "must be a JSON list of strings; got '[1]'"),
         "JSON value, or a plain string": (np.int64(5), "5; expected a JSON value, or a plain string")}
ATTRIBUTES = [(None, attribute) for attribute in schema.ROOT_ATTRIBUTES]
ATTRIBUTES += [(dataset, attribute) for dataset in schema.DATASETS for attribute in dataset.attributes]


@pytest.mark.parametrize("dataset, attribute", ATTRIBUTES,
                         ids=[f"{d.path if d else ''}@{a.name}" for d, a in ATTRIBUTES])
def test_an_attribute_of_the_wrong_type_is_refused_naming_it_the_value_and_what_is_expected(tmp_path, dataset,
                                                                                            attribute):
    compact = dataset is schema.COMPACT
    path = (write_compact_full if compact else write_full)(tmp_path / "codes.h5")
    value, says = WRONG[attribute.type.words]
    where = "/" if dataset is None else dataset.path.replace("<site>", SITES[0].name).replace(
        "<name>", "query_l0" if compact else "rule")
    if attribute.name == "format":
        says = "root attribute 'format' is 5; expected 'latentcode-codes'"
    if attribute.name == "schema_version":
        says = "has schema version 'five'; this latentcode reads version 1 (root attribute 'schema_version')"
    with h5py.File(path, "r+") as file:
        file[where].attrs[attribute.name] = value
    with pytest.raises(CodeFileError) as refused:
        validate(path)
    message = str(refused.value)
    assert str(path) in message and says in message
    assert attribute.name in message and (dataset is None or where in message)


# A dataset of the wrong element type for each entry (strings where numbers belong, and numbers where strings).
DATASETS = list(schema.DATASETS)


@pytest.mark.parametrize("dataset", DATASETS, ids=[dataset.path for dataset in DATASETS])
def test_a_dataset_of_the_wrong_type_is_refused_naming_it(tmp_path, dataset):
    compact = dataset is schema.COMPACT
    path = (write_compact_full if compact else write_full)(tmp_path / "codes.h5")
    name = dataset.name.replace("<site>", SITES[0].name).replace(
        "<name>", "query_l0" if compact else "rule" if "labels" in dataset.name else "loss")
    with h5py.File(path, "r+") as file:
        shape = file[name].shape
        strings = dataset.dtype.kinds == ""
        del file[name]
        file[name] = np.zeros(shape) if strings else np.full(shape, b"x")
    with pytest.raises(CodeFileError) as refused:
        validate(path)
    assert f"{path}: /{name} is a {len(shape)}-D" in str(refused.value)
    assert f"; expected {dataset.expected_dtype}" in str(refused.value)
