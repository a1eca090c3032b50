"""Token sequences to label key-query relations on (`latentcode.analysis.token_relations`).

Two sources, each ``[n, length]`` int64 token ids starting with a fixed first token (``bos``):

- `natural_text`: windows of the language task's corpus (`latentcode.tasks.corpus`, the King James
  Bible; ``train`` bytes to fit on, ``validation`` bytes held out), each starting at a line,
  tokenised by the caller's ``encode(text) -> list of ids`` (e.g. a Hugging Face tokenizer);
- `repeated_random_tokens`: the standard induction probe: ``half`` tokens drawn uniformly without
  replacement from ``low..vocab_size-1``, then the same tokens again. In the second copy the
  induction key of query ``q`` is ``q - half + 1`` (the token after the earlier copy of
  ``tokens[q]``) and its duplicate key ``q - half``.

Numpy only; ``encode`` is any callable, so no tokenizer library is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from latentcode.tasks.base import TaskError
from latentcode.tasks.corpus import SPLITS, corpus_split

__all__ = ["natural_text", "repeated_random_tokens"]

# Bytes of text read per window, per token wanted: KJV English runs about 4 bytes per token in a
# 49k-token BPE vocabulary; 8 leaves room for lines of verse numbers and short words.
_BYTES_PER_TOKEN = 8


def natural_text(encode: Callable[[str], Sequence[int]], n: int, length: int, split: str = "train", seed: int = 0,
                 bos: int = 0) -> np.ndarray:
    """`n` windows of `length` tokens ``[n, length]``: ``bos`` then the first ``length - 1`` tokens of
    the corpus text from a line start at a random offset in `split` (offsets drawn by
    ``np.random.default_rng(seed)``)."""
    if split not in SPLITS:
        raise TaskError(f"split {split!r}: the corpus has splits {SPLITS}")
    if length < 2 or n < 1:
        raise TaskError(f"natural_text needs n >= 1 windows of length >= 2 tokens; got n={n}, length={length}")
    text = corpus_split(split)
    n_bytes = _BYTES_PER_TOKEN * length
    rng = np.random.default_rng(seed)
    windows = np.empty((n, length), dtype=np.int64)
    for row in range(n):
        offset = int(rng.integers(0, len(text) - 2 * n_bytes))
        start = offset + int(np.flatnonzero(text[offset:offset + n_bytes] == ord("\n"))[0]) + 1
        ids = list(encode(text[start:start + n_bytes].tobytes().decode("ascii")))
        if len(ids) < length - 1:
            raise TaskError(f"{n_bytes} bytes of text gave only {len(ids)} tokens, fewer than the {length - 1} needed")
        windows[row, 0] = bos
        windows[row, 1:] = ids[:length - 1]
    return windows


def repeated_random_tokens(n: int, half: int, vocab_size: int, seed: int = 0, bos: int = 0, low: int = 0
                           ) -> np.ndarray:
    """``[n, 1 + 2 * half]``: ``bos``, then `half` distinct tokens drawn from ``low..vocab_size-1``
    (``np.random.default_rng(seed)``), then the same `half` tokens again."""
    if half < 2 or n < 1 or vocab_size - low < half:
        raise TaskError(f"repeated_random_tokens needs n >= 1, half >= 2 and at least `half` tokens to draw from; "
                        f"got n={n}, half={half}, tokens {low}..{vocab_size - 1}")
    rng = np.random.default_rng(seed)
    first = np.stack([rng.choice(np.arange(low, vocab_size), size=half, replace=False) for _ in range(n)])
    return np.concatenate([np.full((n, 1), bos, dtype=np.int64), first, first], axis=1).astype(np.int64)
