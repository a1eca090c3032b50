"""Sites and selectors: which latent codes a[:, q, k] to record.

A site is a (layer, query position, key position) choice (`latentcode.store.Site`); a selector names a
set of sites. Requests may count positions from the end (-1 is the last token); recorded sites always
carry absolute positions. Selector specs (strings, as on the command line; docs/concepts/sites.md):

- `last-self`: the last query attending to itself, in every layer (the paper's fuzzy-logic analysis).
- a name the task defines (`Task.selectors`), e.g. SRAVEN's `sraven-rule` (the last query attending to
  the same feature in the two context panels of the last row, in every layer), read on the task's
  analysis variant by default.
- `all-pairs:LAYER`: every (query, key) pair of one layer; refused above `MAX_ALL_PAIRS` sites.
- `LAYER:QUERY:KEY[,...]`, each field an integer, `*` (every one), a half-open range `START..STOP`
  (either end optional, negative ends from the end: `-6..` is the last six) or a list `A|B|C`:
  `2:*:*` every pair of layer 2, `*:35:*` the row of query 35 in every layer, `1:32..36:0..8` a block;
  expanded once the sequence length is known.

In Python, `block(layers=..., queries=..., keys=...)` builds the same from ints, `range`s, lists or
None (every one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latentcode.errors import LatentcodeError
from latentcode.store import Site
from latentcode.tasks import Task, get_task

PRESETS = ("last-self", "all-pairs")  # and the named site sets of the task (`Task.selectors`)
MAX_ALL_PAIRS = 4096


@dataclass(frozen=True)
class Positions:
    """A set of positions on one axis, resolved once the axis length is known: the half-open range
    `start..stop` (None: from the first / to the last; negative ends count from the end), or an
    explicit tuple `items` of positions (negative ones count from the end)."""

    start: int | None = None
    stop: int | None = None
    items: tuple[int, ...] | None = None

    def resolve(self, length: int, axis: str = "sequence") -> tuple[int, ...]:
        if self.items is not None:
            return resolve_positions(self.items, length, axis)
        what = "the sequence" if axis == "sequence" else f"the {axis} axis"
        for end in (self.start, self.stop):
            if end is not None and not -length <= end <= length:
                raise SiteError(f"range {self.spec()} reaches past {what} of {length} tokens (ends valid from "
                                f"-{length} to {length}; the range is half-open, START..STOP)")
        positions = tuple(range(length)[slice(self.start, self.stop)])
        if not positions:
            raise SiteError(f"range {self.spec()} selects no position of {what} of {length} tokens "
                            "(half-open: START..STOP holds START up to STOP - 1)")
        return positions

    def spec(self) -> str:
        if self.items is not None:
            return "|".join(map(str, self.items))
        if self.start is None and self.stop is None:
            return "*"
        return f"{'' if self.start is None else self.start}..{'' if self.stop is None else self.stop}"


EVERY = Positions()

# A request: (layer, query, key); layer None means every layer; query and key are positions (negative
# ones count from the end) or `Positions` (a range, an explicit set, or every position).
SiteRequest = tuple[int | None, "int | Positions", "int | Positions"]


class SiteError(LatentcodeError, ValueError):
    """A site or selector that does not fit the model or the sequence; says which and why."""


@dataclass(frozen=True)
class Selector:
    """A named set of site requests; `resolve` turns them into absolute sites for a model."""

    name: str
    requests: tuple[SiteRequest, ...] = ()
    all_pairs_layer: int | None = None
    default_variant: str | None = None  # e.g. sraven-rule reads unpermuted instances

    def check_variant(self, variant: str, task: Task, flag: str = "variant") -> None:
        """Refuse a task's own site set on another variant than the one its positions are defined
        for (SRAVEN's `sraven-rule`: the same feature of panels 7 and 8 only where columns are not
        permuted); sites given explicitly are read on any variant."""
        if self.default_variant and variant != self.default_variant and self.name in task.selectors():
            raise SiteError(
                f"{flag} {variant}: the sites {self.name!r} are defined on {self.default_variant!r} instances of "
                f"task {task.name!r} (their positions hold what the task's analysis reads only there); use "
                f"{flag} {self.default_variant}, or give the sites explicitly as LAYER:QUERY:KEY to read them on "
                f"{variant!r} instances")

    def resolve(self, n_layers: int, seq_len: int) -> list[Site]:
        """Absolute sites for a model of `n_layers` layers on sequences of `seq_len` tokens."""
        if self.all_pairs_layer is not None:
            layer = check_layer(self.all_pairs_layer, n_layers, f"all-pairs:{self.all_pairs_layer}")
            return [Site(layer, query, key) for query, key in all_pairs(seq_len)]
        sites = []
        for layer, query, key in self.requests:
            what = request_spec((layer, query, key))
            layers = range(n_layers) if layer is None else [check_layer(layer, n_layers, what)]
            pairs = expand_request(query, key, seq_len, seq_len)
            sites += [Site(resolved_layer, q, k) for resolved_layer in layers for q, k in pairs]
        return sorted(dict.fromkeys(sites))

    def to_dict(self) -> dict:
        requests = [[field.spec() if isinstance(field, Positions) else field for field in request]
                    for request in self.requests]
        return {"name": self.name, "requests": requests, "all_pairs_layer": self.all_pairs_layer}

    def spec(self) -> str:
        """The selector as a spec string that `parse_selector` reads back (task names as they are)."""
        if self.name != "explicit":
            return self.name
        return ",".join(request_spec(request) for request in self.requests)


def request_spec(request: SiteRequest) -> str:
    """`LAYER:QUERY:KEY` of one request, as the command line writes it."""
    layer, query, key = request
    fields = ["*" if layer is None else str(layer)]
    fields += [field.spec() if isinstance(field, Positions) else str(field) for field in (query, key)]
    return ":".join(fields)


def expand_request(query: int | Positions, key: int | Positions, n_queries: int, n_keys: int,
                   axes: tuple[str, str] = ("sequence", "sequence")) -> list[tuple[int, int]]:
    """The absolute (query, key) pairs of one request on `n_queries` queries and `n_keys` keys."""
    queries, keys = _positions(query).resolve(n_queries, axes[0]), _positions(key).resolve(n_keys, axes[1])
    return [(q, k) for q in queries for k in keys]


def _positions(field: int | Positions) -> Positions:
    return field if isinstance(field, Positions) else Positions(items=(field,))


def _as_positions(value: Any, what: str) -> int | Positions:
    """An int, None (every position), a `range` with step 1, a slice or a list -> int or `Positions`."""
    if value is None:
        return EVERY
    if isinstance(value, Positions):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):  # np.bool_ is no np.integer
        return int(value)
    if isinstance(value, (range, slice)):
        if value.step not in (None, 1):
            raise SiteError(f"{what} range {value!r} has step {value.step}; "
                            "only contiguous ranges (step 1) are supported")
        return Positions(value.start, value.stop)
    if isinstance(value, (list, tuple, np.ndarray)):
        items = tuple(np.asarray(value).reshape(-1).tolist())
        if not items or not all(isinstance(item, int) and not isinstance(item, bool) for item in items):
            raise SiteError(f"{what} must be a non-empty list of integer positions; got {value!r}")
        return Positions(items=items)
    raise SiteError(f"{what} must be a position, a range, a list of positions or None (every one); got {value!r}")


def block(layers: Any = None, queries: Any = None, keys: Any = None) -> Selector:
    """Every (query, key) pair of `queries` x `keys` in each of `layers`, as a Selector.

    Each argument is an int, a `range` (or slice), a list of ints, or None for every one; positions
    may be negative (from the end). `block(layers=2)` is every pair of layer 2, `block(queries=-1)`
    the last query's whole row in every layer, `block(2, range(32, 36), range(0, 8))` a block."""
    if layers is None:
        layer_list: list[int | None] = [None]
    elif isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layer_list = [int(layers)]
    elif isinstance(layers, (range, list, tuple, np.ndarray)):
        layer_list = [int(layer) for layer in layers]
        if not layer_list:
            raise SiteError(f"layers is empty ({layers!r}); give layers, or None for every layer")
    else:
        raise SiteError(f"layers must be an int, a range or list of ints, or None (every layer); got {layers!r}")
    query, key = _as_positions(queries, "queries"), _as_positions(keys, "keys")
    return Selector("explicit", requests=tuple((layer, query, key) for layer in layer_list))


def all_pairs(seq_len: int, n_keys: int | None = None) -> list[tuple[int, int]]:
    """Every (query, key) pair of `seq_len` queries and `n_keys` keys (default: as many as queries,
    self-attention); refused above `MAX_ALL_PAIRS`."""
    n_keys = seq_len if n_keys is None else n_keys
    if seq_len * n_keys > MAX_ALL_PAIRS:
        raise SiteError(
            f"all-pairs on {seq_len} queries x {n_keys} keys is {seq_len * n_keys} sites, more than the "
            f"{MAX_ALL_PAIRS} allowed; select query/key positions explicitly (LAYER:QUERY:KEY,...)"
        )
    return [(query, key) for query in range(seq_len) for key in range(n_keys)]


def check_layer(layer: int, n_layers: int, what: str) -> int:
    if not -n_layers <= layer < n_layers:
        raise SiteError(f"site {what}: layer {layer} is outside the model's {n_layers} layers (0..{n_layers - 1})")
    return layer % n_layers


def resolve_positions(positions: Iterable[int], seq_len: int, axis: str = "sequence") -> tuple[int, ...]:
    """Absolute positions; negative ones count from the end. Out of range raises SiteError.
    `axis` names what is indexed in the message ("query", "key": they differ in cross-attention)."""
    resolved = []
    for position in positions:
        if not -seq_len <= position < seq_len:
            what = "the sequence" if axis == "sequence" else f"the {axis} axis"
            raise SiteError(
                f"position {position} is outside {what} of {seq_len} tokens "
                f"(valid: 0..{seq_len - 1}, or -{seq_len}..-1 from the end)"
            )
        resolved.append(position % seq_len)
    return tuple(resolved)


def parse_selector(spec: str | Selector | Sequence, task: Task | Mapping[str, Any] | None = None) -> Selector:
    """A `Selector` from a spec string (see the module docstring), a list of (layer, query, key)
    tuples or `Site`s, or a Selector. `task` (a Task or its config) supplies the named site sets
    only it can place, e.g. SRAVEN's `sraven-rule` (see `Task.selectors`)."""
    if isinstance(spec, Selector):
        return spec
    if not isinstance(spec, str):
        return _explicit_selector(spec)
    spec = spec.strip()
    if spec == "last-self":
        return Selector("last-self", requests=((None, -1, -1),))
    if isinstance(task, Mapping):
        task = get_task(**task) if task.get("name") else None
    task_selectors = task.selectors() if task is not None else {}
    if spec in task_selectors:
        default_variant = task.analysis.variant if spec == task.analysis.selector else None
        return Selector(spec, requests=task_selectors[spec], default_variant=default_variant)
    if ":" not in spec and "," not in spec and not spec.startswith("all-pairs"):
        where = (f"task {task.name!r} defines {sorted(task_selectors) or 'none'}" if task is not None
                 else "no task was given, so no task-defined selector (such as SRAVEN's) is known")
        raise SiteError(
            f"unknown selector {spec!r}: the generic ones are {', '.join(PRESETS)} (all-pairs:LAYER) and {where}; "
            "or give sites as LAYER:QUERY:KEY[,...]"
        )
    if spec.startswith("all-pairs"):
        _, _, layer = spec.partition(":")
        if not layer.lstrip("-").isdigit():
            raise SiteError(f"all-pairs needs a layer, as in all-pairs:0; got {spec!r}")
        return Selector(spec, all_pairs_layer=int(layer))
    return _parsed_sites(spec, [*PRESETS, *task_selectors])


def _explicit_selector(sites: Sequence) -> Selector:
    """A Selector of the (layer, query, key) tuples or `Site`s listed."""
    requests = []
    for item in sites:
        if isinstance(item, Site):
            requests.append((item.layer, item.query, item.key))
        elif isinstance(item, (tuple, list)) and len(item) == 3:
            requests.append(tuple(item))
        else:
            raise SiteError(f"a site is (layer, query, key), got {item!r}")
    if not requests:
        raise SiteError("the list of sites is empty")
    return Selector("explicit", requests=tuple(requests))


def _parsed_sites(spec: str, presets: list[str]) -> Selector:
    """The Selector of LAYER:QUERY:KEY[,...] (`presets`: the names a spec might have meant instead)."""
    requests = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        try:
            if len(fields) != 3:
                raise ValueError
            layer = None if fields[0].strip() == "*" else int(fields[0])
            requests.append((layer, parse_positions(fields[1]), parse_positions(fields[2])))
        except ValueError:
            raise SiteError(
                f"cannot read site {part.strip()!r} of {spec!r}: expected a preset ({', '.join(presets)}) or "
                "LAYER:QUERY:KEY[,LAYER:QUERY:KEY...] where each field is an integer (negative positions count "
                "from the end), * (every one) or, for QUERY and KEY, a half-open range START..STOP (e.g. "
                "2:*:*, *:35:*, 1:32..36:0..8)"
            ) from None
    return Selector("explicit", requests=tuple(requests))


def parse_positions(field: str) -> int | Positions:
    """One QUERY or KEY field: an integer, `*`, or `START..STOP` (either end optional)."""
    field = field.strip()
    if field == "*":
        return EVERY
    if "|" in field:
        return Positions(items=tuple(int(item) for item in field.split("|")))
    if ".." in field:
        start, _, stop = field.partition("..")
        return Positions(int(start) if start.strip() else None, int(stop) if stop.strip() else None)
    return int(field)


def layers_and_first_query(selector: Selector, n_layers: int, seq_len: int) -> tuple[tuple[int, ...], int]:
    """The layers `selector` edits and its first query position, each request checked against the
    model's layers and the window (without listing every pair: `*:*:*` at T = 8192 is 2e9 of them)."""
    if selector.all_pairs_layer is not None:
        all_pairs(seq_len)  # refused above MAX_ALL_PAIRS, as everywhere
        return (check_layer(selector.all_pairs_layer, n_layers, selector.name),), 0
    layers, first_query = set(), seq_len
    for layer, query, key in selector.requests:
        what = request_spec((layer, query, key))
        layers |= set(range(n_layers)) if layer is None else {check_layer(layer, n_layers, what)}
        try:
            queries = _positions(query).resolve(seq_len)
            _positions(key).resolve(seq_len)
        except SiteError as error:
            raise SiteError(f"site {what}: {error}") from None
        first_query = min(first_query, min(queries))
    return tuple(sorted(layers)), first_query
