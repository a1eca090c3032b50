"""What every in-context learning task shares: the batch, the task interface and the registry.

Batches
-------
``Task.sample`` returns a :class:`Batch`: the model input ``x`` ``[n, seq_len, d_in]`` (or integer
tokens ``[n, seq_len]`` for a task with a ``d_vocab``), the targets ``y`` ``[n, n_predictions]`` and
``labels``, a dict of named per-example arrays that
describe what generated each instance. Labels travel with the data so that later stages
(extraction, probes, plots) never recompute them.

Seed scheme
-----------
A task has its own integer ``seed`` (default 0). What defines the task -- which combinations
fall in which split, and the fixed context / fixed query of the fuzzy-logic variants -- is drawn
from ``np.random.default_rng([task_seed, stream])`` with a constant ``stream`` per purpose
(``SPLIT_STREAM``, ``FIXED_INPUT_STREAM``) and depends on nothing else, in particular not on the
training seed.

``Task.sample(n, split, seed, variant)`` is a pure function of the task's config and its
arguments. Its generator is::

    np.random.default_rng([task_seed, SAMPLE_STREAM, split_index, len(seed), *seed])

where ``seed`` is a non-negative int or a tuple of them, so a training loop can pass
``seed=(training_seed, step, process_index)`` and get independent, reproducible streams with
nothing stored. ``len(seed)`` is part of the entropy so that seeds differing only by trailing
zeros never coincide (``SeedSequence`` zero-pads short entropy: ``[1, 2]`` and ``[1, 2, 0]``
give one stream). The variant is deliberately *not* part of the entropy: the
variants of one ``(split, seed)`` are views of the same instances (same task combinations, same
random draws) that differ only in what the variant changes, e.g. the SRAVEN ``unpermuted``
variant shows exactly the instances of the ``permuted`` one without their column permutations.

``Task.eval_set(split, n)`` is ``Task.sample(n, split, seed=eval_seed(split))`` with
``eval_seed(split) = zlib.crc32(b"eval/" + split.encode())``: a fixed set of instances per
``(task config, split, n, variant)``, so every model is scored on the same examples. Sets of
different ``n`` are different sets, not prefixes of each other.

Split sizes
-----------
A fraction ``f`` of ``count`` items is ``round_half_up(f * count)`` items, i.e.
``floor(f * count + 0.5)``. Held-out combinations are chosen so that every item (a fuzzy-logic
term, a SRAVEN rule) still occurs in some training combination; see
:func:`hold_out_combinations`.
"""

from __future__ import annotations

import abc
import inspect
import itertools
import math
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

# Enumerating every combination of a task is what makes the splits exact; past this many the
# arrays get too large to keep around, so such configurations are refused.
MAX_ENUMERATED_COMBINATIONS = 5_000_000


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
        memory with the arrays there), for a model: ``model(batch.torch().x)``. Labels stay numpy
        arrays: they describe the instances, for the analysis. Imports torch only when called, so
        tasks stay free of it."""
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

    def sample(
        self,
        n: int,
        split: str = "train",
        seed: int | Sequence[int] = 0,
        variant: str | None = None,
    ) -> Batch:
        """Draw ``n`` fresh instances of ``split``; a pure function of its arguments and the task.

        ``seed`` is a non-negative int or a sequence of them, e.g.
        ``(training_seed, step, process_index)``; see the module docstring for the scheme.
        ``variant`` defaults to ``variants[0]``.
        """
        n = check_integer("n", n, minimum=1)
        split_index = self._split_index(split)
        variant = self._check_variant(variant)
        sample_seed = normalize_seed(seed)
        rng = np.random.default_rng(
            [self.seed, SAMPLE_STREAM, split_index, len(sample_seed), *sample_seed]
        )
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

    def derived_labels(self, batch: Batch, sites: Sequence) -> dict[str, np.ndarray]:
        """Labels that depend on the recorded sites (objects with ``.query`` and ``.key``), e.g.
        the rule of the sites' common query position; added to the codes file beside ``labels``.
        Their names are in `derived_label_names` (or `label_names`, recomputed at another query)."""
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

    def prediction_kind(self) -> str:
        """What the model's raw output at a prediction position is, as stored in a codes file."""
        return "logits" if self.objective == "classification" else "regression output"

    @property
    def n_recorded_predictions(self) -> int:
        """How many of the last prediction positions a codes file keeps the model's outputs of:
        all ``n_predictions``, unless a task keeps fewer (a language model's logits at every
        position would outweigh everything else in the file)."""
        return self.n_predictions

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
            raise TaskError(
                f"prediction has shape {prediction.shape}; expected {expected} "
                "[n, n_predictions, d_out] for this batch"
            )
        return prediction


# --- registry ---------------------------------------------------------------------------------

_TASK_CLASSES: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make ``cls`` available to :func:`get_task` under ``cls.name``."""
    if not isinstance(getattr(cls, "analysis", None), AnalysisDefaults):
        raise TypeError(f"task class {cls.__name__} must set `analysis = AnalysisDefaults(...)`")
    _TASK_CLASSES[cls.name] = cls
    return cls


def task_names() -> tuple[str, ...]:
    """The names :func:`get_task` accepts."""
    return tuple(sorted(_TASK_CLASSES))


def task_class(name: str) -> type[Task]:
    """The class registered as ``name`` (its class attributes describe the task without building it)."""
    if name not in _TASK_CLASSES:
        raise TaskError(f"unknown task {name!r}; valid names: {list(task_names())}")
    return _TASK_CLASSES[name]


def get_task(name: str, **params) -> Task:
    """Build the task called ``name`` with keyword ``params`` (see each task's ``__init__``)."""
    cls = task_class(name)
    valid = cls.parameter_names()
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise TaskError(
            f"unknown parameter(s) {unknown} for task {name!r}; valid parameters: {list(valid)}"
        )
    return cls(**params)


# --- shared helpers ---------------------------------------------------------------------------


def check_integer(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int, or a TaskError naming ``name``, the value and the allowed range
    (``latentcode.validation.check_integer``, raising the tasks' error)."""
    return validation.check_integer(name, value, minimum, maximum, error=TaskError)


def check_fraction(name: str, value) -> float:
    """``value`` as a float strictly between 0 and 1, or a ValueError."""
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
        raise TaskError(
            f"seed={seed!r} must be a non-negative integer or a non-empty sequence of them"
        )
    return tuple(int(part) for part in parts)


def fraction_of(fraction: float, count: int) -> int:
    """``round_half_up(fraction * count)``: how many of ``count`` items a fraction selects."""
    return math.floor(fraction * count + 0.5)


def enumerate_combinations(
    n_items: int, k: int, *, with_replacement: bool, what: str
) -> np.ndarray:
    """All k-combinations of ``range(n_items)`` in lexicographic order, ``[count, k]`` int64.

    Each row is sorted; the order is that of ``itertools.combinations`` (or
    ``combinations_with_replacement``). ``what`` names the combinations in the error raised
    when there are more than ``MAX_ENUMERATED_COMBINATIONS``.
    """
    count = math.comb(n_items + k - 1, k) if with_replacement else math.comb(n_items, k)
    if count > MAX_ENUMERATED_COMBINATIONS:
        raise TaskError(
            f"there are {count:,} {what}, more than the {MAX_ENUMERATED_COMBINATIONS:,} "
            "this generator enumerates; choose fewer items or a smaller combination size"
        )
    combine = (
        itertools.combinations_with_replacement if with_replacement else itertools.combinations
    )
    flat = np.fromiter(
        itertools.chain.from_iterable(combine(range(n_items), k)), dtype=np.int64, count=count * k
    )
    return flat.reshape(count, k)


def hold_out_combinations(
    combinations: np.ndarray, n_held_out: int, rng: np.random.Generator, *, what: str, parts: str,
    strata: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Split the rows of ``combinations`` ``[count, k]`` into kept and held-out row indices.

    Every item that occurs in ``combinations`` also occurs in some kept row, so held-out
    combinations are new compositions of known parts. The rows are visited in a random order
    drawn from ``rng``: a row is reserved for the kept set when it contains an item no earlier
    reserved row contains (a greedy cover); the first ``n_held_out`` unreserved rows in that
    order are held out and the rest are kept. With ``strata`` (``[count]``, a label per row, e.g.
    how hard the combination is), the held-out rows are drawn stratum by stratum, as many from each
    as its share of the rows (largest remainders; a stratum short of unreserved rows passes its
    quota on, in that order), so that the held-out set has the mix of the whole; without it, the
    draw is exactly as it always was (the splits of trained models depend on it).
    Returns sorted ``(kept, held_out)`` indices.
    Raises a ValueError, naming the setting ``what`` and the items ``parts`` (e.g. "rules"),
    when too few rows are left for the cover.
    """
    count = len(combinations)
    order = rng.permutation(count)
    items_to_cover = set(np.unique(combinations).tolist())
    covered: set[int] = set()
    reserved = []
    for row in order:
        if covered == items_to_cover:
            break
        items = set(combinations[row].tolist())
        if not items <= covered:
            reserved.append(row)
            covered |= items
    if count - n_held_out < len(reserved):
        raise TaskError(
            f"{what}: holding out {n_held_out} of {count} combinations leaves {count - n_held_out} "
            f"for training, but {len(reserved)} are needed for every one of the "
            f"{len(items_to_cover)} {parts} to occur in training; hold out a smaller fraction"
        )
    is_reserved = np.zeros(count, dtype=bool)
    is_reserved[reserved] = True
    unreserved_in_order = order[~is_reserved[order]]
    if strata is None:
        held_out = np.sort(unreserved_in_order[:n_held_out])
    else:
        held_out = np.sort(_stratified(unreserved_in_order, np.asarray(strata), n_held_out))
    kept = np.setdiff1d(np.arange(count), held_out)
    return kept, held_out


def _stratified(candidates: np.ndarray, strata: np.ndarray, n_held_out: int) -> np.ndarray:
    """The first rows of ``candidates`` (row indices in draw order) of each stratum, as many of a
    stratum as its share of all rows ``strata`` allots (largest remainders), ``n_held_out`` in all."""
    labels, sizes = np.unique(strata, return_counts=True)
    shares = n_held_out * sizes / sizes.sum()
    quotas = np.floor(shares).astype(int)
    for index in np.argsort(-(shares - quotas), kind="stable")[: n_held_out - quotas.sum()]:
        quotas[index] += 1
    available = np.array([(strata[candidates] == label).sum() for label in labels])
    short = np.maximum(quotas - available, 0).sum()
    quotas = np.minimum(quotas, available)
    for index in np.argsort(-(shares - quotas), kind="stable"):  # a short stratum's quota goes to the others
        extra = min(short, available[index] - quotas[index])
        quotas[index] += extra
        short -= extra
    chosen = [candidates[strata[candidates] == label][:quota] for label, quota in zip(labels, quotas, strict=True)]
    return np.concatenate(chosen)
