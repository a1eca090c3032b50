"""latentcode.validation: each check accepts what it should, refuses the rest with a message naming
the value received and what is expected, and is the one the command line and the Python API share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from latentcode.errors import LatentcodeError, UsageError
from latentcode.tasks import get_task
from latentcode.tasks.base import TaskError
from latentcode.validation import (
    check_integer,
    check_output,
    check_split,
    check_variant,
    describe_integer_range,
)

# A stand-in with what the checks read of a task (its class attributes would do as well).
TASK = SimpleNamespace(name="toy", splits=("train", "ood"), variants=("plain", "shuffled"))


@pytest.mark.parametrize("split", TASK.splits)
def test_check_split_returns_a_split_the_task_has(split):
    assert check_split(split, TASK) == split


@pytest.mark.parametrize("flag, start", [(None, "unknown split"), ("--split", "--split: unknown split")])
def test_check_split_names_the_split_the_task_and_its_splits(flag, start):
    with pytest.raises(UsageError) as raised:
        check_split("odd", TASK, flag)
    assert str(raised.value) == f"{start} 'odd' for task 'toy'; valid splits: ['train', 'ood']"


@pytest.mark.parametrize("variant", TASK.variants)
def test_check_variant_returns_a_variant_the_task_has(variant):
    assert check_variant(variant, TASK) == variant


@pytest.mark.parametrize("variant", ["mirrored", "Plain", "", None])
def test_check_variant_names_the_variant_the_task_and_its_variants(variant):
    with pytest.raises(UsageError) as raised:
        check_variant(variant, TASK, "--variant")
    assert str(raised.value) == (f"--variant: unknown variant {variant!r} for task 'toy'; "
                                 "valid variants: ['plain', 'shuffled']")


def test_a_caller_chooses_the_error_class_and_it_stays_a_user_error():
    with pytest.raises(TaskError, match="unknown variant 'x'"):
        check_variant("x", TASK, error=TaskError)
    assert issubclass(TaskError, LatentcodeError) and issubclass(UsageError, LatentcodeError)


@pytest.mark.parametrize("value, minimum, maximum", [
    (1, 1, None), (0, 0, None), (7, None, 7), (-3, None, None), (np.int64(4), 1, 4), (2**32 - 1, 0, 2**32 - 1)])
def test_check_integer_accepts_integers_in_range_and_returns_a_python_int(value, minimum, maximum):
    result = check_integer("n", value, minimum, maximum)
    assert result == value and type(result) is int


@pytest.mark.parametrize("value, minimum, maximum, message", [
    (0, 1, None, "n=0 must be at least 1"),
    (-1, 0, None, "n=-1 must be at least 0"),
    (9, 1, 8, "n=9 must be at most 8"),
    (2.0, 1, None, "n=2.0 must be an integer"),
    ("3", 1, None, "n='3' must be an integer"),
    (True, 0, None, "n=True must be an integer"),
    (None, 0, None, "n=None must be an integer"),
])
def test_check_integer_refuses_with_the_name_the_value_and_the_range(value, minimum, maximum, message):
    with pytest.raises(UsageError) as raised:
        check_integer("n", value, minimum, maximum)
    assert str(raised.value) == message


@pytest.mark.parametrize("minimum, maximum, words", [
    (1, None, "a positive integer"), (0, None, "a non-negative integer"), (2, None, "an integer of at least 2"),
    (0, 2**32 - 1, "a non-negative integer below 4294967296")])
def test_describe_integer_range_says_the_range_in_words(minimum, maximum, words):
    assert describe_integer_range(minimum, maximum) == words


def test_the_python_api_and_the_command_line_refuse_a_split_with_the_same_message(tmp_path):
    """A task refuses an unknown split with exactly the message `check_split` gives; the command line
    gives it after the flag, and without importing torch."""
    task = get_task("fuzzy_logic")
    with pytest.raises(TaskError) as raised:
        task.sample(4, "odd")
    expected = "unknown split 'odd' for task 'fuzzy_logic'; valid splits: ['train', 'test', 'ood', 'unseen_terms']"
    assert str(raised.value) == expected
    with pytest.raises(TaskError, match="unknown variant 'mirrored' for task 'fuzzy_logic'; valid variants"):
        task.sample(4, "train", variant="mirrored")
    run = Path(__file__).resolve().parents[1] / "models" / "fuzzy_logic-hyla"
    if not run.is_dir():
        pytest.skip("shipped checkpoints missing")
    code = "import sys; from latentcode.cli import main; s = main(sys.argv[1:]); print('torch' in sys.modules); sys.exit(s)"
    for command in (["extract", str(run), "--split", "odd", "--out", str(tmp_path / "c.h5")],
                    ["intervene", str(run), "--split", "odd", "--zero-ablate", "all", "--out", str(tmp_path / "e")]):
        done = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.strip() == f"error: --split: {expected}", done.stderr
        assert done.stdout.strip() == "False"


@pytest.mark.parametrize("path, place", [("/proc/x/p", "/proc"), ("/proc/p", "/proc"), ("/sys/x/p", "/sys")])
@pytest.mark.parametrize("kind", ["file", "directory", "stem"])
def test_check_output_refuses_a_place_where_nothing_can_be_created(path, place, kind):
    """/proc and /sys pass the permission test as root, yet refuse every new entry: `latentcode patch
    --out /proc/x/p` used to pass the check and fail after the work."""
    if not Path(place).is_dir():
        pytest.skip(f"no {place} on this system")
    with pytest.raises(UsageError) as raised:
        check_output(path, "--out", kind=kind)
    assert str(raised.value).startswith(f"--out {path}: cannot write in {place} (creating anything there fails: ")
    assert "\n" not in str(raised.value)


def test_check_output_leaves_the_place_it_tried_as_it_was(tmp_path):
    (tmp_path / "mine.txt").write_text("mine")
    assert check_output(tmp_path / "new" / "out.h5", "--out") == tmp_path / "new" / "out.h5"
    assert check_output(tmp_path / "stem", "--out", kind="stem") == tmp_path / "stem"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine.txt"]


def test_a_stem_given_with_its_figures_suffix_is_the_stem_without_it(tmp_path):
    """`latentcode heatmap F --out heat.png` wrote heat.png.png."""
    from latentcode.validation import check_output_stem

    assert check_output_stem(tmp_path / "heat.png", (".png",), False) == tmp_path / "heat"
    assert check_output_stem(tmp_path / "probe.csv", (".csv", ".json", ".png"), False) == tmp_path / "probe"
    assert check_output_stem(tmp_path / "run.v2", (".png",), False) == tmp_path / "run.v2"  # not a suffix it writes
