"""The codes file's schema, declared once: every root attribute, group and dataset, with its type,
shape, whether a reader needs it, and what it means. The writer creates what it lists, validation
checks a file against it, and `help(latentcode.store)` shows `documentation()` of it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from latentcode.errors import LatentcodeError

FORMAT = "latentcode-codes"
SCHEMA_VERSION = 1
SCORE_KINDS = ("pattern", "scores")


class CodeFileError(LatentcodeError, ValueError):
    """A codes file that cannot be read, or that cannot take the data offered; says why."""


def to_json(value: Any) -> str:
    """An attribute's text: a string as it is, anything else as (key-sorted) JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def from_json(text: Any) -> Any:
    """An attribute written by `to_json`: JSON where it parses, else the string itself."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


# -- what an attribute holds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ValueType:
    """What an attribute holds: `words` for the documentation; `encode` turns the writer's value into
    what is stored, `parse` what is stored into the reader's value; `absent` stands in for an absent
    attribute (None: the reader's value is None). A JSON type (`json`: the type its text parses to,
    `items`: that of every item of a list) reads empty text as its empty value; any other type is
    well formed where `check` says so, and always where `fits` says its stored dtype holds only
    well-formed scalars (so that validation need not read the value)."""

    words: str
    encode: Callable[[Any], Any]
    parse: Callable[[Any], Any]
    check: Callable[[Any], bool] = lambda value: True
    fits: Callable[[np.dtype], bool] = lambda dtype: False
    absent: Any = ""
    json: type | None = None
    items: type | None = None

    def read(self, stored: Any) -> Any:
        """The reader's value of an attribute stored as `stored` (None: absent)."""
        if stored is None:
            return None if self.absent is None else self.parse(self.absent)
        return self.parse(stored)


def _is_integer(value: Any) -> bool:
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True


def _json_of(kind: type) -> Callable[[str], Any]:
    empty = "{}" if kind is dict else "[]"
    return lambda text: json.loads(text or empty)


def _is_variable_length_string(dtype: np.dtype) -> bool:
    """h5py reads a variable-length string attribute as str (a fixed-length one as bytes)."""
    info = h5py.check_string_dtype(dtype)
    return info is not None and info.length is None


TEXT = ValueType("string", encode=str, parse=lambda value: value, check=lambda value: isinstance(value, str),
                 fits=_is_variable_length_string)
INTEGER = ValueType("integer", encode=int, parse=int, check=_is_integer, fits=lambda dtype: dtype.kind in "iu",
                    absent=None)
# The seed: JSON, except that a string seed is stored as it is (`from_json` reads both).
JSON_VALUE = ValueType("JSON value, or a plain string", encode=to_json, parse=from_json,
                       check=lambda value: isinstance(value, str), fits=_is_variable_length_string)
JSON_OBJECT = ValueType("JSON object", encode=to_json, parse=_json_of(dict), json=dict)
JSON_LIST = ValueType("JSON list", encode=to_json, parse=_json_of(list), json=list)
JSON_STRINGS = ValueType("JSON list of strings", encode=to_json, parse=_json_of(list), json=list, items=str)


@dataclass(frozen=True)
class Attribute:
    """One attribute of the root or of a dataset."""

    name: str
    type: ValueType
    required: bool
    meaning: str


# -- what a dataset holds -------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataType:
    """The element type of a dataset: `words` for the documentation, `written` the dtype the writer
    creates (None: the caller's own numeric dtype), `kinds` the numpy dtype kinds a reader accepts
    ("" for strings)."""

    words: str
    written: Any
    kinds: str

    def accepts(self, dtype: np.dtype) -> bool:
        if not self.kinds:
            return h5py.check_string_dtype(dtype) is not None
        return dtype.kind in self.kinds


FLOAT32 = DataType("float32", written=np.float32, kinds="f")
NUMBERS = DataType("numbers (bool, integer or float)", written=None, kinds="biuf")
PREDICTIONS = DataType("float32", written=np.float32, kinds="biuf")  # written float32, read as any number
STRINGS = DataType("UTF-8 strings", written=h5py.string_dtype(), kinds="")


@dataclass(frozen=True)
class Group:
    """A group holding one dataset per name (`members`, e.g. "<site>")."""

    path: str
    required: bool
    meaning: str


@dataclass(frozen=True)
class Dataset:
    """A dataset, or (with `<name>` in its path) one per name in its group. `ndim` is its exact rank
    (None: one or more); the reader refuses a dataset of another rank with `expected_shape`, and one
    of another element type with `expected_dtype` ("a ... dataset" in words). `per_example`:
    one row per example (all such datasets have N rows)."""

    path: str
    dtype: DataType
    shape: str
    required: bool
    meaning: str
    expected_shape: str = "a dataset with one row per example"
    expected_dtype: str = "numbers"
    ndim: int | None = None
    per_example: bool = True
    attributes: tuple[Attribute, ...] = ()

    @property
    def group(self) -> str:
        """The group of a `<name>` dataset ("codes"), "" for a dataset at the root."""
        return self.path.strip("/").rpartition("/")[0]

    @property
    def name(self) -> str:
        """The path without its leading slash: the name h5py finds it by ("split", "codes/<site>")."""
        return self.path.lstrip("/")


# -- the schema -----------------------------------------------------------------------------------------
ROOT_ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("format", TEXT, True, f'"{FORMAT}"'),
    Attribute("schema_version", INTEGER, True, f"{SCHEMA_VERSION}"),
    Attribute("latentcode_version", TEXT, False, "version of the package that wrote the file"),
    Attribute("created", TEXT, False, "ISO 8601 UTC time of the first write"),
    Attribute("model_name", TEXT, False, 'short name for titles and tables, e.g. "hyla"'),
    Attribute("model_config", JSON_OBJECT, True, "the model's configuration (ModelConfig.to_dict() for our models)"),
    Attribute("checkpoint_sha256", TEXT, False, 'SHA-256 of the weights file the codes came from (of a pretrained '
              "model's directory: of its weights files' names and SHA-256s, latentcode.pretrained.checkpoint_sha256; "
              '"" if none)'),
    Attribute("model_path", TEXT, False, "a pretrained model's file or directory, as the extraction found it (where "
              "`latentcode view` looks for its tokenizer, checked against checkpoint_sha256); \"\" for other models"),
    Attribute("model_dtype", TEXT, False, 'the dtype the model computed in: "float32", "bfloat16" or "float16" ("" in '
              "files from before it: float32); the codes are stored as float32 whatever it"),
    Attribute("task_config", JSON_OBJECT, True, "the task's configuration (Task.config()), {} if none"),
    Attribute("selector", JSON_OBJECT, True, '{"name": ..., "sites": [[layer, query, key], ...]}'),
    Attribute("score", TEXT, False, f"{SCORE_KINDS[0]!r} (normalized latent codes, default) or {SCORE_KINDS[1]!r} "
              "(raw, before normalization)"),
    Attribute("source", TEXT, False, 'where codes came from: "latentcode", "transformer_lens", "torch", ...'),
    Attribute("seed", JSON_VALUE, False, "the sample seed of the first write (every write's seed: /provenance)"),
    Attribute("splits", JSON_STRINGS, True, "the split names present, in order of first appearance"),
    Attribute("n_heads", INTEGER, True, "H, the length of a latent code (0 when sites differ: then each codes "
              "dataset's width is its own H, e.g. layers with different heads)"),
    Attribute("task_analysis", JSON_OBJECT, False, "what the task's analysis uses (Task.analysis): selector, "
              "variant, probe_label, picture_label, headline_metric; {} if unknown"),
    Attribute("prediction_kind", TEXT, False, 'what /prediction holds: "logits", "regression output" or ""'),
    Attribute("attention_layers", JSON_LIST, False, 'one entry per attention layer the source read, where known: '
              '{"name", "kind" ("self" or "cross"), "queries", "keys"} (the lengths of the query and key axes; a '
              "cross-attention layer's queries index the decoder, its keys the encoder); [] if unknown"),
    Attribute("split_descriptions", JSON_OBJECT, False, "split name -> what it holds, in words "
              "(Task.split_descriptions); {} if unknown"),
    Attribute("position_names", JSON_STRINGS, False, "the task's name of each input position, as the viewer labels "
              'keys (Task.position_names), e.g. "panel (3,1) slot 2"; [] if the task names none'),
    Attribute("token_names", JSON_STRINGS, False, "the text of each token id of /extra/token_ids (the input tokens "
              "of each example, [N, T]), as the viewer names keys (Task.token_names, or a pretrained model's "
              "tokenizer.decode([id]) of every id); [] where the file records no tokens (or was written before "
              "pretrained extractions kept them: the viewer then asks the model's tokenizer)"),
    Attribute("compact", JSON_OBJECT, False, "only in a file with a compact store (/compact): "
              '{"version", "layers", "n_heads", "n_kv_heads", "head_dim", "seq_len"}, what rebuilds a[h, q, k] of '
              "every pair of those layers from the queries and keys (latentcode.store.compact); {} if none"),
    Attribute("file_id", TEXT, False, "32 random hex digits drawn when the file is created or overwritten (kept "
              "by appends): which file this is, whatever its name; a sharded file records its shards' ids"),
    Attribute("shards", JSON_LIST, False, 'only in a sharded file: {"file", "rows", "id", "datasets"} for each '
              "shard: its file name (beside this file), the rows [start, stop) it holds, its file_id and the "
              "shape of each dataset read from it; a reader refuses a shard whose id or shapes differ, or that "
              "lacks a dataset (HDF5 would read its rows as zeros)"),
)
# Written by `write_sharded_file` only; a `CodeWriter` writes every other root attribute.
SHARDED_ONLY = ("shards",)

CODES_GROUP = Group("/codes", True, "one dataset per site")
LABELS_GROUP = Group("/labels", True, "one dataset per task label")
EXTRA_GROUP = Group("/extra", True, "one dataset per further per-example array the caller passed")
COMPACT_GROUP = Group("/compact", False, "the compact store: what determines a[h, q, k] at every pair of the "
                      "recorded layers, instead of [H, T, T] per layer (latentcode.store.compact)")
GROUPS: tuple[Group, ...] = (CODES_GROUP, LABELS_GROUP, EXTRA_GROUP)

CODES = Dataset(
    "/codes/<site>", FLOAT32, "[N, H]", True,
    "the latent codes at one site, named l{layer}_q{query}_k{key} (positions absolute, counted from 0); "
    "a file holds at least one",
    expected_shape="a 2-D float dataset [examples, heads]", expected_dtype="a 2-D float dataset [examples, heads]",
    ndim=2,
    attributes=(Attribute("layer", INTEGER, False, "the site's layer"),
                Attribute("query", INTEGER, False, "the site's query position"),
                Attribute("key", INTEGER, False, "the site's key position")),
)
LABELS = Dataset(
    "/labels/<name>", NUMBERS, "[N, ...]", False, "one task label",
    attributes=(Attribute("value_names", JSON_STRINGS, False,
                          "the name of each integer value, where the task names them (e.g. the SRAVEN rules)"),
                Attribute("column_names", JSON_STRINGS, False, "the name of each column of a multi-column "
                          "label, where the task names them (e.g. the terms of term_present)")),
)
PREDICTION = Dataset(
    "/prediction", PREDICTIONS, "[N, ...]", False, "the model's output at the prediction positions",
    attributes=(Attribute("kind", TEXT, False, "as the root attribute prediction_kind"),),
)
TARGET = Dataset("/target", NUMBERS, "[N, ...]", False, "the task's target")
SPLIT = Dataset("/split", STRINGS, "[N]", True, "the split of each example",
                expected_shape="a 1-D dataset of strings", expected_dtype="a 1-D dataset of strings", ndim=1)
EXTRA = Dataset("/extra/<name>", NUMBERS, "[N, ...]", False, "a further per-example array the caller passed")
PROVENANCE = Dataset(
    "/provenance", STRINGS, "[W]", False,
    'one JSON object per write (the first and each append), in order: rows [start, stop), splits, seed, mode '
    '("new", "overwrite", "append"), written (UTC time), latentcode_version, source, score and the selector '
    "without its sites. Absent in files written before it existed: there the root seed covers every row",
    expected_shape="a 1-D dataset of JSON strings", expected_dtype="a 1-D dataset of JSON strings",
    ndim=1, per_example=False,
)
COMPACT = Dataset(
    "/compact/<name>", NUMBERS, "[N, ...]", False,
    "query_l{layer} float32 [N, H, T, d]: the queries of a layer as its attention call received them (after "
    "RoPE); key_l{layer} float32 [N, H_kv, T, d]: its keys, one per key/value head (query head h reads key head "
    "h // (H / H_kv)); key_valid bool [N, T]: the keys that are tokens (not padding)",
    attributes=(Attribute("scale", JSON_VALUE, False, "of query_l*: the factor of q.k (a number)"),
                Attribute("causal", INTEGER, False, "of query_l*: 1 if query q attends only to keys k <= q"),
                Attribute("window", INTEGER, False, "of query_l*: a sliding window, k > q - window (0: none)"),
                Attribute("softcap", JSON_VALUE, False, "of query_l*: scores become c tanh(s / c) (0: none)"),
                Attribute("sinks", JSON_VALUE, False, "of query_l*: one logit per head that joins each row's "
                          "softmax and takes no key ([] or absent: none)")),
)
DATASETS: tuple[Dataset, ...] = (CODES, LABELS, PREDICTION, TARGET, SPLIT, EXTRA, COMPACT, PROVENANCE)


def required_top_level() -> list[str]:
    """The groups and datasets at the root that every codes file has ("/codes", ..., "/split")."""
    return [entry.path for entry in (*GROUPS, *DATASETS) if entry.required and entry.path.count("/") == 1]


# -- documentation --------------------------------------------------------------------------------------
_NAME_WIDTH = 30
_WIDTH = 104


def _line(indent: int, name: str, text: str) -> str:
    first = " " * indent + name
    first = first.ljust(_NAME_WIDTH) if len(first) < _NAME_WIDTH else first + " "
    return textwrap.fill(text, _WIDTH, initial_indent=first, subsequent_indent=" " * _NAME_WIDTH)


def _need(entry: Attribute | Group | Dataset) -> str:
    return "required" if entry.required else "optional"


def documentation() -> str:
    """The schema in words, one entry a line (a group before its datasets): what
    `help(latentcode.store)` shows."""
    heading = (f"Schema (version {SCHEMA_VERSION}), readable with h5py alone. Required: a reader refuses a file "
               "without it; optional: written by every writer, read with its default where absent::")
    lines = [textwrap.fill(heading, _WIDTH), "", _line(4, "/", "root attributes")]
    lines += [_line(8, attribute.name, f"{attribute.type.words}, {_need(attribute)}: {attribute.meaning}")
              for attribute in ROOT_ATTRIBUTES]
    groups = {f"/{group.path.strip('/')}": group for group in (*GROUPS, COMPACT_GROUP)}
    for dataset in DATASETS:
        group = groups.pop(f"/{dataset.group}", None)
        if group is not None:
            lines.append(_line(4, group.path, f"group, {_need(group)}: {group.meaning}"))
        lines.append(_line(4, dataset.path, f"{dataset.dtype.words} {dataset.shape}, {_need(dataset)}: "
                                            f"{dataset.meaning}"))
        lines += [_line(8, f"@{attribute.name}", f"{attribute.type.words}, {_need(attribute)}: {attribute.meaning}")
                  for attribute in dataset.attributes]
    assert not groups, f"groups without a dataset in the schema: {list(groups)}"
    return "\n".join(lines)
