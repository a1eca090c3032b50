"""One training process per run directory: `train` and `--resume` hold the run's lock."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from latentcode.cli import main
from latentcode.files import LockHeld
from latentcode.rundir import RunDirectory
from latentcode.training import RunDirectoryError, train

REPOSITORY = Path(__file__).resolve().parents[2]
ENVIRONMENT = {**os.environ, "PYTHONPATH": str(REPOSITORY), "OMP_NUM_THREADS": "1"}


def hold_lock(path: Path, new: bool) -> subprocess.Popen:
    """Another process holding the run's lock (light: imports no torch)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from latentcode.rundir import RunDirectory; "
         f"lock = RunDirectory(sys.argv[1]).lock(new={new}).acquire(); print('held', flush=True); time.sleep(600)",
         str(path)],
        stdout=subprocess.PIPE, text=True, env=ENVIRONMENT,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def release(holder: subprocess.Popen) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)


def test_a_run_directory_in_use_is_refused_for_train_and_resume(tmp_path, small_config, capsys):
    config = small_config(checkpoint_every=2, log_every=1)
    path = tmp_path / "run"
    holder = hold_lock(path, new=True)
    try:
        with pytest.raises(LockHeld, match=rf"{path} is being written by pid {holder.pid} on .* since .*\(training\)"):
            train(config, path, progress=False)
    finally:
        release(holder)
    assert not path.exists(), "the refused run wrote nothing"

    train(config, path, progress=False, stop_after_step=3)  # the lock died with its holder
    metrics = (path / "metrics.jsonl").read_bytes()
    holder = hold_lock(path, new=False)
    try:
        with pytest.raises(LockHeld, match=rf"pid {holder.pid} "):
            train(resume=path, progress=False)
        assert main(["train", "--resume", str(path), "--quiet"]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"error: {path} is being written by pid {holder.pid}") and error.count("\n") == 1
    finally:
        release(holder)
    assert (path / "metrics.jsonl").read_bytes() == metrics and not (path / "summary.json").exists()
    assert train(resume=path, progress=False).summary["resumed_from_step"] == 2
    assert not (tmp_path / ".run.lock").exists()


def test_resuming_a_missing_directory_names_it(tmp_path):
    with pytest.raises(RunDirectoryError, match=r"missing is not a latentcode run directory \(it does not exist\)"):
        train(resume=tmp_path / "missing", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_the_lock_of_a_directory_does_not_depend_on_how_it_is_spelt(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run")
    with RunDirectory(tmp_path / "run").lock():
        for spelling in (tmp_path / "link", tmp_path / "run" / ".." / "run", Path(os.path.relpath(tmp_path / "run"))):
            with pytest.raises(LockHeld):
                RunDirectory(spelling).lock().acquire()


@pytest.mark.slow
def test_two_train_processes_started_together_make_one_run(tmp_path, small_config):
    """The issue's race: two `latentcode train` into one directory used to train into the same run."""
    config_file = tmp_path / "config.json"
    config = small_config(n_train_instances=40 * 128, log_every=1)
    config_file.write_text(config.to_json())
    command = [sys.executable, "-m", "latentcode.cli", "train", "--config", str(config_file), "--quiet",
               "--out", str(tmp_path / "run")]
    processes = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENVIRONMENT) for _ in range(2)]
    results = sorted((process.wait(timeout=600), process.stderr.read()) for process in processes)
    assert [code for code, _ in results] == [0, 2], results
    assert "is being written by pid" in results[1][1] or "already holds this run" in results[1][1]
    steps = [record["step"] for record in RunDirectory(tmp_path / "run").read_metrics() if record["event"] == "train"]
    assert steps == list(range(1, config.steps + 1)), "every step once"
