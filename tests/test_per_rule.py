"""analyses/results/per_rule (issue 26): the recorded per-rule and per-multiset accuracies of the
shipped permuted SRAVEN models add up to the accuracies their runs recorded, on the right multisets."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import latentcode
from latentcode.rundir import RunRecord
from latentcode.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla"])
def test_the_per_rule_tables_count_the_evaluation_sets_and_agree_with_the_recorded_accuracies(attention):
    """The tables' instance counts per multiset and per rule equal those of the run's evaluation
    sets, counted here from the instances' own rule labels; their correct instances add up to the
    run's recorded accuracies within two instances of 4,096 (the table and the run's final
    evaluation differ by at most that: ties broken differently by another batching)."""
    table = pd.read_csv(ROOT / "analyses" / "results" / "per_rule" / f"sraven-permuted-{attention}.csv")
    run = ROOT / "models" / f"sraven-permuted-{attention}"
    recorded = json.loads((run / "summary.json").read_text())["final_metrics"]
    task = get_task(**RunRecord.read(run).task_config)
    variant = latentcode.Run(run).config.variant
    names = task.value_names()["rules"]
    for split in ("test", "ood"):
        multisets = table[(table["level"] == "multiset") & (table["split"] == split)]
        rules = table[(table["level"] == "rule") & (table["split"] == split)]
        instances = task.eval_set(split, 4096, variant=variant)
        rule_labels = np.asarray(instances.labels["rules"])  # [4096, M], in feature order
        expected_multisets = Counter(" + ".join(names[rule] for rule in sorted(row)) for row in rule_labels)
        assert dict(zip(multisets["group"], multisets["n"], strict=True)) == expected_multisets
        expected_rules = Counter(names[rule] for rule in rule_labels.ravel())
        assert dict(zip(rules["group"], rules["n"], strict=True)) == expected_rules
        correct = (multisets["accuracy"] * multisets["n"]).sum()
        assert abs(correct - recorded[split]["accuracy"] * 4096) <= 2 + 1e-3, split
        correct_features = (rules["accuracy"] * rules["n"]).sum()
        assert abs(correct_features - recorded[split]["feature_accuracy"] * rules["n"].sum()) <= 2 + 1e-3, split
        assert set(multisets["group"]) == {" + ".join(names[rule] for rule in row) for row in task.combinations(split)}
