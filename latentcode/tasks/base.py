"""What every in-context learning task shares: the batch and the task interface (the registry of
tasks is `latentcode.tasks.registry`).

``Task.sample(n, split, seed, variant)`` is a pure function of the task's config and its arguments;
its generator is ``np.random.default_rng([task_seed, SAMPLE_STREAM, split_index, len(seed), *seed])``
(``seed``: a non-negative int or a tuple of them). The variants of one ``(split, seed)`` are views of
the same instances. What defines the task (the splits, fixed inputs) is drawn from
``default_rng([task_seed, stream])`` alone. The whole seed scheme, and why, is in docs/concepts/tasks.md.
"""

from __future__ import annotations

import abc
import inspect
import numbers
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from latentcode import validation
from latentcode.errors import LatentcodeError

SPLIT_STREAM = 0
FIXED_INPUT_STREAM = 1
SAMPLE_STREAM = 2


@dataclass(frozen=True)
class Batch:
    """A batch of task instances.

    Attributes:
        x: the model input: float32 ``[n, seq_len, d_in]``, or int64 token ids ``[n, seq_len]``
            for a task with a ``d_vocab`` (e.g. the language task's bytes).
        y: ``[n, n_predictions]`` targets: float32 values (regression) or int64 class indices
            (classification), one per prediction position (the last ``n_predictions`` tokens).
        labels: named arrays describing each instance, each with first dimension ``n``.
        split: the split the instances were drawn from.
        variant: the input variant they were drawn with.
    """

    x: np.ndarray
    y: np.ndarray
    labels: dict[str, np.ndarray]
    split: str
    variant: str

    def __post_init__(self) -> None:
        n = len(self.x)
        if len(self.y) != n:
            raise TaskError(f"y has {len(self.y)} rows but x has {n}")
        for name, values in self.labels.items():
            if len(values) != n:
                raise TaskError(f"label {name!r} has {len(values)} rows but x has {n}")

    def __len__(self) -> int:
        return len(self.x)

    def torch(self, device=None) -> Batch:
        """The same batch with ``x`` and ``y`` as torch tensors on ``device`` (default CPU, sharing
        memory with the arrays), for a model: ``model(batch.torch().x)``; labels stay numpy arrays."""
        import torch

        return replace(self, x=torch.as_tensor(self.x, device=device),
                       y=torch.as_tensor(self.y, device=device))


class TaskError(LatentcodeError, ValueError):
    """A task parameter, split, variant or input that the task does not accept; says which and why."""


@dataclass(frozen=True)
class AnalysisDefaults:
    """What the paper analyses for a task; extraction writes it into every codes file (and training
    into every run directory), so the analysis stage reads it from there and never asks the task.

    Attributes:
        selector: the named site set of the paper's latent-code analysis (a name `Task.selectors`
            or the generic selectors of `latentcode.sources.sites` know).
        variant: the input variant that analysis reads.
        probe_label: the label the paper decodes from the codes (the sub-task).
        picture_label: what figures colour by: one value per example.
        headline_metric: the task metric (of `Task.evaluate`) that sums up a split.
        selection_split: the in-distribution split a sweep selects runs on (the paper's protocol).
        lower_is_better: whether a lower headline metric is better (a loss, bits per byte).
        held_out_split: the split whose codes are read beside `train`'s, where probes fitted on
            `train` are scored: unseen compositions (`ood`), or held-out text (`validation`).
    """

    selector: str
    variant: str
    probe_label: str
    picture_label: str
    headline_metric: str
    selection_split: str = "test"
    lower_is_better: bool = False
    held_out_split: str = "ood"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class TrainingSetup:
    """The paper's training setup for a task, by scale: a preset of `latentcode train`.

    Attributes:
        description: one line for `latentcode train --help`.
        task: the `get_task` parameters of the paper's default setting.
        model: `ModelConfig` fields of the paper's model (d_in or d_vocab, d_out and n_ctx come from
            the task).
        optimizer: batch_size, learning_rate, weight_decay, warmup_steps.
        train_instances: training instances per scale (tiny, demo, cpu, paper).
        eval_instances: evaluation instances per split, per scale.
        paper_grid: the values the paper searched, per field (`latentcode sweep --grid paper`).
        shipped: overrides with which the checkpoints in `models/` were trained (and so how
            `latentcode demo --train` trains), e.g. a variant this CPU can learn.
        scales: overrides of task, model or training fields by scale (applied before the user's),
            e.g. a smaller model that a CPU trains at the cpu scale and the paper's at paper.
    """

    description: str
    task: dict[str, Any]
    model: dict[str, Any]
    optimizer: dict[str, Any]
    train_instances: dict[str, int]
    eval_instances: dict[str, int]
    paper_grid: dict[str, list]
    shipped: dict[str, Any] = field(default_factory=dict)
    scales: dict[str, dict[str, Any]] = field(default_factory=dict)


# The optional capabilities of a task (`Task.provides`): the methods of `Task` that a task may override.
CAPABILITIES = ("derived_labels", "position_partitions", "counterfactual_pairs", "transplant_pairs")


def eval_seed(split: str) -> int:
    """The constant sample seed of a split's fixed evaluation set (see the module docstring)."""
    return zlib.crc32(b"eval/" + split.encode())


class Task(abc.ABC):
    """An in-context learning task: named splits of task combinations and a seeded generator.

    Subclasses set the class attributes below, set the instance attributes (and one attribute
    per ``__init__`` parameter, which ``config`` reads) in ``__init__``, and implement
    ``_generate`` and ``evaluate``.
    """

    name: ClassVar[str]
    splits: ClassVar[tuple[str, ...]]
    variants: ClassVar[tuple[str, ...]]  # the first one is the default
    label_names: ClassVar[tuple[str, ...]]  # the labels of every batch (`Batch.labels`)
    # Labels a codes file gains at extraction from the sites recorded (`derived_labels`), not in a
    # batch: e.g. SRAVEN's `rule`, the rule of the sites' common query position.
    derived_label_names: ClassVar[tuple[str, ...]] = ()
    objective: ClassVar[str]  # "regression" or "classification"
    analysis: ClassVar[AnalysisDefaults]
    training_setup: ClassVar[TrainingSetup | None] = None  # None: no `latentcode train` preset
    # Parameters that only choose how instances of the same task are read (language's window length):
    # codes read with another value still come from a run trained with one (latentcode.provenance).
    reading_parameters: ClassVar[tuple[str, ...]] = ()
    # `get_task` parameters of a small instance of the task, quick to build and sample ({}: the
    # defaults): the contract tests (tests/tasks/test_task_contract.py) run every task with them.
    small_config: ClassVar[dict[str, Any]] = {}

    seq_len: int  # tokens per instance
    d_in: int | None  # width of one input token (None for a task of integer tokens)
    d_vocab: int | None = None  # tasks of integer tokens: how many ids (x is int64 [n, seq_len])
    d_out: int  # model output width per prediction position
    n_predictions: int  # how many final positions carry predictions
    seed: int  # the task's own seed: fixes the splits and any fixed inputs
    # Every task combination in canonical (lexicographic) order, [n_all, k]; a label's
    # ``task_index`` indexes its rows.
    all_combinations: np.ndarray
    # split name -> sorted indices into ``all_combinations`` that the split draws from
    _split_pools: dict[str, np.ndarray]

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        """The keyword parameters of the task (what ``get_task`` and ``config`` use)."""
        parameters = inspect.signature(cls.__init__).parameters
        return tuple(name for name in parameters if name != "self")

    def config(self) -> dict:
        """JSON-serialisable parameters; ``get_task(**task.config())`` rebuilds this task."""
        return {"name": self.name, **{name: getattr(self, name) for name in self.parameter_names()}}

    def __repr__(self) -> str:
        arguments = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.parameter_names())
        return f"{type(self).__name__}({arguments})"

    # --- sampling -----------------------------------------------------------------------------

    def sample(self, n: int, split: str = "train", seed: int | Sequence[int] = 0, variant: str | None = None) -> Batch:
        """Draw ``n`` fresh instances of ``split``; a pure function of its arguments and the task.

        ``seed`` is a non-negative int or a sequence of them, e.g.
        ``(training_seed, step, process_index)``; see the module docstring for the scheme.
        ``variant`` defaults to ``variants[0]``.
        """
        n = check_integer("n", n, minimum=1)
        split_index = self._split_index(split)
        variant = self._check_variant(variant)
        sample_seed = normalize_seed(seed)
        rng = np.random.default_rng([self.seed, SAMPLE_STREAM, split_index, len(sample_seed), *sample_seed])
        return self._generate(n, split, variant, rng)

    def eval_set(self, split: str, n: int, variant: str | None = None) -> Batch:
        """The fixed evaluation set: ``sample(n, split, eval_seed(split), variant)``."""
        return self.sample(n, split, seed=eval_seed(split), variant=variant)

    def combinations(self, split: str) -> np.ndarray:
        """The task combinations ``split`` draws from, ``[n_combinations, k]``, rows sorted."""
        self._split_index(split)
        return self.all_combinations[self._split_pools[split]]

    def _draw_task_indices(self, rng: np.random.Generator, n: int, split: str) -> np.ndarray:
        """``[n]`` int64 indices into ``all_combinations``, uniform over the split's pool."""
        pool = self._split_pools[split]
        return pool[rng.integers(len(pool), size=n)]

    @abc.abstractmethod
    def _generate(self, n: int, split: str, variant: str, rng: np.random.Generator) -> Batch:
        """Generate ``n`` instances of an already validated split and variant."""

    @abc.abstractmethod
    def evaluate(self, prediction: np.ndarray, batch: Batch) -> dict[str, float]:
        """Score raw model outputs ``[n, n_predictions, d_out]`` at the prediction positions."""

    # --- what later stages need to know -------------------------------------------------------

    def selectors(self) -> dict[str, tuple[tuple[int | None, int, int], ...]]:
        """Named site sets that only this task can place: name -> ``(layer, query, key)``
        requests (layer None: every layer; negative positions count from the end)."""
        return {}

    def value_names(self) -> dict[str, list[str]]:
        """Display names of the integer values of categorical labels: label -> names by value."""
        return {}

    def column_names(self) -> dict[str, list[str]]:
        """Names of the columns of multi-column labels (e.g. a multi-hot label): label -> names."""
        return {}

    def position_names(self) -> list[str]:
        """The name of each input position as the task thinks of it (the viewer's key names), one
        per position of a sequence; [] where positions are only numbers (e.g. bytes of a text)."""
        return []

    def token_names(self) -> list[str]:
        """The text of each token id, for a task whose inputs are tokens of a text: an extraction then
        keeps each example's input tokens (`/extra/token_ids`) and these names; [] otherwise."""
        return []

    def prediction_kind(self) -> str:
        """What the model's raw output at a prediction position is, as stored in a codes file."""
        return "logits" if self.objective == "classification" else "regression output"

    @property
    def n_recorded_predictions(self) -> int:
        """How many of the last prediction positions a codes file keeps the model's outputs of
        (all ``n_predictions`` unless a task keeps fewer)."""
        return self.n_predictions

    # --- optional capabilities ----------------------------------------------------------------
    # What only some tasks can do, declared here with what a task without it does; a task provides
    # one by overriding its method. Callers ask `provides`, never `hasattr` or the task's name.

    @classmethod
    def provides(cls, capability: str) -> bool:
        """Whether this task provides ``capability``, one of `CAPABILITIES` (overrides its method)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown task capability {capability!r}; valid capabilities: {list(CAPABILITIES)}")
        return getattr(cls, capability) is not getattr(Task, capability)

    def derived_labels(self, batch: Batch, sites: Sequence) -> dict[str, np.ndarray]:
        """Labels that depend on the recorded sites (objects with ``.query`` and ``.key``), added to the
        codes file beside ``labels``; named in `derived_label_names` (or `label_names`, recomputed at
        another query). Without the capability: none."""
        return {}

    def position_partitions(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Ways to cut the positions ``0..seq_len-1`` into parts, ``{partition: {part: positions}}``,
        for site groups shaped by the task (`latentcode.tasks.partitions`). Without the capability:
        none (`task_partitions` still gives every task ``context`` vs ``query``)."""
        return {}

    def counterfactual_pairs(self, n: int, split: str = "ood", *, seed: int = 0, variant: str | None = None,
                             prediction: int = -1, pool: int = 8, **options):
        """``n`` base instances of ``split``, each with a donor per relation at the prediction position
        ``prediction``: a `latentcode.tasks.counterfactuals.CounterfactualPairs`. ``options``: the task's
        own (e.g. SRAVEN's ``well_posed``). Without the capability: a TaskError."""
        raise TaskError(f"task {self.name!r} draws no counterfactual pairs (Task.counterfactual_pairs)")

    def transplant_pairs(self, n: int, *, seed: int = 0, variant: str | None = None, **options):
        """``n`` pairs of an unseen composition (``ood``) as the base and a training composition that
        swaps one of its constituents as the donor: the code-reuse score's transplant
        (`FuzzyLogic.transplant_pairs`). Without the capability: a TaskError."""
        raise TaskError(f"the transplant needs a task whose compositions are sets of constituents; "
                        f"task {self.name!r} is not one (Task.transplant_pairs)")

    # --- validation ---------------------------------------------------------------------------

    def _split_index(self, split: str) -> int:
        return self.splits.index(validation.check_split(split, self, error=TaskError))

    def _check_variant(self, variant: str | None) -> str:
        if variant is None:
            return self.variants[0]
        return validation.check_variant(variant, self, error=TaskError)

    def _check_prediction(self, prediction: np.ndarray, batch: Batch) -> np.ndarray:
        prediction = np.asarray(prediction)
        expected = (len(batch), self.n_predictions, self.d_out)
        if prediction.shape != expected:
            raise TaskError(f"prediction has shape {prediction.shape}; expected {expected} "
                            "[n, n_predictions, d_out] for this batch")
        return prediction


# --- shared helpers ---------------------------------------------------------------------------


def check_integer(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int, or a TaskError naming ``name``, the value and the allowed range."""
    return validation.check_integer(name, value, minimum, maximum, error=TaskError)


def check_fraction(name: str, value) -> float:
    """``value`` as a float strictly between 0 and 1, or a TaskError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TaskError(f"{name}={value!r} must be a number strictly between 0 and 1")
    value = float(value)
    if not 0.0 < value < 1.0:
        raise TaskError(f"{name}={value} must be strictly between 0 and 1")
    return value


def normalize_seed(seed: int | Sequence[int]) -> tuple[int, ...]:
    """A sample seed as a tuple of non-negative ints (an int becomes a 1-tuple)."""
    parts = (seed,) if isinstance(seed, numbers.Integral) else tuple(seed)
    if not parts or any(
        isinstance(part, bool) or not isinstance(part, numbers.Integral) or part < 0
        for part in parts
    ):
        raise TaskError(f"seed={seed!r} must be a non-negative integer or a non-empty sequence of them")
    return tuple(int(part) for part in parts)
