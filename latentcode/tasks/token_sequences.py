"""Repeated random tokens: the standard induction probe, to label key-query relations on
(`latentcode.analysis.token_relations`) beside natural text (`latentcode.pretrained.corpus_token_windows`).

``bos``, then ``half`` tokens drawn uniformly without replacement from ``low..vocab_size-1``, then
the same tokens again. In the second copy the induction key of query ``q`` is ``q - half + 1`` (the
token after the earlier copy of ``tokens[q]``) and its duplicate key ``q - half``. Numpy only.
"""

from __future__ import annotations

import numpy as np

from latentcode.tasks.base import TaskError

__all__ = ["repeated_random_tokens"]


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
