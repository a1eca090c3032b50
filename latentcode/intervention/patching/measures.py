"""What `patch` measures on a subject's inputs, drawn, with the same operations on counterfactual pairs
and on token windows, so that the sweep, its controls, attribution and the search are one loop:

    measure = measure_of(plan, loaded, n, seed)            # PairsMeasure or WindowsMeasure
    table, effects = measure.sweep(model, groups, on_pass)  # a row per group; [groups, n] per-base effect
    measure.scores(model, groups), measure.attribution_maps(model, layers)   # what a search ranks by

PairsMeasure: the effect is the transfer (follow with the r' donor minus with a third-sub-task donor),
the objective the logit difference (r''s answer - the true one). WindowsMeasure: each window takes the
codes of window donor[i] (resample ablation); the effect is the change of the next-token loss (nats,
from the first query a group changes on), the objective that loss. Means ± std / sqrt(n) over the bases.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from latentcode.inputs import DONORS, CorpusWindows
from latentcode.intervention.patching.sweep import mean_and_se, patching_sweep
from latentcode.token_windows import METRICS, window_metrics

ATTRIBUTION_SHARE = 4  # attribution's passes of windows hold a quarter of the sweep's (a backward pass keeps more)


def measure_of(plan: Any, loaded: Any, n: int, seed: int) -> PairsMeasure | WindowsMeasure:
    """`n` bases of the plan's inputs drawn with `seed` for `loaded` (`patch_bases`), and what is measured
    on them."""
    bases = plan.inputs.patch_bases(loaded, plan.split, n, seed, plan.variant, plan.prediction)
    measure = WindowsMeasure if isinstance(plan.inputs, CorpusWindows) else PairsMeasure
    return measure.of(plan, loaded, bases)


class _Measure:
    """What both measures do alike: a search's exact scores are the sweep's effect and its s.e."""

    scoring: dict[str, Any] = {}  # options of the sweep a search scores with

    def scores(self, model: Any, groups: Sequence, **options: Any) -> list[tuple[float, float]]:
        table, _ = self.sweep(model, groups, **self.scoring, **options)
        return list(zip(table[self.effect].astype(float), table[f"{self.effect} se"].astype(float), strict=True))

    def conclude(self, table: Any, summary: dict[str, Any]) -> None:
        """Add to a sweep's summary what its table shows at a glance (nothing, unless said)."""

    def describe(self, plan: Any) -> str:
        """The cost line said before the work."""
        passes = plan.cost.get("examples", plan.cost.get("window_passes", 0))
        what = "search" if plan.search else f"{plan.cost['groups']} groups"
        return (f"cost: at most {plan.cost['groups']} groups patched, about {passes:,} {self.unit} forward passes "
                f"({what}; {self.bases(plan)}) on {plan.split}")

    def attribution(self, model: Any, groups: Sequence, table: Any) -> tuple[np.ndarray, np.ndarray]:
        """Attribution's estimate of each group's change of the objective and the exact change (`[groups]`
        each; the table gains the exact one's column where it had none)."""
        from latentcode.intervention.patching.site_groups import union_of

        found = self.attributions(model, union_of(groups), contrast=False)
        estimate = sum(weight * attribution.for_groups(groups).mean(1) for weight, attribution in found)
        return estimate, self.exact_objective(table)

    def attribution_maps(self, model: Any, layers: Sequence[int]) -> dict[int, np.ndarray]:
        """Per layer `[query, key]`: the estimate of patching each pair (all heads, mean over the bases), of
        the objective (a run's: with the r' donor minus with the third donor)."""
        maps: dict[int, Any] = {}
        every_pair = ",".join(f"{layer}:*:*" for layer in layers)
        for weight, attribution in self.attributions(model, every_pair, contrast=True):
            for layer in attribution.effects:
                maps[layer] = maps.get(layer, 0.0) + weight * np.nan_to_num(attribution.map(layer, self.task.seq_len))
        return maps


class PairsMeasure(_Measure):
    """`pairs`: `n` counterfactual pairs of the run's task."""

    effect = "transfer"
    unit = "example"
    donors_scored, donors_confirmed = 2, 3  # a search's passes per group and base: r' and third; and same
    scoring = {"relations": ("different", "third")}

    def __init__(self, task: Any, pairs: Any):
        self.task, self.pairs = task, pairs

    @classmethod
    def of(cls, plan: Any, loaded: Any, pairs: Any) -> PairsMeasure:
        return cls(plan.task, pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def counts(self) -> Any:
        return self.pairs.counts

    def bases(self, plan: Any) -> str:
        donors = "2 donors to select, 3 to confirm" if plan.search else "3 donors"
        return f"{len(self)} pairs x {donors}; variant {plan.variant}"

    def summary(self, plan: Any, loaded: Any) -> dict[str, Any]:
        return {"run": str(plan.source.path), "task": self.task.config(), "split": plan.split,
                "variant": plan.variant, "n": len(self), "prediction": self.pairs.prediction,
                "pairs": self.pairs.counts,
                "checkpoint_sha256": loaded.identity["checkpoint_sha256"]}  # a report shows it with this model only

    def sweep(self, model: Any, groups: Sequence, on_pass: Callable[[int], None] | None = None,
              relations: Sequence[str] = DONORS, groups_per_pass: int | None = None) -> tuple[Any, np.ndarray]:
        """`transfer_sweep`'s table of the groups and their per-pair transfer `[groups, n]`."""
        from latentcode.intervention.transfer import per_example, transfer_sweep

        table = transfer_sweep(model, self.task, self.pairs, groups, relations=relations, on_pass=on_pass,
                               groups_per_pass=groups_per_pass)
        return table, per_example(table, "different", "follow") - per_example(table, "third", "follow")

    def attributions(self, model: Any, sites: Any, contrast: bool) -> list[tuple[float, Any]]:
        """(weight, `attribution_patching` of the logit difference with the r' donor), and with `contrast`
        minus that with the third donor."""
        from latentcode.intervention.patching.attribution import attribution_patching
        from latentcode.intervention.transfer import counterfactual_metrics, output_position

        position = output_position(self.task, self.pairs.prediction)
        objective = counterfactual_metrics(self.pairs, self.task.objective, position)["logit_difference"]
        return [(weight, attribution_patching(model, self.pairs.base.torch().x, self.pairs.donors[relation].torch().x,
                                              objective, sites=sites))
                for weight, relation in ((1.0, "different"), (-1.0, "third"))[:2 if contrast else 1]]

    def exact_objective(self, table: Any) -> np.ndarray:
        """The exact change of the logit difference per group with the r' donor (added to `table`)."""
        from latentcode.intervention.transfer import per_example

        exact = (per_example(table, "different", "logit_difference")
                 - table["logit_difference (unpatched)"].iloc[0]).mean(1)
        table["logit_difference effect"] = exact
        return exact


class WindowsMeasure(_Measure):
    """`ids`: `n` token windows `[n, seq_len + 1]` (on the model's device) of a causal LM, each patched
    with the codes of window `donor[i]`, read from the plan's `first_query` on in passes of its `batch_size`."""

    effect = "change"
    unit = "window"
    donors_scored = donors_confirmed = 1

    def __init__(self, plan: Any, loaded: Any, ids: Tensor, donor: np.ndarray):
        self.plan, self.task, self.loaded = plan, plan.task, loaded
        self.windows, self.targets = ids[:, :-1], ids[:, 1 + plan.first_query:]
        self.donor = donor
        self.batches = [slice(start, start + plan.batch_size) for start in range(0, len(ids), plan.batch_size)]

    @classmethod
    def of(cls, plan: Any, loaded: Any, bases: tuple[np.ndarray, np.ndarray]) -> WindowsMeasure:
        ids, donor = bases
        return cls(plan, loaded, torch.from_numpy(ids).to(loaded.device), donor)

    def __len__(self) -> int:
        return len(self.windows)

    @property
    def counts(self) -> dict[str, int]:
        return {"windows": len(self)}

    def conclude(self, table: Any, summary: dict[str, Any]) -> None:
        summary["loss_before"] = float(table["before"].iloc[0])
        summary["largest"] = table.nlargest(min(5, len(table)), "change")[["group", "change", "change se"]].to_dict(
            "records")

    def bases(self, plan: Any) -> str:
        return (f"{len(self)} windows of {self.task.seq_len} tokens, each with a donor window, in passes of up to "
                f"{self.plan.batch_size}"
                + ("; then a backward pass per batch (attribution)" if plan.attribution else ""))

    def summary(self, plan: Any, loaded: Any) -> dict[str, Any]:
        return {"model": loaded.name, "path": loaded.identity.get("model_path"), "method": "resample ablation",
                "split": plan.split, "seq_len": self.task.seq_len, "n": len(self), "seed": plan.seed,
                "layers": list(plan.layers or []), "sites": plan.sites,
                "positions": f"{self.plan.first_query}..{self.task.seq_len - 1}", "donors": self.donor.tolist()}

    def _metrics(self, part: slice | np.ndarray) -> dict[str, Callable[[Any], Tensor]]:
        """METRICS as functions of a model output of the windows `part`; the three read one log-softmax
        (kept with the output it came from, so a later output never reads a stale one)."""
        targets, first_query, kept = self.targets[part], self.plan.first_query, [None, None]

        def metric(index: int) -> Callable[[Any], Tensor]:
            def of(output: Any) -> Tensor:
                if kept[0] is not output:
                    logits = output if isinstance(output, Tensor) else output.logits
                    kept[0], kept[1] = output, window_metrics(logits[:, first_query:], targets)
                return kept[1][:, index]
            return of

        return {name: metric(index) for index, name in enumerate(METRICS)}

    def sweep(self, model: Any, groups: Sequence, on_pass: Callable[[int], None] | None = None,
              groups_per_pass: int | None = None) -> tuple[Any, np.ndarray]:
        """A row per group (the loss before and after, its change and those of the probability and the
        accuracy, mean ± s.e.) and the per-window loss change `[groups, n]`, batch by batch."""
        import pandas as pd

        sweeps = []
        for batch in self.batches:
            sweeps.append(patching_sweep(model, self.loaded.inputs(self.windows[batch]),
                                         self.loaded.inputs(self.windows[self.donor[batch]]), groups,
                                         self._metrics(batch), max_examples_per_pass=self.plan.batch_size,
                                         on_pass=on_pass))
            if on_pass is not None:
                on_pass(2 * len(self.windows[batch]))  # the base and the donor
        base = {name: np.concatenate([sweep.base[name] for sweep in sweeps]) for name in METRICS}  # [n]
        patched = {name: np.concatenate([sweep.patched[name] for sweep in sweeps], axis=1) for name in METRICS}
        change = {name: patched[name] - base[name][None] for name in METRICS}  # [groups, n]
        rows = []
        for index, group in enumerate(groups):
            row = {"model": self.loaded.name, "split": self.plan.split, "T": self.task.seq_len, "n": len(self),
                   **group.coordinates, "group": group_name(group),
                   "sites": group.selector.spec() if "head" in group.coordinates else "",
                   "positions": f"{self.plan.first_query}..{self.task.seq_len - 1}",
                   "metric": "next-token loss (nats)", "before": float(base[METRICS[0]].mean()),
                   "after": float(patched[METRICS[0]][index].mean())}
            row["change"], row["change se"] = mean_and_se(change[METRICS[0]][index])
            for name, short in zip(METRICS[1:], ("probability", "accuracy"), strict=True):
                row[f"{short} change"], row[f"{short} change se"] = mean_and_se(change[name][index])
            rows.append(row)
        table = pd.DataFrame(rows)
        table.attrs["forward_passes"] = sum(sweep.forward_passes for sweep in sweeps)
        return table, change[METRICS[0]]

    def attributions(self, model: Any, sites: Any, contrast: bool) -> list[tuple[float, Any]]:
        """(share of the windows, `attribution_patching` of the next-token loss) per pass of a quarter of a
        batch (a backward pass keeps every activation)."""
        from latentcode.intervention.patching.attribution import attribution_patching

        step, found = max(1, self.plan.batch_size // ATTRIBUTION_SHARE), []
        for start in range(0, len(self), step):
            part = slice(start, start + step)
            with torch.enable_grad():
                found.append((len(self.windows[part]) / len(self), attribution_patching(
                    model, self.loaded.inputs(self.windows[part]), self.loaded.inputs(self.windows[self.donor[part]]),
                    self._metrics(part)[METRICS[0]], sites=sites)))
        return found

    def exact_objective(self, table: Any) -> np.ndarray:
        return table["change"].to_numpy(float)


def group_name(group: Any) -> str:
    """A window table's name of a group: l1.h3 (heads grid), l1 sink k=0 (offsets), else its selector."""
    coordinates = group.coordinates
    if "head" in coordinates and "query_part" not in coordinates:
        return f"l{coordinates['layer']}.h{coordinates['head']}"
    if "band" in coordinates:
        return f"l{coordinates['layer']} {coordinates['band']}"
    return group.name
