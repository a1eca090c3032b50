"""Sharded codes files: where each process's shard lies, and the checks a reader makes of them.

A sharded extraction writes one codes file per process, `NAME.shard-RANK-of-WORLD.h5`, and then a
file `NAME.h5` whose per-example datasets and /split are virtual datasets over the shards' rows
(`write_sharded_file`), listing them in its root attribute `shards` with each shard's identity: its
`file_id` (drawn when the shard was written) and the shape of every dataset read from it. HDF5
would read a missing shard or dataset as fill values without a word, and a shard of another
seed or extraction would pass a row count, so the reader checks each listed shard at open.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import h5py

from latentcode.files import kind_of
from latentcode.store.schema import SPLIT, CodeFileError


def shard_path(path: str | Path, rank: int, world_size: int) -> Path:
    """Where process `rank` of `world_size` writes its share of `path`: `NAME.shard-RANK-of-WORLD.h5`
    beside it (`codes.h5` -> `codes.shard-0-of-2.h5`)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.shard-{rank}-of-{world_size}{path.suffix or '.h5'}")


def declared_shard_names(file: h5py.File) -> list[str]:
    """The shard file names a file's root attribute `shards` lists (none if absent or malformed:
    `checked_shards` says what is wrong)."""
    try:
        entries = json.loads(file.attrs.get("shards", "[]"))
        return [str(entry["file"]) for entry in entries]
    except (TypeError, ValueError, KeyError):
        return []


def checked_shards(path: Path, file: h5py.File) -> list[dict[str, Any]]:
    """The `shards` entries of an open sharded file ([] for any other), after checking that each
    shard is a regular file beside it (not a link) holding the rows the entry says."""
    if "shards" not in file.attrs:
        return []
    text = file.attrs["shards"]
    try:
        entries = json.loads(text)
        valid = isinstance(entries, list) and all(
            isinstance(entry, dict) and isinstance(entry.get("file"), str)
            and isinstance(entry.get("rows"), list) and len(entry["rows"]) == 2 for entry in entries)
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise CodeFileError(f"{path}: root attribute 'shards' is not a JSON list of {{\"file\", \"rows\"}} objects: "
                            f"{str(text)[:60]!r}")
    expected_start = 0
    for entry in entries:
        name, (start, stop) = entry["file"], entry["rows"]
        if name in ("", ".", "..") or Path(name).name != name:
            raise CodeFileError(f"{path}: shard {name!r} is not a file name; shards lie beside the file")
        if start != expected_start or stop < start:
            raise CodeFileError(f"{path}: shard {name} holds rows {[start, stop]}; expected them to start at "
                                f"{expected_start}, after the previous shard")
        expected_start = stop
        shard = path.parent / name
        try:
            mode = os.lstat(shard).st_mode
        except FileNotFoundError:
            raise CodeFileError(f"{path} is sharded and its shard {shard} is missing: a sharded file reads its rows "
                                "from the shards beside it; move them with it") from None
        if not stat.S_ISREG(mode):
            raise CodeFileError(f"{path}: its shard {shard} is {kind_of(mode)}; expected a regular file")
        try:
            with h5py.File(shard, "r") as source:
                rows = source[SPLIT.name].shape[0] if isinstance(source.get(SPLIT.name), h5py.Dataset) else None
                if rows != stop - start:
                    raise CodeFileError(f"{path}: its shard {shard} holds {rows} rows; the file expects "
                                        f"{stop - start} (a shard replaced since the file was written)")
                check_identity(path, shard, source, entry)
        except OSError as error:
            raise CodeFileError(f"{path}: its shard {shard} is not a readable HDF5 file ({error})") from None
    return entries


def check_identity(path: Path, shard: Path, source: h5py.File, entry: dict[str, Any]) -> None:
    """Refuse a shard that is not the one `path` was written over: another file_id (the same model's
    shard of another seed or extraction, of the same row count), or a dataset missing or of another
    shape (HDF5 would read a missing source as zeros, silently)."""
    if not isinstance(entry.get("id"), str) or not isinstance(entry.get("datasets"), dict):
        raise CodeFileError(f"{path}: its shards entry for {shard.name} records no identity (id and dataset shapes; "
                            "written before latentcode recorded them), so a replaced shard could not be told; write "
                            "the sharded file again (latentcode.store.write_sharded_file) over the shards you trust")
    found = str(source.attrs.get("file_id", ""))
    if found != entry["id"]:
        raise CodeFileError(f"{path}: its shard {shard} has file_id {found[:12] or 'none'!r}; the file was written "
                            f"over shard {entry['id'][:12]!r} (a shard replaced by another extraction's since)")
    for name, shape in entry["datasets"].items():
        dataset = source.get(name)
        if not isinstance(dataset, h5py.Dataset):
            raise CodeFileError(f"{path}: its shard {shard} lacks the dataset /{name} (HDF5 would read its rows as "
                                "zeros); the shard was changed since the file was written")
        if list(dataset.shape) != list(shape):
            raise CodeFileError(f"{path}: its shard {shard} has /{name} of shape {list(dataset.shape)}; the file "
                                f"expects {list(shape)} (the shard was changed since the file was written)")
