"""Does patching a site group transfer the donor's sub-task? Patching sweeps read against their
baseline, on counterfactual pairs from a task (`Task.counterfactual_pairs`).

For each group, the codes are patched from the "different" donor (sub-task r') and, on the same
bases, from the "third" donor (sub-task r'', neither the base's nor r'), and three metrics of the
measured prediction are read:

    follow            the prediction is r''s answer (classification: argmax equals it; regression:
                      closer to r''s value than to the true one)
    keep              the prediction is the true answer (the reverse)
    logit_difference  logit[r''s answer] - logit[true answer] (regression: squared error to the
                      true value minus squared error to r''s value), differentiable

    transfer = follow (different donor) - follow (third donor)
    damage   = keep (unpatched) - keep (same-sub-task donor)

"transfer" is the part of "follow" that the donor's sub-task explains: a damaged code can land on
r''s answer by itself, and the third donor measures how often. "damage" is how often the patch
breaks the model's own answer when the donor's sub-task is the base's own (nothing to transfer): a
group that only damages shows a large damage beside a transfer near 0. Standard errors are taken
over the paired per-base differences.

`latentcode patch` calls `transfer_sweep`; `analyses/rule_localisation.py` builds the paper-task maps
on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.intervention.patching import SiteGroup, patching_sweep
from latentcode.intervention.patching.sweep import mean_and_se

METRICS = ("follow", "keep", "logit_difference")


def counterfactual_metrics(pairs: Any, objective: str, position: int) -> dict[str, Any]:
    """The three metrics (module docstring) of output position `position` (an index into the model's
    output sequence, e.g. -1) for `pairs` (`CounterfactualPairs`); `objective` is the task's
    ("classification" or "regression")."""
    answer = torch.as_tensor(pairs.counterfactual_answer)
    truth = torch.as_tensor(pairs.base_answer)
    if objective == "classification":
        answer, truth = answer.long(), truth.long()

        def logits(output: Tensor) -> Tensor:
            return output[:, position].float()

        def on(labels: Tensor, output: Tensor) -> Tensor:  # the answers follow the output's device
            return labels.to(output.device)

        return {
            "follow": lambda output: (logits(output).argmax(-1) == on(answer, output)).float(),
            "keep": lambda output: (logits(output).argmax(-1) == on(truth, output)).float(),
            "logit_difference": lambda output: (logits(output).gather(1, on(answer, output)[:, None])[:, 0]
                                                - logits(output).gather(1, on(truth, output)[:, None])[:, 0]),
        }
    answer, truth = answer.float(), truth.float()

    def value(output: Tensor) -> Tensor:
        return output[:, position, 0].float()

    def distances(output: Tensor) -> tuple[Tensor, Tensor]:  # to the base's answer, to the counterfactual one
        return (value(output) - truth.to(output.device)).abs(), (value(output) - answer.to(output.device)).abs()

    return {
        "follow": lambda output: (distances(output)[1] < distances(output)[0]).float(),
        "keep": lambda output: (distances(output)[0] <= distances(output)[1]).float(),
        "logit_difference": lambda output: distances(output)[0] ** 2 - distances(output)[1] ** 2,
    }


def output_position(task: Any, prediction: int) -> int:
    """The index into the model's output sequence of the task's prediction `prediction`."""
    return -task.n_predictions + prediction


def transfer_sweep(model: nn.Module, task: Any, pairs: Any, groups: Sequence[SiteGroup],
                   relations: Sequence[str] = ("different", "third"), **sweep_options: Any):
    """One row per group: its coordinates, `group`, `n`, per relation R and metric M the mean `M (R)`
    and its standard error `M (R) se`, the unpatched means `M (unpatched)`, and `transfer`,
    `transfer se` where both the different and the third donor were run, `damage`, `damage se` where
    the same donor was. Returns a pandas table. `sweep_options` go to `patching_sweep` (e.g.
    `on_pass`, `groups_per_pass`)."""
    import pandas as pd

    position = output_position(task, pairs.prediction)
    metrics = counterfactual_metrics(pairs, task.objective, position)
    base_x = pairs.base.torch().x
    sweeps = {relation: patching_sweep(model, base_x, pairs.donors[relation].torch().x, groups, metrics,
                                       **sweep_options)
              for relation in relations}
    first = sweeps[relations[0]]
    n = len(pairs)
    rows = []
    for index, group in enumerate(groups):
        row = {**group.coordinates, "group": group.name, "n": n}
        for metric in METRICS:
            row[f"{metric} (unpatched)"] = float(first.base[metric].mean())
        for relation, sweep in sweeps.items():
            for metric in METRICS:
                row[f"{metric} ({relation})"], row[f"{metric} ({relation}) se"] = mean_and_se(
                    sweep.patched[metric][index])
        if "different" in sweeps and "third" in sweeps:
            paired = sweeps["different"].patched["follow"][index] - sweeps["third"].patched["follow"][index]
            row["transfer"], row["transfer se"] = mean_and_se(paired)
        if "same" in sweeps:
            row["damage"], row["damage se"] = mean_and_se(first.base["keep"] - sweeps["same"].patched["keep"][index])
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["per_example"] = PerExample({relation: sweep.patched for relation, sweep in sweeps.items()})
    table.attrs["forward_passes"] = sum(sweep.forward_passes for sweep in sweeps.values())
    return table


class PerExample(dict):
    """`{relation: {metric: [groups, n] array}}` behind a table, compared by identity: pandas compares
    the attrs of the tables it concatenates, and arrays of different lengths cannot be compared
    (`pd.concat` of two sweeps on different pairs raised); unequal attrs are dropped instead."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__


def per_example(table, relation: str, metric: str) -> np.ndarray:
    """`[groups, n]` values of `metric` under `relation` behind a `transfer_sweep` table."""
    return table.attrs["per_example"][relation][metric]
