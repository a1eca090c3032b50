"""Training on a disk that fills up (issue 34): at the lock's write, at an append to metrics.jsonl, or
at a checkpoint's safetensors, `latentcode train` ends with one line naming the file and "No space
left on device" (it used to end in an OSError or a SafetensorError traceback), leaves no torn metrics
line and no temporary checkpoint, and, once space is freed, `train --resume` finishes the run."""

import json
import os
import subprocess
import sys

import pytest

# KiB left free on a file system of 1 MiB, by a filler file (tmpfs counts whole 4 KiB pages). A tiny
# fuzzy-logic run writes its lock (a few hundred bytes), config.json (2 KiB), metrics.jsonl (2 KiB)
# and a checkpoint (180 KiB) every 12 steps: all of it needs about 600 KiB.
SIZE = 1024
FREE = {"lock": 0, "metrics": 10, "checkpoint": 20}


def train(*arguments, cwd):
    return subprocess.run([sys.executable, "-m", "latentcode.cli", "train", *arguments, "--quiet", "--threads", "1"],
                          capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture()
def small(tmp_path):
    directory = tmp_path / "small"
    directory.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}k", "tmpfs", str(directory)],
                                           capture_output=True).returncode:
        pytest.skip("needs mount (root, CAP_SYS_ADMIN) for a small file system")
    yield directory
    subprocess.run(["umount", str(directory)], check=True)


@pytest.mark.parametrize("where", FREE)
def test_a_full_disk_while_training_is_one_line_and_the_run_resumes(small, where):
    filler = small / "filler"
    filler.write_bytes(b"\0" * 1024 * (SIZE - FREE[where]))
    result = train("--preset", "fuzzy_logic", "--scale", "tiny", "--out", "run", cwd=small)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.startswith("error: cannot write ") and "No space left on device" in result.stderr
    run = small / "run"
    if where == "lock":
        assert "lock" in result.stderr and sorted(path.name for path in small.iterdir()) == ["filler"]
        return  # nothing was written: nothing to resume
    assert ("metrics.jsonl" if where == "metrics" else "safetensors") in result.stderr
    for line in (run / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # no torn line
    assert not list(run.glob("checkpoints/.tmp-*"))
    filler.unlink()
    resumed = train("--resume", "run", cwd=small)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == json.loads((run / "config.json").read_text())["steps"]


def test_a_resume_into_an_unwritable_checkpoints_directory_is_one_line_before_any_training(tmp_path):
    """It used to train to the next checkpoint and end in mkdtemp's PermissionError traceback."""
    import shutil

    from tests.test_cli_bad_inputs import immutable

    assert train("--preset", "fuzzy_logic", "--scale", "tiny", "--out", "run", cwd=tmp_path).returncode == 0
    run = tmp_path / "run"
    checkpoints = sorted((run / "checkpoints").iterdir())
    for path in (*checkpoints[1:], run / "model"):
        shutil.rmtree(path)
    (run / "summary.json").unlink()  # a run killed after its first checkpoint
    metrics = (run / "metrics.jsonl").read_bytes()
    with immutable(run / "checkpoints"):
        result = train("--resume", "run", cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.startswith("error: cannot write run/checkpoints: ")
    assert (run / "metrics.jsonl").read_bytes() == metrics  # nothing truncated or appended
    assert sorted((run / "checkpoints").iterdir()) == checkpoints[:1]
    assert train("--resume", "run", cwd=tmp_path).returncode == 0  # writable again: it finishes
    assert (run / "summary.json").is_file()
