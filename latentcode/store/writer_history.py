"""What `CodeWriter` checks and records of a file's history: whether rows may be appended to it, and
the /provenance entry of each write (which rows, splits and seed)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from latentcode.store.schema import (
    CODES,
    FORMAT,
    PROVENANCE,
    SCHEMA_VERSION,
    CodeFileError,
    from_json,
    to_json,
)
from latentcode.store.shards import declared_shard_names
from latentcode.store.site import Site
from latentcode.store.validation import references_outside


def _extend(dataset: h5py.Dataset, rows: np.ndarray) -> None:
    n = dataset.shape[0]
    dataset.resize(n + len(rows), axis=0)
    dataset[n:] = rows


def record_provenance(file: h5py.File, metadata: Mapping[str, Any], first_row: int, n_rows: int,
                      splits_written: list[str], mode: str, version: str) -> None:
    """One /provenance entry for rows `[first_row, n_rows)` of `file` (a file from before /provenance
    first gets an entry for its earlier rows, which came from the root seed)."""
    if PROVENANCE.name not in file:
        file.create_dataset(PROVENANCE.name, shape=(0,), maxshape=(None,), dtype=PROVENANCE.dtype.written,
                            chunks=(64,))
        if first_row:
            attrs = file.attrs
            _extend(file[PROVENANCE.name], np.asarray([to_json({
                "rows": [0, first_row], "splits": json.loads(attrs["splits"]),
                "seed": from_json(attrs.get("seed", "")), "mode": "new", "written": attrs.get("created", ""),
                "latentcode_version": attrs.get("latentcode_version", ""), "reconstructed": True,
            })], dtype=object))
    selector = metadata.get("selector", {})
    if isinstance(selector, str):
        selector = json.loads(selector or "{}")
    if not isinstance(selector, dict):
        selector = {"spec": selector}
    seed = metadata.get("seed", "")
    entry = {
        "rows": [first_row, n_rows],
        "splits": splits_written,
        "seed": seed.item() if isinstance(seed, np.generic) else seed,
        "mode": mode,
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "latentcode_version": version,
        "source": str(metadata.get("source", "")),
        "score": metadata["score"],
        "selector": {key: value for key, value in selector.items() if key != "sites"},
    }
    _extend(file[PROVENANCE.name], np.asarray([to_json(entry)], dtype=object))


def check_appendable(path: Path, file: h5py.File, sites: list[Site], heads_of: Mapping[Site, int], n_heads: int,
                     metadata: Mapping[str, Any]) -> None:
    """Refuse, in one line, to append rows of `sites` (`heads_of`) described by `metadata` to `file`
    (at `path`) unless it is an unsharded codes file of the same schema, sites, heads, model and task."""
    attrs = file.attrs
    problems = []
    if attrs.get("format") != FORMAT:
        raise CodeFileError(f"cannot append to {path}: it is not a latentcode codes file")
    outside = references_outside(file)
    if outside:
        raise CodeFileError(f"cannot append to {path}: it refers to other files ({'; '.join(outside)})")
    if "shards" in attrs:
        raise CodeFileError(f"cannot append to {path}: it is a sharded file (virtual datasets over "
                            f"{len(declared_shard_names(file))} shard files); extract into a new file")
    if int(attrs.get("schema_version", -1)) != SCHEMA_VERSION:
        problems.append(f"schema version {attrs.get('schema_version')} (this writer: {SCHEMA_VERSION})")
    existing_sites = sorted(Site.from_name(name) for name in file[CODES.group])
    if existing_sites != sites:
        problems.append(
            f"sites differ: file has {[s.name for s in existing_sites]}, new data has {[s.name for s in sites]}"
        )
    codes = file[CODES.group]
    existing_heads = {Site.from_name(name): codes[name].shape[1] for name in codes}
    if existing_sites == sites and existing_heads != heads_of:
        problems.append(f"n_heads: file {int(attrs['n_heads']) or existing_heads}, new data {n_heads or heads_of}")
    for key in ("score", "checkpoint_sha256", "model_config", "task_config", "compact"):
        if key not in metadata:
            continue
        new = metadata[key] if key in ("score", "checkpoint_sha256") else to_json(metadata[key])
        old = attrs[key]
        if key.endswith("config"):
            old, new = json.loads(old or "{}"), json.loads(new or "{}")
        if old != new:
            problems.append(f"{key}: file {old!r}, new data {new!r}")
    if problems:
        raise CodeFileError(f"cannot append to {path}: incompatible schema: " + "; ".join(problems))
