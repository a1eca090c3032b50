"""What the token view shows, read from one codes file with numpy alone (no torch): an example's
tokens as text, and any query's attention row `[H, T]` of any layer, rebuilt from the compact store
(`CodeFile.compact.rows`, queries and keys -> softmax) or, in a file without one, gathered from the
sites the file records (keys it does not record are NaN).

    rows = TokenRows(CodeFile("smol.h5"), token_names)
    rows.row(example=0, layer=10, query=2047)     # float32 [H, T]
    rows.overview(example=0, query=2047)          # per layer x head: top key, its code, the entropy
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from latentcode.errors import AnalysisError
from latentcode.store import CodeFile

__all__ = ["TOKEN_IDS", "TokenRows", "check_token_file"]

TOKEN_IDS = "token_ids"  # the extra array of each example's input tokens [N, T]


def check_token_file(code_file: CodeFile, token_names: Sequence[str] | None = None) -> list[str]:
    """The text of each token id of `code_file` (its own `token_names`, else those given), or an
    AnalysisError (one line) saying what is missing for a token view."""
    if TOKEN_IDS not in code_file.extra_names:
        raise AnalysisError(f"{code_file.path} keeps no token ids (/extra/{TOKEN_IDS}); the token view needs the "
                            "input tokens of each example, as latentcode extract of a language model writes them")
    names = list(code_file.token_names or token_names or [])
    if not names:
        raise AnalysisError(f"{code_file.path} keeps token ids but not their text (root attribute token_names), "
                            "and no tokenizer named them; expected a file written by latentcode extract, or "
                            "token_names given")
    return names


class TokenRows:
    """An example's tokens and its attention rows, from the compact store where the file has one.

    Every array is float32; a code the file cannot give (a key no site records) is NaN."""

    def __init__(self, code_file: CodeFile, token_names: Sequence[str] | None = None):
        self.code_file = code_file
        self.token_names = check_token_file(code_file, token_names)
        self.compact = code_file.compact
        # One read of the file at a time (a server's threads share it), taken per row: a row asked while
        # an overview reads its 30 layers waits for one layer, not thirty.
        self._lock = threading.Lock()
        self._token_ids = code_file.extra(TOKEN_IDS)  # [N, T]
        if self._token_ids.ndim != 2:
            raise AnalysisError(f"{code_file.path}: /extra/{TOKEN_IDS} has shape {list(self._token_ids.shape)}; "
                                "expected [examples, tokens]")
        largest = int(self._token_ids.max()) if self._token_ids.size else -1
        if largest >= len(self.token_names) or (self._token_ids.size and int(self._token_ids.min()) < 0):
            raise AnalysisError(f"{code_file.path} holds token id {largest}, but {len(self.token_names)} token "
                                "names; expected a name for every id")
        self.n_examples, self.seq_len = self._token_ids.shape
        if self.compact is not None:
            self.layers = list(self.compact.layers)
            self.n_heads = self.compact.n_heads
            if self.compact.seq_len != self.seq_len:
                raise AnalysisError(f"{code_file.path}: {self.seq_len} token ids per example but a compact store "
                                    f"of {self.compact.seq_len} positions; expected the same")
        else:
            self._sites: dict[tuple[int, int], list] = {}
            for site in code_file.sites:
                if 0 <= site.query < self.seq_len and 0 <= site.key < self.seq_len:
                    self._sites.setdefault((site.layer, site.query), []).append(site)
            self.layers = sorted({layer for layer, _ in self._sites})
            self.n_heads = max((code_file.heads_of[site] for site in code_file.sites), default=0)
            self._site_codes: dict = {}
        if not self.layers:
            raise AnalysisError(f"{code_file.path} has no compact store and no site within its {self.seq_len} "
                                "tokens; expected either to show attention rows")

    @property
    def has_compact(self) -> bool:
        return self.compact is not None

    def token_ids(self, example: int) -> np.ndarray:
        """`[T]` int64 ids of one example (a row of the file)."""
        return np.asarray(self._token_ids[self._check_example(example)], dtype=np.int64)

    def queries(self, layer: int | None = None) -> list[int]:
        """The queries whose rows this file gives (every position with a compact store)."""
        if self.has_compact:
            return list(range(self.seq_len))
        return sorted({query for (site_layer, query) in self._sites if layer is None or site_layer == layer})

    def row(self, example: int, layer: int, query: int) -> np.ndarray:
        """a[h, query, :] of every head: float32 `[H, T]`."""
        return self.rows(example, layer, [query])[:, 0]

    def rows(self, example: int, layer: int, queries: Sequence[int], head: int | None = None) -> np.ndarray:
        """`[H, len(queries), T]` (H = 1 where `head` is given)."""
        example = self._check_example(example)
        self._check(layer, queries)
        if self.has_compact:
            with self._lock:
                return self.compact.rows(layer, queries, np.asarray([example]),
                                         heads=None if head is None else [head])[0]
        out = np.full((self.n_heads, len(queries), self.seq_len), np.nan, dtype=np.float32)
        for column, query in enumerate(queries):
            for site in self._sites.get((layer, int(query)), ()):
                if site not in self._site_codes:
                    self._site_codes[site] = self.code_file.codes(site)
                codes = self._site_codes[site][example]
                out[: len(codes), column, site.key] = codes
        return out if head is None else out[head : head + 1]

    def overview(self, example: int, query: int, before_layer=None) -> list[list[list[float]]]:
        """Per layer, per head: `[top key, its code, entropy of the row in nats]` of row `query`
        (NaN-free: unrecorded keys are left out; a layer without the row gives [-1, 0, 0]).
        `before_layer()`, where given, is called before each layer's read (a server lets waiting rows go first)."""
        summary = []
        for layer in self.layers:
            if before_layer is not None:
                before_layer()
            if not self.has_compact and (layer, int(query)) not in self._sites:
                summary.append([[-1, 0.0, 0.0]] * self.n_heads)
                continue
            summary.append(row_summary(self.row(example, layer, query)))
        return summary

    def block(self, example: int, layer: int, head: int, queries: range, keys: range) -> np.ndarray:
        """a[head, queries, keys] of one example: float32 `[len(queries), len(keys)]`."""
        if not (0 <= head < self.n_heads):
            raise AnalysisError(f"head {head} is outside the {self.n_heads} heads; expected 0..{self.n_heads - 1}")
        for name, span in (("queries", queries), ("keys", keys)):
            if not len(span) or span.start < 0 or span.stop > self.seq_len:
                raise AnalysisError(f"{name} {span.start}..{span.stop - 1} are outside the {self.seq_len} tokens")
        return self.rows(example, layer, list(queries), head=head)[0][:, keys.start : keys.stop]

    def _check_example(self, example: int) -> int:
        if not (0 <= int(example) < self.n_examples):
            raise AnalysisError(f"example {example} is outside the {self.n_examples} examples of "
                                f"{self.code_file.path}; expected 0..{self.n_examples - 1}")
        return int(example)

    def _check(self, layer: int, queries: Sequence[int]) -> None:
        if layer not in self.layers:
            raise AnalysisError(f"layer {layer} is not among the layers {self.layers} of {self.code_file.path}")
        bad = [query for query in queries if not 0 <= int(query) < self.seq_len]
        if bad:
            raise AnalysisError(f"query {bad[0]} is outside the {self.seq_len} tokens; expected 0..{self.seq_len - 1}")


def row_summary(rows: np.ndarray) -> list[list[float]]:
    """`[top key, its code, entropy in nats]` of each head's row of `rows` `[H, T]` (NaN as absent)."""
    clean = np.nan_to_num(rows.astype(np.float64), nan=0.0)
    top = clean.argmax(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(clean > 0, clean * np.log(clean), 0.0).sum(axis=-1)
    return [[int(key), round(float(clean[h, key]), 4), round(float(entropy[h]), 4)] for h, key in enumerate(top)]
