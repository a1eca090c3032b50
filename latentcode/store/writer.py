"""Writing a codes file: a streaming, atomic writer of latent codes and their per-example arrays,
creating what the schema (`latentcode.store.schema`) lists."""

from __future__ import annotations

import datetime
import io
import json
import os
import shutil
import stat
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from latentcode.errors import LatentcodeError
from latentcode.files import (
    ExclusiveLock,
    check_replaceable,
    new_temporary_file,
    remove_dead_temporaries,
    write_error,
)
from latentcode.store.compact import check_compact, write_compact_rows
from latentcode.store.full_disk import failed_writes, write_nowhere
from latentcode.store.schema import (
    CODES,
    CODES_GROUP,
    EXTRA,
    FORMAT,
    GROUPS,
    LABELS,
    PREDICTION,
    ROOT_ATTRIBUTES,
    SCHEMA_VERSION,
    SCORE_KINDS,
    SHARDED_ONLY,
    SPLIT,
    TARGET,
    CodeFileError,
    from_json,
)
from latentcode.store.site import Site
from latentcode.store.writer_history import check_appendable, record_provenance

COMPRESSIONS = ("gzip", "lzf", "none")
DEFAULT_COMPRESSION = "gzip"
# Deflate level 1: higher levels buy almost nothing on float codes (docs/benchmarks.md).
_GZIP_LEVEL = 1
#: what a writer or reader of codes in memory calls its file in messages
MEMORY_NAME = "<codes in memory>"
_CHUNK_ROWS = 1024
_FLUSH_ROWS = 4096
_FLUSH_BYTES = 64 * 2**20


def _package_version() -> str:
    from latentcode import __version__

    return __version__


def check_compression(compression: str | None) -> str | None:
    """The h5py filter name for a `compression` choice ("gzip", "lzf", "none" or None)."""
    if compression is None or compression == "none":
        return None
    if compression not in COMPRESSIONS:
        raise CodeFileError(f"compression must be one of {list(COMPRESSIONS)}, got {compression!r}")
    return compression


def _heads_per_site(sites: Sequence[Site], n_heads: int | Mapping[Site, int]) -> dict[Site, int]:
    """The number of heads at each site (one number for all, or one per site), checked."""
    if not sites:
        raise CodeFileError("no sites to record")
    negative = [site for site in sites if min(site.layer, site.query, site.key) < 0]
    if negative:  # the reader could not open the file: site names hold non-negative numbers
        raise CodeFileError(f"site {negative[0]} has a negative layer or position; a codes file records "
                            "layers and absolute positions counted from 0")
    heads_of = {site: int(n_heads[site] if isinstance(n_heads, Mapping) else n_heads) for site in sites}
    if min(heads_of.values()) < 1:
        raise CodeFileError(f"n_heads must be a positive number of heads per site, got {n_heads!r}")
    return heads_of


class CodeWriter:
    """Stream latent codes and their labels into a codes file, atomically.

    >>> with CodeWriter("codes.h5", sites, n_heads=16, metadata={...}) as writer:
    ...     for batch in batches:
    ...         writer.append(codes={site: array [B, H]}, labels={...}, split="ood", ...)

    `metadata` fills the root attributes that describe where the codes came from (`latentcode.store.schema`)
    and, as `value_names` / `column_names` (label -> names), the attributes of /labels/<name>.
    With `append=True` an existing file is extended if its schema is compatible (same sites, heads, score, labels,
    model, checkpoint and task), otherwise refused; with `append=False` an existing file is refused (nothing already
    written is overwritten) unless `overwrite=True`. `compression`: "gzip" (default), "lzf" or "none" (None) for a new
    file. The writer holds the file's lock from construction to `close`/`abort`; another writer holding it raises
    `LockHeld` at once, or after `wait_for_lock` seconds (None: wait as long as it takes).
    """

    def __init__(
        self,
        path: str | Path | bytes | None,
        sites: Sequence[Site],
        n_heads: int | Mapping[Site, int],
        metadata: Mapping[str, Any] | None = None,
        *,
        append: bool = False,
        overwrite: bool = False,
        compression: str | None = DEFAULT_COMPRESSION,
        wait_for_lock: float | None = 0.0,
    ):
        # path None: the file is built in memory (`image` once closed; `InMemoryCodes` reads it);
        # bytes: codes in memory (a codes file's image) to append to, left as they are
        self.in_memory = path is None or isinstance(path, bytes)
        self.path = Path(MEMORY_NAME) if self.in_memory else Path(path)  # type: ignore[arg-type]
        self.image: bytes | None = None
        self.sites = sorted(dict.fromkeys(sites))
        self.heads_of = _heads_per_site(self.sites, n_heads)
        self.n_heads = next(iter(set(self.heads_of.values()))) if len(set(self.heads_of.values())) == 1 else 0
        self.compression = check_compression(compression)
        self.metadata = dict(metadata or {})
        score = self.metadata.setdefault("score", "pattern")
        if score not in SCORE_KINDS:
            raise CodeFileError(f"score must be one of {SCORE_KINDS}, got {score!r}")
        if self.in_memory:
            self._open_in_memory(path, append)  # type: ignore[arg-type]
        else:
            self._open_on_disk(append, overwrite, wait_for_lock)
        self.n_appended = 0
        self._first_row = len(self.file[SPLIT.name])
        self._splits_written: list[str] = []
        # Rows wait in memory and go to HDF5 in blocks: one h5py write per dataset per block,
        # not per batch (with many sites, per-call overhead otherwise dominates).
        self._pending: dict[str, list[np.ndarray]] = {}
        self._open_datasets: dict[str, h5py.Dataset] = {}
        self._pending_rows = self._pending_bytes = 0
        self._n_rows = self._first_row

    def _open_in_memory(self, image: bytes | None, append: bool) -> None:
        """Build the file in memory: a new one, or a copy of `image` to append to."""
        if append and image is None:
            raise CodeFileError("append=True needs codes to add to; give the file's path, or the codes in memory")
        self._lock, self._closed, self.temporary_path = None, False, None
        self.mode = "append" if append else "new"
        self._buffer = io.BytesIO(image if append else b"")  # a copy: the codes appended to stay as they are
        self.file = h5py.File(self._buffer, "r+" if append else "w")
        self._open_contents()

    def _open_on_disk(self, append: bool, overwrite: bool, wait_for_lock: float | None) -> None:
        """Take the file's lock, then open a temporary file beside it (a copy of it to append to)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise write_error(error, self.path) from None
        # Everything from here on, the existence checks included, happens under the lock.
        self._lock = ExclusiveLock(
            self.path, wait=wait_for_lock, purpose="writing latent codes",
            hint="wait until it has finished (--wait-for-lock SECONDS / wait_for_lock= waits for it) "
                 "or choose another path",
        ).acquire()
        self._closed = False
        try:
            exists = self._check_target(append, overwrite)
            self.mode = "append" if append and exists else "overwrite" if exists else "new"
            remove_dead_temporaries(self.path)
            self.temporary_path = new_temporary_file(self.path)
            if exists:  # the rename must not change who may read the file
                os.chmod(self.temporary_path, stat.S_IMODE(os.stat(self.path).st_mode))
            if self.mode == "append":
                shutil.copyfile(self.path, self.temporary_path)
            self.file = h5py.File(self.temporary_path, "r+" if self.mode == "append" else "w")
            self._open_contents()
        except OSError as error:
            self._discard()
            if error.errno is None or isinstance(error, LatentcodeError):
                raise  # h5py's own OSErrors (a damaged file) carry no errno and say what they mean
            raise write_error(error, self.path) from None
        except BaseException:
            self._discard()
            raise

    def _check_target(self, append: bool, overwrite: bool) -> bool:
        """Whether the file exists; refuses what may not be written over or appended to."""
        # A symbolic link (dangling or not), a device, a FIFO or a directory under the name is
        # refused: the rename would replace the link itself, or a device with a regular file.
        check_replaceable(self.path)
        exists = self.path.exists()
        if exists and not append and not overwrite:
            raise FileExistsError(
                f"{self.path} already exists; pass append=True to add examples to it "
                "(--append on the command line), overwrite=True to replace it, or choose another path"
            )
        if append and exists and not h5py.is_hdf5(self.path):
            raise CodeFileError(f"cannot append to {self.path}: it is not an HDF5 file")
        return exists

    def _open_contents(self) -> None:
        """A file appended to must match the codes to add (its compression kept); a new one is laid out."""
        if self.mode == "append":
            check_appendable(self.path, self.file, self.sites, self.heads_of, self.n_heads, self.metadata)
            compression = self.file[CODES.group][self.sites[0].name].compression
            self.compression = compression if compression in COMPRESSIONS else None
        else:
            self._initialize()

    # -- setup ---------------------------------------------------------------------------------
    def _initialize(self) -> None:
        """Create what the schema lists for a new file: the root attributes, the groups, a codes
        dataset per site and /split (the other datasets come with the first batch that has them)."""
        sites = [[site.layer, site.query, site.key] for site in self.sites]
        computed = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "latentcode_version": _package_version(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model_dtype": self.metadata.get("model_dtype", "float32"),
            "selector": self.metadata.get("selector", {"name": "explicit", "sites": sites}),
            "splits": [],
            "n_heads": self.n_heads,
            "file_id": os.urandom(16).hex(),
        }
        for attribute in ROOT_ATTRIBUTES:  # the rest from `metadata`, each its type's empty value where absent
            name, kind = attribute.name, attribute.type
            if name in SHARDED_ONLY:
                continue
            if name in computed:
                value = computed[name]
            elif kind.json is list:
                value = list(self.metadata.get(name) or [])
            else:
                value = self.metadata.get(name, {} if kind.json is dict else "")
            self.file.attrs[name] = kind.encode(value)
        for group in GROUPS:
            self.file.create_group(group.path)
            if group is not CODES_GROUP:
                continue
            for site in self.sites:
                dataset = self._create(self.file[group.path], site.name, (self.heads_of[site],), CODES.dtype.written)
                for attribute in CODES.attributes:  # layer, query, key
                    dataset.attrs[attribute.name] = attribute.type.encode(getattr(site, attribute.name))
        self.file.create_dataset(
            SPLIT.name, shape=(0,), maxshape=(None,), dtype=SPLIT.dtype.written, chunks=(_CHUNK_ROWS,),
            **self._filters(shuffle=False),
        )

    def _filters(self, shuffle: bool = True) -> dict[str, Any]:
        if self.compression is None:
            return {}
        level = {"compression_opts": _GZIP_LEVEL} if self.compression == "gzip" else {}
        return {"compression": self.compression, "shuffle": shuffle, **level}

    def _create(self, group: h5py.Group, name: str, row_shape: tuple[int, ...], dtype) -> h5py.Dataset:
        return group.create_dataset(
            name, shape=(0, *row_shape), maxshape=(None, *row_shape), dtype=dtype,
            chunks=(min(_CHUNK_ROWS, max(1, 2**18 // max(1, int(np.prod(row_shape))))), *row_shape),
            **self._filters(),
        )

    # -- writing -------------------------------------------------------------------------------
    def append(
        self,
        codes: Mapping[Site | str, np.ndarray],
        labels: Mapping[str, np.ndarray] | None = None,
        split: str | Sequence[str] = "",
        prediction: np.ndarray | None = None,
        target: np.ndarray | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Append one batch: `codes[site]` `[B, H]` for every site, and `[B, ...]` per-example arrays."""
        if getattr(self, "file", None) is None:
            raise CodeFileError(f"the CodeWriter of {self.path} is closed; open a new one with append=True to add rows")
        codes, batch_size = self._checked_codes(codes)
        arrays = _per_example_arrays(labels, extra, prediction, target, batch_size)
        splits = _split_names(split, batch_size)
        if self._n_rows:
            self._check_same_per_example_arrays(arrays)
        for name, array in codes.items():
            _warn_if_not_finite(name, array, batch_size)
            self._queue(f"{CODES.group}/{name}", array.astype(CODES.dtype.written, copy=False))
        for name, array in arrays.items():
            if name not in self.file:
                self._create_per_example(name, array)
            dataset = self.file[name]
            if dataset.shape[1:] != array.shape[1:]:
                raise CodeFileError(
                    f"{name} has rows of shape {list(array.shape[1:])}; the file holds {list(dataset.shape[1:])}"
                )
            self._queue(name, array)
        self._queue(SPLIT.name, np.asarray(splits, dtype=object))
        known = json.loads(self.file.attrs["splits"])  # in order of first appearance
        self.file.attrs["splits"] = json.dumps(list(dict.fromkeys(known + splits)))
        self._splits_written = list(dict.fromkeys(self._splits_written + splits))
        self.n_appended += batch_size
        self._n_rows += batch_size
        self._pending_rows += batch_size
        if self._pending_rows >= _FLUSH_ROWS or self._pending_bytes >= _FLUSH_BYTES:
            self.flush()

    def _checked_codes(self, codes: Mapping[Site | str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """The batch's codes by site name, each `[B, H]` with the site's H; and B."""
        codes = {site.name if isinstance(site, Site) else site: np.asarray(array) for site, array in codes.items()}
        expected_names = [site.name for site in self.sites]
        missing = sorted(set(expected_names) - set(codes))
        unexpected = sorted(set(codes) - set(expected_names))
        if missing or unexpected:
            raise CodeFileError(f"codes for sites {missing} are missing and {unexpected} are not in the file")
        batch_size = len(codes[expected_names[0]])
        for site in self.sites:
            array = codes[site.name]
            if array.shape != (batch_size, self.heads_of[site]):
                raise CodeFileError(
                    f"codes of site {site.name} have shape {list(array.shape)}; expected "
                    f"[{batch_size}, {self.heads_of[site]}] (batch, heads)"
                )
        return codes, batch_size

    def _create_per_example(self, name: str, array: np.ndarray) -> None:
        """The dataset of a per-example array first seen in this batch, with its schema attributes."""
        group, _, leaf = name.rpartition("/")
        dataset = self._create(self.file[group] if group else self.file, leaf, array.shape[1:], array.dtype)
        if group == LABELS.group:
            for attribute in LABELS.attributes:  # value_names, column_names: where the task names them
                names = self.metadata.get(attribute.name, {}).get(leaf)
                if names is not None:
                    dataset.attrs[attribute.name] = attribute.type.encode(list(names))
        if name == PREDICTION.name:
            for attribute in PREDICTION.attributes:  # kind: the root attribute prediction_kind
                dataset.attrs[attribute.name] = attribute.type.encode(self.file.attrs.get("prediction_kind", ""))

    def write_compact(self, name: str, rows: np.ndarray, attributes: Mapping[str, Any] | None = None) -> None:
        """Rows of /compact/`name` (`latentcode.store.compact`) for the next batch, before its `append`:
        written at once, so that one layer's queries and keys at a time are in memory."""
        with failed_writes(self.path):
            write_compact_rows(self.file, name, self._n_rows, np.asarray(rows), self._filters(), dict(attributes or {}))

    def _queue(self, name: str, rows: np.ndarray) -> None:
        self._pending.setdefault(name, []).append(rows)
        self._pending_bytes += rows.nbytes if rows.dtype != object else 8 * len(rows)

    def flush(self) -> None:
        """Write the rows waiting in memory into the (temporary) file."""
        with failed_writes(self.path):  # no space left, said once
            for name, blocks in self._pending.items():
                # Datasets stay open until the file closes: one closed by the garbage collector when
                # its cached chunks cannot be written (a full disk) stays half-open in HDF5 for good.
                if name not in self._open_datasets:
                    self._open_datasets[name] = self.file[name]
                dataset = self._open_datasets[name]
                n = dataset.shape[0]
                dataset.resize(n + sum(map(len, blocks)), axis=0)
                dataset[n:] = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        self._pending, self._pending_rows, self._pending_bytes = {}, 0, 0

    def _check_same_per_example_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        stored = {f"{group}/{name}" for group in (LABELS.group, EXTRA.group) for name in self.file[group]}
        stored |= {name for name in (PREDICTION.name, TARGET.name) if name in self.file}
        if stored != set(arrays):
            raise CodeFileError(
                f"the file holds per-example arrays {sorted(stored)} but this batch has {sorted(arrays)}; "
                "every batch needs the same labels, prediction, target and extras"
            )

    # -- finishing -----------------------------------------------------------------------------
    def close(self) -> Path:
        """Finish the file, move it under its final name and let the next writer in."""
        if self._closed:
            return self.path
        try:
            self.flush()
            check_compact(self.path, self.file, from_json(self.file.attrs.get("compact", "{}")) or {}, self._n_rows)
            with failed_writes(self.path):  # one /provenance entry for this write: its rows, splits and seed
                record_provenance(self.file, self.metadata, self._first_row, self._n_rows, self._splits_written,
                                  self.mode, _package_version())
                # Everything reaches the disk (or fails, e.g. no space left) here: a failed flush
                # leaves the file to be thrown away cleanly; a failed close could not be undone.
                self.file.flush()
            file, self.file = self.file, None  # closed at most once, even if closing fails
            with failed_writes(self.path):
                file.close()
            self._open_datasets = {}
            if self.in_memory:
                self.image = self._buffer.getvalue()
            else:
                check_replaceable(self.path)  # a link planted while we wrote is not replaced either
                os.replace(self.temporary_path, self.path)
        except OSError as error:
            self._discard()
            raise write_error(error, self.path) from None
        except BaseException:
            self._discard()
            raise
        self._closed = True
        if self._lock is not None:
            self._lock.release()
        return self.path

    def abort(self) -> None:
        """Drop everything written by this writer; an existing file under `path` stays as it was."""
        if not self._closed:
            self._discard()

    def _discard(self) -> None:
        self._closed = True
        try:
            file = getattr(self, "file", None)
            temporary = getattr(self, "temporary_path", None)
            if file is not None:
                write_nowhere(file)
                try:
                    with failed_writes(self.path):
                        file.close()
                except Exception:  # noqa: BLE001 - the file is being thrown away
                    pass
                self.file = None
                self.__dict__.pop("_open_datasets", None)
            if temporary is not None:
                temporary.unlink(missing_ok=True)
        finally:
            if getattr(self, "_lock", None) is not None:
                self._lock.release()

    def __enter__(self) -> CodeWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _per_example_arrays(labels: Mapping[str, np.ndarray] | None, extra: Mapping[str, np.ndarray] | None,
                        prediction: np.ndarray | None, target: np.ndarray | None,
                        batch_size: int) -> dict[str, np.ndarray]:
    """The batch's labels, extras, prediction and target by dataset name, each numeric with B rows."""
    arrays: dict[str, np.ndarray] = {f"{LABELS.group}/{k}": np.asarray(v) for k, v in (labels or {}).items()}
    arrays |= {f"{EXTRA.group}/{k}": np.asarray(v) for k, v in (extra or {}).items()}
    if prediction is not None:
        arrays[PREDICTION.name] = np.asarray(prediction, dtype=PREDICTION.dtype.written)
    if target is not None:
        arrays[TARGET.name] = np.asarray(target)
    for name, array in arrays.items():
        if len(array) != batch_size:
            raise CodeFileError(
                f"{name} has {len(array)} rows but the codes have {batch_size}: every per-example "
                "array needs one row per example"
            )
        if array.dtype.kind not in "biuf":
            raise CodeFileError(f"{name} has dtype {array.dtype}; only numeric arrays can be stored")
    return arrays


def _split_names(split: str | Sequence[str], batch_size: int) -> list[str]:
    """One split name per example: `split` for all of them, or one each."""
    splits = [split] * batch_size if isinstance(split, str) else list(split) if isinstance(split, Iterable) else [split]
    if not all(isinstance(name, str) for name in splits):  # e.g. 3: h5py would store it, readers then fail
        raise CodeFileError(f"split names are text, got {split!r}; give a name such as 'train' (or one per example)")
    if len(splits) != batch_size:
        raise CodeFileError(f"split has {len(splits)} entries but the codes have {batch_size}")
    return splits


def _warn_if_not_finite(site_name: str, codes: np.ndarray, batch_size: int) -> None:
    bad = ~np.isfinite(codes)
    if bad.any():
        warnings.warn(
            f"{int(bad.any(axis=1).sum())} of {batch_size} latent codes at site {site_name} contain NaN or inf "
            f"({int(bad.sum())} values); they are stored as they are",
            RuntimeWarning, stacklevel=3,  # the caller of CodeWriter.append
        )
