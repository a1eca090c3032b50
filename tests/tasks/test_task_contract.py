"""The task contract, checked on every registered task (the registry's list, never a hand-written one),
each at its own small configuration (`Task.small_config`) and at its defaults: a new task module is
tested here without a line of this file changing (issue 33)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from latentcode.tasks import CAPABILITIES, Batch, Task, eval_seed, get_task, task_class, task_names
from latentcode.tasks.base import TaskError
from latentcode.tasks.counterfactuals import CounterfactualPairs
from latentcode.tasks.partitions import task_partitions

NAMES = task_names()


def contract_tasks() -> list[Task]:
    """Every registered task at its small configuration, then at its defaults."""
    return ([get_task(name, **task_class(name).small_config) for name in NAMES]
            + [get_task(name) for name in NAMES])


TASKS = contract_tasks()
SMALL = TASKS[: len(NAMES)]


def assert_batches_equal(first: Batch, second: Batch) -> None:
    np.testing.assert_array_equal(first.x, second.x)
    np.testing.assert_array_equal(first.y, second.y)
    assert first.labels.keys() == second.labels.keys()
    for name in first.labels:
        np.testing.assert_array_equal(first.labels[name], second.labels[name])


def unknown(names) -> str:
    """A name not among `names` (a split or a variant the task does not have)."""
    return next(candidate for candidate in ("nosuchsplit", "nosuchsplit2") if candidate not in names)


def test_the_registry_finds_a_task():
    assert NAMES and all(task_class(name).name == name for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_class_declares_what_the_later_stages_read(name):
    cls = task_class(name)
    assert issubclass(cls, Task) and cls.__module__.startswith("latentcode.tasks.")
    assert cls.splits and len(set(cls.splits)) == len(cls.splits)
    assert cls.variants and len(set(cls.variants)) == len(cls.variants)
    assert cls.objective in ("regression", "classification")
    assert set(cls.small_config) <= set(cls.parameter_names()), "small_config names a parameter the task lacks"
    analysis = cls.analysis
    assert analysis.variant in cls.variants
    assert analysis.selection_split in cls.splits and analysis.held_out_split in cls.splits
    labels = set(cls.label_names) | set(cls.derived_label_names)
    assert analysis.probe_label in labels and analysis.picture_label in labels
    assert not set(cls.derived_label_names) & set(cls.label_names)
    assert set(cls.reading_parameters) <= set(cls.parameter_names())


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_capabilities_are_declared_on_task_and_asked_by_name(task):
    provided = {capability: task.provides(capability) for capability in CAPABILITIES}
    assert all(isinstance(value, bool) for value in provided.values())
    assert provided == {capability: type(task).provides(capability) for capability in CAPABILITIES}
    if task.derived_label_names:
        assert provided["derived_labels"], "a task naming derived labels must compute them"
    with pytest.raises(ValueError, match=r"unknown task capability 'counterfactuals'; valid capabilities"):
        task.provides("counterfactuals")


@pytest.mark.parametrize("task", TASKS, ids=repr)
def test_config_round_trip_rebuilds_identical_task(task):
    config = task.config()
    assert config["name"] == task.name
    rebuilt = get_task(**json.loads(json.dumps(config)))
    assert rebuilt.config() == config
    for split in task.splits:
        if "task_index" in task.label_names:
            np.testing.assert_array_equal(rebuilt.combinations(split), task.combinations(split))
        assert_batches_equal(rebuilt.sample(16, split, seed=3), task.sample(16, split, seed=3))


@pytest.mark.parametrize("task", TASKS, ids=repr)
def test_batch_shapes_and_labels(task):
    for split in task.splits:
        for variant in task.variants:
            batch = task.sample(10, split, seed=1, variant=variant)
            assert len(batch) == 10
            assert (batch.split, batch.variant) == (split, variant)
            if task.d_vocab is None:  # vectors of d_in
                assert batch.x.shape == (10, task.seq_len, task.d_in) and batch.x.dtype == np.float32
            else:  # integer tokens
                assert batch.x.shape == (10, task.seq_len) and batch.x.dtype == np.int64
                assert 0 <= batch.x.min() and batch.x.max() < task.d_vocab
            assert batch.y.shape == (10, task.n_predictions)
            assert batch.y.dtype == (np.float32 if task.objective == "regression" else np.int64)
            assert tuple(batch.labels) == task.label_names
            assert all(len(values) == 10 for values in batch.labels.values())
            if "task_index" in task.label_names:
                drawn = {tuple(row) for row in task.all_combinations[batch.labels["task_index"]]}
                assert drawn <= {tuple(row) for row in task.combinations(split)}


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_variants_of_one_seed_are_views_of_the_same_instances(task):
    """The variant is not part of the sample's entropy (tasks/base.py): same tasks, same count."""
    for split in task.splits:
        batches = [task.sample(12, split, seed=4, variant=variant) for variant in task.variants]
        if "task_index" in task.label_names:
            for batch in batches[1:]:
                np.testing.assert_array_equal(batch.labels["task_index"], batches[0].labels["task_index"])
        assert_batches_equal(task.sample(12, split, seed=4), batches[0])  # the first variant is the default


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_same_seed_same_data_different_seed_different_data(task):
    for split in task.splits:
        assert_batches_equal(task.sample(32, split, seed=(1, 2)), task.sample(32, split, seed=(1, 2)))
        assert not np.array_equal(task.sample(32, split, seed=(1, 2)).x, task.sample(32, split, seed=(1, 3)).x)
        # numpy's SeedSequence alone would confuse these two
        assert not np.array_equal(task.sample(32, split, seed=(1, 2)).x, task.sample(32, split, seed=(1, 2, 0)).x)
        assert_batches_equal(task.sample(8, split, seed=5), task.sample(8, split, seed=(5,)))
    first, second = task.splits[:2]
    assert not np.array_equal(task.sample(32, first, seed=5).x, task.sample(32, second, seed=5).x)


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_eval_set_is_fixed_and_documented(task):
    for split in task.splits:
        fixed = task.eval_set(split, 64)
        assert_batches_equal(fixed, task.eval_set(split, 64))
        assert_batches_equal(fixed, task.sample(64, split, seed=eval_seed(split)))
        assert_batches_equal(fixed, get_task(**task.config()).eval_set(split, 64))


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_sample_argument_errors(task):
    bad_split, bad_variant = unknown(task.splits), unknown(task.variants)
    with pytest.raises(TaskError, match=rf"unknown split '{bad_split}'.*'{task.splits[0]}'"):
        task.sample(4, bad_split)
    with pytest.raises(TaskError, match=rf"unknown variant '{bad_variant}'.*{task.variants[0]}"):
        task.sample(4, variant=bad_variant)
    with pytest.raises(TaskError, match=r"n=0 must be at least 1"):
        task.sample(0)
    with pytest.raises(TaskError, match=r"n=2.5 must be an integer"):
        task.sample(2.5)
    with pytest.raises(TaskError, match=r"seed=\(1, -2\) must be a non-negative integer"):
        task.sample(4, seed=(1, -2))
    with pytest.raises(TaskError, match=r"unknown split"):
        task.eval_set(bad_split, 4)


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_evaluate_scores_the_headline_metric_and_checks_the_shape(task):
    batch = task.sample(5, task.analysis.selection_split, seed=0)
    if task.objective == "regression":
        perfect = batch.y[..., None].astype(np.float32)  # d_out 1: the targets themselves
    else:
        perfect = np.where(np.arange(task.d_out) == batch.y[..., None], 10.0, 0.0).astype(np.float32)
    assert perfect.shape == (5, task.n_predictions, task.d_out)
    metrics = task.evaluate(perfect, batch)
    assert task.analysis.headline_metric in metrics
    assert all(isinstance(value, float) and np.isfinite(value) for value in metrics.values())
    guess = task.evaluate(np.zeros_like(perfect), batch)[task.analysis.headline_metric]
    best = metrics[task.analysis.headline_metric]
    assert (best <= guess) if task.analysis.lower_is_better else (best >= guess), "a perfect prediction scores worse"
    with pytest.raises(TaskError, match=r"prediction has shape \(5, 7\); expected"):
        task.evaluate(np.zeros((5, 7)), batch)


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_selectors_and_derived_labels_are_the_tasks(task):
    """`task.label_names` did not show SRAVEN's `rule`, the label the README decodes (issue 24)."""
    batch = task.sample(8, task.splits[0], seed=0)
    assert set(batch.labels) == set(task.label_names)
    assert task.analysis.selector in {*task.selectors(), "last-self"}  # last-self: the generic named selector
    for requests in task.selectors().values():
        assert requests and all(-task.seq_len <= position < task.seq_len
                                for _, query, key in requests for position in (query, key))
        sites = [SimpleNamespace(query=query % task.seq_len, key=key % task.seq_len) for _, query, key in requests]
        derived = task.derived_labels(batch, sites)
        assert set(derived) <= set(task.derived_label_names) | set(task.label_names)
        assert all(len(values) == len(batch) for values in derived.values())
    if task.analysis.probe_label in task.derived_label_names:  # read where the analysis records
        requests = task.selectors()[task.analysis.selector]
        sites = [SimpleNamespace(query=query % task.seq_len, key=key % task.seq_len) for _, query, key in requests]
        assert task.analysis.probe_label in task.derived_labels(batch, sites)


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_partitions_cut_every_position_once(task):
    partitions = task_partitions(task)  # it refuses a partition that does not
    assert "context" in partitions
    assert set(task.position_partitions()) <= set(partitions)
    assert bool(task.position_partitions()) <= task.provides("position_partitions")


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_counterfactual_pairs_are_drawn_or_refused(task):
    split = task.analysis.held_out_split
    if not task.provides("counterfactual_pairs"):
        with pytest.raises(TaskError, match=rf"task '{task.name}' draws no counterfactual pairs"):
            task.counterfactual_pairs(4, split)
        return
    pairs = task.counterfactual_pairs(4, split, seed=0)
    assert isinstance(pairs, CounterfactualPairs)
    assert len(pairs.base) == 4 and pairs.base.split == split
    assert {"different", "third"} <= set(pairs.donors)
    for donor in pairs.donors.values():
        assert len(donor) == 4 and donor.x.shape == pairs.base.x.shape
    assert len(pairs.base_answer) == len(pairs.counterfactual_answer) == 4
    again = task.counterfactual_pairs(4, split, seed=0)
    assert_batches_equal(again.base, pairs.base)


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_transplant_pairs_are_drawn_or_refused(task):
    if not task.provides("transplant_pairs"):
        with pytest.raises(TaskError, match=rf"task '{task.name}' is not one \(Task.transplant_pairs\)"):
            task.transplant_pairs(4)
        return
    pairs = task.transplant_pairs(4, seed=0)
    assert isinstance(pairs, CounterfactualPairs) and len(pairs.base) == 4
    assert pairs.base.split == "ood" and all(donor.split == "train" for donor in pairs.donors.values())


@pytest.mark.parametrize("task", SMALL, ids=repr)
def test_names_of_positions_values_and_columns(task):
    """The viewer's key names (recorded in codes files at extraction): one per input position, or none."""
    names = task.position_names()
    assert names == [] or (len(names) == task.seq_len == len(set(names)))
    labels = set(task.label_names) | set(task.derived_label_names)
    assert set(task.value_names()) <= labels and set(task.column_names()) <= labels
    batch = task.sample(16, task.splits[0], seed=0)
    for label, value_names in task.value_names().items():
        if label in batch.labels:
            assert batch.labels[label].max() < len(value_names)
