"""Find where a code matters without being told: a coarse-to-fine search over the task's site groups.

    1. layers   every whole layer, patched exactly; the `layers_kept` best go on
    2. blocks   every (query part x key part) of every two of the task's partitions in those layers
                (`partitions`), ranked by attribution patching within each layer; the `per_step` best
                of each layer patched exactly; the best becomes the current group
    3. refine   the current group's query set or key set cut by one part of a partition: kept to the
                part (split) or with the part dropped (e.g. without the query row); ranked by how
                much of the attribution estimate they keep for their size, the `per_step` best patched
                exactly; the best (then the smallest) replaces the current group while its transfer
                holds (>= the best transfer on the route - `tolerance` s.e.), else stop
    4. confirm  the best layer, the best block and the group found, on fresh pairs: transfer beside
                damage (same-sub-task keep), with n and s.e.

Every choice is made on the `selection` pairs; every reported number comes from the `confirmation`
pairs, which no choice looked at. Transfer and the logit difference are `latentcode.intervention.transfer`'s;
attribution ranks by the estimated change of the logit difference with the r' donor minus that with
the third donor. On a causal LM's windows (`measures.WindowsMeasure`) the transfer is the next-token
loss change of resample ablation and the partitions the windows' (first token vs later ones, quarters).

    result = site_search(model, task, selection_pairs, confirmation_pairs)
    result.found            # the SiteGroup found
    result.confirmed        # fresh pairs: best layer, best block, found: transfer, transfer se, damage, damage se, n
    result.candidates       # every candidate: stage, estimate, and where patched, its selection transfer
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

from latentcode.intervention.patching.site_groups import SiteGroup, part_group
from latentcode.tasks.partitions import Partitions, task_partitions

Say = Callable[[str], None]


@dataclass(frozen=True)
class Candidate:
    """A group `layer`: `queries` x `keys` and how the search reached it (`stage`, `how`)."""

    layer: int
    queries: tuple[int, ...]
    keys: tuple[int, ...]
    stage: str
    how: str

    @property
    def key(self) -> tuple:
        return self.layer, self.queries, self.keys

    @property
    def size(self) -> int:
        return len(self.queries) * len(self.keys)

    def group(self) -> SiteGroup:
        return part_group(self.layer, self.queries, self.keys, stage=self.stage, how=self.how)


@dataclass
class SiteSearch:
    """The result of `site_search`: `found` (the group), `route` (best layer, best block, found),
    `candidates` (pandas: every candidate with its attribution `estimate` and, where patched, its
    selection-pair `transfer`, `transfer se`; `on route`: the accepted groups, coarse to fine), `confirmed`
    (pandas, `transfer_sweep` on the confirmation pairs of the route), `examples` (example forward passes run
    by the exact sweeps)."""

    found: SiteGroup
    route: list[Candidate]
    candidates: Any
    confirmed: Any
    examples: int
    settings: dict = field(default_factory=dict)


class _Exact:
    """Exact scores (transfer, or loss change) of candidates on the selection, each patched once (a cache)."""

    def __init__(self, model, selection, on_pass, groups_per_pass):
        self.model, self.selection = model, selection
        self.options = {"on_pass": on_pass, "groups_per_pass": groups_per_pass}
        self.results: dict[tuple, tuple[float, float]] = {}

    def __call__(self, candidates: Sequence[Candidate]) -> list[tuple[float, float]]:
        todo = [c for c in dict.fromkeys(candidates) if c.key not in self.results]
        if todo:
            scores = self.selection.scores(self.model, [c.group() for c in todo], **self.options)
            for candidate, score in zip(todo, scores, strict=True):
                self.results[candidate.key] = score
        return [self.results[c.key] for c in candidates]


def _estimate(maps: dict[int, np.ndarray], candidate: Candidate) -> float:
    return float(maps[candidate.layer][np.ix_(candidate.queries, candidate.keys)].sum())


def _blocks(partitions: Partitions, layer: int) -> list[Candidate]:
    found = {}
    for query_parts in partitions.values():
        for key_parts in partitions.values():
            for query_name, queries in query_parts.items():
                for key_name, keys in key_parts.items():
                    candidate = Candidate(layer, tuple(sorted(queries)), tuple(sorted(keys)), "block",
                                          f"{query_name} x {key_name}")
                    found.setdefault(candidate.key, candidate)
    return list(found.values())


def _refinements(partitions: Partitions, current: Candidate) -> list[Candidate]:
    """The current group with its queries or its keys kept to one part, or without it."""
    found = {}
    for side in ("queries", "keys"):
        positions = set(getattr(current, side))
        for parts in partitions.values():
            for name, part in parts.items():
                for verb, kept in (("only", positions & set(part)), ("without", positions - set(part))):
                    if not kept or kept == positions:
                        continue
                    kept_positions = tuple(sorted(kept))
                    queries, keys = ((kept_positions, current.keys) if side == "queries"
                                     else (current.queries, kept_positions))
                    candidate = Candidate(current.layer, queries, keys, "refine", f"{side} {verb} {name}")
                    found.setdefault(candidate.key, candidate)
    return list(found.values())


def site_search(
    model: nn.Module,
    task: Any,
    selection: Any,
    confirmation: Any,
    *,
    partitions: Partitions | None = None,
    layers: Sequence[int] | None = None,
    layers_kept: int = 1,
    per_step: int = 8,
    tolerance: float = 1.0,
    max_rounds: int = 6,
    groups_per_pass: int | None = None,
    on_pass: Callable[[int], None] | None = None,
    say: Say | None = None,
) -> SiteSearch:
    """Search the site group whose patch transfers the donor's sub-task most (module docstring).
    `selection`, `confirmation`: `CounterfactualPairs` of the task, drawn apart (e.g. two seeds), or
    what `patch` measures on any model's inputs (`measures`: a causal LM's windows, each with another
    window's codes, ranked by the next-token loss change instead of the transfer); `partitions` default
    `task_partitions(task)`; `layers` default every layer of the model."""
    import pandas as pd

    from latentcode.intervention.patching.measures import PairsMeasure
    from latentcode.sources.detect import detect_source

    selection, confirmation = (inputs if hasattr(inputs, "scores") else PairsMeasure(task, inputs)
                               for inputs in (selection, confirmation))
    effect = selection.effect

    say = say or (lambda text: None)
    partitions = task_partitions(task) if partitions is None else partitions
    every = tuple(range(task.seq_len))
    layers = list(range(detect_source(model).n_layers())) if layers is None else list(layers)
    exact = _Exact(model, selection, on_pass, groups_per_pass)
    rows: list[dict] = []

    def record(candidates: Sequence[Candidate], estimates: Sequence[float | None], round_: int) -> None:
        for candidate, estimate in zip(candidates, estimates, strict=True):
            transfer, se = exact.results.get(candidate.key, (math.nan, math.nan))
            rows.append({"stage": candidate.stage, "round": round_, "layer": candidate.layer, "how": candidate.how,
                         "n_queries": len(candidate.queries), "n_keys": len(candidate.keys),
                         "group": candidate.group().name, "estimate": estimate,
                         "patched": candidate.key in exact.results,
                         effect: transfer, f"{effect} se": se})

    say(f"layers: patching each of {len(layers)} whole layers on {len(selection)} selection pairs")
    whole = [Candidate(layer, every, every, "layer", f"layer {layer}") for layer in layers]
    layer_results = exact(whole)
    record(whole, [None] * len(whole), 0)
    order = np.argsort([-transfer for transfer, _ in layer_results], kind="stable")
    kept_layers = [whole[i].layer for i in order[:layers_kept]]
    route = [whole[order[0]]]

    say(f"attribution: layers {kept_layers}, r' and third donors")
    maps = selection.attribution_maps(model, kept_layers)
    # Ranked within each layer: the first-order estimate is not comparable across layers (it
    # overstates the last layer's query row, whose patch mostly damages).
    blocks, estimates, best = [], [], []
    for layer in kept_layers:
        in_layer = _blocks(partitions, layer)
        in_layer_estimates = [_estimate(maps, block) for block in in_layer]
        best += [in_layer[i] for i in np.argsort(in_layer_estimates, kind="stable")[::-1][:per_step]]
        blocks, estimates = blocks + in_layer, estimates + in_layer_estimates
    say(f"blocks: {len(blocks)} ranked by attribution, the best {len(best)} patched")
    results = exact(best)
    record(blocks, estimates, 0)
    current = best[int(np.argmax([transfer for transfer, _ in results]))]
    route.append(current)

    for round_ in range(1, max_rounds + 1):
        candidates = [c for c in _refinements(partitions, current) if c.key not in exact.results]
        if not candidates:
            break
        estimates = [_estimate(maps, c) for c in candidates]
        # A cut that keeps the estimate while dropping many pairs ranks first: the estimate beyond the
        # current group's estimate shared out in proportion to size.
        current_estimate = _estimate(maps, current)
        concentration = [estimate - current_estimate * candidate.size / current.size
                         for estimate, candidate in zip(estimates, candidates, strict=True)]
        best = [candidates[i] for i in np.argsort(concentration, kind="stable")[::-1][:per_step]]
        say(f"refine {round_}: {len(candidates)} cuts of {current.how} ({current.size} pairs), the best {len(best)} "
            "patched")
        results = exact(best)
        record(candidates, estimates, round_)
        # The effect holds: within `tolerance` s.e. of the best group on the route so far (so that
        # small losses do not add up); of those, the largest transfer, then the fewest pairs.
        held = max(exact.results[c.key] for c in route[1:])
        holding = [i for i, (transfer, _) in enumerate(results) if transfer >= held[0] - tolerance * held[1]]
        if not holding:
            break
        current = best[min(holding, key=lambda i: (-results[i][0], best[i].size))]
        route.append(current)

    # Confirmed: the best whole layer, the best block and the group found (the cuts between them are in
    # `candidates`, on the selection pairs): three groups whatever the route's length.
    on_route = {candidate.group().name for candidate in route}
    route = list(dict.fromkeys([route[0], route[1], route[-1]]))
    say(f"confirm: {len(route)} groups (best layer, best block, found) on {len(confirmation)} fresh pairs")
    groups = [candidate.group() for candidate in route]
    confirmed, _ = confirmation.sweep(model, groups, on_pass=on_pass, groups_per_pass=groups_per_pass)
    confirmed.insert(0, "step", [f"{c.stage}: {c.how}" for c in route])
    examples = (selection.donors_scored * len(selection) * len(exact.results)
                + confirmation.donors_confirmed * len(confirmation) * len(route))
    settings = {"layers": layers, "layers_kept": layers_kept, "per_step": per_step, "tolerance": tolerance,
                "max_rounds": max_rounds, "partitions": {name: list(parts) for name, parts in partitions.items()},
                "selection_pairs": len(selection), "confirmation_pairs": len(confirmation)}
    candidates = pd.DataFrame(rows)
    candidates["on route"] = candidates["group"].isin(on_route) & candidates["patched"]
    return SiteSearch(route[-1].group(), route, candidates, confirmed, examples, settings)
