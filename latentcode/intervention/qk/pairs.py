"""Which (query, key) pairs of a sequence to decompose, named the way `latentcode qk --pairs` takes them:

    previous        (q, q - 1) for every q >= 1: a previous-token head's pairs
    induction       (q, k) with k <= q and tokens[k - 1] == tokens[q]: the key is the token that followed an
                    earlier occurrence of the query's token (an induction head's pairs; integer tokens only)
    Q:K[,Q:K...]    explicit pairs; Q and K each an integer, a range A..B (inclusive) or * (every position)

Pairs whose key comes after the query are dropped for a causal model (the score is masked there). Parsed
with the standard library alone, so that the command line checks the selector before torch is imported.
"""

from __future__ import annotations

import numpy as np

from latentcode.errors import UsageError

NAMED = ("induction", "previous")
MAX_PAIRS = 65_536


def parse_side(field: str, selector: str) -> tuple[int, int] | None:
    """`*` -> None (every position); `7` -> (7, 7); `2..5` -> (2, 5)."""
    field = field.strip()
    if field == "*":
        return None
    first, _, last = field.partition("..")
    try:
        low, high = int(first), int(last or first)
    except ValueError:
        raise UsageError(f"unknown pair selector {selector!r}; expected induction, previous, or Q:K pairs separated "
                         f"by commas, each side an integer, A..B or * (e.g. 12:3,12:5 or 20:*)") from None
    if low < 0 or high < low:
        raise UsageError(f"pair selector {selector!r}: {field!r} is not a position or an increasing range of "
                         f"positions >= 0")
    return low, high


def check_selector(selector: str) -> list[tuple[tuple[int, int] | None, tuple[int, int] | None]] | str:
    """The parsed selector: a named one (its name) or a list of (query side, key side)."""
    if not isinstance(selector, str) or not selector.strip():
        raise UsageError(f"pair selector must be induction, previous or Q:K pairs, got {selector!r}")
    if selector in NAMED:
        return selector
    parsed = []
    for item in selector.split(","):
        query, colon, key = item.partition(":")
        if not colon:
            raise UsageError(f"unknown pair selector {selector!r}; expected induction, previous, or Q:K pairs "
                             f"separated by commas, each side an integer, A..B or * (e.g. 12:3,12:5 or 20:*)")
        parsed.append((parse_side(query, selector), parse_side(key, selector)))
    return parsed


def select_pairs(selector: str, tokens, causal: bool = True) -> np.ndarray:
    """The pairs `selector` names in a sequence of `tokens` (`[pos]`, or `[pos, d_in]` floats), int64
    `[pair, 2]`; a selector that names no pair here, or positions past the sequence, is refused."""
    parsed = check_selector(selector)
    tokens = np.asarray(tokens)
    n_positions = tokens.shape[0]
    if parsed == "previous":
        pairs = np.stack([np.arange(1, n_positions), np.arange(n_positions - 1)], axis=1)
    elif parsed == "induction":
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise UsageError("pair selector 'induction' needs integer tokens (a language model's); this sequence has "
                             f"shape {list(tokens.shape)} of {tokens.dtype}")
        query, key = np.nonzero(tokens[None, :-1] == tokens[:, None])  # tokens[q] == tokens[k - 1], k = key + 1
        pairs = np.stack([query, key + 1], axis=1)
    else:
        pairs = []
        for query_side, key_side in parsed:
            for side in (query_side, key_side):
                if side is not None and side[1] >= n_positions:
                    raise UsageError(f"pair selector {selector!r} names position {side[1]}, past the sequence's "
                                     f"{n_positions} positions (0..{n_positions - 1})")
            queries = range(n_positions) if query_side is None else range(query_side[0], query_side[1] + 1)
            keys = range(n_positions) if key_side is None else range(key_side[0], key_side[1] + 1)
            pairs += [(q, k) for q in queries for k in keys]
        pairs = np.unique(np.asarray(pairs, dtype=np.int64).reshape(-1, 2), axis=0)
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if causal:
        pairs = pairs[pairs[:, 1] <= pairs[:, 0]]
    if len(pairs) == 0:
        raise UsageError(f"pair selector {selector!r} names no {'causal ' if causal else ''}pair in this sequence of "
                         f"{n_positions} positions")
    if len(pairs) > MAX_PAIRS:
        raise UsageError(f"pair selector {selector!r} names {len(pairs)} pairs; at most {MAX_PAIRS} are decomposed "
                         "at once (the terms take pairs x components^2 floats): name fewer")
    return pairs
