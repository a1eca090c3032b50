"""What a model reads, with one interface for every model and every operation (extract, intervene,
patch): a task's instances (`TaskInstances`) or a causal LM's windows of the corpus (`CorpusWindows`,
over `latentcode.token_windows.TokenWindows`).

    inputs = inputs_of(subject.task(task))               # the plans: torch-free checks through it
    inputs.check_split(split); inputs.selector(sites, variant)
    for x, rows in inputs.batches(loaded, split, n, seed, variant, batch_size, range(n_batches), sites):
        ...  # run_extraction: forward x, then writer.append(codes, prediction, **rows)
    kept = inputs.scores(logits, rows["target"], first_query)   # intervene: what its metrics need
    inputs.evaluate(kept, inputs.subset(everything, indices))   # the metrics of these instances
    inputs.check_patch(split, variant, prediction, per_head, n)   # patch: its bases checked
    inputs.patch_bases(loaded, split, n, seed, variant, prediction)   # pairs, or windows and donors

A task's batch `i` is drawn from `(seed, i)`, so a sharded extraction equals a one-process one; a corpus's
windows are drawn all at once from `seed` and cut into batches. `scores` keeps only what the metrics need
of a pass (a task's outputs at its prediction positions, a window's `window_metrics`), so a large
vocabulary's logits never accumulate. Patch compares a task's counterfactual pairs, or windows each taking
the codes of another (`TokenWindows.donors`: resample ablation).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latentcode.errors import UsageError, about
from latentcode.sources.sites import Selector, parse_selector
from latentcode.store import Site
from latentcode.tasks import Batch, Task, eval_seed, task_class, task_names
from latentcode.tasks.partitions import task_partitions
from latentcode.token_windows import (
    LABEL_VALUES,
    LOGIT_BYTES_PER_TOKEN,
    MAX_PATCH_TOKENS,
    MAX_TOKENS_PER_PASS,
    METRICS,
    TokenWindows,
    window_metrics,
)
from latentcode.validation import check_fits_in_memory, check_integer, check_split, check_variant

Rows = tuple[np.ndarray, dict[str, Any]]  # the model's inputs, and the keyword arguments of CodeWriter.append
DONORS = ("different", "third", "same")  # patch's donors of a pair: r', a third sub-task (the baseline), the base's


def inputs_of(task: Task | TokenWindows) -> TaskInstances | CorpusWindows:
    """What `Subject.task` gave, read as an extraction reads it."""
    return CorpusWindows(task) if isinstance(task, TokenWindows) else TaskInstances(task)


class _Inputs:
    """What both inputs answer alike."""

    task: Any

    @property
    def seq_len(self) -> int:
        return self.task.seq_len

    def partitions(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """The partitions of the task's positions that patch's grids and search read (`task_partitions`)."""
        return task_partitions(self.task)

    def check_budget(self, cost: Mapping[str, int], n: int) -> None:
        """Refuse a patch whose `cost` is beyond what the inputs allow (nothing, unless said)."""


@dataclass(frozen=True)
class TaskInstances(_Inputs):
    """A Task's instances: `batch_size` 256 per forward pass unless given, the split's evaluation seed,
    the model's prediction at the task's last `n_predictions` positions recorded beside the target;
    patched as counterfactual pairs."""

    task: Task
    batch_size = 256
    labels_from_sites = True  # `batches` adds the labels of the sites' positions (task.derived_labels)
    # patch: a base, what is read on it, the grids beside the task's partitions, the default number of bases
    unit, effect, grids, default_n = "pair", "transfer", ("rows", "heads", "offsets"), 256
    per_group = "3 x --n {n} forward passes"

    @property
    def n_predictions(self) -> int:
        return self.task.n_recorded_predictions

    def check_split(self, split: str | None) -> str:
        """`split` (None: the task's held-out split), if the task has it."""
        with about("split"):
            return check_split(self.task.analysis.held_out_split if split is None else split, self.task)

    def parse(self, spec: Any) -> Selector:
        """A selector of sites, the task's named ones (e.g. `sraven-rule`) among them."""
        return parse_selector(spec, self.task)

    def selector(self, sites: Any, variant: str | None) -> tuple[Selector, str]:
        """The sites (the task places its own, e.g. `sraven-rule`) and the variant (default: the sites',
        else the task's first), checked together."""
        with about("sites"):
            selector = self.parse(sites)
        with about("variant"):
            variant = check_variant(variant or selector.default_variant or self.task.variants[0], self.task)
            selector.check_variant(variant, self.task)
        return selector, variant

    @staticmethod
    def default_seed(split: str) -> int:
        return eval_seed(split)  # every model is read on the same instances

    @staticmethod
    def pass_size(batch_size: int, n: int) -> int:
        """Instances per forward pass: `batch_size`."""
        return batch_size

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

    def check_patch(self, split: str | None, variant: str | None, prediction: int, per_head: bool, n: int
                    ) -> tuple[str, str, int, int]:
        """(split, variant, prediction, examples per pass) of `n` counterfactual pairs: the split and
        variant to patch on (defaults: the held-out split, the task's first variant), after
        checking that the task draws pairs, that they fit in memory and that `prediction` is one of the
        task's prediction positions."""
        task = self.task
        if not task.provides("counterfactual_pairs"):
            having = [name for name in task_names() if task_class(name).provides("counterfactual_pairs")]
            raise UsageError(f"task {task.name!r} draws no counterfactual pairs (Task.counterfactual_pairs); patch "
                             f"needs them: {' and '.join(having)} have them")
        split = self.check_split(split)
        with about("variant"):
            variant = check_variant(variant or task.variants[0], task)
        # The bases and their three donors are drawn before the first pass ([n, sequence, d_in] each, float32,
        # with int64 indices of several times n while drawing them): what must fit, whatever the groups.
        with about("n"):
            check_fits_in_memory(4 * n * (1 + len(DONORS)) * task.seq_len * (task.d_in or 1) + 32 * n,
                                 f"{n} base/donor pairs (sequences of {task.seq_len}, with {len(DONORS)} donors each)")
        if not -task.n_predictions <= prediction < task.n_predictions:
            with about("prediction"):
                raise UsageError(f"prediction {prediction}: the task has {task.n_predictions} prediction positions "
                                 f"(0..{task.n_predictions - 1}, or negative from the end)")
        return split, variant, prediction, self.batch_size

    @staticmethod
    def patch_cost(groups: int, n: int, batch_size: int) -> dict[str, int]:
        """Groups patched and example forward passes (three donors each, and the unpatched base)."""
        return {"groups": groups, "examples": len(DONORS) * n * (groups + 2)}

    def patch_bases(self, loaded: Any, split: str, n: int, seed: int, variant: str, prediction: int) -> Any:
        """`n` counterfactual pairs of `split` (`Task.counterfactual_pairs`)."""
        return self.task.counterfactual_pairs(n, split, seed=seed, variant=variant, prediction=prediction)

    @staticmethod
    def unknown_grid(grid: str, error: Exception) -> Exception:
        return error  # the task's own message names its partitions


@dataclass(frozen=True)
class CorpusWindows(_Inputs):
    """A causal LM's windows of the corpus: one window of thousands of tokens per forward pass unless
    given (memory, and a shard per process), seed 0; labelled by their last token (`LABEL_VALUES`); no
    prediction recorded; patched by resample ablation (each window with the codes of another)."""

    task: TokenWindows
    batch_size = 1
    labels_from_sites = False  # a window is labelled by its last token alone
    n_predictions = 0
    unit, effect, grids, default_n = "window", "change", ("heads", "offsets"), 32
    per_group = "--n {n} window forward passes"

    def check_split(self, split: str | None) -> str:
        return self.task.check_split(split)

    @staticmethod
    def parse(spec: Any) -> Selector:
        return parse_selector(spec)

    def selector(self, sites: Any, variant: str | None) -> tuple[Selector, None]:
        with about("variant"):
            if variant is not None:
                raise UsageError(f"a pretrained model reads windows of the language corpus, which have no variant; "
                                 f"got variant {variant!r}")
        with about("sites"):
            return self.parse(sites), None

    @staticmethod
    def default_seed(split: str) -> int:
        return 0

    def pass_size(self, batch_size: int, n: int) -> int:
        """Windows per forward pass: at most `batch_size`, `n` and MAX_TOKENS_PER_PASS tokens (one at least)."""
        return min(batch_size, n, max(1, MAX_TOKENS_PER_PASS // self.seq_len))

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
        ids = self.task.draw(loaded, split, n, seed, extra=int(targets))  # every process draws the same n
        inputs = ids[:, :-1] if targets else ids
        labels = self.task.labels(loaded.tokenizer, inputs)
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
        return window_metrics(logits[:, first_query:], target).cpu().numpy()

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

    def check_patch(self, split: str | None, variant: str | None, prediction: int, per_head: bool, n: int
                    ) -> tuple[str, None, None, int]:
        """(split, None, None, windows per pass) of `n` >= 2 windows of `split` (default validation), each
        taking another's codes, in passes whose logits fit; what only a task's pairs can give refused."""
        for option, value, default in (("variant", variant, None), ("prediction", prediction, -1),
                                       ("per_head", per_head, False)):
            if value != default:
                with about(option):
                    raise UsageError(f"{option} {value!r} needs a run's task; {self.task.model_name} is a pretrained "
                                     "model, patched by resample ablation of its windows (--task seq_len=T)")
        split = self.check_split(split)
        with about("n"):
            n = check_integer("n", n, minimum=1)
            if n < 2:
                raise UsageError(f"n={n}: resample ablation needs at least 2 windows (each takes the codes of another)")
            batch_size = self.pass_size(n, n)
            check_fits_in_memory(LOGIT_BYTES_PER_TOKEN * batch_size * self.seq_len,
                                 f"passes of {batch_size} windows of {self.seq_len} tokens (their logits)")
        return split, None, None, batch_size

    @staticmethod
    def patch_cost(groups: int, n: int, batch_size: int) -> dict[str, int]:
        """Groups patched, window forward passes and forward passes (batches of `batch_size`)."""
        return {"groups": groups, "window_passes": n * (groups + 2), "passes": -(-n // batch_size) * (groups + 2)}

    def check_budget(self, cost: Mapping[str, int], n: int) -> None:
        """Refuse a patch beyond MAX_PATCH_TOKENS tokens through the model."""
        tokens = cost.get("window_passes", cost.get("examples", 0)) * self.seq_len
        if tokens > MAX_PATCH_TOKENS:
            with about("n"):
                raise UsageError(f"n={n} windows x ({cost['groups']} groups + 2) passes x {self.seq_len} tokens "
                                 f"is {tokens:,} tokens through the model, beyond the budget of {MAX_PATCH_TOKENS:,} "
                                 "(hours of a CPU); give a smaller --n, fewer --layers or a shorter --task seq_len")

    def patch_bases(self, loaded: Any, split: str, n: int, seed: int, variant: None, prediction: None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """int64 `[n, seq_len + 1]`: `n` windows of `split` and the next token of their last position, and
        `[n]` the donor window of each (`TokenWindows.donors`)."""
        return self.task.draw(loaded, split, n, seed, extra=1), self.task.donors(n, seed)

    def unknown_grid(self, grid: str, error: Exception) -> Exception:
        return UsageError(f"grid {grid!r}: a pretrained model is patched by (layer, head) (--grid heads), by "
                          "relative-offset band (--grid offsets) or by its windows' partitions "
                          f"({', '.join(self.partitions())}); rows need a run's task")
