"""The shared task interface: the registry, and what the contract tests (test_task_contract.py, over
every registered task) cannot say in general: defaults, seeds and names of particular tasks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from latentcode.tasks import (
    AnalysisDefaults,
    Batch,
    FuzzyLogic,
    SRaven,
    Task,
    eval_seed,
    get_task,
    register_task,
    task_class,
    task_names,
)

REPOSITORY = Path(__file__).resolve().parents[2]


def assert_batches_equal(first: Batch, second: Batch) -> None:
    np.testing.assert_array_equal(first.x, second.x)
    np.testing.assert_array_equal(first.y, second.y)
    assert first.labels.keys() == second.labels.keys()
    for name in first.labels:
        np.testing.assert_array_equal(first.labels[name], second.labels[name])


def registered_in_the_source() -> set[str]:
    """The `name` of every `@register_task` class in latentcode/tasks/*.py, read from the source text
    (not through the registry, whose discovery is what is tested)."""
    names = set()
    for path in (REPOSITORY / "latentcode" / "tasks").glob("*.py"):
        for block in path.read_text().split("@register_task\nclass ")[1:]:
            names.add(re.search(r'^    name = "([^"]+)"$', block, re.MULTILINE).group(1))
    return names


def test_the_registry_finds_every_task_module_and_nothing_lists_them():
    assert set(task_names()) == registered_in_the_source()
    assert task_names() == tuple(sorted(task_names()))
    assert isinstance(get_task("fuzzy_logic"), FuzzyLogic)
    assert isinstance(get_task("sraven"), SRaven)
    package = (REPOSITORY / "latentcode" / "tasks" / "__init__.py").read_text()
    assert not [name for name in task_names() if f'"{name}"' in package.replace('DEMO_TASK = "fuzzy_logic"', "")]


def test_register_task_refuses_what_is_not_a_task_and_a_second_class_of_one_name():
    with pytest.raises(TypeError, match="takes a Task subclass"):
        register_task(object)

    class AnotherSRaven(SRaven):
        analysis = AnalysisDefaults(selector="sraven-rule", variant="unpermuted", probe_label="rule",
                                    picture_label="rule", headline_metric="accuracy")

    with pytest.raises(TypeError, match=r"two task classes are named 'sraven': latentcode.tasks.sraven.SRaven and"):
        register_task(AnotherSRaven)
    assert task_class("sraven") is SRaven
    assert register_task(SRaven) is SRaven  # the same class again (a reloaded module) is no clash


def test_only_the_capabilities_a_task_overrides_are_provided():
    assert SRaven.provides("counterfactual_pairs") and not task_class("language").provides("counterfactual_pairs")
    assert FuzzyLogic.provides("transplant_pairs") and not SRaven.provides("transplant_pairs")
    assert not Task.provides("position_partitions")


def test_unknown_task_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown task 'raven'.*fuzzy_logic.*sraven"):
        get_task("raven")


def test_unknown_parameter_is_named_with_valid_parameters():
    with pytest.raises(ValueError, match=r"\['n_feature'\].*'sraven'.*n_features.*n_values"):
        get_task("sraven", n_feature=4)


def test_default_variant_is_the_first():
    task = get_task("sraven")
    assert task.sample(4, seed=2).variant == "permuted"
    assert_batches_equal(task.sample(4, seed=2), task.sample(4, seed=2, variant="permuted"))


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


def test_the_eval_seed_is_the_crc32_of_its_split():
    assert eval_seed("ood") == 4271584072  # zlib.crc32(b"eval/ood"): changing it changes every score


def test_batch_refuses_labels_of_another_length():
    with pytest.raises(ValueError, match=r"label 'rules' has 3 rows but x has 2"):
        Batch(np.zeros((2, 4, 3)), np.zeros((2, 1)), {"rules": np.zeros(3)}, "train", "permuted")


def test_tasks_package_imports_no_task_module_and_discovery_no_torch():
    """`import latentcode.tasks` is light (the CLI's checks import it before torch): the registry imports
    the task modules on its first question, and none of them imports torch."""
    code = ("import sys, latentcode.tasks\n"
            "print(sorted(m for m in sys.modules if m.startswith('latentcode.tasks.')))\n"
            "print(latentcode.tasks.task_names(), 'torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPOSITORY), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    imported, names = result.stdout.splitlines()
    assert imported == str(["latentcode.tasks.base", "latentcode.tasks.registry"])
    assert names == f"{task_names()} False"


@pytest.mark.parametrize("task", [get_task("sraven"), get_task("sraven", n_features=3), get_task("fuzzy_logic"),
                                  get_task("fuzzy_logic", seq_len=8)], ids=repr)
def test_position_names_name_every_input_position_and_the_query_last(task):
    """The viewer's key names (recorded in codes files at extraction): one per input position."""
    names = task.position_names()
    if isinstance(task, SRaven):  # 8 context panels of n_features slots, then the query panel's slots
        assert names[task.n_features] == "panel (1,2) slot 0" and names[-1] == f"query slot {task.n_features - 1}"
        assert task.derived_label_names == ("rule",)
    else:
        assert names[0] == "example 0" and names[-1] == "query"


def test_tasks_list_prints_a_line_per_registered_task(capsys):
    from latentcode.cli import main

    assert main(["tasks", "list"]) in (0, None)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == list(task_names())
    sraven = lines[task_names().index("sraven")]
    assert "variants permuted, unpermuted;" in sraven and "preset yes" in sraven
    assert "capabilities derived_labels, position_partitions, counterfactual_pairs" in sraven
