"""Base/donor pairs for the code-reuse transplant: an unseen composition as the base, a
training composition that swaps one of its terms as the donor.

The base is an instance of an `ood` task {a, b} (an unseen set of seen terms). The "different" donor
is a training instance of a task that differs from it by one term, {a, c}
(`FuzzyLogic.tasks_differing_by_one_term`), whose function at the base's query differs from the base's
answer by more than `min_difference`; its counterfactual answer is that function at the base's query.
The "third" donor is a training instance of any other training task whose function there differs from
both by more than `min_difference` (the baseline of `latentcode.intervention.transfer`). Patching
the donor's codes into the base and finding the prediction at {a, c}'s answer more often than with
the third donor says the model reads a training composition's code in an unseen one as it reads it
in training: the code is reused, not rebuilt.

Both sides are drawn from the same variant, by default the training variant (`uniform`: every input
fresh), as `FuzzyLogic.counterfactual_pairs` draws them. Not `fixed_query`: at its one query input the
16 terms take four values (0.09, 0.39, 0.44, 0.56 with task seed 0), so almost no third task differs
from both the base's and the donor's function there by more than 0.1 (none of 1,024 candidates with
frac_test 0.7).
"""

from __future__ import annotations

import numpy as np

from latentcode.tasks.base import TaskError
from latentcode.tasks.counterfactuals import (
    CounterfactualPairs,
    check_pair_request,
    choose_third,
    draw_among,
    draw_from_pool,
    first_kept,
    take,
)
from latentcode.validation import check_variant


def transplant_pairs(task, n: int, *, seed: int = 0, variant: str | None = None, pool: int = 8,
                     min_difference: float = 0.1) -> CounterfactualPairs:
    """`n` pairs (module docstring) of a `FuzzyLogic` task (`FuzzyLogic.transplant_pairs`); donors from `pool * n`
    training instances."""
    if not task.provides("transplant_pairs"):
        raise TaskError(f"the transplant needs a task whose compositions are sets of terms (fuzzy_logic); "
                        f"got {task.name!r}")
    check_pair_request(n, 0, task.n_predictions, pool, min_difference)
    variant = check_variant(task.variants[0] if variant is None else variant, task, error=TaskError)
    candidates = task.sample(4 * n, "ood", seed=(seed, 11), variant=variant)
    donor_pool = task.sample(pool * n, "train", seed=(seed, 12), variant=variant)
    rng = np.random.default_rng([seed, 13])
    tasks, pool_part = np.unique(donor_pool.labels["task_index"], return_inverse=True)
    functions = np.stack([task.counterfactual_target(candidates, task.all_combinations[t]) for t in tasks], 1)
    truth = candidates.y[:, 0]
    base_task = candidates.labels["task_index"]
    neighbours = {t: np.isin(tasks, task.tasks_differing_by_one_term(task.all_combinations[t], split="train"))
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
        part_names=task.function_names(), counts=counts)
