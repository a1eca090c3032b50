"""SRAVEN's `hold_out`: the default split is the one every trained model used; "stratified" holds out
as hard a mix of rule multisets as it trains on (issue 26)."""

import hashlib
import json

import numpy as np
import pytest

from latentcode.tasks import get_task
from latentcode.tasks.sraven import RULES

STEPLESS = [RULES.index(rule) for rule in ("sum", "difference", "distribute_three")]


def stepless_counts(combinations, n_features):
    return np.bincount(np.isin(combinations, STEPLESS).sum(axis=1), minlength=n_features + 1)


# SHA-256 (first 16 hex digits) of the held-out multisets, as JSON, of the shipped and recorded
# models' tasks (models/sraven-*, analyses/results/runs/sraven-M2-*), taken before `hold_out` existed.
RECORDED_SPLITS = {
    (2, 0): "6e4c0393fc6515ad", (2, 1): "72feaf53441eee45", (2, 2): "e2d75566944397df", (4, 0): "a5f21d9f975c8e8d",
}


@pytest.mark.parametrize(("n_features", "seed"), sorted(RECORDED_SPLITS))
def test_the_default_split_is_the_one_trained_models_used(n_features, seed):
    task = get_task("sraven", n_features=n_features, seed=seed)
    held_out = json.dumps(task.combinations("ood").tolist()).encode()
    assert hashlib.sha256(held_out).hexdigest()[:16] == RECORDED_SPLITS[n_features, seed]
    assert "hold_out" not in task.config(), "configs recorded before hold_out existed stay equal"
    np.testing.assert_array_equal(get_task("sraven", n_features=n_features, seed=seed, hold_out="greedy")
                                  .combinations("ood"), task.combinations("ood"))


def test_the_default_holds_out_mostly_progressions():
    held_out = get_task("sraven", n_features=2, seed=0).combinations("ood")
    assert stepless_counts(held_out, 2).tolist() == [6, 3, 0]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_features", [2, 4])
def test_stratified_holds_out_the_mix_of_all_multisets(n_features, seed):
    task = get_task("sraven", n_features=n_features, seed=seed, hold_out="stratified")
    assert task.config()["hold_out"] == "stratified" and get_task(**task.config()).config() == task.config()
    held_out, kept = task.combinations("ood"), task.combinations("train")
    shares = stepless_counts(task.all_combinations, n_features) * len(held_out) / len(task.all_combinations)
    assert np.abs(stepless_counts(held_out, n_features) - shares).max() < 1  # largest remainders
    assert len(held_out) == len(get_task("sraven", n_features=n_features, seed=seed).combinations("ood"))
    assert not set(map(tuple, held_out)) & set(map(tuple, kept))
    assert set(np.unique(kept)) == set(range(len(RULES))), "every rule still occurs in training"


def test_an_unknown_hold_out_is_refused():
    with pytest.raises(ValueError, match=r"hold_out must be one of \['greedy', 'stratified'\], got 'balanced'"):
        get_task("sraven", hold_out="balanced")


def test_a_training_config_may_set_it():
    from latentcode.training import build_train_config

    config = build_train_config("sraven", "cpu", "hyla", n_features=2, hold_out="stratified", task_seed=1)
    assert config.task["hold_out"] == "stratified" and config.task["seed"] == 1
    assert "hold_out" not in build_train_config("sraven", "cpu", "hyla").task
