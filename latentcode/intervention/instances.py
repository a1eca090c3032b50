"""The instances an intervention reads, and its metrics of them, for either kind of task:

    instances = instances_of(plan, loaded)       # a Task's instances, or a causal LM's token windows
    kept = instances.keep(loaded.logits(instances.inputs(batch)), batch)  # per instance: outputs or metrics
    instances.evaluate(all_kept, resamples)      # [resamples] dicts: the metrics of each resample

`TaskInstances`: `n` instances of the task's split (drawn batch by batch with `task.sample`, seed
`(seed, batch index)`, the split's evaluation seed unless given), read on the task's own metrics
(`task.evaluate`, re-evaluated on each bootstrap resample: a metric need not be a mean over
instances). `WindowInstances`: `n` windows (`TokenWindows.draw`, one token more for the last
position's target), read on `window_metrics` from the plan's first query on, each a mean over
windows. Both keep only what the metrics need of a pass (predictions at the prediction positions,
or three numbers per window), so a 49k-word vocabulary's logits never accumulate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from latentcode.tasks import Batch, eval_seed
from latentcode.token_windows import METRICS, TokenWindows


class TaskInstances:
    """A trained model's task instances (see the module docstring)."""

    def __init__(self, plan: Any, loaded: Any) -> None:
        task, split, variant = plan.task, plan.split, plan.variant
        seed = eval_seed(split) if plan.seed is None else plan.seed
        self.task, self.device, self.sites = task, loaded.device, plan.sites
        self.n = plan.n
        self.batches = [slice(start, min(start + plan.batch_size, plan.n))
                        for start in range(0, plan.n, plan.batch_size)]
        self.drawn = [task.sample(part.stop - part.start, split, seed=(seed, index), variant=variant)
                      for index, part in enumerate(self.batches)]
        self.everything = Batch(
            x=np.concatenate([batch.x for batch in self.drawn]),
            y=np.concatenate([batch.y for batch in self.drawn]),
            labels={name: np.concatenate([batch.labels[name] for batch in self.drawn])
                    for name in self.drawn[0].labels},
            split=split, variant=variant)
        self.positions = f"{task.seq_len - task.n_predictions}..{task.seq_len - 1}"
        self.metric_names: tuple[str, ...] | None = None
        self._resampled: list[Batch] | None = None

    def inputs(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.drawn[index].x).to(self.device)

    def labels(self, index: int) -> dict[str, np.ndarray]:
        batch = self.drawn[index]
        return {**batch.labels, **self.task.derived_labels(batch, self.sites)}

    def keep(self, logits: torch.Tensor, index: int) -> np.ndarray:
        """`[batch, n_predictions, d_out]`: the outputs at the prediction positions."""
        return logits[:, -self.task.n_predictions :, :].float().cpu().numpy()

    def evaluate(self, kept: np.ndarray, resamples: np.ndarray | None = None) -> list[dict[str, float]]:
        """The task's metrics of all instances (resamples None), or of each resample `[R, n]`."""
        if resamples is None:
            return [self.task.evaluate(kept, self.everything)]
        if self._resampled is None:
            self._resampled = [self._resample(indices) for indices in resamples]
        return [self.task.evaluate(kept[indices], batch) for indices, batch in zip(resamples, self._resampled,
                                                                                 strict=True)]

    def _resample(self, indices: np.ndarray) -> Batch:
        everything = self.everything
        return Batch(x=everything.x[indices], y=everything.y[indices],
                     labels={name: values[indices] for name, values in everything.labels.items()},
                     split=everything.split, variant=everything.variant)


class WindowInstances:
    """A causal LM's token windows (see the module docstring)."""

    def __init__(self, plan: Any, loaded: Any) -> None:
        ids = plan.task.draw(loaded, plan.split, plan.n, 0 if plan.seed is None else plan.seed, extra=1)
        ids = torch.from_numpy(ids).to(loaded.device)  # the windows follow the model (a few int64 per token)
        self.n, self.first_query = plan.n, plan.first_query
        self.ids, self.targets = ids[:, :-1], ids[:, 1 + plan.first_query :]
        self.batches = [slice(start, start + plan.batch_size) for start in range(0, plan.n, plan.batch_size)]
        self.positions = f"{plan.first_query}..{plan.seq_len - 1}"
        self.metric_names = METRICS

    def inputs(self, index: int) -> torch.Tensor:
        return self.ids[self.batches[index]]

    def labels(self, index: int) -> dict[str, np.ndarray]:
        return {}  # a window carries no label (a per-label mean is refused by the plan's check)

    def keep(self, logits: torch.Tensor, index: int) -> np.ndarray:
        """`[batch, 3]`: METRICS of each window from the first query on."""
        return TokenWindows.metrics(logits[:, self.first_query :], self.targets[self.batches[index]]).cpu().numpy()

    def evaluate(self, kept: np.ndarray, resamples: np.ndarray | None = None) -> list[dict[str, float]]:
        """The mean METRICS over all windows (resamples None), or over each resample `[R, n]`."""
        means = kept.mean(0)[None] if resamples is None else kept[resamples].mean(1)
        return [dict(zip(METRICS, (float(value) for value in row), strict=True)) for row in means]


def instances_of(plan: Any, loaded: Any) -> TaskInstances | WindowInstances:
    """The instances of the plan's task: a causal LM's windows, or a Task's instances."""
    return (WindowInstances if isinstance(plan.task, TokenWindows) else TaskInstances)(plan, loaded)
