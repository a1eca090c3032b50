"""The one-initialisation SRAVEN comparison (analyses/reproduction/sraven_init.py): the paired statistics
against scipy's paired test on the same numbers, seeds matched by seed, and the per-multiset scoring
against the model's accuracy computed directly on the whole evaluation set."""

from pathlib import Path

import numpy as np
import pytest

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture
def sraven_init(monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(ANALYSES))
    return importlib.import_module("reproduction.sraven_init")


def recorded(monkeypatch, module, ood: dict[str, dict[int, float]]) -> None:
    """Stand-in recorded runs: OOD accuracy (%) per attention and seed, nothing else recorded."""
    values = {module.run_name(attention, seed): value for attention, seeds in ood.items() for seed, value in seeds.items()}
    monkeypatch.setattr(module, "metric_of", lambda name, split, metric: values.get(name))


def test_the_paired_comparison_matches_scipy_on_the_seeds_both_attentions_have(sraven_init, monkeypatch):
    from scipy import stats

    hyla = {0: 66.0, 1: 67.0, 2: 47.0, 3: 61.0}
    softmax = {0: 58.0, 1: 68.0, 2: 51.0, 4: 99.0}  # seed 4 has no HYLA partner, seed 3 no softmax one
    recorded(monkeypatch, sraven_init, {"hyla": hyla, "softmax": softmax})
    comparison = sraven_init.paired("hyla", "softmax")
    first, second = [hyla[s] for s in (0, 1, 2)], [softmax[s] for s in (0, 1, 2)]
    differences = np.subtract(first, second)
    assert comparison["seeds"] == [0, 1, 2]
    assert comparison["mean"] == pytest.approx(differences.mean())
    assert comparison["error"] == pytest.approx(stats.sem(differences))
    assert comparison["t_p"] == pytest.approx(stats.ttest_rel(first, second).pvalue)
    assert comparison["ahead"] == 1  # only seed 0 puts HYLA above
    assert comparison["sign_p"] == pytest.approx(1.0)  # 1 of 3 under a fair coin: two-sided p = 1
    interval = stats.t.interval(0.95, 2, loc=differences.mean(), scale=stats.sem(differences))
    assert (comparison["low"], comparison["high"]) == pytest.approx(interval)
    assert sraven_init.verdict_word(comparison) == "level (within the noise)"


def test_a_consistent_gap_is_ahead_or_behind_and_one_shared_seed_is_no_comparison(sraven_init, monkeypatch):
    recorded(monkeypatch, sraven_init, {"hyla": {s: 70.0 + s for s in range(5)},
                                        "linear": {s: 50.0 + 2 * s for s in range(5)},
                                        "softmax": {0: 40.0}})
    assert sraven_init.verdict_word(sraven_init.paired("hyla", "linear")) == "ahead"
    assert sraven_init.verdict_word(sraven_init.paired("linear", "hyla")) == "behind"
    assert sraven_init.paired("hyla", "softmax") is None
    assert sraven_init.verdict().startswith("not all three models")


def test_per_multiset_and_per_rule_rows_pool_to_the_accuracy_computed_on_the_whole_set(sraven_init):
    """score_per_rule's groups partition the evaluation set: weighted by n, the multisets give back the
    all-features-right accuracy and the query rules the per-feature accuracy, computed here directly."""
    import torch
    from reproduction.sraven import PER_RULE_N, score_per_rule

    import latentcode

    run = latentcode.Run(MODELS / "sraven-permuted-hyla")
    task, model = run.task(), run.load_model()
    rows = score_per_rule(task, model, "hyla")
    batch = task.eval_set("ood", PER_RULE_N, variant="permuted")
    with torch.no_grad():
        predicted = model(torch.from_numpy(batch.x))[:, -task.n_features:, :].argmax(-1).numpy()
    correct = predicted == batch.y
    multisets = [row for row in rows if row["split"] == "ood" and row["level"] == "multiset"]
    rules = [row for row in rows if row["split"] == "ood" and row["level"] == "rule" and row["n"]]
    assert sum(row["n"] for row in multisets) == len(batch.y)
    assert sum(row["n"] * row["accuracy"] for row in multisets) / len(batch.y) == pytest.approx(correct.all(axis=1).mean())
    assert sum(row["n"] * row["accuracy"] for row in rules) / sum(row["n"] for row in rules) == pytest.approx(correct.mean())
