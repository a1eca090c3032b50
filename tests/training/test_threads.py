"""Threads of training processes: each of several jobs gets its share of the cores, and `train` uses
the cores left free, and says so in one line, when other processes already keep the cores busy."""

import subprocess
import sys
import time

import pytest
import torch

from latentcode.cli import main
from latentcode.training import sweeps, threads
from latentcode.training.presets import build_train_config
from latentcode.training.threads import (
    contention_note,
    thread_environment,
    threads_per_job,
    threads_that_fit,
)


@pytest.mark.parametrize("jobs, cores, expected", [(1, 2, 2), (2, 2, 1), (3, 2, 1), (2, 16, 8), (3, 16, 5)])
def test_threads_per_job_share_the_cores(jobs, cores, expected):
    assert threads_per_job(jobs, cores) == expected


def test_thread_environment_sets_the_share_unless_the_user_chose():
    environment = thread_environment(2, {"PATH": "/bin"})
    share = str(threads_per_job(2))
    assert environment == {"PATH": "/bin", "OMP_NUM_THREADS": share, "MKL_NUM_THREADS": share}
    assert thread_environment(2, {"OMP_NUM_THREADS": "3"}) == {"OMP_NUM_THREADS": "3"}


@pytest.mark.parametrize("threads, busy_cores, cores, expected", [
    (2, 1.0, 2, 1),     # another job on one of 2 cores: one thread
    (2, 1.9, 2, 1),     # both cores busy: still one thread, never none
    (2, 0.2, 2, None),  # background noise: torch's count stays
    (1, 2.0, 2, None),  # one thread cannot oversubscribe
    (8, 2.0, 16, None),
    (16, 2.0, 16, 14),
    (16, 0.7, 16, 15),  # the count shrinks whenever the default would not fit
])
def test_threads_that_fit_are_the_cores_left_free(threads, busy_cores, cores, expected):
    assert threads_that_fit(threads, busy_cores, cores) == expected


def test_contention_note_is_one_line_that_says_what_was_chosen():
    note = contention_note(threads=2, chosen=1, busy_cores=1.0, cores=2)
    assert "\n" not in note and "1.0 of this machine's 2 cores" in note
    assert "uses 1 thread instead of 2" in note and "--threads N" in note


def test_busy_cores_elsewhere_sees_a_spinning_process():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert threads.busy_cores_elsewhere(interval=0.5) >= 0.5
    finally:
        spinner.kill()
        spinner.wait()


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_train_threads_sets_this_process_threads(tmp_path, restore_threads, capsys):
    torch.set_num_threads(2)
    code = main(["train", "--preset", "fuzzy_logic", "--scale", "tiny", "--attention", "linear", "--threads", "1",
                 "--out", str(tmp_path / "run"), "--quiet", "--set", "n_layers=1", "--set", "d_model=32"])
    assert code == 0 and torch.get_num_threads() == 1
    assert "note:" not in capsys.readouterr().err


def test_train_uses_fewer_threads_and_says_so_when_other_processes_keep_the_cores_busy(tmp_path, restore_threads, monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: 1.0)
    torch.set_num_threads(2)
    arguments = ["train", "--preset", "fuzzy_logic", "--scale", "tiny", "--attention", "linear", "--quiet",
                 "--set", "n_layers=1", "--set", "d_model=32"]
    assert main([*arguments, "--out", str(tmp_path / "busy")]) == 0
    assert "uses 1 thread instead of 2" in capsys.readouterr().err and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: 0.1)
    assert main([*arguments, "--out", str(tmp_path / "idle")]) == 0
    assert "note:" not in capsys.readouterr().err
    # A run refused before its first step prints its one-line error and no note.
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: 1.0)
    assert main(["train", "--resume", str(tmp_path / "busy"), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error:") and "has already finished" in error and "note:" not in error


def test_train_threads_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "--preset", "fuzzy_logic", "--threads", "0"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "argument --threads: expected a positive integer, got '0'" in error and "Traceback" not in error


def test_sweep_processes_get_their_share_of_the_cores(tmp_path, monkeypatch):
    started = []

    class FinishedProcess:
        returncode = 0

        def __init__(self, command, env, **_):
            started.append(env)

        def poll(self):
            return 0

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(sweeps.subprocess, "Popen", FinishedProcess)
    config = build_train_config("fuzzy_logic", "tiny", "linear")
    pending = [(name, {}, config, sweeps.RunDirectory(tmp_path / name)) for name in ("a", "b")]
    sweeps._run_in_processes(pending, jobs=2, progress=False)
    assert [env["OMP_NUM_THREADS"] for env in started] == [str(threads_per_job(2))] * 2
