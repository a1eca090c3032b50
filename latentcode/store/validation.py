"""Checking a codes file against its schema (`latentcode.store.schema`), once, at open.

`validate(path)` refuses a file that differs from the schema with one `CodeFileError` naming the
file, the attribute or dataset, the value found and what is expected, or one that refers to other
files (`references_outside`) unless `allow_external=True`; it returns what the reader needs (`Contents`).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from latentcode.store.compact import check_compact, check_compact_values
from latentcode.store.schema import (
    CODES,
    CODES_GROUP,
    DATASETS,
    EXTRA,
    FORMAT,
    GROUPS,
    LABELS,
    PREDICTION,
    PROVENANCE,
    ROOT_ATTRIBUTES,
    SCHEMA_VERSION,
    SPLIT,
    TARGET,
    Attribute,
    CodeFileError,
    Dataset,
    required_top_level,
)
from latentcode.store.shards import checked_shards, declared_shard_names
from latentcode.store.site import Site


@dataclass
class Contents:
    """What a valid codes file holds, apart from its per-example arrays."""

    attrs: dict[str, Any]  # the root attributes as stored (numpy scalars as Python values)
    values: dict[str, Any]  # every root attribute of the schema parsed, its default where absent
    shards: list[dict[str, Any]]  # the `shards` entries of a sharded file ([] for any other)
    sites: list[Site]
    heads_of: dict[Site, int]
    label_names: list[str]
    extra_names: list[str]
    has_prediction: bool
    has_target: bool
    value_names: dict[str, list[str]]
    column_names: dict[str, list[str]]
    writes: list[dict[str, Any]]  # the /provenance entries ([] in a file from before it)
    split_index: np.ndarray  # [N] int16: each example's split, an index into `values["splits"]`


def validate(path: str | Path, *, allow_external: bool = False, image: bytes | None = None) -> Contents:
    """Check the codes file at `path` against the schema; what it holds, or one `CodeFileError`.
    `image`: the bytes of a codes file held in memory (`InMemoryCodes`); `path` then only names it."""
    path = Path(path)
    if image is None:
        if not path.exists():
            raise FileNotFoundError(f"no codes file at {path}")
        check_readable_hdf5(path)
    with (h5py.File(path, "r") if image is None else open_image(image)) as file:
        outside = [] if allow_external else references_outside(file)
        if outside:
            raise CodeFileError(
                f"{path} refers to other files ({'; '.join(outside)}); a codes file holds its "
                "data itself: rewrite it, or open it with CodeFile(path, allow_external=True) if you trust them"
            )
        check_format_and_version(path, file)
        check_soft_links(path, file)
        attrs = checked_attributes(path, file)
        shards = checked_shards(path, file)
        values = parsed_attributes(attrs)
        heads_of = checked_datasets(path, file, values["n_heads"])
        check_compact(path, file, values["compact"], file[SPLIT.name].shape[0])
        check_compact_values(path, file, values["compact"])
        labels = file[LABELS.group]
        return Contents(
            attrs=attrs, values=values, shards=shards, sites=list(heads_of), heads_of=heads_of,
            label_names=sorted(labels), extra_names=extra_names(file),
            has_prediction=PREDICTION.name in file, has_target=TARGET.name in file,
            value_names=_label_attribute(labels, "value_names"),
            column_names=_label_attribute(labels, "column_names"),
            writes=checked_provenance(path, file),
            split_index=split_indices(path, file[SPLIT.name], values["splits"]),
        )


def open_image(image: bytes) -> h5py.File:
    """An HDF5 file held in memory as `image` (its bytes), opened read-only."""
    return h5py.File(io.BytesIO(image), "r")


#: rows read at a time where a whole per-example dataset would not fit in bounded memory
ROWS_PER_READ = 65536


def split_indices(path: Path, split: h5py.Dataset, names: list[str]) -> np.ndarray:
    """int16 `[N]`: each example's split as an index into `names`, read `ROWS_PER_READ` rows at a
    time (2 bytes a row, where the strings as numpy text took about 180 to open a file)."""
    if len(names) > np.iinfo(np.int16).max:
        raise CodeFileError(f"{path}: root attribute 'splits' lists {len(names)} splits; expected at most 32767")
    index = np.empty(len(split), dtype=np.int16)
    lookup = {name.encode(): number for number, name in enumerate(names)}
    for start in range(0, len(split), ROWS_PER_READ):
        block = split[start:start + ROWS_PER_READ]
        values, inverse = np.unique(block, return_inverse=True)
        found = [lookup.get(value if isinstance(value, bytes) else str(value).encode(), -1) for value in values]
        if min(found, default=0) < 0:
            unlisted = sorted({value.decode(errors="replace") if isinstance(value, bytes) else str(value)
                               for value, number in zip(values, found, strict=True) if number < 0})
            raise CodeFileError(f"{path}: /split names splits {unlisted[:5]} that the root attribute 'splits' "
                                f"({names}) does not list")
        index[start:start + len(block)] = np.asarray(found, dtype=np.int16)[inverse.reshape(-1)]
    return index


def check_soft_links(path: Path, file: h5py.File) -> None:
    """Refuse a soft link (at the root or in a group of the schema) whose target is not in the file:
    h5py lists its name, then fails with a KeyError when it is read."""
    for group in (file, *(file[g.path] for g in GROUPS if isinstance(file.get(g.path), h5py.Group))):
        for name in group:
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.SoftLink) and file.get(link.path) is None:
                where = f"{group.name.rstrip('/')}/{name}"
                raise CodeFileError(f"{path}: {where} is a soft link to {link.path}, which is not in the file; "
                                    "expected a dataset")


def check_readable_hdf5(path: Path) -> None:
    """Refuse, naming the file, what h5py cannot open: not HDF5 at all, or truncated or damaged."""
    if path.is_dir():
        raise CodeFileError(f"{path} is a directory; expected a codes file")
    if not h5py.is_hdf5(path):
        raise CodeFileError(f"{path} is not an HDF5 file")
    try:
        h5py.File(path, "r").close()
    except OSError as error:  # h5py reports a truncated or damaged file only as OSError
        raise CodeFileError(f"{path} is a damaged or truncated HDF5 file ({error})") from None


def references_outside(file: h5py.File) -> list[str]:
    """What in `file` points into other files: external links, virtual datasets with sources
    elsewhere, datasets stored in external raw files; walked without following any of them."""
    found: list[str] = []
    seen: set = set()
    shards = set(declared_shard_names(file))  # a sharded file's own shards are not outside it

    def walk(group: h5py.Group, prefix: str) -> None:
        for name in group:
            path = f"{prefix}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                found.append(f"{path} is an external link to {link.filename}:{link.path}")
                continue
            if isinstance(link, h5py.SoftLink):
                continue  # a path inside this file, reached through its hard link
            item = group[name]
            if item.id in seen:  # hard links can make cycles
                continue
            seen.add(item.id)
            if isinstance(item, h5py.Group):
                walk(item, path)
            elif isinstance(item, h5py.Dataset):
                if item.is_virtual:
                    files = sorted({source.file_name for source in item.virtual_sources()} - {"."} - shards)
                    if files:
                        found.append(f"{path} is a virtual dataset reading {files}")
                if item.external:
                    found.append(f"{path} is stored in external files {[entry[0] for entry in item.external]}")

    walk(file, "")
    return found


def check_format_and_version(path: Path, file: h5py.File) -> None:
    """Refuse an HDF5 file that is not a codes file, or one of a schema version this reader does not read."""
    found = _python(file.attrs.get("format"))
    if found != FORMAT:
        raise CodeFileError(f"{path} is an HDF5 file but not a latentcode codes file (root attribute 'format' is "
                            f"{found!r}; expected {FORMAT!r})")
    if "schema_version" not in file.attrs:
        raise CodeFileError(f"{path} lacks the root attribute 'schema_version' that every codes file has")
    try:
        version = int(file.attrs["schema_version"])
    except (TypeError, ValueError):
        version = _python(file.attrs["schema_version"])
    if version != SCHEMA_VERSION:
        raise CodeFileError(f"{path} has schema version {version!r}; this latentcode reads version {SCHEMA_VERSION} "
                            "(root attribute 'schema_version')")


def _python(value: Any) -> Any:
    """An attribute as h5py reads it, numpy scalars as Python values."""
    return value.item() if isinstance(value, np.generic) else value


def _a(words: str) -> str:
    return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"


def _listed(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def _label_attribute(labels: h5py.Group, name: str) -> dict[str, Any]:
    """Label name -> the value of its attribute `name`, for the labels that have it."""
    attribute = next(attribute for attribute in LABELS.attributes if attribute.name == name)
    return {label: attribute.type.read(labels[label].attrs[name]) for label in sorted(labels)
            if name in labels[label].attrs}


def _check_attribute(path: Path, where: str, value: Any, attribute: Attribute) -> None:
    """Refuse an attribute whose value is not of its declared type, naming `where` it is."""
    kind = attribute.type
    if kind.json is None:
        if not kind.check(value):
            raise CodeFileError(f"{path}: {where} is {value!r}; expected {_a(kind.words)}")
        return
    try:
        parsed = kind.parse(value)
    except (TypeError, ValueError) as error:
        raise CodeFileError(f"{path}: {where} is not valid JSON ({error}): {str(value)[:60]!r}") from None
    if value and not isinstance(parsed, kind.json):
        raise CodeFileError(f"{path}: {where} holds a JSON {type(parsed).__name__}; expected a JSON "
                            f"{'object' if kind.json is dict else 'list'}")
    if kind.items is not None and not all(isinstance(item, kind.items) for item in parsed):
        raise CodeFileError(f"{path}: {where} must be {_a(kind.words)}; got {str(value)[:60]!r}")


def _kind(item: Any) -> str:
    if isinstance(item, h5py.Group):
        return "a group"
    if isinstance(item, h5py.Dataset):
        return f"a {item.ndim}-D {item.dtype} dataset"
    return type(item).__name__


def checked_attributes(path: Path, file: h5py.File) -> dict[str, Any]:
    """The root attributes of an open codes file as Python values, after checking the groups and
    datasets every file has, and the root attributes against their types."""
    attrs = {key: _python(value) for key, value in file.attrs.items()}
    top_level = required_top_level()
    for name in top_level:
        if name.lstrip("/") not in file:
            raise CodeFileError(f"{path} has no {name}; a latentcode codes file has {_listed(top_level)}")
        is_group = any(group.path == name for group in GROUPS)
        if not isinstance(file[name], h5py.Group if is_group else h5py.Dataset):
            raise CodeFileError(f"{path}: {name} is {_kind(file[name])}; expected "
                                f"{'a group' if is_group else 'a dataset'}")
    labels = file[LABELS.group]
    for name in labels:
        if not isinstance(labels[name], h5py.Dataset):
            raise CodeFileError(f"{path}: /{LABELS.group}/{name} is {_kind(labels[name])}; expected a dataset")
    for attribute in ROOT_ATTRIBUTES:
        if attribute.required and attribute.name not in attrs:
            raise CodeFileError(f"{path} lacks the root attribute {attribute.name!r} that every codes file has")
    for attribute in ROOT_ATTRIBUTES:
        if attribute.name in attrs:
            _check_attribute(path, f"root attribute {attribute.name!r}", attrs[attribute.name], attribute)
    return attrs


def parsed_attributes(attrs: dict[str, Any]) -> dict[str, Any]:
    """Every root attribute of the schema as the reader uses it (`ValueType.read`): JSON parsed,
    integers as int, an absent one as its type's value for absent ("", {}, [] or None)."""
    return {attribute.name: attribute.type.read(attrs.get(attribute.name)) for attribute in ROOT_ATTRIBUTES}


def extra_names(file: h5py.File) -> list[str]:
    """The per-example arrays under /extra (groups there, which no writer makes, are not among them)."""
    return sorted(name for name in file[EXTRA.group] if isinstance(file[EXTRA.group].get(name), h5py.Dataset))


def _members(file: h5py.File, dataset: Dataset) -> list[tuple[str, Any]]:
    """The datasets of a schema entry present in `file`, as (name, item): one per name of its group
    ("codes/l0_q3_k3", ...) for a `<name>` entry, else the one dataset if present."""
    if not dataset.group:
        return [(dataset.name, file[dataset.name])] if dataset.name in file else []
    if dataset.group not in file:  # an optional group (/compact)
        return []
    if dataset is EXTRA:
        return [(f"{EXTRA.group}/{name}", file[EXTRA.group][name]) for name in extra_names(file)]
    return [(f"{dataset.group}/{name}", file[dataset.group][name]) for name in file[dataset.group]]


def _check_dataset(path: Path, name: str, item: Any, dataset: Dataset) -> None:
    """Refuse a dataset of another kind, rank or element type than its schema entry declares."""
    rank_fits = isinstance(item, h5py.Dataset) and (item.ndim == dataset.ndim if dataset.ndim else item.ndim >= 1)
    if not rank_fits:
        raise CodeFileError(f"{path}: /{name} is {_kind(item)}; expected {dataset.expected_shape}")
    if not dataset.dtype.accepts(item.dtype):
        raise CodeFileError(f"{path}: /{name} is {_kind(item)}; expected {dataset.expected_dtype}")


def checked_datasets(path: Path, file: h5py.File, n_heads: int) -> dict[Site, int]:
    """The sites of an open codes file and the heads of each, after checking every per-example
    dataset and its attributes against its schema entry: /split 1-D strings, /codes/<site>
    [N, H] named by a site, and every per-example dataset N rows."""
    _check_dataset(path, SPLIT.name, file[SPLIT.name], SPLIT)
    n_rows = file[SPLIT.name].shape[0]
    heads_of: dict[Site, int] = {}
    for dataset in DATASETS:
        if not dataset.per_example:
            continue
        for name, item in _members(file, dataset):
            _check_dataset(path, name, item, dataset)
            if dataset is CODES:
                heads_of[_checked_site(path, name, item, n_heads)] = item.shape[1]
            if item.shape[0] != n_rows:
                raise CodeFileError(f"{path}: /{name} has {item.shape[0]} rows but /split has {n_rows}; every "
                                    "per-example dataset has one row per example (a damaged or hand-edited file)")
            for attribute in dataset.attributes:
                if attribute.name in item.attrs:
                    _check_dataset_attribute(path, name, item, attribute)
        if dataset is CODES and not heads_of:
            raise CodeFileError(f"{path}: {CODES_GROUP.path} holds no sites; a codes file holds at least one "
                                f"{CODES.path}")
    return dict(sorted(heads_of.items()))


def _check_dataset_attribute(path: Path, name: str, item: h5py.Dataset, attribute: Attribute) -> None:
    stored = item.attrs.get_id(attribute.name)
    if stored.shape == () and attribute.type.fits(stored.dtype):
        return  # well formed whatever its value: not read (a file of many sites opens as fast as before)
    value = _python(item.attrs[attribute.name])
    _check_attribute(path, f"attribute {attribute.name!r} of /{name}", value, attribute)


def _checked_site(path: Path, name: str, codes: h5py.Dataset, n_heads: int) -> Site:
    """The site of the codes dataset `name`, after checking that its width is n_heads (where not 0)."""
    if n_heads and codes.shape[1] != n_heads:
        raise CodeFileError(f"{path}: /{name} has {codes.shape[1]} heads but the root attribute n_heads "
                            f"says {n_heads}")
    try:
        return Site.from_name(name.rpartition("/")[2])
    except CodeFileError as error:
        raise CodeFileError(f"{path}: /{name}: {error}") from None


def checked_provenance(path: Path, file: h5py.File) -> list[dict[str, Any]]:
    """The /provenance entries: JSON objects with the rows and splits of each write."""
    if PROVENANCE.name not in file:
        return []
    item = file[PROVENANCE.name]
    _check_dataset(path, PROVENANCE.name, item, PROVENANCE)
    writes = []
    for number, text in enumerate(item.asstr()[:]):
        try:
            entry = json.loads(text)
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("splits"), list) or "seed" not in entry:
            raise CodeFileError(f"{path}: /provenance entry {number} is not a JSON object with the splits and seed "
                                f"of a write: {str(text)[:60]!r}")
        writes.append(entry)
    return writes
