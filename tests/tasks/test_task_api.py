"""The shared task interface: registry, config round trip, validation, seeds, batches."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from latentcode.tasks import Batch, FuzzyLogic, SRaven, eval_seed, get_task, task_names

SMALL_PARAMS = {
    "fuzzy_logic": {"n_variables": 3, "n_terms": 2, "seq_len": 8, "frac_test": 0.5, "seed": 7},
    "sraven": {"n_features": 3, "n_values": 5, "frac_ood": 0.3, "seed": 7},
}


def all_tasks():
    return [get_task(name, **params) for name, params in SMALL_PARAMS.items()] + [
        get_task("fuzzy_logic"),
        get_task("sraven"),
    ]


def assert_batches_equal(first: Batch, second: Batch) -> None:
    np.testing.assert_array_equal(first.x, second.x)
    np.testing.assert_array_equal(first.y, second.y)
    assert first.labels.keys() == second.labels.keys()
    for name in first.labels:
        np.testing.assert_array_equal(first.labels[name], second.labels[name])


def test_registry_names_and_classes():
    assert task_names() == ("fuzzy_logic", "language", "sraven")
    assert isinstance(get_task("fuzzy_logic"), FuzzyLogic)
    assert isinstance(get_task("sraven"), SRaven)


def test_unknown_task_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown task 'raven'.*fuzzy_logic.*sraven"):
        get_task("raven")


def test_unknown_parameter_is_named_with_valid_parameters():
    with pytest.raises(ValueError, match=r"\['n_feature'\].*'sraven'.*n_features.*n_values"):
        get_task("sraven", n_feature=4)


@pytest.mark.parametrize("task", all_tasks(), ids=repr)
def test_config_round_trip_rebuilds_identical_task(task):
    config = task.config()
    assert config["name"] == task.name
    rebuilt = get_task(**json.loads(json.dumps(config)))
    assert rebuilt.config() == config
    for split in task.splits:
        np.testing.assert_array_equal(rebuilt.combinations(split), task.combinations(split))
        assert_batches_equal(rebuilt.sample(16, split, seed=3), task.sample(16, split, seed=3))


@pytest.mark.parametrize("task", all_tasks(), ids=repr)
def test_batch_shapes_and_labels(task):
    for split in task.splits:
        for variant in task.variants:
            batch = task.sample(10, split, seed=1, variant=variant)
            assert len(batch) == 10
            assert (batch.split, batch.variant) == (split, variant)
            assert batch.x.shape == (10, task.seq_len, task.d_in)
            assert batch.x.dtype == np.float32
            assert batch.y.shape == (10, task.n_predictions)
            expected_dtype = np.float32 if task.objective == "regression" else np.int64
            assert batch.y.dtype == expected_dtype
            assert tuple(batch.labels) == task.label_names
            assert all(len(values) == 10 for values in batch.labels.values())
            drawn = {tuple(row) for row in task.all_combinations[batch.labels["task_index"]]}
            assert drawn <= {tuple(row) for row in task.combinations(split)}


def test_default_variant_is_the_first():
    task = get_task("sraven")
    assert task.sample(4, seed=2).variant == "permuted"
    assert_batches_equal(task.sample(4, seed=2), task.sample(4, seed=2, variant="permuted"))


@pytest.mark.parametrize("task", all_tasks(), ids=repr)
def test_same_seed_same_data_different_seed_different_data(task):
    for split in task.splits:
        assert_batches_equal(
            task.sample(32, split, seed=(1, 2)), task.sample(32, split, seed=(1, 2))
        )
        assert not np.array_equal(
            task.sample(32, split, seed=(1, 2)).x, task.sample(32, split, seed=(1, 3)).x
        )
        # numpy's SeedSequence alone would confuse these two
        assert not np.array_equal(
            task.sample(32, split, seed=(1, 2)).x, task.sample(32, split, seed=(1, 2, 0)).x
        )
    assert not np.array_equal(task.sample(32, "train", seed=5).x, task.sample(32, "test", seed=5).x)


def test_integer_seed_equals_one_tuple():
    task = get_task("sraven")
    assert_batches_equal(task.sample(8, seed=5), task.sample(8, seed=(5,)))
    assert_batches_equal(task.sample(8, seed=5), task.sample(8, seed=np.int64(5)))


def test_task_seed_fixes_splits_sample_seed_does_not_change_them():
    for name in ("fuzzy_logic", "sraven"):
        first, again, other = get_task(name, seed=0), get_task(name, seed=0), get_task(name, seed=1)
        np.testing.assert_array_equal(first.combinations("ood"), again.combinations("ood"))
        assert not np.array_equal(first.combinations("ood"), other.combinations("ood"))
        # same sample seed, different task seed: different data
        assert not np.array_equal(first.sample(8, seed=0).x, other.sample(8, seed=0).x)


@pytest.mark.parametrize("task", all_tasks(), ids=repr)
def test_eval_set_is_fixed_and_documented(task):
    for split in task.splits:
        fixed = task.eval_set(split, 64)
        assert_batches_equal(fixed, task.eval_set(split, 64))
        assert_batches_equal(fixed, task.sample(64, split, seed=eval_seed(split)))
        assert_batches_equal(fixed, get_task(**task.config()).eval_set(split, 64))
    assert (
        eval_seed("ood") == 4271584072
    )  # zlib.crc32(b"eval/ood"): changing it changes every score


@pytest.mark.parametrize("task", all_tasks()[:2], ids=repr)
def test_sample_argument_errors(task):
    with pytest.raises(ValueError, match=r"unknown split 'validation'.*'train'"):
        task.sample(4, "validation")
    with pytest.raises(ValueError, match=r"unknown variant 'shuffled'.*" + task.variants[0]):
        task.sample(4, variant="shuffled")
    with pytest.raises(ValueError, match=r"n=0 must be at least 1"):
        task.sample(0)
    with pytest.raises(ValueError, match=r"n=2.5 must be an integer"):
        task.sample(2.5)
    with pytest.raises(ValueError, match=r"seed=\(1, -2\) must be a non-negative integer"):
        task.sample(4, seed=(1, -2))
    with pytest.raises(ValueError, match=r"unknown split"):
        task.eval_set("validation", 4)
    with pytest.raises(ValueError, match=r"unknown split"):
        task.combinations("validation")


@pytest.mark.parametrize("task", all_tasks()[:2], ids=repr)
def test_evaluate_checks_prediction_shape(task):
    batch = task.sample(5)
    with pytest.raises(ValueError, match=r"prediction has shape \(5, 7\); expected"):
        task.evaluate(np.zeros((5, 7)), batch)


def test_batch_refuses_labels_of_another_length():
    with pytest.raises(ValueError, match=r"label 'rules' has 3 rows but x has 2"):
        Batch(np.zeros((2, 4, 3)), np.zeros((2, 1)), {"rules": np.zeros(3)}, "train", "permuted")


def test_tasks_package_imports_no_torch():
    code = "import sys, latentcode.tasks, latentcode.tasks.sraven; print('torch' in sys.modules)"
    repository = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([repository, os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("name", task_names())
def test_labels_added_at_extraction_are_named_by_the_task(name):
    """`task.label_names` did not show SRAVEN's `rule`, the label the README decodes (issue 24)."""
    from types import SimpleNamespace

    task = get_task(name, **({"seq_len": 64} if name == "language" else {}))
    batch = task.sample(8, task.splits[0], seed=0)
    assert set(batch.labels) == set(task.label_names)
    assert not set(task.derived_label_names) & set(task.label_names)
    for requests in task.selectors().values():
        sites = [SimpleNamespace(query=query % task.seq_len, key=key % task.seq_len) for _, query, key in requests]
        assert set(task.derived_labels(batch, sites)) <= set(task.derived_label_names) | set(task.label_names)
    if name == "sraven":
        assert task.derived_label_names == ("rule",)


@pytest.mark.parametrize("task", all_tasks(), ids=repr)
def test_position_names_name_every_input_position_and_the_query_last(task):
    """The viewer's key names (recorded in codes files at extraction): one per input position."""
    names = task.position_names()
    batch = task.sample(2, split="train", seed=0)
    assert len(names) == batch.x.shape[1] == len(set(names))
    if isinstance(task, SRaven):  # 8 context panels of n_features slots, then the query panel's slots
        assert names[task.n_features] == "panel (1,2) slot 0" and names[-1] == f"query slot {task.n_features - 1}"
    else:
        assert names[0] == "example 0" and names[-1] == "query"
