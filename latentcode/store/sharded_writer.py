"""Writing a sharded codes file: one file over the codes files of a sharded extraction's processes
(`write_sharded_file`; how it is read: `latentcode.store.shards`)."""

from __future__ import annotations

import contextlib
import datetime
import json
import secrets
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from latentcode.errors import OutputExistsError
from latentcode.files import AtomicOutputs, check_replaceable
from latentcode.store.reader import CodeFile
from latentcode.store.schema import (
    CODES,
    COMPACT,
    COMPACT_GROUP,
    EXTRA,
    GROUPS,
    LABELS,
    PREDICTION,
    PROVENANCE,
    SPLIT,
    TARGET,
    CodeFileError,
    to_json,
)


def write_sharded_file(path: str | Path, shards: Sequence[str | Path], *, overwrite: bool = False,
                       wait_for_lock: float | None = 0.0) -> Path:
    """Write `path` as one codes file over the codes files `shards` (beside it, in row order): /split,
    every per-example dataset and every /compact dataset a virtual dataset over the shards' rows, the root attributes
    and /provenance those of one write, plus `shards`. `CodeFile` reads it as any codes file; the data
    stays in the shards. Written like `CodeWriter` writes: under the lock, atomically."""
    path = Path(path)
    shards = [Path(shard) for shard in shards]
    readers = _shard_readers(path, shards)
    with AtomicOutputs(lock=path, wait=wait_for_lock, purpose="writing latent codes",
                       hint="wait until it has finished or choose another path") as outputs:
        check_replaceable(path)
        exists = path.exists()
        if exists and not overwrite:
            raise OutputExistsError(f"{path} already exists; pass overwrite=True to replace it, or choose another "
                                    "path")
        with contextlib.ExitStack() as stack:
            sources = [stack.enter_context(h5py.File(shard, "r")) for shard in shards]
            out = stack.enter_context(h5py.File(outputs.temporary(path), "w"))
            _write_virtual(out, shards, sources, readers, mode="overwrite" if exists else "new")
    return path


def _shard_readers(path: Path, shards: list[Path]) -> list[CodeFile]:
    """The shards, open: beside `path`, each with its identity, all from one extraction."""
    if not shards:
        raise CodeFileError(f"no shards to combine into {path}")
    for shard in shards:
        if shard.parent.resolve() != path.parent.resolve():
            raise CodeFileError(f"shard {shard} is not beside {path}; "
                                "a sharded file reads shards from its own directory")
    readers = [CodeFile(shard) for shard in shards]
    for reader in readers:
        if not reader.attrs.get("file_id"):
            raise CodeFileError(f"shard {reader.path} has no root attribute 'file_id' (written by a latentcode before "
                                "shard identities); extract the shards again")
    for reader in readers[1:]:
        differ = _differences(readers[0], reader)
        if differ:
            raise CodeFileError(f"shards {shards[0]} and {reader.path} differ in {differ}; the shards of one file "
                                "come from one extraction")
    return readers


def _differences(first: CodeFile, other: CodeFile) -> list[str]:
    """What of one extraction differs between two shards: root attributes, sites, arrays, /compact."""
    same = ("n_heads", "model_config", "checkpoint_sha256", "task_config", "selector", "score", "source", "seed",
            "compact")
    differ = [key for key in same if other.attrs.get(key) != first.attrs.get(key)]
    if other.heads_of != first.heads_of:
        differ.append("sites")
    if (other.label_names, other.extra_names, other.has_prediction, other.has_target) != (
            first.label_names, first.extra_names, first.has_prediction, first.has_target):
        differ.append("per-example arrays")
    if _compact_names(other) != _compact_names(first):
        differ.append("/compact datasets")
    return differ


def _write_virtual(out: h5py.File, shards: list[Path], sources: list[h5py.File], readers: list[CodeFile],
                   mode: str) -> None:
    first = sources[0]
    counts = [len(reader) for reader in readers]
    bounds = np.cumsum([0, *counts]).tolist()
    for key, value in first.attrs.items():
        out.attrs[key] = value
    out.attrs["file_id"] = secrets.token_hex(16)  # a file of its own, not its first shard
    out.attrs["splits"] = json.dumps(list(dict.fromkeys(name for reader in readers for name in reader.splits)))
    for group in (*GROUPS, *([COMPACT_GROUP] if COMPACT.group in first else [])):
        out.create_group(group.path)
    names = [SPLIT.name, *(f"{CODES.group}/{site.name}" for site in readers[0].sites),
             *(f"{LABELS.group}/{label}" for label in readers[0].label_names),
             *(f"{EXTRA.group}/{extra}" for extra in readers[0].extra_names),
             *(name for name in (PREDICTION.name, TARGET.name) if name in first),
             *(f"{COMPACT.group}/{name}" for name in _compact_names(readers[0]))]
    # Each shard's identity: its file_id and the shape of every dataset read from it, checked at open.
    out.attrs["shards"] = json.dumps([{"file": shard.name, "rows": [bounds[i], bounds[i + 1]],
                                       "id": str(sources[i].attrs["file_id"]),
                                       "datasets": {name: list(sources[i][name].shape) for name in names}}
                                      for i, shard in enumerate(shards)])
    for name in names:
        row_shapes = {source[name].shape[1:] for source in sources}
        dtypes = {source[name].dtype for source in sources}
        if len(row_shapes) != 1 or len(dtypes) != 1:
            raise CodeFileError(f"/{name} differs between the shards (rows {sorted(map(list, row_shapes))}, dtypes "
                                f"{sorted(map(str, dtypes))}); the shards of one file come from one extraction")
        layout = h5py.VirtualLayout(shape=(bounds[-1], *first[name].shape[1:]), dtype=first[name].dtype)
        for shard, source, start, stop in zip(shards, sources, bounds, bounds[1:], strict=False):
            # The bare file name: HDF5 looks for it beside the virtual file, wherever the pair moves.
            layout[start:stop] = h5py.VirtualSource(shard.name, name, shape=source[name].shape,
                                                    dtype=source[name].dtype)
        dataset = out.create_virtual_dataset(name, layout)
        for key, value in first[name].attrs.items():
            dataset.attrs[key] = value
    entry = readers[0].writes[-1]
    entry = {**entry, "rows": [0, bounds[-1]], "splits": json.loads(out.attrs["splits"]), "mode": mode,
             "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "shards": [shard.name for shard in shards]}
    out.create_dataset(PROVENANCE.name, data=np.asarray([to_json(entry)], dtype=object), dtype=PROVENANCE.dtype.written,
                       maxshape=(None,), chunks=(64,))


def _compact_names(reader: CodeFile) -> list[str]:
    """The datasets of a codes file's compact store (`latentcode.store.compact`), [] for none."""
    if reader.compact is None:
        return []
    with h5py.File(reader.path, "r") as file:
        return sorted(file[COMPACT.group])
