import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from latentcode.cli import main
from latentcode.training.presets import presets
from latentcode.training.sweeps import Job, best_runs, expand_grid, run_jobs, sweep


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "latentcode.cli", *args], capture_output=True, text=True)


def test_train_help_shows_the_presets():
    result = run_cli("train", "--help")
    assert result.returncode == 0
    assert "fuzzy_logic:" in result.stdout and "sraven:" in result.stdout and "paper grid" in result.stdout
    assert "--resume" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--preset", "mnist"], f"error: unknown preset 'mnist'; valid presets: {', '.join(presets())}"),
        (["train", "--preset", "sraven", "--attention", "nope"], "error: unknown attention preset 'nope'"),
        (["train", "--preset", "sraven", "--n-heads", "5"], "error: kqv_dim=64 is not divisible by n_heads=5"),
        (["train"], "error: latentcode train needs --preset"),
        (["train", "--resume", "/nonexistent/run"], "is not a latentcode run directory"),
        (["sweep", "--preset", "sraven", "--out", "x", "--grid", "lr"], "--grid expects FIELD=V1,V2,..."),
    ],
)
def test_cli_errors_are_one_clear_line(args, message, capsys):
    assert main(args) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_cli_train_prints_the_final_metrics(tmp_path, capsys):
    code = main(["train", "--preset", "fuzzy_logic", "--scale", "tiny", "--attention", "linear", "--out",
                 str(tmp_path / "run"), "--quiet", "--set", "n_layers=1", "--set", "d_model=32"])
    assert code == 0
    out = capsys.readouterr().out
    assert "run finished" in out and "ood" in out and "r2" in out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["model"]["n_layers"] == 1


def test_sweep_runs_the_grid_and_writes_a_table(tmp_path):
    rows = sweep("fuzzy_logic", "tiny", {"attention": ["softmax", "hyla"], "n_layers": [1], "d_model": [32]},
                 tmp_path / "sweep", seeds=[0], progress=False)
    assert [row["attention"] for row in rows] == ["softmax", "hyla"]
    assert all(row["status"] == "finished" and "ood.r2" in row and "test.r2" in row for row in rows)
    assert (tmp_path / "sweep" / "results.csv").read_text().count("\n") == 3
    best = json.loads((tmp_path / "sweep" / "best.json").read_text())
    assert set(best["best"]) == {"softmax", "hyla"} and "never OOD" in best["selected_on"]
    # A second call finds every run finished and trains nothing.
    again = sweep("fuzzy_logic", "tiny", {"attention": ["softmax", "hyla"], "n_layers": [1], "d_model": [32]},
                  tmp_path / "sweep", seeds=[0], progress=False)
    assert again == rows


def test_best_is_chosen_on_the_in_distribution_split_never_ood():
    rows = [
        {"attention": "hyla", "status": "finished", "learning_rate": 1e-3, "test.r2": 0.9, "ood.r2": 0.1},
        {"attention": "hyla", "status": "finished", "learning_rate": 3e-3, "test.r2": 0.8, "ood.r2": 0.9},
        {"attention": "hyla", "status": "diverged", "learning_rate": 1e-2},
    ]
    assert best_runs(rows, "fuzzy_logic")["hyla"]["learning_rate"] == 1e-3


def test_grid_expansion():
    points = expand_grid({"attention": ["a", "b"], "learning_rate": [1, 2]}, seeds=[0, 1])
    assert len(points) == 8 and points[0] == {"attention": "a", "learning_rate": 1, "seed": 0}


def test_sweep_results_are_written_as_a_set_never_through_a_planted_link(tmp_path):
    """results.csv, results.json and best.json were opened in place: a link planted at one of them
    got the table written into its target (issue 23)."""
    from latentcode.files import UnsafePath
    from latentcode.training.sweeps import write_results

    rows = [{"run": "a", "attention": "hyla", "seed": 0, "validation.r2": 0.5}]
    victim = tmp_path / "victim.txt"
    victim.write_text("another user's file\n")
    (tmp_path / "best.json").symlink_to(victim)
    with pytest.raises(UnsafePath, match="best.json is a symbolic link"):
        write_results(tmp_path, rows, "fuzzy_logic")
    assert victim.read_text() == "another user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "victim.txt"]
    (tmp_path / "best.json").unlink()
    write_results(tmp_path, rows, "fuzzy_logic")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "results.csv", "results.json", "victim.txt"]
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == "run,attention,seed,validation.r2"


def open_paths() -> set[str]:
    """What this process's file descriptors point to."""
    paths = set()
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            paths.add(os.readlink(f"/proc/self/fd/{descriptor}"))
        except OSError:  # the descriptor of the listing itself, closed by now
            pass
    return paths


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads open descriptors from /proc")


@needs_proc
def test_run_jobs_closes_each_log_when_its_process_ends(tmp_path):
    """The sweep scheduler opened a log per run and never closed it: one descriptor leaked per run."""
    jobs = [Job("ok", [sys.executable, "-c", "print('hello')"], log=tmp_path / "ok.log"),
            Job("failed", [sys.executable, "-c", "import sys; print('bye'); sys.exit(3)"], log=tmp_path / "failed.log"),
            Job("third", [sys.executable, "-c", "print('third')"], log=tmp_path / "third.log")]
    still_open_when_finished = []

    def finished(job, returncode):
        still_open_when_finished.extend(str(job.log) for path in open_paths() if path == str(job.log))

    before = open_paths()
    returncodes = run_jobs(jobs, 2, os.environ, on_finish=finished, poll_seconds=0.01)
    assert returncodes == {"ok": 0, "failed": 3, "third": 0}
    assert still_open_when_finished == []
    assert open_paths() == before
    assert [(tmp_path / f"{name}.log").read_text() for name in ("ok", "failed", "third")] == ["hello\n", "bye\n", "third\n"]


@needs_proc
def test_run_jobs_closes_the_logs_when_a_job_cannot_start(tmp_path):
    jobs = [Job("running", [sys.executable, "-c", "import time; time.sleep(0.3)"], log=tmp_path / "running.log"),
            Job("missing", [str(tmp_path / "no-such-program")], log=tmp_path / "missing.log")]
    with pytest.raises(FileNotFoundError) as raised:
        run_jobs(jobs, 2, os.environ, poll_seconds=0.01)
    # `raised` keeps the scheduler's frame alive: an unclosed file object in it keeps its descriptor
    assert raised.traceback and not {str(tmp_path / "running.log"), str(tmp_path / "missing.log")} & open_paths()


def test_run_jobs_draws_the_next_job_only_when_a_slot_is_free(tmp_path):
    """A generator of jobs decides what to run when a slot frees (reproduce.py skips runs another
    process has started meanwhile): with one slot, the second job is drawn after the first ended."""
    events = []

    def jobs():
        for name in ("first", "second"):
            events.append(f"draw {name}")
            yield Job(name, [sys.executable, "-c", "pass"])

    run_jobs(jobs(), 1, os.environ, on_finish=lambda job, code: events.append(f"end {job.name}"), poll_seconds=0.01)
    assert events == ["draw first", "end first", "draw second", "end second"]
