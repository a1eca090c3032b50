"""Fuzzy logic: in-context regression of a disjunction of K conjunctive terms of L variables.

A *term* is a conjunction of all L variables, each possibly negated; the ``2**L`` terms are indexed
by their negation bit pattern: in term ``t`` the bit of variable ``l`` is ``(t >> (L - 1 - l)) & 1``,
1 meaning negated (term 0 is ``x_0 AND ... AND x_{L-1}``). A *task* is an unordered set of K distinct
terms; its function is the disjunction of its terms with Zadeh operators (``AND = min``, ``OR = max``,
``NOT x = 1 - x``), the Boolean function on inputs in {0, 1}.

Splits, drawn from ``default_rng([seed, SPLIT_STREAM])``: ``round_half_up(frac_unseen_terms * 2**L)``
random terms are *unseen*, and the combinations of only unseen terms form ``unseen_terms``. Of the
K-combinations of the seen terms, ``round_half_up(frac_test * count)`` are held out as ``ood`` so that
every seen term still occurs in training; the rest form ``train``, and ``test`` draws fresh instances
of them. Combinations mixing seen and unseen terms belong to no split. ``task_index`` indexes all
``C(2**L, K)`` combinations in ``itertools.combinations`` order (``FuzzyLogic.all_combinations``).

An instance is N tokens ``[x_1 .. x_L, f(x)]`` with inputs uniform in [0, 1); the last token is the
query, its target set to 0 in the input and predicted at the last position (``y``, MSE). Variants:
``uniform`` (all inputs fresh), ``fixed_context`` (the first N-1 inputs the same for every instance,
``fixed_context``) and ``fixed_query`` (the query input the same, ``fixed_query``); the fixed inputs
come from ``default_rng([seed, FIXED_INPUT_STREAM])``.

The paper's settings: L=4, K=2, N in {16, 32, 64, 96}, frac_test in {0.3, 0.5, 0.7},
frac_unseen_terms=0.25.
"""

from __future__ import annotations

import numpy as np

from latentcode.tasks.base import (
    FIXED_INPUT_STREAM,
    SPLIT_STREAM,
    AnalysisDefaults,
    Batch,
    Task,
    TaskError,
    TrainingSetup,
    check_fraction,
    check_integer,
)
from latentcode.tasks.combinations import enumerate_combinations, fraction_of, hold_out_combinations
from latentcode.tasks.counterfactuals import (
    CounterfactualPairs,
    check_pair_request,
    choose_donors,
    choose_third,
    donors_at,
    draw_among,
    draw_from_pool,
    first_kept,
    take,
)
from latentcode.tasks.registry import register_task

# The term_present label has 2**L columns; past this it stops being a sensible probe target.
MAX_VARIABLES = 12


def negation_bits_of_terms(terms: np.ndarray, n_variables: int) -> np.ndarray:
    """Negation bits ``[..., L]`` int8 of term indices ``[...]``: bit l = (t >> (L-1-l)) & 1."""
    shifts = np.arange(n_variables - 1, -1, -1)
    return ((np.asarray(terms)[..., None] >> shifts) & 1).astype(np.int8)


def evaluate_disjunction(inputs: np.ndarray, negation_bits: np.ndarray) -> np.ndarray:
    """Zadeh value of an OR of AND-terms: ``max_k min_l literal(k, l)``.

    Args:
        inputs: ``[..., N, L]`` values in [0, 1].
        negation_bits: ``[..., K, L]`` in {0, 1}, 1 meaning the variable is negated in the term.

    Returns:
        ``[..., N]``, in the dtype of ``inputs``.
    """
    inputs = np.asarray(inputs)
    negated = np.asarray(negation_bits).astype(inputs.dtype)
    # Variables and terms go first, in memory too: numpy reduces over a leading axis much
    # faster than over a short trailing one.
    variable_first = np.ascontiguousarray(np.moveaxis(inputs, -1, 0))[:, None]  # [L, 1, ..., N]
    term_first = np.moveaxis(negated, (-1, -2), (0, 1))[..., None]  # [L, K, ..., 1]
    # |u - 0| = u and |u - 1| = 1 - u: the literal is the input or its negation.
    literals = np.abs(variable_first - term_first)  # [L, K, ..., N]
    return literals.min(axis=0).max(axis=0)


@register_task
class FuzzyLogic(Task):
    """The fuzzy-logic task (see the module docstring).

    Labels, each with first dimension n:
        terms: int64 ``[n, K]``, the task's term indices, sorted.
        term_present: int8 ``[n, 2**L]``, multi-hot of ``terms`` (the term-decoding target).
        negation_bits: int8 ``[n, K, L]``, the negation bits of ``terms``.
        target: float32 ``[n]``, the query's true target (= ``y[:, 0]``).
        task_index: int64 ``[n]``, row of the task in ``all_combinations``.
    """

    name = "fuzzy_logic"
    splits = ("train", "test", "ood", "unseen_terms")
    variants = ("uniform", "fixed_context", "fixed_query")
    label_names = ("terms", "term_present", "negation_bits", "target", "task_index")
    objective = "regression"
    small_config = {"n_variables": 3, "n_terms": 2, "seq_len": 8, "frac_test": 0.5, "seed": 7}
    # The paper's analysis (as the authors' code): the last token attending to itself, on the
    # fixed-query variant, so that codes differ by the function only; each term is decoded.
    analysis = AnalysisDefaults(selector="last-self", variant="fixed_query", probe_label="term_present",
                                picture_label="task_index", headline_metric="r2")
    split_descriptions = {"train": "in-distribution functions", "test": "new instances of the training functions",
                          "ood": "unseen combinations of seen terms", "unseen_terms": "functions of terms never seen"}
    training_setup = TrainingSetup(
        description="fuzzy logic, L=4 variables, K=2 terms, N=32 examples (paper Table: 2 layers, d_model 128, "
        "8 heads, kqv 16, d_mlp 256, batch 128, warmup 100, 50,000 steps)",
        task={"name": "fuzzy_logic", "n_variables": 4, "n_terms": 2, "seq_len": 32, "frac_test": 0.5,
              "frac_unseen_terms": 0.25, "seed": 0},
        model={"n_layers": 2, "d_model": 128, "n_heads": 8, "kqv_dim": 16, "d_mlp": 256, "positions": "relative",
               "causal": False, "attn_dropout": 0.1},
        optimizer={"batch_size": 128, "learning_rate": 1e-3, "weight_decay": 0.1, "warmup_steps": 100},
        train_instances={"tiny": 24 * 128, "demo": 1_500 * 128, "cpu": 8_000 * 128, "paper": 50_000 * 128},
        eval_instances={"tiny": 256, "demo": 1024, "cpu": 4096, "paper": 16_000},
        paper_grid={"learning_rate": [1e-3, 3e-3], "weight_decay": [0.03, 0.1], "warmup_steps": [100]},
        # 70% of term pairs held out, as the paper's Table A1 column.
        shipped={"frac_test": 0.7},
        # tiny is a smoke test: the paper's 8 heads of width 2 in 2 layers, on a residual stream of 32.
        scales={"tiny": {"d_model": 32, "d_mlp": 64}},
    )

    def __init__(self, *, n_variables: int = 4, n_terms: int = 2, seq_len: int = 32, frac_test: float = 0.3,
                 frac_unseen_terms: float = 0.25, seed: int = 0) -> None:
        self.n_variables = check_integer("n_variables", n_variables, minimum=1, maximum=MAX_VARIABLES)
        self.n_all_terms = 2**self.n_variables
        self.n_terms = check_integer("n_terms", n_terms, minimum=1, maximum=self.n_all_terms)
        # R^2 needs the variance of a sequence's targets, so at least one context example.
        self.seq_len = check_integer("seq_len", seq_len, minimum=2)
        self.frac_test = check_fraction("frac_test", frac_test)
        self.frac_unseen_terms = check_fraction("frac_unseen_terms", frac_unseen_terms)
        self.seed = check_integer("seed", seed, minimum=0)
        self.d_in = self.n_variables + 1
        self.d_out = 1
        self.n_predictions = 1

        self._make_splits()
        fixed_inputs = np.random.default_rng([self.seed, FIXED_INPUT_STREAM]).random(
            (self.seq_len, self.n_variables), dtype=np.float32
        )
        fixed_inputs.flags.writeable = False
        self.fixed_context = fixed_inputs[:-1]  # float32 [N-1, L]: the context of the fixed_context variant
        self.fixed_query = fixed_inputs[-1]  # float32 [L]: the query input of the fixed_query variant

    def position_names(self) -> list[str]:
        """``example i`` for the N-1 context pairs (x, f(x)), then ``query`` (x, target hidden)."""
        return [f"example {index}" for index in range(self.seq_len - 1)] + ["query"]

    def position_partitions(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Each ``example`` (one token), ``block`` parts of four context examples and the query, and
        ``context`` vs ``query`` (the last token)."""
        last = self.seq_len - 1
        blocks = {f"examples {start}..{min(start + 4, last) - 1}": tuple(range(start, min(start + 4, last)))
                  for start in range(0, last, 4)}
        return {
            "example": {**{f"example {i}": (i,) for i in range(last)}, "query": (last,)},
            "block": {**blocks, "query": (last,)},
            "context": {"context": tuple(range(last)), "query": (last,)},
        }

    def value_names(self) -> dict[str, list[str]]:
        """Terms by their conjunctions; a task (`task_index`) by its disjunction of terms."""
        return {"terms": self.term_names(), "task_index": self.function_names()}

    def function_names(self) -> list[str]:
        """Each row of ``all_combinations`` as its function, e.g. ``x0∧¬x1∧x2∧x3 ∨ ¬x0∧x1∧x2∧x3``."""
        return [" ∨ ".join(self.term_names()[term] for term in terms) for terms in self.all_combinations]

    def column_names(self) -> dict[str, list[str]]:
        return {"term_present": self.term_names(),
                "negation_bits": [f"x{variable}" for variable in range(self.n_variables)]}

    def term_names(self) -> list[str]:
        """Each term as its conjunction, e.g. ``x0∧¬x1∧x2∧x3``, by term index."""
        bits = negation_bits_of_terms(np.arange(self.n_all_terms), self.n_variables)
        return ["∧".join(("¬" if bit else "") + f"x{variable}" for variable, bit in enumerate(row)) for row in bits]

    def _make_splits(self) -> None:
        K = self.n_terms
        rng = np.random.default_rng([self.seed, SPLIT_STREAM])

        n_unseen = fraction_of(self.frac_unseen_terms, self.n_all_terms)
        if n_unseen < K:
            raise TaskError(f"frac_unseen_terms={self.frac_unseen_terms} holds out {n_unseen} of the "
                            f"{self.n_all_terms} terms, fewer than the n_terms={K} a task needs: the "
                            "unseen_terms split would be empty; use a larger fraction")
        n_seen = self.n_all_terms - n_unseen
        if n_seen < K + 1:
            raise TaskError(f"frac_unseen_terms={self.frac_unseen_terms} leaves {n_seen} seen terms, too few "
                            f"to form both training and ood combinations of n_terms={K}; use a smaller fraction")
        is_unseen_term = np.zeros(self.n_all_terms, dtype=bool)
        is_unseen_term[rng.permutation(self.n_all_terms)[:n_unseen]] = True
        self.unseen_terms = np.flatnonzero(is_unseen_term)

        self.all_combinations = enumerate_combinations(self.n_all_terms, K, with_replacement=False,
                                                       what=f"{K}-combinations of {self.n_all_terms} terms")
        only_unseen = is_unseen_term[self.all_combinations].all(axis=1)
        only_seen = (~is_unseen_term[self.all_combinations]).all(axis=1)
        seen_pool = np.flatnonzero(only_seen)

        n_ood = fraction_of(self.frac_test, len(seen_pool))
        if n_ood < 1:
            raise TaskError(f"frac_test={self.frac_test} holds out 0 of the {len(seen_pool)} combinations of "
                            "seen terms: the ood split would be empty; use a larger fraction")
        kept, held_out = hold_out_combinations(self.all_combinations[seen_pool], n_ood, rng,
                                               what=f"frac_test={self.frac_test}", parts="seen terms")
        self._split_pools = {"train": seen_pool[kept], "test": seen_pool[kept], "ood": seen_pool[held_out],
                             "unseen_terms": np.flatnonzero(only_unseen)}

    def _generate(self, n: int, split: str, variant: str, rng: np.random.Generator) -> Batch:
        task_index = self._draw_task_indices(rng, n, split)
        terms = self.all_combinations[task_index]  # [n, K]
        inputs = rng.random((n, self.seq_len, self.n_variables), dtype=np.float32)
        if variant == "fixed_context":
            inputs[:, :-1] = self.fixed_context
        elif variant == "fixed_query":
            inputs[:, -1] = self.fixed_query

        negation_bits = negation_bits_of_terms(terms, self.n_variables)  # [n, K, L]
        targets = evaluate_disjunction(inputs, negation_bits)  # [n, N]
        x = np.concatenate([inputs, targets[..., None]], axis=-1)
        x[:, -1, -1] = 0.0  # the query's target is what the model predicts
        term_present = np.zeros((n, self.n_all_terms), dtype=np.int8)
        np.put_along_axis(term_present, terms, 1, axis=1)
        labels = {
            "terms": terms,
            "term_present": term_present,
            "negation_bits": negation_bits,
            "target": targets[:, -1].copy(),
            "task_index": task_index,
        }
        return Batch(x=x, y=targets[:, -1:].copy(), labels=labels, split=split, variant=variant)

    def evaluate(self, prediction: np.ndarray, batch: Batch) -> dict[str, float]:
        """MSE and mean per-sequence R^2 of the predicted query targets.

        ``prediction``: ``[n, 1, 1]`` predicted values. R^2 of a sequence is
        ``1 - (prediction - target)^2 / var(targets)``, the variance (ddof=0) taken over the
        sequence's N targets (N-1 context targets and the query's); sequences with zero variance
        (possible only on a measure-zero set of inputs) are left out of the mean.
        """
        predicted = self._check_prediction(prediction, batch)[:, 0, 0].astype(np.float64)
        query_target = batch.y[:, 0].astype(np.float64)
        sequence_targets = np.concatenate([batch.x[:, :-1, -1], batch.y], axis=1).astype(np.float64)
        squared_error = (predicted - query_target) ** 2
        variance = sequence_targets.var(axis=1)
        informative = variance > 0
        r2 = 1.0 - squared_error[informative] / variance[informative]
        return {
            "mse": float(squared_error.mean()),
            "r2": float(r2.mean()) if informative.any() else float("nan"),
        }

    # --- counterfactual targets and the tasks a one-term swap reaches ----------------------------

    def counterfactual_target(self, batch: Batch, terms) -> np.ndarray:
        """The disjunction of ``terms`` evaluated on each instance's query input.

        With the instance's own terms (``batch.labels["terms"]``) this is ``batch.y[:, 0]``.

        Args:
            batch: a batch of this task, any variant; the query input is read from ``batch.x``.
            terms: term indices in ``0..2**L-1``: ``[k]``, one term set for every instance, or
                ``[n, k]``, one per instance (any ``k >= 1``, not only the task's ``n_terms``).

        Returns:
            float32 ``[n]``.
        """
        n = len(batch)
        expected = (n, self.seq_len, self.d_in)
        if batch.x.shape != expected:
            raise TaskError(f"batch.x has shape {batch.x.shape}; expected {expected} [n, N, L + 1] for {self!r}")
        terms = self._check_terms(terms)
        if terms.ndim == 1:
            terms = np.broadcast_to(terms, (n, len(terms)))
        elif len(terms) != n:
            raise TaskError(f"terms has shape {terms.shape}; expected [k] or [{n}, k] [n, k]")
        query_inputs = batch.x[:, -1:, : self.n_variables]  # [n, 1, L]
        negation_bits = negation_bits_of_terms(terms, self.n_variables)  # [n, k, L]
        return evaluate_disjunction(query_inputs, negation_bits)[:, 0]

    def tasks_differing_by_one_term(self, terms, split: str | None = None) -> np.ndarray:
        """The tasks whose term set is ``terms`` with exactly one term swapped for another.

        Args:
            terms: the ``n_terms`` distinct term indices of a task, in any order.
            split: only tasks of this split, or ``None`` for all ``C(2**L, K)`` of them.

        Returns:
            int64 ``[m]``, sorted rows of ``all_combinations`` (their ``task_index``); the swap
            that reaches task ``i`` replaces ``setdiff1d(terms, all_combinations[i])`` by
            ``setdiff1d(all_combinations[i], terms)``.
        """
        terms = self._check_terms(terms)
        if terms.shape != (self.n_terms,) or len(np.unique(terms)) != self.n_terms:
            raise TaskError(f"terms={terms.tolist()} must be {self.n_terms} distinct term indices, a task's "
                            "term set")
        n_shared = np.isin(self.all_combinations, terms).sum(axis=1)
        neighbours = np.flatnonzero(n_shared == self.n_terms - 1)
        if split is not None:
            self._split_index(split)
            neighbours = np.intersect1d(neighbours, self._split_pools[split])
        return neighbours.astype(np.int64)

    def counterfactual_pairs(self, n: int, split: str = "ood", *, seed: int = 0, variant: str | None = None,
                             prediction: int = 0, pool: int = 8, min_difference: float = 0.1):
        """``n`` base instances of ``split`` with a donor per relation (``different``, ``third``,
        ``same``; see ``latentcode.tasks.counterfactuals``); the sub-task is the term set
        (``task_index``).

        The target task T' of each base is drawn uniformly among the tasks of the donor pool whose
        function differs from the base's at the base's query by more than ``min_difference`` (so
        that following T' is visible); the third donor's task T'' is neither, and its function there
        differs from T''s by more than ``min_difference``. Donors come from ``pool * n`` fresh
        instances of the same split and variant (default: the task's training variant, whose query
        inputs vary)."""
        prediction = check_pair_request(n, prediction, self.n_predictions, pool, min_difference)
        variant = self._check_variant(variant)
        n_candidates = 2 * n
        candidates = self.sample(n_candidates, split, seed=(seed, 1), variant=variant)
        donor_pool = self.sample(pool * n, split, seed=(seed, 2), variant=variant)
        rng = np.random.default_rng([seed, 3])
        tasks, pool_part = np.unique(donor_pool.labels["task_index"], return_inverse=True)
        base_task = candidates.labels["task_index"]
        base_part = np.searchsorted(tasks, base_task)
        base_part = np.where((base_part < len(tasks)) & (tasks[np.minimum(base_part, len(tasks) - 1)] == base_task),
                             base_part, len(tasks))  # len(tasks): the base's task is not in the pool
        functions = np.stack([self.counterfactual_target(candidates, self.all_combinations[task]) for task in tasks], 1)
        truth = candidates.y[:, prediction]
        target_ok = np.abs(functions - truth[:, None]) > min_difference  # [candidates, pool tasks]
        padded = np.concatenate([target_ok, np.zeros((n_candidates, 1), dtype=bool)], axis=1)
        kept, target, donor_different, donor_same = choose_donors(rng, base_part, padded, pool_part)
        target = np.minimum(target, len(tasks) - 1)
        target_value = functions[np.arange(n_candidates), target]
        third_ok = np.abs(functions - target_value[:, None]) > min_difference
        third_ok &= np.abs(functions - truth[:, None]) > min_difference
        has_third, third, donor_third = choose_third(rng, third_ok, pool_part)
        kept &= has_third & (donor_same >= 0)
        rows = first_kept(kept, n, f"{split} instances have donors of every relation with functions that differ by "
                                   f"more than {min_difference} at the query; ask for fewer pairs than {n}, a larger "
                                   "pool or a smaller min_difference")
        counts = {"candidates": n_candidates, "tasks in the donor pool": len(tasks),
                  "with a distinguishing task T'": int(target_ok.any(1).sum()),
                  "kept (all donors found)": int(kept.sum()),
                  "pairs": n}
        return CounterfactualPairs(
            base=take(candidates, rows),
            donors=donors_at(donor_pool, {"different": donor_different[rows], "third": donor_third[rows],
                                          "same": donor_same[rows]}),
            prediction=prediction, base_answer=truth[rows], counterfactual_answer=target_value[rows],
            base_part=base_task[rows], donor_parts={"different": tasks[target[rows]], "third": tasks[third[rows]],
                                                   "same": base_task[rows]},
            part_names=self.function_names(),
            counts=counts)

    def transplant_pairs(self, n: int, *, seed: int = 0, variant: str | None = None, pool: int = 8,
                         min_difference: float = 0.1) -> CounterfactualPairs:
        """``n`` pairs for the code-reuse transplant: an unseen composition as the base, a training composition
        that swaps one of its terms as the donor; donors from ``pool * n`` training instances.

        The base is an instance of an ``ood`` task {a, b}. The "different" donor is a training instance of a
        task {a, c} one term away (`tasks_differing_by_one_term`) whose function at the base's query differs
        from the base's answer by more than ``min_difference`` (its counterfactual answer); the "third" donor
        one of any other training task whose function there differs from both (the baseline of
        `latentcode.intervention.transfer`). Both sides come from one variant, by default ``uniform``; not
        ``fixed_query``, where the terms take four values at the one query input, so almost no third task
        differs from both (docs/concepts/tasks.md)."""
        check_pair_request(n, 0, self.n_predictions, pool, min_difference)
        variant = self._check_variant(variant)
        candidates = self.sample(4 * n, "ood", seed=(seed, 11), variant=variant)
        donor_pool = self.sample(pool * n, "train", seed=(seed, 12), variant=variant)
        rng = np.random.default_rng([seed, 13])
        tasks, pool_part = np.unique(donor_pool.labels["task_index"], return_inverse=True)
        functions = np.stack([self.counterfactual_target(candidates, self.all_combinations[t]) for t in tasks], 1)
        truth = candidates.y[:, 0]
        base_task = candidates.labels["task_index"]
        neighbours = {t: np.isin(tasks, self.tasks_differing_by_one_term(self.all_combinations[t], split="train"))
                      for t in np.unique(base_task)}
        target_ok = np.stack([neighbours[t] for t in base_task]) & (np.abs(functions - truth[:, None]) > min_difference)
        target = draw_among(rng, target_ok)
        donor_different = draw_from_pool(rng, pool_part, target)
        target_value = functions[np.arange(len(truth)), target]
        third_ok = (np.abs(functions - target_value[:, None]) > min_difference)
        third_ok &= np.abs(functions - truth[:, None]) > min_difference
        third_ok[np.arange(len(truth)), target] = False
        has_third, third, donor_third = choose_third(rng, third_ok, pool_part)
        kept = target_ok.any(axis=1) & has_third
        rows = first_kept(kept, n, f"ood instances have a one-term training neighbour and a third training task whose "
                                   f"functions differ by more than {min_difference} at the query; ask for fewer pairs "
                                   f"than {n}, a larger pool or a smaller min_difference")
        counts = {"candidates": len(truth), "training tasks in the donor pool": len(tasks),
                  "with a one-term neighbour that differs at the query": int(target_ok.any(1).sum()),
                  "kept (both donors found)": int(kept.sum()), "pairs": n}
        return CounterfactualPairs(
            base=take(candidates, rows),
            donors={"different": take(donor_pool, donor_different[rows]), "third": take(donor_pool, donor_third[rows])},
            prediction=0, base_answer=truth[rows], counterfactual_answer=target_value[rows], base_part=base_task[rows],
            donor_parts={"different": tasks[target[rows]], "third": tasks[third[rows]]},
            part_names=self.function_names(), counts=counts)

    def _check_terms(self, terms) -> np.ndarray:
        """``terms`` as int64 ``[k]`` or ``[n, k]`` (k >= 1), each in ``0..2**L-1``."""
        array = np.asarray(terms)
        if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
            raise TaskError(f"terms={terms!r} must be integer term indices")
        if array.ndim not in (1, 2) or array.shape[-1] == 0:
            raise TaskError(f"terms has shape {array.shape}; expected [k] or [n, k] with k >= 1")
        outside = (array < 0) | (array >= self.n_all_terms)
        if outside.any():
            raise TaskError(f"term {array[outside][0]} is out of range; expected 0..{self.n_all_terms - 1} "
                            f"for n_variables={self.n_variables}")
        return array.astype(np.int64)
