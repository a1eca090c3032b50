import json
import subprocess
import sys

import pytest

from latentcode.cli import main
from latentcode.training.sweeps import best_runs, expand_grid, sweep


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
        (["train", "--preset", "mnist"], "error: unknown preset 'mnist'; valid presets: fuzzy_logic, language, sraven"),
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
