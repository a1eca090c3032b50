"""What a codes file holds, in words: its sites, input variant and splits, for titles and reports.

Everything comes from the file itself (the selector, the task's split descriptions recorded at
extraction), so a figure of any task names its sites, variant and split without this module
knowing the task:

>>> codes_context(code_file, "ood")
'sraven-rule sites (query 35 → keys 27, 31, every layer) · unpermuted variant · split ood (held-out rule multisets)'
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from latentcode.store import CodeFile

__all__ = ["codes_context", "position_ranges", "site_set", "split_descriptions", "split_phrase", "variant_of",
           "wrap_lines"]


# Beyond this many (query, key) pairs of several queries, a title summarises them rather than lists them.
MAX_LISTED_PAIRS = 4


def position_ranges(values: Sequence[int]) -> str:
    """Sorted positions with runs of three or more as ranges: ``[384, ..., 511]`` -> ``"384–511"``,
    ``[1, 2, 3, 7, 9, 10]`` -> ``"1–3, 7, 9, 10"``; a title then stays one line at 512 keys."""
    values = sorted(dict.fromkeys(values))
    parts, start = [], 0
    for index in range(1, len(values) + 1):
        if index == len(values) or values[index] != values[index - 1] + 1:
            run = values[start:index]
            parts += [f"{run[0]}–{run[-1]}"] if len(run) >= 3 else [str(value) for value in run]
            start = index
    return ", ".join(parts)


def _positions(values: Sequence[int], singular: str, plural: str) -> str:
    values = sorted(dict.fromkeys(values))
    return f"{singular if len(values) == 1 else plural} {position_ranges(values)}"


def _query_key_text(pairs: Sequence[tuple[int, int]]) -> str:
    """``[(35, 27), (35, 31)]`` -> ``"query 35 → keys 27, 31"``; many pairs of several queries are
    summarised: ``"queries 0–63 × keys 0–63"`` where every query has the same keys, else ``"4,096
    pairs: queries 0–63 → keys 0–511"``."""
    queries = sorted({query for query, _ in pairs})
    if len(queries) == 1:
        return f"query {queries[0]} → " + _positions([key for _, key in pairs], "key", "keys")
    if len(pairs) <= MAX_LISTED_PAIRS:
        return ", ".join(f"q{query}→k{key}" for query, key in pairs)
    keys_of = {query: frozenset(key for q, key in pairs if q == query) for query in queries}
    keys = sorted({key for _, key in pairs})
    if len(set(keys_of.values())) == 1:
        return f"{_positions(queries, 'query', 'queries')} × {_positions(keys, 'key', 'keys')}"
    return f"{len(set(pairs)):,} pairs: {_positions(queries, 'query', 'queries')} → {_positions(keys, 'key', 'keys')}"


def site_set(code_file: CodeFile, layer: int | None = None) -> str:
    """The sites the codes come from: the selector's name and the (query, key) positions, e.g.
    ``"sraven-rule sites (query 35 → keys 27, 31, every layer)"``; for one `layer`, that layer's."""
    name = code_file.selector.get("name") or code_file.selector.get("spec") or ""
    name = "" if name == "explicit" else name
    prefix = f"{name} sites" if name else "sites"
    if layer is not None:
        pairs = [(site.query, site.key) for site in code_file.sites_of_layer(layer)]
        return f"{prefix} ({_query_key_text(pairs)} in layer {layer})"
    pairs_of_layer = {
        layer: tuple((site.query, site.key) for site in code_file.sites_of_layer(layer)) for layer in code_file.layers
    }
    shared = set(pairs_of_layer.values())
    if len(shared) == 1:
        where = "every layer" if len(code_file.layers) > 1 else f"layer {code_file.layers[0]}"
        return f"{prefix} ({_query_key_text(shared.pop())}, {where})"
    per_layer = "; ".join(f"layer {layer}: {_query_key_text(pairs)}" for layer, pairs in pairs_of_layer.items())
    return f"{prefix} ({per_layer})"


def variant_of(code_file: CodeFile) -> str | None:
    """The task's input variant the codes were extracted on (None where the file does not say)."""
    return code_file.selector.get("variant") or None


def split_descriptions(code_files: Sequence[CodeFile]) -> dict[str, str]:
    """What each split holds, as the codes files record it (first file wins)."""
    descriptions: dict[str, str] = {}
    for code_file in code_files:
        descriptions = {**code_file.split_descriptions, **descriptions}
    return descriptions


def split_phrase(code_file: CodeFile, split: str | None) -> str:
    """``"split ood (held-out rule multisets)"``; ``"all splits (train, ood)"`` for None."""
    if split is None:
        return f"all splits ({', '.join(code_file.splits)})"
    description = code_file.split_descriptions.get(split)
    return f"split {split} ({description})" if description else f"split {split}"


def codes_context(code_file: CodeFile, split: str | None, layer: int | None = None) -> str:
    """Sites, variant and split of the codes of a figure, in one line (see the module docstring)."""
    variant = variant_of(code_file)
    parts = [site_set(code_file, layer), f"{variant} variant" if variant else None, split_phrase(code_file, split)]
    return " · ".join(part for part in parts if part)


def wrap_lines(lines: Sequence[str], width_inches: float, fontsize_points: float = 11.0) -> str:
    """Join title lines, each wrapped to fit a figure `width_inches` wide (a character is about
    0.55 em wide in the default sans-serif font)."""
    characters = max(30, int(width_inches * 72 / (0.55 * fontsize_points)))
    return "\n".join(textwrap.fill(line, characters, break_on_hyphens=False) for line in lines if line)
