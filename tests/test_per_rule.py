"""analyses/results/per_rule (issue 26): the recorded per-rule and per-multiset accuracies of the
shipped permuted SRAVEN models add up to the accuracies their runs recorded, on the right multisets."""

import json
from pathlib import Path

import pandas as pd
import pytest

from latentcode.rundir import RunRecord
from latentcode.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla"])
def test_the_per_rule_tables_add_up_to_the_recorded_accuracies(attention):
    table = pd.read_csv(ROOT / "analyses" / "results" / "per_rule" / f"sraven-permuted-{attention}.csv")
    run = ROOT / "models" / f"sraven-permuted-{attention}"
    recorded = json.loads((run / "summary.json").read_text())["final_metrics"]
    task = get_task(**RunRecord.read(run).task_config)
    names = task.value_names()["rules"]
    for split in ("test", "ood"):
        multisets = table[(table["level"] == "multiset") & (table["split"] == split)]
        rules = table[(table["level"] == "rule") & (table["split"] == split)]
        assert multisets["n"].sum() == 4096 and rules["n"].sum() == 4096 * task.n_features
        accuracy = (multisets["accuracy"] * multisets["n"]).sum() / 4096
        assert accuracy == pytest.approx(recorded[split]["accuracy"], abs=2e-3)  # the same instances
        feature_accuracy = (rules["accuracy"] * rules["n"]).sum() / rules["n"].sum()
        assert feature_accuracy == pytest.approx(recorded[split]["feature_accuracy"], abs=2e-3)
        expected = {" + ".join(names[rule] for rule in row) for row in task.combinations(split)}
        assert set(multisets["group"]) == expected
