"""The compact store: latent codes a[h, q, k] of every pair of a layer, rebuilt on demand from what
determines them (per recorded layer, the queries `[N, H, T, d]` and keys `[N, H_kv, T, d]` as the
attention call received them, after RoPE; its scale, mask, softcap and sinks), instead of `[H, T, T]`
per layer and example. numpy and h5py only; float32 throughout.

The arithmetic of a row, as the attention call computes it (sizes and the schema's datasets:
docs/concepts/codes-file.md, `latentcode.store.schema`):

    s[h, q, k] = scale * q[h, q] . k[h // group, k]            (group = H / H_kv)
    s <- softcap * tanh(s / softcap)                          (softcap > 0)
    s[h, q, k] = -inf  where k > q (causal), k <= q - window (window > 0), or key k is padding
    a[h, q, :] = softmax over the keys (and the sink logit of head h, which takes no key)

A row whose keys are all masked gets zeros, as `TorchAttentionSource` records it. `score="scores"`
files give `s` (masked entries -inf) instead of `a`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from latentcode.store.schema import COMPACT, CodeFileError, from_json

COMPACT_VERSION = 1
KEY_VALID = "key_valid"


def query_name(layer: int) -> str:
    return f"query_l{layer}"


def key_name(layer: int) -> str:
    return f"key_l{layer}"


@dataclass(frozen=True)
class LayerMask:
    """What a layer's attention call does besides q.k: `scale`, `causal`, `window` (0: none),
    `softcap` (0: none) and `sinks` (one logit per head, or None)."""

    scale: float
    causal: bool = True
    window: int = 0
    softcap: float = 0.0
    sinks: tuple[float, ...] | None = None

    def attributes(self) -> dict[str, Any]:
        return {"scale": json.dumps(float(self.scale)), "causal": int(self.causal), "window": int(self.window),
                "softcap": json.dumps(float(self.softcap)), "sinks": json.dumps(list(self.sinks or []))}

    @classmethod
    def from_attributes(cls, attrs: Any, where: str) -> LayerMask:
        try:
            sinks = from_json(attrs.get("sinks", "[]"))
            return cls(scale=float(from_json(attrs["scale"])), causal=bool(int(attrs.get("causal", 1))),
                       window=int(attrs.get("window", 0)), softcap=float(from_json(attrs.get("softcap", "0"))),
                       sinks=tuple(float(value) for value in sinks) or None)
        except (KeyError, TypeError, ValueError) as error:
            raise CodeFileError(f"{where}: attributes scale/causal/window/softcap/sinks are not readable ({error!r}); "
                                "expected numbers as written by the compact store") from None


def rebuild_rows(query_rows: np.ndarray, keys: np.ndarray, rows: np.ndarray, key_valid: np.ndarray, mask: LayerMask,
                 score: str = "pattern") -> np.ndarray:
    """a (or s) of some query rows: float32 `[N, H, len(rows), T]`.

    query_rows: `[N, H, len(rows), d]`, the queries at positions `rows`; keys: `[N, H_kv, T, d]`;
    key_valid: bool `[N, T]`."""
    n_heads, n_kv_heads = query_rows.shape[1], keys.shape[1]
    group = n_heads // n_kv_heads
    queries = query_rows.astype(np.float32, copy=False).reshape(
        query_rows.shape[0], n_kv_heads, group, len(rows), query_rows.shape[-1])
    # [N, H_kv, group, rows, d] @ [N, H_kv, 1, d, T] -> [N, H_kv, group, rows, T]
    scores = np.matmul(queries, keys.astype(np.float32, copy=False)[:, :, None].swapaxes(-1, -2))
    scores = scores.reshape(query_rows.shape[0], n_heads, len(rows), keys.shape[2]) * np.float32(mask.scale)
    if mask.softcap:
        scores = np.float32(mask.softcap) * np.tanh(scores / np.float32(mask.softcap))
    positions = np.arange(keys.shape[2])
    allowed = np.broadcast_to(key_valid[:, None, None, :], scores.shape)
    rows = np.asarray(rows)
    if mask.causal:
        allowed = allowed & (positions[None, :] <= rows[:, None])
    if mask.window:
        allowed = allowed & (positions[None, :] > rows[:, None] - mask.window)
    scores = np.where(allowed, scores, np.float32(-np.inf)).astype(np.float32, copy=False)
    if score == "scores":
        return scores
    return softmax_rows(scores, None if mask.sinks is None else np.asarray(mask.sinks, dtype=np.float32))


def softmax_rows(scores: np.ndarray, sinks: np.ndarray | None = None) -> np.ndarray:
    """softmax over the last axis of `[N, H, Q, T]`, -inf as masked, with an optional sink logit per
    head `[H]` in each row's denominator; a row with nothing to attend to gives zeros."""
    top = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks[None, :, None, None])
    top = np.where(np.isfinite(top), top, np.float32(0))
    exponentials = np.exp(scores - top)
    total = exponentials.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks[None, :, None, None] - top)
    with np.errstate(invalid="ignore", divide="ignore"):
        probabilities = np.where(total > 0, exponentials / np.where(total > 0, total, 1), np.float32(0))
    return probabilities.astype(np.float32, copy=False)


class CompactCodes:
    """Rebuild codes from a file's /compact group (`CodeFile.compact`). Every method takes example
    indices (`examples`, None: all of the split mask given) and returns float32 arrays."""

    def __init__(self, path: Path, info: dict[str, Any], score: str,
                 opener: Callable[[], h5py.File] | None = None):
        self.path, self.info, self.score = Path(path), info, score
        # how to open the file (`CodeFile.open_hdf5`: a file on disk, or one held in memory)
        self._opener = opener if opener is not None else lambda: h5py.File(self.path, "r")
        self.layers: list[int] = [int(layer) for layer in info["layers"]]
        self.n_heads, self.n_kv_heads = int(info["n_heads"]), int(info["n_kv_heads"])
        self.seq_len, self.head_dim = int(info["seq_len"]), int(info["head_dim"])

    # The file, its datasets and each layer's mask stay open / parsed between reads: on a busy machine
    # opening the file and reading attributes cost more than rebuilding a row.
    def _dataset(self, name: str) -> h5py.Dataset:
        if getattr(self, "_open", None) is None:
            self._open, self._datasets, self._masks = self._opener(), {}, {}
        if name not in self._datasets:
            self._datasets[name] = self._open[COMPACT.group][name]
        return self._datasets[name]

    def _mask(self, layer: int) -> LayerMask:
        dataset = self._dataset(query_name(layer))
        if layer not in self._masks:
            self._masks[layer] = LayerMask.from_attributes(dataset.attrs, f"{self.path}: /compact/{query_name(layer)}")
        return self._masks[layer]

    def close(self) -> None:
        """Close the file kept open between reads (reopened by the next read)."""
        if getattr(self, "_open", None) is not None:
            self._open.close()
            self._open = None

    def _check(self, layer: int, positions: Sequence[int], axis: str) -> np.ndarray:
        if layer not in self.layers:
            raise CodeFileError(f"{self.path} has no compact layer {layer}; its compact layers are {self.layers}")
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        bad = positions[(positions < -self.seq_len) | (positions >= self.seq_len)]
        if len(bad):
            raise CodeFileError(f"{axis} position {int(bad[0])} is outside the sequence of {self.seq_len} tokens "
                                f"of {self.path}; expected 0..{self.seq_len - 1} (or negative from the end)")
        return positions % self.seq_len

    def rows(self, layer: int, queries: Sequence[int], examples: np.ndarray | None = None,
             heads: Sequence[int] | None = None) -> np.ndarray:
        """a[h, q, :] for the query rows `queries`: `[N, H', len(queries), T]` (H' = len(heads))."""
        queries = self._check(layer, queries, "query")
        mask = self._mask(layer)
        unique, inverse = np.unique(queries, return_inverse=True)
        # Keys beyond the last row asked are masked out (causal): read only up to it.
        n_keys = int(unique.max()) + 1 if mask.causal else self.seq_len
        key_valid_rows = self._dataset(KEY_VALID)
        examples = np.arange(key_valid_rows.shape[0]) if examples is None else np.asarray(examples).reshape(-1)
        query_rows = _read(self._dataset(query_name(layer)), examples, heads, unique)
        group_size = self.n_heads // self.n_kv_heads
        read_kv = None if heads is None else sorted({h // group_size for h in heads})
        keys = _read(self._dataset(key_name(layer)), examples, read_kv, slice(0, n_keys))
        key_valid = np.stack([key_valid_rows[int(example), :n_keys] for example in examples]).astype(bool)
        if heads is not None:  # the key head of each requested head, among those read; its sink
            keys = keys[:, [read_kv.index(h // group_size) for h in heads]]
            if mask.sinks is not None:
                mask = replace(mask, sinks=tuple(mask.sinks[h] for h in heads))
        codes = rebuild_rows(query_rows, keys, unique, key_valid, mask, self.score)
        if n_keys < self.seq_len:
            fill = 0.0 if self.score == "pattern" else -np.inf
            codes = np.concatenate([codes, np.full((*codes.shape[:-1], self.seq_len - n_keys), fill, np.float32)], -1)
        return codes[:, :, inverse.reshape(-1)]

    def codes(self, layer: int, query: int, key: int, examples: np.ndarray | None = None) -> np.ndarray:
        """a[:, q, k] of every example: `[N, H]`."""
        key = int(self._check(layer, [key], "key")[0])
        return self.rows(layer, [query], examples)[:, :, 0, key]

    def block(self, layer: int, queries: Sequence[int], keys: Sequence[int],
              examples: np.ndarray | None = None) -> np.ndarray:
        """`[N, H, len(queries), len(keys)]`."""
        keys = self._check(layer, keys, "key")
        return self.rows(layer, queries, examples)[..., keys]

    def column(self, layer: int, key: int, examples: np.ndarray | None = None, rows_per_read: int = 256) -> np.ndarray:
        """a[:, :, k] of every query: `[N, H, T]`, rebuilt `rows_per_read` rows at a time."""
        key = int(self._check(layer, [key], "key")[0])
        parts = [self.rows(layer, range(start, min(start + rows_per_read, self.seq_len)), examples)[..., key]
                 for start in range(0, self.seq_len, rows_per_read)]
        return np.concatenate(parts, axis=-1)

    def layer_pattern(self, layer: int, example: int) -> np.ndarray:
        """Every pair of one layer for one example: `[H, T, T]` (memory H T² floats: one layer's rebuild)."""
        return self.rows(layer, range(self.seq_len), np.asarray([example]))[0]

    def queries_and_keys(self, layer: int, example: int, head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The stored queries and keys of query head `head` in one example, as the attention call received
        them (after RoPE): `(queries [T, d], keys [T, d], key_valid [T])`, the keys of its key/value head."""
        self._check(layer, [], "query")
        if not 0 <= head < self.n_heads:
            raise CodeFileError(f"head {head} is outside the {self.n_heads} heads of {self.path}; expected "
                                f"0..{self.n_heads - 1}")
        kv_head = head // (self.n_heads // self.n_kv_heads)
        queries = self._dataset(query_name(layer))[int(example), head]
        keys = self._dataset(key_name(layer))[int(example), kv_head]
        return (np.asarray(queries, np.float32), np.asarray(keys, np.float32),
                np.asarray(self._dataset(KEY_VALID)[int(example)], bool))

    def top_keys(self, layer: int, query: int, k: int, examples: np.ndarray | None = None):
        """The `k` keys with the largest codes in row `query`, per example and head: `(keys [N, H, k] int64,
        codes [N, H, k] float32)`, largest first."""
        row = self.rows(layer, [query], examples)[:, :, 0]
        keys = np.argsort(-row, axis=-1, kind="stable")[..., :k]
        return keys, np.take_along_axis(row, keys, axis=-1)


def _read(dataset: h5py.Dataset, examples: np.ndarray, heads: Sequence[int] | None, positions) -> np.ndarray:
    """`dataset[examples][:, heads][:, :, positions]` read example by example, each one h5py
    selection (a slice where the positions are contiguous): `[len(examples), heads, positions, ...]`."""
    if not isinstance(positions, slice):
        positions = np.asarray(positions)
        if len(positions) and positions[-1] - positions[0] + 1 == len(positions):
            positions = slice(int(positions[0]), int(positions[-1]) + 1)
        else:
            positions = list(positions)  # increasing and unique: h5py's rule for a list
    blocks = []
    for example in examples:
        if heads is None:
            blocks.append(dataset[int(example), :, positions])
        else:
            low, high = min(heads), max(heads) + 1
            blocks.append(dataset[int(example), low:high, positions][[h - low for h in heads]])
    return np.stack(blocks)


def check_compact(path: Path, file: h5py.File, info: dict[str, Any], n_rows: int) -> None:
    """Refuse a /compact group whose datasets disagree with the root attribute `compact`, one line."""
    if not info:
        if COMPACT.group in file:
            raise CodeFileError(f"{path} has a /compact group but no root attribute 'compact' describing it")
        return
    missing = [key for key in ("version", "layers", "n_heads", "n_kv_heads", "head_dim", "seq_len") if key not in info]
    if missing:
        raise CodeFileError(f"{path}: root attribute 'compact' lacks {missing}; expected version, layers, n_heads, "
                            "n_kv_heads, head_dim and seq_len")
    if info["version"] != COMPACT_VERSION:
        raise CodeFileError(f"{path}: compact store version {info['version']!r}; this latentcode reads "
                            f"{COMPACT_VERSION}")
    if COMPACT.group not in file:
        raise CodeFileError(f"{path}: root attribute 'compact' describes a compact store but /compact is missing")
    group = file[COMPACT.group]
    heads, kv_heads, dim, length = (int(info[key]) for key in ("n_heads", "n_kv_heads", "head_dim", "seq_len"))
    if kv_heads < 1 or heads % kv_heads:
        raise CodeFileError(f"{path}: compact n_heads {heads} is not a multiple of n_kv_heads {kv_heads}")
    expected = {KEY_VALID: (n_rows, length)}
    for layer in info["layers"]:
        expected[query_name(layer)] = (n_rows, heads, length, dim)
        expected[key_name(layer)] = (n_rows, kv_heads, length, dim)
    for name, shape in expected.items():
        if name not in group:
            raise CodeFileError(f"{path}: /compact/{name} is missing; the root attribute 'compact' lists layers "
                                f"{info['layers']}")
        if group[name].shape != shape:
            raise CodeFileError(f"{path}: /compact/{name} has shape {list(group[name].shape)}; the root attribute "
                                f"'compact' and /split say {list(shape)}")
    for layer in info["layers"]:
        mask = LayerMask.from_attributes(group[query_name(layer)].attrs, f"{path}: /compact/{query_name(layer)}")
        if mask.sinks is not None and len(mask.sinks) != heads:
            raise CodeFileError(f"{path}: /compact/{query_name(layer)} has {len(mask.sinks)} sinks; expected {heads}")


# The largest score a layer may reach, |scale q.k| <= scale |q| |k|: from 2^23 on a float32 score has no
# fraction left (its spacing is 1), so its rounding alone moves a code by up to e^0.5 and the rebuilt
# codes are rounding noise, not the attention call's (whose scores a real model keeps in the tens).
SCORE_BOUND = float(2**23)
#: bytes of a compact dataset read at a time by the check at open
CHECK_BLOCK_BYTES = 16 << 20


def _largest_norm(path: Path, dataset: h5py.Dataset, what: str) -> float:
    """The largest norm of a query or key vector of `dataset` [N, heads, T, d], read in blocks of
    examples; a CodeFileError naming the dataset where a value is NaN or infinite."""
    per_example = max(1, int(np.prod(dataset.shape[1:])) * dataset.dtype.itemsize)
    step, largest = max(1, CHECK_BLOCK_BYTES // per_example), 0.0
    for start in range(0, dataset.shape[0], step):
        block = np.asarray(dataset[start:start + step], dtype=np.float32)
        # Squared norms (summed in float64): a NaN or infinity shows in them, at 1/d of the cost of
        # testing every value.
        squares = np.einsum("...d,...d->...", block, block, dtype=np.float64)
        if not np.isfinite(squares).all() and not np.isfinite(block).all():
            example = start + int(np.flatnonzero(~np.isfinite(block).reshape(len(block), -1).all(axis=1))[0])
            raise CodeFileError(f"{path}: /compact/{dataset.name.rsplit('/', 1)[-1]} holds a NaN or infinite {what} "
                                f"(example {example}); expected finite {what}s as an attention call receives them "
                                "(a damaged or hand-edited file)")
        if squares.size:
            largest = max(largest, float(np.sqrt(squares.max(), dtype=np.float64)))
    return largest


def check_compact_values(path: Path, file: h5py.File, info: dict[str, Any]) -> None:
    """Refuse, in one line naming the dataset, a /compact group whose values no attention call gives:
    a scale that is not positive and finite, a softcap, window or sink that is not finite and
    non-negative, NaN or infinite queries or keys, queries and keys whose scores could reach
    SCORE_BOUND, or a key mask that leaves an example no real token (every row of it zeros).
    Reads every query and key once (in blocks of CHECK_BLOCK_BYTES); after `check_compact`."""
    if not info:
        return
    group = file[COMPACT.group]
    for layer in info["layers"]:
        where = f"{path}: /compact/{query_name(layer)}"
        mask = LayerMask.from_attributes(group[query_name(layer)].attrs, where)
        if not (np.isfinite(mask.scale) and mask.scale > 0):
            raise CodeFileError(f"{where} has scale {mask.scale}; expected a positive finite number (1/sqrt(d) or "
                                "the model's own)")
        if not (np.isfinite(mask.softcap) and mask.softcap >= 0) or mask.window < 0:
            raise CodeFileError(f"{where} has softcap {mask.softcap} and window {mask.window}; expected finite "
                                "numbers >= 0 (0: none)")
        if mask.sinks is not None and not np.isfinite(mask.sinks).all():
            raise CodeFileError(f"{where} has sinks {list(mask.sinks)}; expected finite logits")
        queries = _largest_norm(path, group[query_name(layer)], "query")
        keys = _largest_norm(path, group[key_name(layer)], "key")
        if mask.scale * queries * keys >= SCORE_BOUND:
            raise CodeFileError(
                f"{path}: /compact/{key_name(layer)} and /compact/{query_name(layer)} hold keys up to norm {keys:.3g} "
                f"and queries up to {queries:.3g}: with scale {mask.scale:.3g} scores could reach "
                f"{mask.scale * queries * keys:.3g}; expected under 2^23 = {SCORE_BOUND:.0f}, beyond which float32 "
                "scores are rounding noise (a damaged or hand-edited file)")
    key_valid = group[KEY_VALID]
    step = max(1, CHECK_BLOCK_BYTES // max(1, key_valid.shape[1]))
    for start in range(0, key_valid.shape[0], step):
        empty = np.flatnonzero(~np.asarray(key_valid[start:start + step], dtype=bool).any(axis=1))
        if len(empty):
            raise CodeFileError(f"{path}: /compact/{KEY_VALID} marks no key of example {start + int(empty[0])} as "
                                "real; expected at least one real token per example (else its rows are all zeros)")


def write_compact_rows(file: h5py.File, name: str, first_row: int, rows: np.ndarray, filters: dict[str, Any],
                       attributes: dict[str, Any] | None = None) -> None:
    """Write `rows` `[B, ...]` at rows `[first_row, first_row + B)` of /compact/`name`, creating it
    (chunks of one example, one head and up to 1,024 positions: a query row or a key head reads few)."""
    group = file.require_group(COMPACT.group)
    if name not in group:
        if first_row:
            raise CodeFileError(f"/compact/{name} starts at row {first_row}: every batch records the same layers")
        row_shape = rows.shape[1:]
        # Queries are read a row at a time, keys a head's prefix at a time.
        positions = 64 if name.startswith("query") else 1024
        chunks = (1, 1, min(row_shape[-2], positions), row_shape[-1]) if len(row_shape) == 3 else (1, *row_shape)
        group.create_dataset(name, shape=(0, *row_shape), maxshape=(None, *row_shape), dtype=rows.dtype,
                             chunks=chunks, **filters)
    dataset = group[name]
    if dataset.shape[0] != first_row or dataset.shape[1:] != rows.shape[1:]:
        raise CodeFileError(f"/compact/{name} holds {list(dataset.shape)}; rows of shape {list(rows.shape[1:])} "
                            f"were offered at row {first_row}")
    dataset.resize(first_row + len(rows), axis=0)
    dataset[first_row:] = rows
    for key, value in (attributes or {}).items():
        dataset.attrs[key] = value
