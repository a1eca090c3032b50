"""Base/donor pairs for patching experiments (`Task.counterfactual_pairs`: SRAVEN, fuzzy logic).

"The codes at these sites carry the sub-task" is tested by patching the codes of a *donor* instance
into a *base* instance and asking whether the prediction moves to the *counterfactual answer*: what
the donor's sub-task (rule, term set) gives on the base's own inputs. Three relations of donor to
base, drawn for the same bases and the same target answer:

    different   the donor's sub-task r' differs from the base's r at the measured prediction, and
                its answer on the base is well-posed (SRAVEN: the completed last row is a valid row
                of r'; fuzzy logic: the functions differ at the query by more than `min_difference`)
                and differs from the base's answer
    third       a donor of a third sub-task r'' (neither r nor r') whose own answer on the base
                differs from r''s: the baseline every "different" number is read against
    same        a donor of the base's own sub-task r: patching should keep the answer

`CounterfactualPairs.counts` says how many candidate bases each step keeps: how well-posed the
question is on a task.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from latentcode.tasks.base import Batch, TaskError
from latentcode.validation import check_integer

RELATIONS = ("different", "third", "same")


def take(batch: Batch, rows: np.ndarray) -> Batch:
    """Rows `rows` of a batch (x, y and every label)."""
    rows = np.asarray(rows)
    return replace(batch, x=batch.x[rows], y=batch.y[rows], labels={k: v[rows] for k, v in batch.labels.items()})


@dataclass
class CounterfactualPairs:
    """`n` base instances and, row by row, a donor for each relation (see the module docstring).

    Attributes:
        base: the base instances.
        donors: `{relation: Batch}`, each aligned with `base`.
        prediction: the measured prediction position (0..n_predictions-1).
        base_answer: `[n]`, the base's own (true) answer there.
        counterfactual_answer: `[n]`, the answer of the "different" donor's sub-task on the base.
        base_part, donor_parts: `[n]` and `{relation: [n]}`, the sub-task (rule or task index) of
            the base and of each donor at the measured prediction.
        part_names: names of the sub-task values (rule names, term sets).
        counts: how many candidates each step kept, and per base sub-task how many bases were kept.
    """

    base: Batch
    donors: dict[str, Batch]
    prediction: int
    base_answer: np.ndarray
    counterfactual_answer: np.ndarray
    base_part: np.ndarray
    donor_parts: dict[str, np.ndarray]
    part_names: list[str]
    counts: dict[str, object] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.base)

    def split(self, fraction: float, seed: int = 0) -> tuple[CounterfactualPairs, CounterfactualPairs]:
        """Two disjoint parts of the pairs (e.g. to fit a learned intervention and to score it)."""
        order = np.random.default_rng([seed, 11]).permutation(len(self))
        cut = int(round(fraction * len(self)))
        return self.rows(order[:cut]), self.rows(order[cut:])

    def rows(self, rows: np.ndarray) -> CounterfactualPairs:
        return replace(self, base=take(self.base, rows), donors={k: take(v, rows) for k, v in self.donors.items()},
                       base_answer=self.base_answer[rows], counterfactual_answer=self.counterfactual_answer[rows],
                       base_part=self.base_part[rows], donor_parts={k: v[rows] for k, v in self.donor_parts.items()})


def choose_donors(rng: np.random.Generator, base_part: np.ndarray, target_ok: np.ndarray,
                  pool_part: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each base: a target sub-task r' drawn uniformly among `target_ok [n, P]` (never the base's
    own, and only sub-tasks the donor pool holds), a pool donor of r' and a pool donor of the base's
    own sub-task. Returns `(kept [n] bool, target [n], donor_different [n], donor_same [n])`, donors
    as pool indices; a base is kept where both donors exist."""
    in_pool = np.bincount(pool_part, minlength=target_ok.shape[1]) > 0
    target_ok = target_ok & in_pool[None, :]
    target_ok[np.arange(len(target_ok)), base_part] = False
    target = draw_among(rng, target_ok)
    kept = target_ok.any(axis=1) & in_pool[base_part]
    donor_different = draw_from_pool(rng, pool_part, np.where(kept, target, base_part))
    donor_same = draw_from_pool(rng, pool_part, base_part)
    return kept, target, donor_different, donor_same


def draw_among(rng: np.random.Generator, ok: np.ndarray) -> np.ndarray:
    """For each row of `ok [n, P]`, a column drawn uniformly among its True ones (0 where there is none)."""
    return np.where(ok, rng.random(ok.shape), -1.0).argmax(axis=1)


def draw_from_pool(rng: np.random.Generator, pool_part: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each wanted sub-task, a uniformly drawn pool index of that sub-task (-1 where none)."""
    chosen = np.full(len(wanted), -1, dtype=np.int64)
    for part in np.unique(wanted):
        members = np.flatnonzero(pool_part == part)
        rows = np.flatnonzero(wanted == part)
        if len(members):
            chosen[rows] = members[rng.integers(len(members), size=len(rows))]
    return chosen


def choose_third(rng: np.random.Generator, third_ok: np.ndarray,
                 pool_part: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A third sub-task per base among `third_ok [n, P]` that the pool holds, and a pool donor of it:
    `(kept [n], part [n], donor [n])`; a base is kept where both exist."""
    third_ok = third_ok & (np.bincount(pool_part, minlength=third_ok.shape[1]) > 0)[None, :]
    part = draw_among(rng, third_ok)
    donor = draw_from_pool(rng, pool_part, part)
    return third_ok.any(axis=1) & (donor >= 0), part, donor


def first_kept(kept: np.ndarray, n: int, shortage: str) -> np.ndarray:
    """The first `n` kept candidates' rows; a `TaskError` saying `shortage` (why candidates were
    dropped, what to ask for instead) where fewer are kept."""
    rows = np.flatnonzero(kept)
    if len(rows) < n:
        raise TaskError(f"only {len(rows)} of {len(kept)} {shortage}")
    return rows[:n]


def donors_at(donor_pool: Batch, donors: dict[str, np.ndarray]) -> dict[str, Batch]:
    """`{relation: the pool's rows donors[relation]}`, each aligned with the bases."""
    return {relation: take(donor_pool, rows) for relation, rows in donors.items()}


def check_pair_request(n: int, prediction: int, n_predictions: int, pool: int, min_difference: float = 0.0) -> int:
    """The prediction position in 0..n_predictions-1, once `n` (pairs) and `pool` (donors per base)
    are positive integers, `prediction` one of the task's positions (negative: from the end) and
    `min_difference` (fuzzy logic's) a finite number >= 0."""
    check_integer("n", n, minimum=1, error=TaskError)
    check_integer("pool", pool, minimum=1, error=TaskError)
    if isinstance(prediction, bool) or not isinstance(prediction, (int, np.integer)) \
            or not -n_predictions <= prediction < n_predictions:
        raise TaskError(f"prediction={prediction!r} is outside the task's {n_predictions} prediction positions "
                        f"(valid: 0..{n_predictions - 1}, or negative from the end)")
    if not np.isfinite(min_difference) or min_difference < 0:
        raise TaskError(f"min_difference={min_difference!r} must be a finite number >= 0")
    return int(prediction) % n_predictions
