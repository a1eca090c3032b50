"""SRAVEN, the symbolic Raven's Progressive Matrices: infer M rules from 8 panels, fill in the 9th.

A panel is a vector of M features, each an integer in ``0..K-1``. A 3x3 grid of panels is made
feature by feature: each feature follows one of the 8 ``RULES``, row by row
(`latentcode.tasks.sraven_rules`). A *task* is the multiset of the M rules
(``SRaven.all_combinations``, in ``combinations_with_replacement(range(8), M)`` order; 330 for M=4);
an instance assigns them to the features in a random order (the ``rules`` label, in feature order).

Splits: ``round_half_up(frac_ood * count)`` multisets are held out as ``ood`` (drawn from
``default_rng([seed, SPLIT_STREAM])``) so that every rule still occurs in training; ``train`` and
``test`` draw fresh instances from the others. ``hold_out="greedy"`` (default, the split every
trained model used) takes them in random order, which holds out mostly multisets of progressions
(the cover keeps the rarer rules in training); ``"stratified"`` takes from each number of stepless
(hard) rules its share of all multisets, so that ``ood`` is as hard as training.

Column permutations: for each column c a random permutation ``p_c`` of the M positions is applied
to its panels in every row, ``presented[row, c, j] = panel[row, c, p_c[j]]``, so query position j
holds feature ``p_2[j]``: ``y[:, j] = targets[:, p_2[j]]``. The ``unpermuted`` variant uses identity
permutations on the very instances of the ``permuted`` one.

Tokens: the 8 context panels row by row, each as M one-hot tokens of width K, then M all-zero query
tokens: ``x`` float32 ``[n, 9M, K]``; ``y`` int64 ``[n, M]``, the 9th panel as presented, predicted
at the last M positions (cross-entropy). An instance is correct when all M are right.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from latentcode.tasks.ambiguity import is_ambiguous
from latentcode.tasks.base import (
    SPLIT_STREAM,
    AnalysisDefaults,
    Batch,
    Task,
    TaskError,
    TrainingSetup,
    check_fraction,
    check_integer,
)
from latentcode.tasks.combinations import fraction_of, hold_out_combinations
from latentcode.tasks.counterfactuals import (
    CounterfactualPairs,
    check_pair_request,
    choose_donors,
    choose_third,
    donors_at,
    first_kept,
    take,
)
from latentcode.tasks.registry import register_task
from latentcode.tasks.sraven_rules import (
    DIFFERENCE,
    DISTRIBUTE_THREE,
    GRID_SIZE,
    RULES,
    STEP,
    STEPLESS_RULES,
    SUM,
    check_n_values,
    permute_columns,
    rule_multisets,
    sample_feature_grids,
    sample_panels,
)

__all__ = [
    "RULES",
    "SRaven",
    "is_ambiguous",
    "permute_columns",
    "sample_feature_grids",
]

HOLD_OUTS = ("greedy", "stratified")


@register_task
class SRaven(Task):
    """The SRAVEN task (see the module docstring).

    Labels, each with first dimension n:
        rules: int64 ``[n, M]``, the rule of each feature, in feature order.
        column_permutations: int64 ``[n, 3, M]``, ``p_c`` of each column (identity when unpermuted).
        targets: int64 ``[n, M]``, the 9th panel in feature order (``y`` is it as presented).
        query_rule: int64 ``[n, M]``, the rule of each query position as presented: ``rules[:, p_2]``.
        task_index: int64 ``[n]``, row of the rule multiset in ``all_combinations``.
    """

    name = "sraven"
    splits = ("train", "test", "ood")
    variants = ("permuted", "unpermuted")
    label_names = ("rules", "column_permutations", "targets", "query_rule", "task_index")
    # `rule` [n]: the rule of the sites' common query position, added to a codes file at extraction
    # (`derived_labels`); what the paper decodes.
    derived_label_names = ("rule",)
    objective = "classification"
    small_config = {"n_features": 3, "n_values": 5, "frac_ood": 0.3, "seed": 7}
    # The paper's analysis: the last query token attending to the same feature in the two context
    # panels of the last row (`sraven-rule`), on unpermuted instances, where position j of every
    # panel is feature j; the rule of that feature is what the codes should tell.
    analysis = AnalysisDefaults(selector="sraven-rule", variant="unpermuted", probe_label="rule",
                                picture_label="rule", headline_metric="accuracy")
    split_descriptions = {"train": "in-distribution rule multisets", "test": "new instances of the training rule "
                          "multisets", "ood": "held-out rule multisets, never trained on"}
    training_setup = TrainingSetup(
        description="SRAVEN, M=4 features, K=8 values, 25% of rule multisets held out (paper Table: 4/8/16 "
        "layers, width factor 1/2/4, d_model 128, 16 heads, kqv 64, d_mlp 256, batch 128, 20M instances)",
        task={"name": "sraven", "n_features": 4, "n_values": 8, "frac_ood": 0.25, "seed": 0},
        model={"n_layers": 4, "d_model": 128, "n_heads": 16, "kqv_dim": 64, "d_mlp": 256, "positions": "relative",
               "causal": False, "attn_dropout": 0.1, "width_factor": 1},
        optimizer={"batch_size": 128, "learning_rate": 1e-3, "weight_decay": 0.1, "warmup_steps": 1000},
        train_instances={"tiny": 24 * 128, "demo": 600 * 128, "cpu": 8_000 * 128, "paper": 20_000_000},
        eval_instances={"tiny": 256, "demo": 1024, "cpu": 4096, "paper": 51_200},
        paper_grid={"learning_rate": [3e-4, 1e-3], "weight_decay": [0.1, 0.3], "warmup_steps": [1000, 3000],
                    "n_layers": [4, 8, 16], "width_factor": [1, 2, 4]},
        # A small CPU budget leaves a model of the permuted task near chance (models/README.md).
        shipped={"variant": "unpermuted"},
        # tiny is a smoke test: a small model (heads of the paper's width 4) whose step takes a fraction
        # of a second on one thread, not the paper's 4 layers of d_model 128.
        scales={"tiny": {"n_layers": 2, "d_model": 32, "n_heads": 4, "kqv_dim": 16, "d_mlp": 64}},
    )

    def __init__(self, *, n_features: int = 4, n_values: int = 8, frac_ood: float = 0.25, seed: int = 0,
                 hold_out: str = "greedy") -> None:
        self.n_features = check_integer("n_features", n_features, minimum=1)
        self.n_values = check_n_values(n_values)
        self.frac_ood = check_fraction("frac_ood", frac_ood)
        self.seed = check_integer("seed", seed, minimum=0)
        if hold_out not in HOLD_OUTS:
            raise TaskError(f"hold_out must be one of {list(HOLD_OUTS)}, got {hold_out!r}")
        self.hold_out = hold_out
        self.seq_len = GRID_SIZE**2 * self.n_features
        self.d_in = self.n_values
        self.d_out = self.n_values
        self.n_predictions = self.n_features
        self._make_splits()

    def config(self) -> dict:
        """As every task's, without ``hold_out`` where it is the default (so that configs recorded
        before it existed stay equal)."""
        config = super().config()
        if config["hold_out"] == "greedy":
            del config["hold_out"]
        return config

    def selectors(self) -> dict[str, tuple[tuple[int | None, int, int], ...]]:
        """``sraven-rule``: the last query token (position 9M-1, feature M-1 of the 9th panel)
        attending to the same feature of panels 7 and 8 (positions 7M-1 and 8M-1), every layer."""
        M = self.n_features
        query = GRID_SIZE**2 * M - 1
        return {"sraven-rule": ((None, query, 7 * M - 1), (None, query, 8 * M - 1))}

    def position_partitions(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """``slot`` j (position j of every panel), ``panel`` (row, column), panel ``row`` and ``column``
        of the 3x3 grid, and ``context`` vs ``query`` (the 9th panel); panel p holds positions pM .. pM+M-1."""
        M, panels = self.n_features, GRID_SIZE**2

        def panels_where(keep) -> tuple[int, ...]:
            return tuple(p * M + j for p in range(panels) if keep(p) for j in range(M))

        return {
            "slot": {f"slot {j}": tuple(range(j, panels * M, M)) for j in range(M)},
            "panel": {f"panel {p // GRID_SIZE},{p % GRID_SIZE}": panels_where(lambda q, p=p: q == p)
                      for p in range(panels)},
            "row": {f"row {r}": panels_where(lambda p, r=r: p // GRID_SIZE == r) for r in range(GRID_SIZE)},
            "column": {f"column {c}": panels_where(lambda p, c=c: p % GRID_SIZE == c) for c in range(GRID_SIZE)},
            "context": {"context": panels_where(lambda p: p < panels - 1),
                        "query": panels_where(lambda p: p == panels - 1)},
        }

    def derived_labels(self, batch: Batch, sites: Sequence) -> dict[str, np.ndarray]:
        """``rule`` ``[n]``: the rule governing the sites' common query position, where they
        share one query position among the query tokens."""
        queries = {site.query for site in sites}
        first_query_token = self.seq_len - self.n_predictions
        if len(queries) != 1 or next(iter(queries)) < first_query_token:
            return {}
        return {"rule": batch.labels["query_rule"][:, next(iter(queries)) - first_query_token]}

    def position_names(self) -> list[str]:
        """``panel (row,column) slot j`` for the 8 context panels row by row, then ``query slot j``
        (slot j holds feature j in the unpermuted variant, feature p_c[j] in the permuted one)."""
        names = [f"panel ({panel // GRID_SIZE + 1},{panel % GRID_SIZE + 1}) slot {slot}"
                 for panel in range(GRID_SIZE**2 - 1) for slot in range(self.n_features)]
        return names + [f"query slot {slot}" for slot in range(self.n_features)]

    def value_names(self) -> dict[str, list[str]]:
        # a task (`task_index`) is its multiset of rules
        multisets = [", ".join(RULES[rule] for rule in rules) for rules in self.all_combinations]
        return {"rules": list(RULES), "query_rule": list(RULES), "rule": list(RULES), "task_index": multisets}

    def _make_splits(self) -> None:
        self.all_combinations = rule_multisets(self.n_features)
        count = len(self.all_combinations)
        n_ood = fraction_of(self.frac_ood, count)
        if n_ood < 1:
            raise TaskError(f"frac_ood={self.frac_ood} holds out 0 of the {count} rule multisets: the ood "
                            "split would be empty; use a larger fraction")
        rng = np.random.default_rng([self.seed, SPLIT_STREAM])
        strata = None
        if self.hold_out == "stratified":  # the number of stepless (hard) rules in each multiset
            strata = np.isin(self.all_combinations, STEPLESS_RULES).sum(axis=1)
        kept, held_out = hold_out_combinations(
            self.all_combinations, n_ood, rng, what=f"frac_ood={self.frac_ood}", parts="rules", strata=strata
        )
        self._split_pools = {"train": kept, "test": kept, "ood": held_out}

    def _generate(self, n: int, split: str, variant: str, rng: np.random.Generator) -> Batch:
        M, K = self.n_features, self.n_values
        task_index = self._draw_task_indices(rng, n, split)
        rules, panels, column_permutations = sample_panels(self.all_combinations[task_index], K, rng)
        if variant == "unpermuted":
            column_permutations = np.broadcast_to(np.arange(M), (n, GRID_SIZE, M)).copy()
        presented = permute_columns(panels, column_permutations)

        # One-hot of the 8 context panels; the M query tokens stay all zero.
        n_context_tokens = (GRID_SIZE**2 - 1) * M
        context_values = presented.reshape(n, GRID_SIZE**2 * M)[:, :n_context_tokens]
        x = np.zeros((n, self.seq_len, K), dtype=np.float32)
        token = np.arange(n)[:, None] * self.seq_len + np.arange(n_context_tokens)
        x.reshape(-1, K)[token.ravel(), context_values.ravel()] = 1.0

        labels = {
            "rules": rules,
            "column_permutations": column_permutations,
            "targets": panels[:, -1, -1, :],
            "query_rule": np.take_along_axis(rules, column_permutations[:, -1, :], axis=1),
            "task_index": task_index,
        }
        return Batch(x=x, y=presented[:, -1, -1, :].copy(), labels=labels, split=split, variant=variant)

    def evaluate(self, prediction: np.ndarray, batch: Batch) -> dict[str, float]:
        """Accuracy from logits ``[n, M, K]`` at the query positions.

        Returns ``accuracy`` (all M values right), ``feature_accuracy`` (mean over positions)
        and ``feature_accuracy_j`` for each query position j as presented.
        """
        logits = self._check_prediction(prediction, batch)
        correct = logits.argmax(axis=-1) == batch.y  # [n, M]
        metrics = {
            "accuracy": float(correct.all(axis=1).mean()),
            "feature_accuracy": float(correct.mean()),
        }
        for position, accuracy in enumerate(correct.mean(axis=0)):
            metrics[f"feature_accuracy_{position}"] = float(accuracy)
        return metrics

    # --- counterfactual answers: what another rule would answer on a feature of an instance ------

    def feature_grids(self, batch: Batch) -> np.ndarray:
        """Each feature's 3x3 grid, undoing the column permutations, as ``sample_feature_grids``
        draws them: int64 ``[n, M, 3, 3]`` (instance, feature, row, column).

        The 8 context cells are read from the one-hot tokens of ``batch.x``, the query cell from
        ``batch.y``; both variants of one ``(split, seed)`` give the same grids.
        """
        M, K = self.n_features, self.n_values
        n = len(batch)
        if batch.x.shape != (n, self.seq_len, K):
            raise TaskError(f"batch.x has shape {batch.x.shape}; expected {(n, self.seq_len, K)} "
                            f"[n, 9M, K] for {self!r}")
        if "column_permutations" not in batch.labels:
            raise TaskError(f"the batch has labels {sorted(batch.labels)}, without 'column_permutations'; "
                            "expected a batch of this task")
        n_context_cells = GRID_SIZE**2 - 1
        context = batch.x[:, : n_context_cells * M].reshape(n, n_context_cells, M, K).argmax(-1)
        presented = np.concatenate([context, batch.y[:, None, :]], axis=1)  # [n, 9, M]
        presented = presented.reshape(n, GRID_SIZE, GRID_SIZE, M)
        # Position j of column c shows feature p_c[j], so feature f sits at position p_c^-1[f].
        inverse_permutations = np.argsort(batch.labels["column_permutations"], axis=-1)
        panels = permute_columns(presented, inverse_permutations)  # [n, row, column, feature]
        return np.ascontiguousarray(panels.transpose(0, 3, 1, 2), dtype=np.int64)

    def counterfactual_answer(self, batch: Batch, feature, rule) -> tuple[np.ndarray, np.ndarray]:
        """The answer that ``rule`` gives on the last row of ``feature``, from that row's first
        two cells ``a, b`` and (for distribute_three) the first two rows:

        - ``constant``: ``a``;
        - ``progression±d``: ``(b ± d) mod K``;
        - ``sum``: ``(a + b) mod K``;  ``difference``: ``(a - b) mod K``;
        - ``distribute_three``: the one value of the first two rows' value set that is neither
          ``a`` nor ``b``; undefined where that leaves no value or more than one.

        With the instance's own rule for the feature this is the true answer (``targets``).

        Args:
            batch: a batch of this task, either variant.
            feature: the feature in feature order (not the presented position), an int or int
                ``[n]`` per instance; the feature at query position j is
                ``batch.labels["column_permutations"][:, -1, j]``.
            rule: an index into ``RULES`` or a rule name, or int ``[n]`` per instance.

        Returns:
            ``(answers, defined)``: int64 ``[n]`` in ``0..K-1`` (-1 where undefined) and bool
            ``[n]``, False where the rule cannot be applied.
        """
        grid, rule = self._grid_and_rule(batch, feature, rule)
        first, second = grid[:, -1, 0], grid[:, -1, 1]
        unwrapped = np.select(
            [rule == RULES.index("constant"), rule == SUM, rule == DIFFERENCE],
            [first, first + second, first - second],
            default=second + STEP[rule],  # the progressions
        )
        answers = unwrapped % self.n_values

        in_last_row = (grid[:, -1, :-1, None] == np.arange(self.n_values)).any(axis=1)  # [n, K]
        missing = _values_of_first_rows(grid, self.n_values) & ~in_last_row  # distribute_three's candidates
        is_distribute = rule == DISTRIBUTE_THREE
        answers = np.where(is_distribute, missing.argmax(axis=1), answers)
        defined = ~is_distribute | (missing.sum(axis=1) == 1)
        return np.where(defined, answers, -1).astype(np.int64), defined

    def completes_a_valid_row(self, batch: Batch, feature, rule, answer) -> np.ndarray:
        """Whether the last row of ``feature`` completed with ``answer`` is a row that ``rule``
        generates (and, for distribute_three, one of the value set the first two rows share):

        - ``constant``: ``a == b == answer``; ``progression±d``: ``b = a ± d`` and ``answer = b ± d``
          (mod K); ``sum`` / ``difference``: ``answer = a ± b`` (mod K);
        - ``distribute_three``: the first two rows hold exactly three values, and ``a``, ``b``,
          ``answer`` are those three in some order.

        ``feature``, ``rule``: as for ``counterfactual_answer``; ``answer``: int ``[n]``. Returns bool ``[n]``.
        The question "does the model follow rule r' here" is well-posed only where this holds for
        r''s counterfactual answer."""
        grid, rule = self._grid_and_rule(batch, feature, rule)
        n, K = len(batch), self.n_values
        answer = np.asarray(answer, dtype=np.int64).reshape(n)
        a, b = grid[:, -1, 0], grid[:, -1, 1]
        step = STEP[rule]
        progression = ((b - a - step) % K == 0) & ((answer - b - step) % K == 0)
        valid = np.select([rule == SUM, rule == DIFFERENCE], [(answer - a - b) % K == 0, (answer - a + b) % K == 0],
                          default=progression)
        first_rows = _values_of_first_rows(grid, K)
        row = np.stack([a, b, answer], axis=1)
        distinct = (a != b) & (a != answer) & (b != answer)
        in_set = np.take_along_axis(first_rows, np.clip(row, 0, K - 1), axis=1).all(axis=1) & (row >= 0).all(axis=1)
        distribute = (first_rows.sum(axis=1) == 3) & distinct & in_set
        return np.where(rule == DISTRIBUTE_THREE, distribute, valid)

    def counterfactual_pairs(self, n: int, split: str = "ood", *, seed: int = 0, variant: str | None = None,
                             prediction: int = -1, pool: int = 8, well_posed: bool = True):
        """``n`` base instances of ``split`` with a donor per relation (``different``, ``third``,
        ``same``; see ``latentcode.tasks.counterfactuals``), at the query position ``prediction``
        (default the last; its rule is ``query_rule[:, prediction]``).

        The target rule r' of each base is drawn uniformly among the rules whose counterfactual
        answer is defined, differs from the true answer and (``well_posed``) completes a valid row
        of r'. The third donor's rule r'' is neither r nor r', and its own answer on the base is not
        r''s. Donors come from a pool of ``pool * n`` fresh instances of the same split and variant.
        ``counts`` says how many of the candidate bases each condition kept, and, per rule r' and per
        rule pair, how often r' was well-posed.
        """
        prediction = check_pair_request(n, prediction, self.n_predictions, pool)
        variant = self._check_variant(self.analysis.variant if variant is None else variant)
        n_candidates = 4 * n
        candidates = self.sample(n_candidates, split, seed=(seed, 1), variant=variant)
        donor_pool = self.sample(pool * n, split, seed=(seed, 2), variant=variant)
        rng = np.random.default_rng([seed, 3])
        feature = candidates.labels["column_permutations"][:, -1, prediction]
        base_rule = candidates.labels["query_rule"][:, prediction]
        truth = candidates.y[:, prediction]
        answers, defined = zip(*(self.counterfactual_answer(candidates, feature, rule) for rule in range(len(RULES))),
                               strict=True)
        answers, defined = np.stack(answers, 1), np.stack(defined, 1)  # [candidates, rules]
        valid_rows = np.stack([self.completes_a_valid_row(candidates, feature, rule, np.maximum(answers[:, rule], 0))
                               for rule in range(len(RULES))], 1) & defined
        distinguishes = defined & (answers != truth[:, None])
        target_ok = distinguishes & (valid_rows if well_posed else True)
        pool_rule = donor_pool.labels["query_rule"][:, prediction]
        kept, target, donor_different, donor_same = choose_donors(rng, base_rule, target_ok.copy(), pool_rule)
        target_answer = answers[np.arange(n_candidates), target]
        third_ok = answers != target_answer[:, None]
        third_ok[np.arange(n_candidates), base_rule] = False
        third_ok[np.arange(n_candidates), target] = False
        has_third, third, donor_third = choose_third(rng, third_ok, pool_rule)
        kept &= has_third
        rows = first_kept(kept, n, f"{split} instances have a well-posed counterfactual rule with donors of every "
                                   f"relation at prediction {prediction}; ask for fewer pairs than {n} or set "
                                   "well_posed=False")
        not_own = np.ones_like(defined)
        not_own[np.arange(n_candidates), base_rule] = False
        counts = {
            "candidates": n_candidates,
            "with a distinguishing rule r'": int((distinguishes & not_own).any(1).sum()),
            "with a well-posed distinguishing rule r'": int((distinguishes & valid_rows & not_own).any(1).sum()),
            "kept (all donors found)": int(kept.sum()),
            "pairs": n,
            # how often each rule's counterfactual row is valid where it is defined and differs from the truth
            "well-posed fraction per rule r'": {
                RULES[r]: float(valid_rows[distinguishes[:, r] & not_own[:, r], r].mean())
                if (distinguishes[:, r] & not_own[:, r]).any() else float("nan") for r in range(len(RULES))},
            "pairs per base rule": {RULES[r]: int((base_rule[rows] == r).sum()) for r in range(len(RULES))},
            "pairs per target rule": {RULES[r]: int((target[rows] == r).sum()) for r in range(len(RULES))},
        }
        donors = donors_at(donor_pool, {"different": donor_different[rows], "third": donor_third[rows],
                                        "same": donor_same[rows]})
        return CounterfactualPairs(
            base=take(candidates, rows), donors=donors, prediction=prediction, base_answer=truth[rows],
            counterfactual_answer=target_answer[rows], base_part=base_rule[rows],
            donor_parts={"different": target[rows], "third": third[rows], "same": base_rule[rows]},
            part_names=list(RULES), counts=counts)

    def _grid_and_rule(self, batch: Batch, feature, rule) -> tuple[np.ndarray, np.ndarray]:
        """The grid ``[n, 3, 3]`` of ``feature`` of each instance and ``rule`` as int64 ``[n]``, both checked."""
        grids, n = self.feature_grids(batch), len(batch)
        feature = _per_instance_index("feature", feature, n, self.n_features)
        if isinstance(rule, str):
            if rule not in RULES:
                raise TaskError(f"unknown rule {rule!r}; valid rules: {list(RULES)}")
            rule = RULES.index(rule)
        return grids[np.arange(n), feature], _per_instance_index("rule", rule, n, len(RULES))


def _values_of_first_rows(grid: np.ndarray, n_values: int) -> np.ndarray:
    """Which values ``0..K-1`` the first two rows of grids ``[n, 3, 3]`` hold: bool ``[n, K]``."""
    return (grid[:, :-1, :, None] == np.arange(n_values)).any(axis=(1, 2))


def _per_instance_index(name: str, index, n: int, count: int) -> np.ndarray:
    """``index`` (an int or ints ``[n]``) as int64 ``[n]``, each in ``0..count-1``."""
    array = np.asarray(index)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise TaskError(f"{name}={index!r} must be an integer or an integer array [n]")
    if array.ndim == 0:
        array = np.full(n, array, dtype=np.int64)
    if array.shape != (n,):
        raise TaskError(f"{name} has shape {array.shape}; expected () or ({n},) [n]")
    outside = (array < 0) | (array >= count)
    if outside.any():
        raise TaskError(f"{name}={array[outside][0]} is out of range; expected 0..{count - 1}")
    return array.astype(np.int64)

