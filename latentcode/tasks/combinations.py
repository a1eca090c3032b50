"""How a task enumerates its combinations and splits them (numpy only): a fraction ``f`` of ``count``
items is ``round_half_up(f * count)``; held-out combinations leave every item in training."""

from __future__ import annotations

import itertools
import math

import numpy as np

from latentcode.tasks.base import TaskError

__all__ = ["MAX_ENUMERATED_COMBINATIONS", "enumerate_combinations", "fraction_of", "hold_out_combinations"]

# Enumerating every combination of a task is what makes the splits exact; past this many the
# arrays get too large to keep around, so such configurations are refused.
MAX_ENUMERATED_COMBINATIONS = 5_000_000


def fraction_of(fraction: float, count: int) -> int:
    """``round_half_up(fraction * count)``: how many of ``count`` items a fraction selects."""
    return math.floor(fraction * count + 0.5)


def enumerate_combinations(n_items: int, k: int, *, with_replacement: bool, what: str) -> np.ndarray:
    """All k-combinations of ``range(n_items)`` in ``itertools`` order (rows sorted), ``[count, k]`` int64,
    read-only. ``what`` names them in the error raised past ``MAX_ENUMERATED_COMBINATIONS``."""
    count = math.comb(n_items + k - 1, k) if with_replacement else math.comb(n_items, k)
    if count > MAX_ENUMERATED_COMBINATIONS:
        raise TaskError(f"there are {count:,} {what}, more than the {MAX_ENUMERATED_COMBINATIONS:,} "
                        "this generator enumerates; choose fewer items or a smaller combination size")
    combine = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    flat = np.fromiter(itertools.chain.from_iterable(combine(range(n_items), k)), dtype=np.int64, count=count * k)
    flat.flags.writeable = False
    return flat.reshape(count, k)


def hold_out_combinations(combinations: np.ndarray, n_held_out: int, rng: np.random.Generator, *, what: str, parts: str,
                          strata: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Split the rows of ``combinations`` ``[count, k]`` into kept and held-out row indices.

    Every item that occurs in ``combinations`` also occurs in some kept row, so held-out
    combinations are new compositions of known parts. The rows are visited in a random order
    drawn from ``rng``: a row is reserved for the kept set when it contains an item no earlier
    reserved row contains (a greedy cover); the first ``n_held_out`` unreserved rows in that
    order are held out and the rest are kept. With ``strata`` (``[count]``, a label per row, e.g.
    how hard the combination is), the held-out rows are drawn stratum by stratum, as many from each
    as its share of the rows (largest remainders; a stratum short of unreserved rows passes its
    quota on, in that order), so that the held-out set has the mix of the whole.
    Returns sorted ``(kept, held_out)`` indices. Raises a TaskError, naming the setting ``what`` and
    the items ``parts`` (e.g. "rules"), when too few rows are left for the cover.
    """
    count = len(combinations)
    order = rng.permutation(count)
    items_to_cover = set(np.unique(combinations).tolist())
    covered: set[int] = set()
    reserved = []
    for row in order:
        if covered == items_to_cover:
            break
        items = set(combinations[row].tolist())
        if not items <= covered:
            reserved.append(row)
            covered |= items
    if count - n_held_out < len(reserved):
        raise TaskError(f"{what}: holding out {n_held_out} of {count} combinations leaves {count - n_held_out} "
                        f"for training, but {len(reserved)} are needed for every one of the "
                        f"{len(items_to_cover)} {parts} to occur in training; hold out a smaller fraction")
    is_reserved = np.zeros(count, dtype=bool)
    is_reserved[reserved] = True
    unreserved_in_order = order[~is_reserved[order]]
    if strata is None:
        held_out = np.sort(unreserved_in_order[:n_held_out])
    else:
        held_out = np.sort(_stratified(unreserved_in_order, np.asarray(strata), n_held_out))
    kept = np.setdiff1d(np.arange(count), held_out)
    return kept, held_out


def _stratified(candidates: np.ndarray, strata: np.ndarray, n_held_out: int) -> np.ndarray:
    """The first rows of ``candidates`` (row indices in draw order) of each stratum, as many of a
    stratum as its share of all rows ``strata`` allots (largest remainders), ``n_held_out`` in all."""
    labels, sizes = np.unique(strata, return_counts=True)
    shares = n_held_out * sizes / sizes.sum()
    quotas = np.floor(shares).astype(int)
    for index in np.argsort(-(shares - quotas), kind="stable")[: n_held_out - quotas.sum()]:
        quotas[index] += 1
    available = np.array([(strata[candidates] == label).sum() for label in labels])
    short = np.maximum(quotas - available, 0).sum()
    quotas = np.minimum(quotas, available)
    for index in np.argsort(-(shares - quotas), kind="stable"):  # a short stratum's quota goes to the others
        extra = min(short, available[index] - quotas[index])
        quotas[index] += extra
        short -= extra
    chosen = [candidates[strata[candidates] == label][:quota] for label, quota in zip(labels, quotas, strict=True)]
    return np.concatenate(chosen)
