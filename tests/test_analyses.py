"""Every script under analyses/ runs end to end at a tiny scale and writes its table and figure.

The end-to-end runs train their own tiny models in a fresh interpreter and are slow; the default
run checks every script's command line and runs the scripts that read finished runs on the
shipped HYLA checkpoints, in this process.
"""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import latentcode
from latentcode.training import build_train_config

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
MODELS = Path(__file__).resolve().parents[1] / "models"
# The scripts of one paper result each (reproduce.py orchestrates the results page: tested below).
SCRIPTS = sorted(path.name for path in ANALYSES.glob("*.py") if path.name not in ("common.py", "reproduce.py"))
SMALL = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "d_mlp=32"]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Finished tiny runs DIR/<task>-<attention>, the layout --runs-from reads."""
    folder = tmp_path_factory.mktemp("runs")
    for task in ("fuzzy_logic", "sraven"):
        for attention in ("softmax", "linear", "hyla"):
            config = build_train_config(task, "tiny", attention, n_layers=2, d_model=32, d_mlp=32)
            latentcode.train(config, folder / f"{task}-{attention}", progress=False)
    return folder


def run_script(name, *args):
    result = subprocess.run([sys.executable, str(ANALYSES / name), "--quiet", "--n-codes", "160", *args],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_fuzzy_ood_r2_grid(tmp_path):
    out = run_script("fuzzy_ood_r2_grid.py", "--scale", "tiny", *SMALL, "--seq-lens", "16", "--fracs", "0.3", "0.5",
                     "--attention", "softmax", "hyla", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "ood_r2.json").read_text())
    assert {(r["attention"], r["frac_test"]) for r in rows} == {(a, f) for a in ("softmax", "hyla") for f in (0.3, 0.5)}
    assert all(r["status"] == "finished" and r["ood.r2"] is not None for r in rows)
    assert (tmp_path / "ood_r2.png").stat().st_size > 0 and "wrote" in out


@pytest.mark.slow
def test_heads_ablation(tmp_path):
    run_script("heads_ablation.py", "--task", "fuzzy_logic", "--scale", "tiny", *SMALL, "--heads", "1", "8",
               "--attention", "hyla", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "heads_ablation.json").read_text())
    assert sorted(r["n_heads"] for r in rows) == [1, 8] and (tmp_path / "heads_ablation.png").is_file()


@pytest.mark.slow
def test_fuzzy_term_decoding(tiny_runs, tmp_path):
    run_script("fuzzy_term_decoding.py", "--runs-from", str(tiny_runs), "--out", str(tmp_path))
    rows = json.loads((tmp_path / "term_decoding.json").read_text())
    assert {r["model"] for r in rows} == {"softmax", "linear", "hyla"}
    assert any(r["metric"] == "mean_f1" for r in rows) and (tmp_path / "term_decoding.png").is_file()
    assert (tmp_path / "negation_bits_r2.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["sraven_rule_decoding.py", "sraven_rule_heatmap.py", "latent_tsne.py"])
def test_sraven_scripts(tiny_runs, tmp_path, script):
    extra = ["--max-points", "80"] if script == "latent_tsne.py" else []
    runs_before = sorted(tiny_runs.rglob("*"))
    run_script(script, "--runs-from", str(tiny_runs), "--out", str(tmp_path), *extra)
    assert sorted(tiny_runs.rglob("*")) == runs_before, "the runs read (e.g. shipped models/) gained files"
    written = {path.name for path in tmp_path.iterdir()}
    expected = {"sraven_rule_decoding.py": {"rule_decoding.csv", "rule_decoding.png"},
                "sraven_rule_heatmap.py": {"hyla_rule_similarity.png", "hyla_rule_similarity.json",
                                           "rule_similarity.png", "rule_similarity_centred.png"},
                "latent_tsne.py": {"softmax_tsne.png", "linear_tsne.png", "hyla_tsne.png"}}[script]
    assert expected <= written


def run_in_process(monkeypatch, name, *args):
    """Run analyses/<name> as `python analyses/<name> --quiet ARGS` would, in this process."""
    monkeypatch.syspath_prepend(str(ANALYSES))  # where the scripts find `common`
    monkeypatch.setattr(sys, "argv", [name, "--quiet", *args])
    try:
        runpy.run_path(str(ANALYSES / name), run_name="__main__")
    finally:
        sys.modules.pop("common", None)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_has_a_command_line(monkeypatch, capsys, script):
    with pytest.raises(SystemExit) as exited:
        run_in_process(monkeypatch, script, "--help")
    assert exited.value.code == 0 and "--runs-from" in capsys.readouterr().out


@pytest.mark.parametrize("script, expected", [
    ("sraven_rule_decoding.py", {"rule_decoding.csv", "rule_decoding.png"}),
    ("sraven_rule_heatmap.py", {"hyla_rule_similarity.png", "hyla_rule_similarity.json"}),
    ("latent_tsne.py", {"hyla_tsne.png"}),
    ("fuzzy_term_decoding.py", {"term_decoding.json", "term_decoding.png", "negation_bits_r2.csv"}),
])
def test_scripts_read_the_shipped_checkpoints(tmp_path, monkeypatch, script, expected):
    shipped_before = sorted(MODELS.rglob("*"))
    extra = ["--max-points", "60"] if script == "latent_tsne.py" else []
    run_in_process(monkeypatch, script, "--runs-from", str(MODELS), "--attention", "hyla", "--n-codes", "96",
                   "--out", str(tmp_path), *extra)
    assert sorted(MODELS.rglob("*")) == shipped_before, "the shipped models/ gained or lost files"
    assert expected <= {path.name for path in tmp_path.iterdir()}
    if script == "fuzzy_term_decoding.py":
        rows = json.loads((tmp_path / "term_decoding.json").read_text())
        assert {row["model"] for row in rows} == {"hyla"}


def test_runs_from_a_directory_without_runs_says_so(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="no finished run at"):
        run_in_process(monkeypatch, "sraven_rule_decoding.py", "--runs-from", str(tmp_path))


def test_the_results_page_is_regenerated_from_the_recorded_runs(tmp_path, monkeypatch, capsys):
    """RESULTS.md's Table A1 quotes the recorded runs: the seed-0 rows are the shipped fuzzy-logic models."""
    monkeypatch.syspath_prepend(str(ANALYSES))
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "page", "--page", str(tmp_path / "RESULTS.md")])
    runpy.run_path(str(ANALYSES / "reproduce.py"), run_name="__main__")
    capsys.readouterr()
    page = (tmp_path / "RESULTS.md").read_text()
    assert (tmp_path / "results" / "figures" / "fig2c_ood_r2_vs_held_out.png").is_file()
    for attention in ("softmax", "linear", "hyla"):
        shipped = json.loads((MODELS / f"fuzzy_logic-{attention}" / "summary.json").read_text())
        assert f"{100 * shipped['final_metrics']['ood']['r2']:.2f}" in page
    monkeypatch.setattr(sys, "argv", ["reproduce.py", "plan"])
    runpy.run_path(str(ANALYSES / "reproduce.py"), run_name="__main__")
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 9 + 6 + 8 and all(line.startswith("latentcode train --preset fuzzy_logic") for line in commands)
