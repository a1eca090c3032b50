"""The HDF5 file of latent codes: schema, streaming atomic writer and reader (h5py and numpy only).

Schema (version 1), readable with h5py alone::

    /                         attributes
        format                "latentcode-codes"
        schema_version        1
        latentcode_version    version of the package that wrote the file
        created               ISO 8601 UTC time of the first write
        model_name            short name for titles and tables, e.g. "hyla"
        model_config          JSON: the model's configuration (ModelConfig.to_dict() for our models)
        checkpoint_sha256     SHA-256 of the weights file the codes came from ("" if none)
        task_config           JSON: the task's configuration (Task.config()), "{}" if none
        selector              JSON: {"name": ..., "sites": [[layer, query, key], ...]}
        score                 "pattern" (normalized latent codes, default) or "scores" (raw, before normalization)
        source                where codes came from: "latentcode", "transformer_lens", "torch", ...
        seed                  the sample seed of the first write (every write's seed: /provenance)
        splits                JSON list of the split names present, in order of first appearance
        n_heads               H, the length of a latent code (0 when sites differ: then each
                              codes dataset's width is its own H, e.g. layers with different heads)
        task_analysis         JSON: what the task's analysis uses (Task.analysis): selector, variant,
                              probe_label, picture_label, headline_metric; "{}" if unknown
        prediction_kind       what /prediction holds: "logits", "regression output" or ""
        attention_layers      JSON list, one entry per attention layer the source read, where known:
                              {"name", "kind" ("self" or "cross"), "queries", "keys"} (the lengths of
                              the query and key axes; a cross-attention layer's queries index the
                              decoder, its keys the encoder); "[]" if unknown
        split_descriptions    JSON: split name -> what it holds, in words (Task.split_descriptions);
                              "{}" if unknown
        shards                only in a sharded file (below): JSON list of {"file", "rows"}: each
                              shard's file name (beside this file) and the rows [start, stop) it holds
    /codes/<site>             float32 [N, H]: one dataset per site, named "l{layer}_q{query}_k{key}"
                              (positions absolute, counted from 0); attributes layer, query, key
    /labels/<name>            [N, ...]: one dataset per task label (numeric); attributes, where the
                              task names them: value_names (JSON list: the name of each integer
                              value, e.g. the SRAVEN rules) and column_names (JSON list: the name of
                              each column of a multi-column label, e.g. the terms of term_present)
    /prediction               [N, ...] float32: the model's output at the prediction positions (optional);
                              attribute kind, as prediction_kind
    /target                   [N, ...]: the task's target (optional)
    /split                    [N] UTF-8 strings: the split of each example
    /extra/<name>             [N, ...]: any further per-example arrays the caller passed
    /provenance               [W] UTF-8 strings: one JSON object per write (the first and each
                              append), in order: rows [start, stop), splits, seed, mode ("new",
                              "overwrite", "append"), written (UTC time), latentcode_version,
                              source, score and the selector without its sites. Absent in files
                              written before it existed: there the root seed covers every row.

All per-example datasets are chunked along N, compressed and resizable; examples are appended in
batches, so a file of a million examples is never held in memory. Every per-example dataset has
the same length N. Compression (`compression=`): "gzip" (default, with byte shuffling: deflate is
part of every HDF5 build, so h5dump, HDFView, netCDF, MATLAB, R and Julia read the file), "lzf"
(somewhat faster, but only h5py ships its filter) or "none". An appended file keeps its own.

A codes file refers to nothing outside itself: the reader refuses external links, virtual datasets
with sources in other files and datasets stored in external raw files, which h5py would otherwise
follow silently (`CodeFile(path, allow_external=True)` reads such a file anyway). The one exception
is a sharded file: `write_sharded_file` (a sharded extraction, one shard per process) writes a file
whose per-example datasets and /split are virtual datasets over the rows of shard files beside it,
named `NAME.shard-RANK-of-WORLD.h5`, listed in its root attribute `shards`; everything else (groups,
attributes, /provenance) is its own, as in any codes file. The reader follows virtual sources only
into the listed shards, and checks at open that each is a regular file beside it (not a link) with
the rows the list says: HDF5 would read a missing shard as fill values without a word. Move the
shards with the file. A sharded file cannot be appended to.

Writers: one at a time. `CodeWriter` holds the lock `.NAME.lock` beside the file (see
`latentcode.files`) from before it looks at the file until its final rename; a second writer is
refused naming the first (pid, host, since when), or waits `wait_for_lock` seconds if asked.
Atomicity: the writer writes to a temporary file `.NAME.<random>.tmp` next to the target and
renames it over the target only when closed without error. An interrupted extraction leaves no
file under the final name, and when appending, the previous file stays intact (the temporary file
starts as its copy); temporary files of killed writers are removed by the next writer. A new file
gets the mode the process umask gives; an appended or overwritten file keeps its mode. A target
that is a symbolic link (dangling or not), a directory, a device or a FIFO is refused, never
written through or replaced; a full disk is one `WriteError` and leaves nothing behind.

Reading: `CodeFile` checks the structure at open (the groups and datasets above, their ranks,
dtypes and row counts, the JSON attributes and their types) and refuses a file that differs with
one `CodeFileError` naming the dataset or attribute.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import stat
import sys
import traceback
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from latentcode.errors import LatentcodeError
from latentcode.files import (
    ExclusiveLock,
    check_replaceable,
    kind_of,
    new_temporary_file,
    remove_dead_temporaries,
    write_error,
)

FORMAT = "latentcode-codes"
SCHEMA_VERSION = 1
SCORE_KINDS = ("pattern", "scores")
COMPRESSIONS = ("gzip", "lzf", "none")
DEFAULT_COMPRESSION = "gzip"
# Deflate level 1: writing the SRAVEN benchmark's 8192 examples took 0.43 s (lzf 0.38 s, level 4
# 0.47 s) for 3.80 MiB (lzf 4.17, level 4 3.77); higher levels buy almost nothing on float codes.
_GZIP_LEVEL = 1
_SITE_NAME = re.compile(r"^l(\d+)_q(\d+)_k(\d+)$")
_CHUNK_ROWS = 1024
_FLUSH_ROWS = 4096
_FLUSH_BYTES = 64 * 2**20


class CodeFileError(LatentcodeError, ValueError):
    """A codes file that cannot be read, or that cannot take the data offered; says why."""


@dataclass(frozen=True, order=True)
class Site:
    """A (layer, query position, key position) choice; positions absolute (0-based) once recorded."""

    layer: int
    query: int
    key: int

    @property
    def name(self) -> str:
        return f"l{self.layer}_q{self.query}_k{self.key}"

    @classmethod
    def from_name(cls, name: str) -> Site:
        match = _SITE_NAME.match(name)
        if not match:
            raise CodeFileError(f"{name!r} is not a site name; expected 'l<layer>_q<query>_k<key>'")
        return cls(*(int(group) for group in match.groups()))

    def __str__(self) -> str:
        return f"(layer {self.layer}, query {self.query}, key {self.key})"


def _package_version() -> str:
    from latentcode import __version__

    return __version__


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _from_json(text: Any) -> Any:
    """An attribute written by `_json`: JSON where it parses, else the string itself."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def check_compression(compression: str | None) -> str | None:
    """The h5py filter name for a `compression` choice ("gzip", "lzf", "none" or None)."""
    if compression is None or compression == "none":
        return None
    if compression not in COMPRESSIONS:
        raise CodeFileError(f"compression must be one of {list(COMPRESSIONS)}, got {compression!r}")
    return compression


def _compression_of(dataset: h5py.Dataset) -> str | None:
    return dataset.compression if dataset.compression in COMPRESSIONS else None


def references_outside(file: h5py.File) -> list[str]:
    """What in `file` points into other files: external links, virtual datasets with sources
    elsewhere, datasets stored in external raw files; walked without following any of them."""
    found: list[str] = []
    seen: set = set()
    shards = set(_declared_shard_names(file))  # a sharded file's own shards are not outside it

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


def _write_nowhere(file: h5py.File) -> None:
    """Point an open file that is being thrown away at an anonymous file in memory, so that closing
    it succeeds whatever HDF5 still has to write (on a full disk, its cached chunks: a close that
    fails leaves HDF5's objects open, and the next h5py call crashes the interpreter, SIGSEGV)."""
    try:
        if not file.id.valid or not hasattr(os, "memfd_create"):
            return
        handle = file.id.get_vfd_handle()
        null = os.memfd_create("latentcode-discarded")  # sparse: extending it costs nothing
    except Exception:  # noqa: BLE001 - another driver, or no handle: close as it is
        return
    try:
        os.dup2(null, handle)
    finally:
        os.close(null)


@contextlib.contextmanager
def _failed_writes(path: Path):
    """Raise a WriteError for writes HDF5 could not do: on a full disk h5py reports most of them only
    while freeing its objects, as 'Exception ignored' tracebacks on stderr, and carries on."""
    failures: list[BaseException] = []
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if "h5py" in repr(unraisable.object) and isinstance(unraisable.exc_value, (OSError, RuntimeError)):
            failures.append(unraisable.exc_value)
        else:
            previous(unraisable)

    def print_hook(kind, value, trace) -> None:  # Cython prints the traceback first, through excepthook
        frame = trace
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        if frame is not None and "h5py" in frame.tb_frame.f_code.co_filename:
            return
        previous_print(kind, value, trace)

    previous_print = sys.excepthook
    sys.unraisablehook, sys.excepthook = hook, print_hook
    try:
        yield
    except (OSError, RuntimeError) as error:
        if isinstance(error, LatentcodeError) or (isinstance(error, OSError) and error.errno is None
                                                   and "write" not in str(error)):
            raise
        # Let go of the h5py objects the failed frames hold, now, while the file is open: freed
        # after it is closed (kept alive by the traceback), HDF5 crashes the interpreter (SIGSEGV).
        traceback.clear_frames(error.__traceback__)
        failures.append(error)
    finally:
        sys.unraisablehook, sys.excepthook = previous, previous_print
    if failures:
        failure = write_error(failures[0], path)
        failures.clear()
        raise failure


class CodeWriter:
    """Stream latent codes and their labels into a codes file, atomically.

    >>> with CodeWriter("codes.h5", sites, n_heads=16, metadata={...}) as writer:
    ...     for batch in batches:
    ...         writer.append(codes={site: array [B, H]}, labels={...}, split="ood", ...)

    `metadata` fills the root attributes (see the module docstring; `model_name`, `model_config`,
    `checkpoint_sha256`, `task_config`, `selector`, `score`, `source`, `seed`). With
    `append=True` an existing file is extended if its schema is compatible (same sites, heads,
    score, labels, model, checkpoint and task), otherwise refused with the reasons; with
    `append=False` an existing file is refused (nothing already written is overwritten) unless
    `overwrite=True`. `compression`: "gzip" (default), "lzf" or "none" (None) for a new file.
    The writer holds the file's lock from construction to `close`/`abort`; another writer holding
    it raises `LockHeld` at once, or after `wait_for_lock` seconds (None: wait as long as it takes).
    """

    def __init__(
        self,
        path: str | Path,
        sites: Sequence[Site],
        n_heads: int | Mapping[Site, int],
        metadata: Mapping[str, Any] | None = None,
        *,
        append: bool = False,
        overwrite: bool = False,
        compression: str | None = DEFAULT_COMPRESSION,
        wait_for_lock: float | None = 0.0,
    ):
        self.path = Path(path)
        self.sites = sorted(dict.fromkeys(sites))
        if not self.sites:
            raise CodeFileError("no sites to record")
        negative = [site for site in self.sites if min(site.layer, site.query, site.key) < 0]
        if negative:  # the reader could not open the file: site names hold non-negative numbers
            raise CodeFileError(f"site {negative[0]} has a negative layer or position; a codes file records "
                                "layers and absolute positions counted from 0")
        if isinstance(n_heads, Mapping):
            self.heads_of = {site: int(n_heads[site]) for site in self.sites}
        else:
            self.heads_of = {site: int(n_heads) for site in self.sites}
        widths = set(self.heads_of.values())
        self.n_heads = widths.pop() if len(widths) == 1 else 0
        self.compression = check_compression(compression)
        self.metadata = dict(metadata or {})
        score = self.metadata.setdefault("score", "pattern")
        if score not in SCORE_KINDS:
            raise CodeFileError(f"score must be one of {SCORE_KINDS}, got {score!r}")
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
            self.mode = "append" if append and exists else "overwrite" if exists else "new"
            remove_dead_temporaries(self.path)
            self.temporary_path = new_temporary_file(self.path)
            if exists:  # the rename must not change who may read the file
                os.chmod(self.temporary_path, stat.S_IMODE(os.stat(self.path).st_mode))
            if self.mode == "append":
                shutil.copyfile(self.path, self.temporary_path)
                self.file = h5py.File(self.temporary_path, "r+")
                self._check_compatible()
                self.compression = _compression_of(self.file["codes"][self.sites[0].name])
            else:
                self.file = h5py.File(self.temporary_path, "w")
                self._initialize()
        except OSError as error:
            self._discard()
            if error.errno is None or isinstance(error, LatentcodeError):
                raise  # h5py's own OSErrors (a damaged file) carry no errno and say what they mean
            raise write_error(error, self.path) from None
        except BaseException:
            self._discard()
            raise
        self.n_appended = 0
        self._first_row = len(self.file["split"])
        self._splits_written: list[str] = []
        # Rows wait in memory and go to HDF5 in blocks: one h5py write per dataset per block,
        # not per batch (with many sites, per-call overhead otherwise dominates).
        self._pending: dict[str, list[np.ndarray]] = {}
        self._open_datasets: dict[str, h5py.Dataset] = {}
        self._pending_rows = 0
        self._pending_bytes = 0
        self._n_rows = self._first_row

    # -- setup ---------------------------------------------------------------------------------
    def _initialize(self) -> None:
        attrs = self.file.attrs
        attrs["format"] = FORMAT
        attrs["schema_version"] = SCHEMA_VERSION
        attrs["latentcode_version"] = _package_version()
        attrs["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        attrs["model_name"] = str(self.metadata.get("model_name", ""))
        attrs["model_config"] = _json(self.metadata.get("model_config", {}))
        attrs["checkpoint_sha256"] = str(self.metadata.get("checkpoint_sha256", ""))
        attrs["task_config"] = _json(self.metadata.get("task_config", {}))
        attrs["selector"] = _json(
            self.metadata.get("selector", {"name": "explicit", "sites": [[s.layer, s.query, s.key] for s in self.sites]})
        )
        attrs["score"] = self.metadata["score"]
        attrs["source"] = str(self.metadata.get("source", ""))
        attrs["seed"] = _json(self.metadata.get("seed", ""))
        attrs["splits"] = "[]"
        attrs["n_heads"] = self.n_heads
        attrs["task_analysis"] = _json(self.metadata.get("task_analysis", {}))
        attrs["prediction_kind"] = str(self.metadata.get("prediction_kind", ""))
        attrs["attention_layers"] = _json(list(self.metadata.get("attention_layers") or []))
        attrs["split_descriptions"] = _json(self.metadata.get("split_descriptions", {}))
        codes = self.file.create_group("codes")
        for site in self.sites:
            dataset = self._create(codes, site.name, (self.heads_of[site],), np.float32)
            dataset.attrs["layer"], dataset.attrs["query"], dataset.attrs["key"] = site.layer, site.query, site.key
        self.file.create_group("labels")
        self.file.create_group("extra")
        self.file.create_dataset(
            "split", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype(), chunks=(_CHUNK_ROWS,),
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

    def _check_compatible(self) -> None:
        attrs = self.file.attrs
        problems = []
        if attrs.get("format") != FORMAT:
            raise CodeFileError(f"cannot append to {self.path}: it is not a latentcode codes file")
        outside = references_outside(self.file)
        if outside:
            raise CodeFileError(f"cannot append to {self.path}: it refers to other files ({'; '.join(outside)})")
        if "shards" in attrs:
            raise CodeFileError(f"cannot append to {self.path}: it is a sharded file (virtual datasets over "
                                f"{len(_declared_shard_names(self.file))} shard files); extract into a new file")
        if int(attrs.get("schema_version", -1)) != SCHEMA_VERSION:
            problems.append(f"schema version {attrs.get('schema_version')} (this writer: {SCHEMA_VERSION})")
        existing_sites = sorted(Site.from_name(name) for name in self.file["codes"])
        if existing_sites != self.sites:
            problems.append(
                f"sites differ: file has {[s.name for s in existing_sites]}, new data has {[s.name for s in self.sites]}"
            )
        existing_heads = {Site.from_name(name): self.file["codes"][name].shape[1] for name in self.file["codes"]}
        if existing_sites == self.sites and existing_heads != self.heads_of:
            problems.append(f"n_heads: file {int(attrs['n_heads']) or existing_heads}, new data {self.n_heads or self.heads_of}")
        for key in ("score", "checkpoint_sha256", "model_config", "task_config"):
            if key not in self.metadata:
                continue
            new = self.metadata[key] if key in ("score", "checkpoint_sha256") else _json(self.metadata[key])
            old = attrs[key]
            if key.endswith("config"):
                old, new = json.loads(old or "{}"), json.loads(new or "{}")
            if old != new:
                problems.append(f"{key}: file {old!r}, new data {new!r}")
        if problems:
            raise CodeFileError(f"cannot append to {self.path}: incompatible schema: " + "; ".join(problems))

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
        arrays: dict[str, np.ndarray] = {f"labels/{k}": np.asarray(v) for k, v in (labels or {}).items()}
        arrays |= {f"extra/{k}": np.asarray(v) for k, v in (extra or {}).items()}
        if prediction is not None:
            arrays["prediction"] = np.asarray(prediction, dtype=np.float32)
        if target is not None:
            arrays["target"] = np.asarray(target)
        for name, array in arrays.items():
            if len(array) != batch_size:
                raise CodeFileError(
                    f"{name} has {len(array)} rows but the codes have {batch_size}: every per-example "
                    "array needs one row per example"
                )
            if array.dtype.kind not in "biuf":
                raise CodeFileError(f"{name} has dtype {array.dtype}; only numeric arrays can be stored")
        splits = [split] * batch_size if isinstance(split, str) else list(split)
        if len(splits) != batch_size:
            raise CodeFileError(f"split has {len(splits)} entries but the codes have {batch_size}")

        existing = {name for name in arrays if name in self.file}
        if self._n_rows:
            self._check_same_per_example_arrays(arrays)
        for name, array in codes.items():
            bad = ~np.isfinite(array)
            if bad.any():
                warnings.warn(
                    f"{int(bad.any(axis=1).sum())} of {batch_size} latent codes at site {name} contain NaN or inf "
                    f"({int(bad.sum())} values); they are stored as they are",
                    RuntimeWarning, stacklevel=2,
                )
            self._queue(f"codes/{name}", array.astype(np.float32, copy=False))
        for name, array in arrays.items():
            if name not in existing:
                group, _, leaf = name.rpartition("/")
                dataset = self._create(self.file[group] if group else self.file, leaf, array.shape[1:], array.dtype)
                if group == "labels":
                    for kind in ("value_names", "column_names"):
                        names = self.metadata.get(kind, {}).get(leaf)
                        if names is not None:
                            dataset.attrs[kind] = _json(list(names))
                if name == "prediction":
                    dataset.attrs["kind"] = str(self.file.attrs.get("prediction_kind", ""))
            dataset = self.file[name]
            if dataset.shape[1:] != array.shape[1:]:
                raise CodeFileError(
                    f"{name} has rows of shape {list(array.shape[1:])}; the file holds {list(dataset.shape[1:])}"
                )
            self._queue(name, array)
        self._queue("split", np.asarray(splits, dtype=object))
        known = json.loads(self.file.attrs["splits"])
        for name in dict.fromkeys(splits):
            if name not in known:
                known.append(name)
            if name not in self._splits_written:
                self._splits_written.append(name)
        self.file.attrs["splits"] = json.dumps(known)
        self.n_appended += batch_size
        self._n_rows += batch_size
        self._pending_rows += batch_size
        if self._pending_rows >= _FLUSH_ROWS or self._pending_bytes >= _FLUSH_BYTES:
            self.flush()

    def _queue(self, name: str, rows: np.ndarray) -> None:
        self._pending.setdefault(name, []).append(rows)
        self._pending_bytes += rows.nbytes if rows.dtype != object else 8 * len(rows)

    def flush(self) -> None:
        """Write the rows waiting in memory into the (temporary) file."""
        with _failed_writes(self.path):  # no space left, said once
            for name, blocks in self._pending.items():
                # Datasets stay open until the file closes: one closed by the garbage collector when
                # its cached chunks cannot be written (a full disk) stays half-open in HDF5 for good.
                if name not in self._open_datasets:
                    self._open_datasets[name] = self.file[name]
                self._extend(self._open_datasets[name], blocks[0] if len(blocks) == 1 else np.concatenate(blocks))
        self._pending, self._pending_rows, self._pending_bytes = {}, 0, 0

    def _check_same_per_example_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        def per_example(group: str) -> set[str]:
            return {f"{group}/{name}" for name in self.file[group]}

        stored = per_example("labels") | per_example("extra") | {n for n in ("prediction", "target") if n in self.file}
        if stored != set(arrays):
            raise CodeFileError(
                f"the file holds per-example arrays {sorted(stored)} but this batch has {sorted(arrays)}; "
                "every batch needs the same labels, prediction, target and extras"
            )

    @staticmethod
    def _extend(dataset: h5py.Dataset, rows: np.ndarray) -> None:
        n = dataset.shape[0]
        dataset.resize(n + len(rows), axis=0)
        dataset[n:] = rows

    # -- finishing -----------------------------------------------------------------------------
    def close(self) -> Path:
        """Finish the file, move it under its final name and let the next writer in."""
        if self._closed:
            return self.path
        try:
            self.flush()
            with _failed_writes(self.path):
                self._record_provenance()
                # Everything reaches the disk (or fails, e.g. no space left) here: a failed flush
                # leaves the file to be thrown away cleanly; a failed close could not be undone.
                self.file.flush()
            file, self.file = self.file, None  # closed at most once, even if closing fails
            with _failed_writes(self.path):
                file.close()
            self._open_datasets = {}
            check_replaceable(self.path)  # a link planted while we wrote is not replaced either
            os.replace(self.temporary_path, self.path)
        except OSError as error:
            self._discard()
            raise write_error(error, self.path) from None
        except BaseException:
            self._discard()
            raise
        self._closed = True
        self._lock.release()
        return self.path

    def abort(self) -> None:
        """Drop everything written by this writer; an existing file under `path` stays as it was."""
        if not self._closed:
            self._discard()

    def _record_provenance(self) -> None:
        """One /provenance entry for this write: which rows, which splits, from which seed."""
        if "provenance" not in self.file:
            self.file.create_dataset("provenance", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype(),
                                     chunks=(64,))
            if self._first_row:  # a file from before /provenance: its rows came from the root seed
                attrs = self.file.attrs
                self._extend(self.file["provenance"], np.asarray([_json({
                    "rows": [0, self._first_row], "splits": json.loads(attrs["splits"]),
                    "seed": _from_json(attrs.get("seed", "")), "mode": "new", "written": attrs.get("created", ""),
                    "latentcode_version": attrs.get("latentcode_version", ""), "reconstructed": True,
                })], dtype=object))
        selector = self.metadata.get("selector", {})
        if isinstance(selector, str):
            selector = json.loads(selector or "{}")
        if not isinstance(selector, dict):
            selector = {"spec": selector}
        seed = self.metadata.get("seed", "")
        entry = {
            "rows": [self._first_row, self._n_rows],
            "splits": self._splits_written,
            "seed": seed.item() if isinstance(seed, np.generic) else seed,
            "mode": self.mode,
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "latentcode_version": _package_version(),
            "source": str(self.metadata.get("source", "")),
            "score": self.metadata["score"],
            "selector": {key: value for key, value in selector.items() if key != "sites"},
        }
        self._extend(self.file["provenance"], np.asarray([_json(entry)], dtype=object))

    def _discard(self) -> None:
        self._closed = True
        try:
            file = getattr(self, "file", None)
            temporary = getattr(self, "temporary_path", None)
            if file is not None:
                _write_nowhere(file)
                try:
                    with _failed_writes(self.path):
                        file.close()
                except Exception:  # noqa: BLE001 - the file is being thrown away
                    pass
                self.file = None
                self.__dict__.pop("_open_datasets", None)
            if temporary is not None:
                temporary.unlink(missing_ok=True)
        finally:
            self._lock.release()

    def __enter__(self) -> CodeWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


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


# Root attributes the reader parses, and what each must be; a file that fails is refused naming
# the attribute, not with a bare JSON or key error.
_JSON_ATTRIBUTES = ("model_config", "task_config", "selector", "splits")
_LABEL_JSON_ATTRIBUTES = ("value_names", "column_names")


def checked_attributes(path: Path, file: h5py.File) -> dict[str, Any]:
    """The root attributes of an open codes file as Python values, after checking that those the
    reader parses are there and well formed (and the label attributes it parses)."""
    attrs = {key: (value.item() if isinstance(value, np.generic) else value) for key, value in file.attrs.items()}
    for group in ("codes", "labels", "extra", "split"):
        if group not in file:
            raise CodeFileError(f"{path} has no /{group}; a latentcode codes file has /codes, /labels, /extra and /split")
        expected = h5py.Dataset if group == "split" else h5py.Group
        if not isinstance(file[group], expected):
            raise CodeFileError(f"{path}: /{group} is {_kind(file[group])}; expected "
                                f"{'a dataset' if group == 'split' else 'a group'}")
    for name in file["labels"]:
        if not isinstance(file["labels"][name], h5py.Dataset):
            raise CodeFileError(f"{path}: /labels/{name} is {_kind(file['labels'][name])}; expected a dataset")
    for name in ("n_heads", *_JSON_ATTRIBUTES):
        if name not in attrs:
            raise CodeFileError(f"{path} lacks the root attribute {name!r} that every codes file has")
    try:
        int(attrs["n_heads"])
    except (TypeError, ValueError):
        raise CodeFileError(f"{path}: root attribute 'n_heads' is {attrs['n_heads']!r}; expected an integer") from None
    optional = ("task_analysis", "attention_layers", "split_descriptions")
    places = [(f"root attribute {name!r}", attrs[name]) for name in (*_JSON_ATTRIBUTES, *optional) if name in attrs]
    places += [(f"attribute {kind!r} of /labels/{label}", file["labels"][label].attrs[kind])
               for label in file["labels"] for kind in _LABEL_JSON_ATTRIBUTES if kind in file["labels"][label].attrs]
    for where, text in places:
        try:
            value = json.loads(text or "{}")
        except (TypeError, ValueError) as error:
            raise CodeFileError(f"{path}: {where} is not valid JSON ({error}): {str(text)[:60]!r}") from None
        name = where.split("'")[1]
        expected = _JSON_TYPES[name]
        if text and not isinstance(value, expected):
            raise CodeFileError(f"{path}: {where} holds a JSON {type(value).__name__}; expected a JSON "
                                f"{'object' if expected is dict else 'list'}")
        if name in ("splits", "value_names", "column_names") and not all(
                isinstance(item, str) for item in value):
            raise CodeFileError(f"{path}: {where} must be a JSON list of strings; got {str(text)[:60]!r}")
    return attrs


# What each JSON attribute must hold once parsed.
_JSON_TYPES = {"model_config": dict, "task_config": dict, "selector": dict, "splits": list, "task_analysis": dict,
               "attention_layers": list, "split_descriptions": dict, "value_names": list, "column_names": list}


def _extra_names(file: h5py.File) -> list[str]:
    """The per-example arrays under /extra (groups there, which no writer makes, are not among them)."""
    return sorted(name for name in file["extra"] if isinstance(file["extra"].get(name), h5py.Dataset))


def _kind(item: Any) -> str:
    if isinstance(item, h5py.Group):
        return "a group"
    if isinstance(item, h5py.Dataset):
        return f"a {item.ndim}-D {item.dtype} dataset"
    return type(item).__name__


def checked_datasets(path: Path, file: h5py.File, n_heads: int) -> list[Site]:
    """The sites of an open codes file, after checking the datasets: /codes/<site> 2-D float
    [N, H] datasets with site names, /split 1-D strings, and every per-example dataset N rows."""
    split = file["split"]
    if split.ndim != 1 or h5py.check_string_dtype(split.dtype) is None:
        raise CodeFileError(f"{path}: /split is {_kind(split)}; expected a 1-D dataset of strings")
    n_rows = split.shape[0]
    sites = []
    for name in file["codes"]:
        item = file["codes"][name]
        if not isinstance(item, h5py.Dataset) or item.ndim != 2 or item.dtype.kind != "f":
            raise CodeFileError(f"{path}: /codes/{name} is {_kind(item)}; expected a 2-D float dataset "
                                "[examples, heads]")
        if n_heads and item.shape[1] != n_heads:
            raise CodeFileError(f"{path}: /codes/{name} has {item.shape[1]} heads but the root attribute n_heads "
                                f"says {n_heads}")
        try:
            sites.append(Site.from_name(name))
        except CodeFileError as error:
            raise CodeFileError(f"{path}: /codes/{name}: {error}") from None
    if not sites:
        raise CodeFileError(f"{path}: /codes holds no sites")
    per_example = [f"codes/{name}" for name in file["codes"]]
    per_example += [f"labels/{name}" for name in file["labels"]]
    per_example += [f"extra/{name}" for name in _extra_names(file)]
    per_example += [name for name in ("prediction", "target") if name in file]
    for name in per_example:
        item = file[name]
        if not isinstance(item, h5py.Dataset) or item.ndim < 1:
            raise CodeFileError(f"{path}: /{name} is {_kind(item)}; expected a dataset with one row per example")
        if not name.startswith("codes/") and item.dtype.kind not in "biuf":
            raise CodeFileError(f"{path}: /{name} is {_kind(item)}; expected numbers")
        if item.shape[0] != n_rows:
            raise CodeFileError(f"{path}: /{name} has {item.shape[0]} rows but /split has {n_rows}; every "
                                "per-example dataset has one row per example (a damaged or hand-edited file)")
    return sorted(sites)


def _checked_provenance(path: Path, file: h5py.File) -> list[dict[str, Any]]:
    """The /provenance entries: JSON objects with the rows and splits of each write."""
    if "provenance" not in file:
        return []
    item = file["provenance"]
    if not isinstance(item, h5py.Dataset) or item.ndim != 1 or h5py.check_string_dtype(item.dtype) is None:
        raise CodeFileError(f"{path}: /provenance is {_kind(item)}; expected a 1-D dataset of JSON strings")
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


class CodeFile:
    """Read a codes file: latent codes and labels as numpy arrays, filtered by site and split.

    >>> codes = CodeFile("codes.h5")
    >>> codes.sites, codes.label_names, codes.splits, len(codes)
    >>> codes.codes(Site(1, 35, 35), split="ood")      # [N_ood, H]
    >>> codes.layer_codes(1, split="ood")               # [N_ood, n_sites_of_layer_1 * H]
    >>> codes.labels("query_rule", split="ood")         # [N_ood, M]
    >>> codes.split_seeds                               # {"ood": [seed, ...]}: one per write

    A file that refers to other files (external links, virtual datasets, external storage) is
    refused unless `allow_external=True`: h5py would read those files without a word.
    """

    def __init__(self, path: str | Path, *, allow_external: bool = False):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"no codes file at {self.path}")
        check_readable_hdf5(self.path)
        with h5py.File(self.path, "r") as file:
            outside = [] if allow_external else references_outside(file)
            if outside:
                raise CodeFileError(
                    f"{self.path} refers to other files ({'; '.join(outside)}); a codes file holds its "
                    "data itself: rewrite it, or open it with CodeFile(path, allow_external=True) if you trust them"
                )
            attrs = dict(file.attrs)
            if attrs.get("format") != FORMAT:
                raise CodeFileError(
                    f"{self.path} is an HDF5 file but not a latentcode codes file (format attribute "
                    f"{attrs.get('format')!r}, expected {FORMAT!r})"
                )
            try:
                version = int(attrs.get("schema_version", -1))
            except (TypeError, ValueError):
                version = attrs.get("schema_version")
            if version != SCHEMA_VERSION:
                raise CodeFileError(
                    f"{self.path} has schema version {version!r}; this latentcode reads version {SCHEMA_VERSION}"
                )
            self.attrs = checked_attributes(self.path, file)
            self.shards = checked_shards(self.path, file)
            self.sites = checked_datasets(self.path, file, int(self.attrs["n_heads"]))
            self.heads_of = {site: file["codes"][site.name].shape[1] for site in self.sites}
            self.label_names = sorted(file["labels"])
            self.extra_names = _extra_names(file)
            self.has_prediction = "prediction" in file
            self.has_target = "target" in file
            self._split_of_example = file["split"].asstr()[:].astype(str)
            self.value_names = {name: json.loads(file["labels"][name].attrs["value_names"])
                                for name in self.label_names if "value_names" in file["labels"][name].attrs}
            self.column_names = {name: json.loads(file["labels"][name].attrs["column_names"])
                                 for name in self.label_names if "column_names" in file["labels"][name].attrs}
            self.writes: list[dict[str, Any]] = _checked_provenance(self.path, file)
        self.n_heads = int(self.attrs["n_heads"])
        self.splits = json.loads(self.attrs["splits"])
        self.model_config = json.loads(self.attrs["model_config"] or "{}")
        self.task_config = json.loads(self.attrs["task_config"] or "{}")
        self.selector = json.loads(self.attrs["selector"] or "{}")
        self.task_analysis = json.loads(self.attrs.get("task_analysis") or "{}")
        self.prediction_kind = str(self.attrs.get("prediction_kind", ""))
        self.attention_layers = json.loads(self.attrs.get("attention_layers") or "[]")
        self.split_descriptions = json.loads(self.attrs.get("split_descriptions") or "{}")
        self.model_name = self.attrs.get("model_name") or self.model_config.get("attention", "model")
        if isinstance(self.model_name, list):
            self.model_name = "+".join(self.model_name)
        if not self.writes:  # written before /provenance: one write, from the root seed
            self.writes = [{"rows": [0, len(self)], "splits": list(self.splits),
                            "seed": _from_json(self.attrs.get("seed", "")), "reconstructed": True}]

        unlisted = sorted({str(name) for name in np.unique(self._split_of_example)} - set(self.splits))
        if unlisted:
            raise CodeFileError(f"{self.path}: /split names splits {unlisted[:5]} that the root attribute 'splits' "
                                f"({self.splits}) does not list")

    @property
    def split_seeds(self) -> dict[str, list[Any]]:
        """The sample seed of each write that added examples to a split, in write order (a seed
        listed twice for one split means those examples were drawn twice)."""
        seeds: dict[str, list[Any]] = {split: [] for split in self.splits}
        for write in self.writes:
            for split in write["splits"]:
                seeds.setdefault(split, []).append(write["seed"])
        return seeds

    def __len__(self) -> int:
        return len(self._split_of_example)

    def __repr__(self) -> str:
        return (f"CodeFile({str(self.path)!r}: {len(self)} examples, splits {self.splits}, "
                f"{len(self.sites)} sites, {self.n_heads} heads, labels {self.label_names})")

    @property
    def layers(self) -> list[int]:
        return sorted({site.layer for site in self.sites})

    def sites_of_layer(self, layer: int) -> list[Site]:
        sites = [site for site in self.sites if site.layer == layer]
        if not sites:
            raise CodeFileError(f"{self.path} has no sites in layer {layer}; its layers are {self.layers}")
        return sites

    def split_mask(self, split: str | Iterable[str] | None) -> np.ndarray:
        """Boolean `[N]`: the examples of `split` (a name or several; None: all)."""
        if split is None:
            return np.ones(len(self), dtype=bool)
        wanted = [split] if isinstance(split, str) else list(split)
        unknown = [name for name in wanted if name not in self.splits]
        if unknown:
            raise CodeFileError(f"{self.path} has no split {unknown[0]!r}; its splits are {self.splits}")
        return np.isin(self._split_of_example, wanted)

    def split_of_examples(self, split: str | Iterable[str] | None = None) -> np.ndarray:
        return self._split_of_example[self.split_mask(split)]

    def _read(self, name: str, split) -> np.ndarray:
        mask = self.split_mask(split)
        with h5py.File(self.path, "r") as file:
            if mask.all():
                return file[name][:]
            # Reading whole chunks and masking in memory beats h5py's point selection by far.
            return file[name][:][mask]

    def codes(self, site: Site | str, split: str | Iterable[str] | None = None) -> np.ndarray:
        """float32 `[N, H]`: the latent codes at one site."""
        site = Site.from_name(site) if isinstance(site, str) else site
        if site not in self.sites:
            raise CodeFileError(f"{self.path} has no site {site}; its sites are {[s.name for s in self.sites]}")
        return self._read(f"codes/{site.name}", split)

    def layer_codes(self, layer: int, split: str | Iterable[str] | None = None) -> np.ndarray:
        """float32 `[N, n_sites * H]`: the codes of every site of a layer, concatenated."""
        return np.concatenate([self.codes(site, split) for site in self.sites_of_layer(layer)], axis=1)

    def labels(self, name: str, split: str | Iterable[str] | None = None) -> np.ndarray:
        if name not in self.label_names:
            raise CodeFileError(f"{self.path} has no label {name!r}; its labels are {self.label_names}")
        return self._read(f"labels/{name}", split)

    def extra(self, name: str, split: str | Iterable[str] | None = None) -> np.ndarray:
        if name not in self.extra_names:
            raise CodeFileError(f"{self.path} has no extra array {name!r}; it has {self.extra_names}")
        return self._read(f"extra/{name}", split)

    def prediction(self, split: str | Iterable[str] | None = None) -> np.ndarray:
        if not self.has_prediction:
            raise CodeFileError(f"{self.path} holds no predictions")
        return self._read("prediction", split)

    def target(self, split: str | Iterable[str] | None = None) -> np.ndarray:
        if not self.has_target:
            raise CodeFileError(f"{self.path} holds no targets")
        return self._read("target", split)

    def to_dataframe(self, sites: Sequence[Site | str] | None = None, split: str | Iterable[str] | None = None):
        """A pandas DataFrame, one row per example: `split`, one column per label (multi-column
        labels flattened as `name[i]` / `name[i,j]`), and one column per code entry `<site>.h<head>`."""
        import pandas as pd

        columns: dict[str, np.ndarray] = {"split": self.split_of_examples(split)}

        def add(name: str, values: np.ndarray) -> None:
            if values.ndim == 1:
                columns[name] = values
                return
            flat = values.reshape(len(values), -1)
            for index, column in zip(np.ndindex(values.shape[1:]), flat.T, strict=True):
                columns[f"{name}[{','.join(map(str, index))}]"] = column

        for name in self.label_names:
            add(name, self.labels(name, split))
        for site in sites or self.sites:
            site = Site.from_name(site) if isinstance(site, str) else site
            codes = self.codes(site, split)
            for head in range(self.heads_of[site]):
                columns[f"{site.name}.h{head}"] = codes[:, head]
        return pd.DataFrame(columns)


# -- sharded files -----------------------------------------------------------------------------------
def shard_path(path: str | Path, rank: int, world_size: int) -> Path:
    """Where process `rank` of `world_size` writes its share of `path`: `NAME.shard-RANK-of-WORLD.h5`
    beside it (`codes.h5` -> `codes.shard-0-of-2.h5`)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.shard-{rank}-of-{world_size}{path.suffix or '.h5'}")


def _declared_shard_names(file: h5py.File) -> list[str]:
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
                rows = source["split"].shape[0] if isinstance(source.get("split"), h5py.Dataset) else None
        except OSError as error:
            raise CodeFileError(f"{path}: its shard {shard} is not a readable HDF5 file ({error})") from None
        if rows != stop - start:
            raise CodeFileError(f"{path}: its shard {shard} holds {rows} rows; the file expects {stop - start} "
                                "(a shard replaced since the file was written)")
    return entries


def write_sharded_file(path: str | Path, shards: Sequence[str | Path], *, overwrite: bool = False,
                       wait_for_lock: float | None = 0.0) -> Path:
    """Write `path` as one codes file over the codes files `shards` (beside it, in row order): /split
    and every per-example dataset a virtual dataset over the shards' rows, the root attributes and
    /provenance those of one write, plus `shards`. `CodeFile` reads it as any codes file; the data
    stays in the shards. Written like `CodeWriter` writes: under the lock, atomically."""
    path = Path(path)
    shards = [Path(shard) for shard in shards]
    if not shards:
        raise CodeFileError(f"no shards to combine into {path}")
    for shard in shards:
        if shard.parent.resolve() != path.parent.resolve():
            raise CodeFileError(f"shard {shard} is not beside {path}; a sharded file reads shards from its own directory")
    readers = [CodeFile(shard) for shard in shards]
    same = ("n_heads", "model_config", "checkpoint_sha256", "task_config", "selector", "score", "source", "seed")
    for reader in readers[1:]:
        differ = [key for key in same if reader.attrs.get(key) != readers[0].attrs.get(key)]
        if reader.heads_of != readers[0].heads_of:
            differ.append("sites")
        if (reader.label_names, reader.extra_names, reader.has_prediction, reader.has_target) != (
                readers[0].label_names, readers[0].extra_names, readers[0].has_prediction, readers[0].has_target):
            differ.append("per-example arrays")
        if differ:
            raise CodeFileError(f"shards {shards[0]} and {reader.path} differ in {differ}; the shards of one file "
                                "come from one extraction")
    lock = ExclusiveLock(path, wait=wait_for_lock, purpose="writing latent codes",
                         hint="wait until it has finished or choose another path").acquire()
    temporary = None
    try:
        check_replaceable(path)
        exists = path.exists()
        if exists and not overwrite:
            raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it, or choose another path")
        remove_dead_temporaries(path)
        temporary = new_temporary_file(path)
        if exists:  # the rename must not change who may read the file
            os.chmod(temporary, stat.S_IMODE(os.stat(path).st_mode))
        with contextlib.ExitStack() as stack:
            sources = [stack.enter_context(h5py.File(shard, "r")) for shard in shards]
            out = stack.enter_context(h5py.File(temporary, "w"))
            _write_virtual(out, shards, sources, readers, mode="overwrite" if exists else "new")
        check_replaceable(path)  # a link planted while we wrote is not replaced either
        os.replace(temporary, path)
        temporary = None
    except OSError as error:
        if error.errno is None or isinstance(error, LatentcodeError):
            raise
        raise write_error(error, path) from None
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        lock.release()
    return path


def _write_virtual(out: h5py.File, shards: list[Path], sources: list[h5py.File], readers: list[CodeFile],
                   mode: str) -> None:
    first = sources[0]
    counts = [len(reader) for reader in readers]
    bounds = np.cumsum([0, *counts]).tolist()
    for key, value in first.attrs.items():
        out.attrs[key] = value
    out.attrs["splits"] = json.dumps(list(dict.fromkeys(name for reader in readers for name in reader.splits)))
    out.attrs["shards"] = json.dumps([{"file": shard.name, "rows": [bounds[i], bounds[i + 1]]}
                                      for i, shard in enumerate(shards)])
    for group in ("codes", "labels", "extra"):
        out.create_group(group)
    names = ["split", *(f"codes/{site.name}" for site in readers[0].sites),
             *(f"labels/{label}" for label in readers[0].label_names),
             *(f"extra/{extra}" for extra in readers[0].extra_names),
             *(name for name in ("prediction", "target") if name in first)]
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
    out.create_dataset("provenance", data=np.asarray([_json(entry)], dtype=object), dtype=h5py.string_dtype(),
                       maxshape=(None,), chunks=(64,))
