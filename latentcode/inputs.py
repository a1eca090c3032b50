"""What a model reads, with one interface for every model and every operation (extract, intervene):
a task's instances (`TaskInstances`) or a causal LM's windows of the corpus (`CorpusWindows`, over
`latentcode.token_windows.TokenWindows`).

    inputs = inputs_of(subject.task(task))               # the plans: torch-free checks through it
    inputs.check_split(split); inputs.selector(sites, variant)
    for x, rows in inputs.batches(loaded, split, n, seed, variant, batch_size, range(n_batches), sites):
        ...  # run_extraction: forward x, then writer.append(codes, prediction, **rows)
    kept = inputs.scores(logits, rows["target"], first_query)   # intervene: what its metrics need
    inputs.evaluate(kept, inputs.subset(everything, indices))   # the metrics of these instances

`batches` yields the model's inputs `x` (token ids or features, numpy) and what the codes file keeps of
them (`labels`, `split`, `target`, `extra`); `description` the file's task attributes (task config,
label value names, split descriptions, token names); `selector_record` how the file names its sites.
A task's batch `i` is drawn from `(seed, i)`, so a sharded extraction equals a one-process one; a
corpus's windows are drawn all at once from `seed` and cut into batches (with `targets`, one token
more each: the next token of every position).

The metrics: a task's own (`task.evaluate` of the predictions at its prediction positions, re-evaluated
on any subset: a metric need not be a mean over instances); a window's next-token loss, probability
and accuracy from the first query an edit can change on (`token_windows.window_metrics`), each a mean
over windows. `scores` keeps only what they need of a pass, so a 49k-word vocabulary's logits never
accumulate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latentcode.errors import UsageError, about
from latentcode.sources.sites import Selector, parse_selector
from latentcode.store import Site
from latentcode.tasks import Batch, Task, eval_seed
from latentcode.token_windows import LABEL_VALUES, METRICS, TokenWindows
from latentcode.validation import check_split, check_variant

Rows = tuple[np.ndarray, dict[str, Any]]  # the model's inputs, and the keyword arguments of CodeWriter.append


def inputs_of(task: Task | TokenWindows) -> TaskInstances | CorpusWindows:
    """What `Subject.task` gave, read as an extraction reads it."""
    return CorpusWindows(task) if isinstance(task, TokenWindows) else TaskInstances(task)


@dataclass(frozen=True)
class TaskInstances:
    """A Task's instances: `batch_size` 256 per forward pass unless given, the split's evaluation seed,
    the model's prediction at the task's last `n_predictions` positions recorded beside the target."""

    task: Task
    batch_size = 256
    labels_from_sites = True  # `batches` adds the labels of the sites' positions (task.derived_labels)

    @property
    def seq_len(self) -> int:
        return self.task.seq_len

    @property
    def n_predictions(self) -> int:
        return self.task.n_recorded_predictions

    def check_split(self, split: str | None) -> str:
        """`split` (None: the task's held-out split), if the task has it."""
        with about("split"):
            return check_split(self.task.analysis.held_out_split if split is None else split, self.task)

    def selector(self, sites: Any, variant: str | None) -> tuple[Selector, str]:
        """The sites (the task places its own, e.g. `sraven-rule`) and the variant (default: the sites',
        else the task's first), checked together."""
        with about("sites"):
            selector = parse_selector(sites, self.task)
        with about("variant"):
            variant = check_variant(variant or selector.default_variant or self.task.variants[0], self.task)
            selector.check_variant(variant, self.task)
        return selector, variant

    @staticmethod
    def default_seed(split: str) -> int:
        return eval_seed(split)  # every model is read on the same instances

    def description(self, loaded: Any, split: str) -> dict[str, Any]:
        task = self.task
        return {"task_config": task.config(), "task_analysis": task.analysis.to_dict(),
                "value_names": task.value_names(), "column_names": task.column_names(),
                "prediction_kind": task.prediction_kind(),
                "split_descriptions": getattr(task, "split_descriptions", {}),
                "position_names": task.position_names(), "token_names": task.token_names()}

    @staticmethod
    def selector_record(spec: Any, selector: Selector, sites: list, variant: str | None) -> dict[str, Any]:
        return {"spec": spec if isinstance(spec, str) else selector.name, **selector.to_dict(), "sites": sites,
                "variant": variant}

    def batches(self, loaded: Any, split: str, n: int, seed: int, variant: str | None, batch_size: int,
                indices: range, sites: Sequence[Site], targets: bool = True) -> Iterator[Rows]:
        """`targets`: always (a task's batch carries its targets)."""
        task, vocabulary = self.task, self.task.token_names()
        for index in indices:
            batch = task.sample(min(batch_size, n - index * batch_size), split, seed=(seed, index), variant=variant)
            # The input tokens, so that a key can be named by its token (the smallest integer type)
            extra = {"token_ids": batch.x.astype(np.uint8 if len(vocabulary) <= 256 else np.int32)} if vocabulary \
                else {}
            yield batch.x, {"labels": {**batch.labels, **task.derived_labels(batch, sites)}, "split": batch.split,
                            "target": batch.y, "extra": extra}

    def positions(self, first_query: int) -> str:
        """The positions whose outputs the metrics read: the task's prediction positions."""
        return f"{self.seq_len - self.task.n_predictions}..{self.seq_len - 1}"

    def scores(self, logits: Any, target: Any, first_query: int) -> np.ndarray:
        """`[batch, n_predictions, d_out]`: the outputs at the prediction positions."""
        return logits[:, -self.task.n_predictions :, :].float().cpu().numpy()

    @staticmethod
    def gathered(drawn: Sequence[Rows], split: str, variant: str | None) -> Batch:
        """The drawn batches as one `Batch` (what `evaluate` scores against)."""
        labels = [rows["labels"] for _, rows in drawn]
        return Batch(x=np.concatenate([x for x, _ in drawn]), y=np.concatenate([rows["target"] for _, rows in drawn]),
                     labels={name: np.concatenate([batch[name] for batch in labels]) for name in labels[0]},
                     split=split, variant=variant)

    @staticmethod
    def subset(batch: Batch, indices: np.ndarray) -> Batch:
        return Batch(x=batch.x[indices], y=batch.y[indices],
                     labels={name: values[indices] for name, values in batch.labels.items()},
                     split=batch.split, variant=batch.variant)

    def evaluate(self, kept: np.ndarray, batch: Batch) -> dict[str, float]:
        """The task's metrics of the predictions `kept` of `batch`'s instances."""
        return self.task.evaluate(kept, batch)


@dataclass(frozen=True)
class CorpusWindows:
    """A causal LM's windows of the corpus: one window of thousands of tokens per forward pass unless
    given (memory, and a shard per process), seed 0; labelled by their last token (`LABEL_VALUES`); no
    prediction recorded."""

    windows: TokenWindows
    batch_size = 1
    labels_from_sites = False  # a window is labelled by its last token alone
    n_predictions = 0

    @property
    def seq_len(self) -> int:
        return self.windows.seq_len

    def check_split(self, split: str | None) -> str:
        return self.windows.check_split(split)

    @staticmethod
    def selector(sites: Any, variant: str | None) -> tuple[Selector, None]:
        with about("variant"):
            if variant is not None:
                raise UsageError(f"a pretrained model reads windows of the language corpus, which have no variant; "
                                 f"got variant {variant!r}")
        with about("sites"):
            return parse_selector(sites), None

    @staticmethod
    def default_seed(split: str) -> int:
        return 0

    def description(self, loaded: Any, split: str) -> dict[str, Any]:
        tokenizer = loaded.tokenizer
        return {"task_config": {}, "value_names": LABEL_VALUES,
                "split_descriptions": {split: f"windows of {self.seq_len} tokens of the language corpus's {split} "
                                              "split"},
                # The text of every token id, so that the file names its tokens (the token view, keys named by
                # their text) without the tokenizer: about 0.5 MB for SmolLM2's 49,152 tokens, 2 s to decode.
                "token_names": [tokenizer.decode([token]) for token in range(len(tokenizer))]}

    @staticmethod
    def selector_record(spec: Any, selector: Selector, sites: list, variant: str | None) -> dict[str, Any]:
        return {"spec": spec, "sites": sites}

    def batches(self, loaded: Any, split: str, n: int, seed: int, variant: str | None, batch_size: int,
                indices: range, sites: Sequence[Site], targets: bool = False) -> Iterator[Rows]:
        """`targets`: each window's next tokens too (`[batch, seq_len]`: one token more is drawn)."""
        ids = self.windows.draw(loaded, split, n, seed, extra=int(targets))  # every process draws the same n
        inputs = ids[:, :-1] if targets else ids
        labels = self.windows.labels(loaded.tokenizer, inputs)
        for index in indices:
            rows = slice(index * batch_size, min(n, (index + 1) * batch_size))
            kept = {"labels": {name: values[rows] for name, values in labels.items()}, "split": split,
                    "extra": {"token_ids": inputs[rows]}}
            yield inputs[rows], {**kept, "target": ids[rows, 1:]} if targets else kept

    def positions(self, first_query: int) -> str:
        return f"{first_query}..{self.seq_len - 1}"

    @staticmethod
    def scores(logits: Any, target: Any, first_query: int) -> np.ndarray:
        """`[batch, 3]`: METRICS of each window from the first query on."""
        import torch

        target = torch.as_tensor(target[:, first_query:], device=logits.device)
        return TokenWindows.metrics(logits[:, first_query:], target).cpu().numpy()

    @staticmethod
    def gathered(drawn: Sequence[Rows], split: str, variant: str | None) -> None:
        return None  # a window's metrics are its own: nothing to score against

    @staticmethod
    def subset(batch: None, indices: np.ndarray) -> None:
        return None

    @staticmethod
    def evaluate(kept: np.ndarray, batch: None) -> dict[str, float]:
        """The mean METRICS over the windows of `kept`."""
        return dict(zip(METRICS, (float(value) for value in kept.mean(0)), strict=True))
