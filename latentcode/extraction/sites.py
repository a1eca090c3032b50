"""Sites and selectors: which latent codes a[:, q, k] to record.

A site is a (layer, query position, key position) choice (`latentcode.store.Site`); a selector
names a set of sites. Requests may use negative positions, counted from the end of the sequence
(-1 is the last token); recorded sites always carry absolute positions.

Selector specs (strings, as on the command line):

- `last-self`: the last query position attending to itself, in every layer (the paper's
  fuzzy-logic analysis).
- a name the task defines (`Task.selectors`), e.g. SRAVEN's `sraven-rule`: the last query token
  attending to the same feature in the two context panels of the last row, in every layer (the
  paper's SRAVEN analysis), read on the task's analysis variant by default.
- `all-pairs:LAYER`: every (query, key) pair of one layer; refused above `MAX_ALL_PAIRS` sites.
- an explicit list `LAYER:QUERY:KEY[,LAYER:QUERY:KEY...]`; `*` as LAYER means every layer
  (e.g. `*:-1:-1` is `last-self`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from latentcode.errors import LatentcodeError
from latentcode.store import Site
from latentcode.tasks import Task, get_task

PRESETS = ("last-self", "all-pairs")  # and the named site sets of the task (`Task.selectors`)
MAX_ALL_PAIRS = 4096

# A request: (layer, query, key) with possibly negative positions; layer None means every layer.
SiteRequest = tuple[int | None, int, int]


class SiteError(LatentcodeError, ValueError):
    """A site or selector that does not fit the model or the sequence; says which and why."""


@dataclass(frozen=True)
class Selector:
    """A named set of site requests; `resolve` turns them into absolute sites for a model."""

    name: str
    requests: tuple[SiteRequest, ...] = ()
    all_pairs_layer: int | None = None
    default_variant: str | None = None  # e.g. sraven-rule reads unpermuted instances

    def resolve(self, n_layers: int, seq_len: int) -> list[Site]:
        """Absolute sites for a model of `n_layers` layers on sequences of `seq_len` tokens."""
        if self.all_pairs_layer is not None:
            layer = check_layer(self.all_pairs_layer, n_layers, f"all-pairs:{self.all_pairs_layer}")
            return [Site(layer, query, key) for query, key in all_pairs(seq_len)]
        sites = []
        for layer, query, key in self.requests:
            layers = range(n_layers) if layer is None else [check_layer(layer, n_layers, f"{layer}:{query}:{key}")]
            for resolved_layer in layers:
                sites.append(Site(resolved_layer, *resolve_positions((query, key), seq_len)))
        return sorted(dict.fromkeys(sites))

    def to_dict(self) -> dict:
        return {"name": self.name, "requests": [list(r) for r in self.requests], "all_pairs_layer": self.all_pairs_layer}


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
        requests = []
        for item in spec:
            if isinstance(item, Site):
                requests.append((item.layer, item.query, item.key))
            elif isinstance(item, (tuple, list)) and len(item) == 3:
                requests.append(tuple(item))
            else:
                raise SiteError(f"a site is (layer, query, key), got {item!r}")
        if not requests:
            raise SiteError("the list of sites is empty")
        return Selector("explicit", requests=tuple(requests))
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
    requests = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        try:
            if len(fields) != 3:
                raise ValueError
            layer = None if fields[0] == "*" else int(fields[0])
            requests.append((layer, int(fields[1]), int(fields[2])))
        except ValueError:
            presets = [*PRESETS, *task_selectors]
            raise SiteError(
                f"cannot read site {part.strip()!r} of {spec!r}: expected a preset ({', '.join(presets)}) or "
                "LAYER:QUERY:KEY[,LAYER:QUERY:KEY...] with integers (negative positions count from the end, "
                "* as LAYER means every layer)"
            ) from None
    return Selector("explicit", requests=tuple(requests))
