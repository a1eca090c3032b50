"""A non-editable install (`pip install --target`, no source tree beside it) finds the shipped
checkpoints and runs the demo from them (issue 11: after `pip install .` the demo trained instead)."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".ruff_cache", "runs", "latentcode-demo*", "analyses", "benchmarks")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package installed from a copy of the repository into a bare target directory."""
    root = tmp_path_factory.mktemp("install")
    source, target = root / "source", root / "target"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, text=True)
    shutil.rmtree(source)  # nothing of the source tree is left to find
    return target


def run_installed(target: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # Only the target on the path: the dependencies come from this interpreter's site-packages.
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("LATENTCODE_MODELS", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env)


@pytest.mark.slow
def test_an_installed_package_finds_its_shipped_checkpoints(installed, tmp_path):
    script = ("import latentcode, latentcode.shipped as shipped\n"
              "print(latentcode.__file__)\n"
              "for task in ('fuzzy_logic', 'sraven'):\n"
              "    for attention in shipped.SHIPPED_ATTENTIONS:\n"
              "        print(shipped.shipped_run(task, attention))\n")
    result = run_installed(installed, "-c", script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    module, *runs = map(Path, result.stdout.split())
    assert module == installed / "latentcode" / "__init__.py"
    assert len(runs) == 6 and all(run.parent == installed / "latentcode" / "shipped_models" for run in runs)
    for run in runs:  # the very checkpoints of the repository, with their cards and metrics
        for name in ("model/model.safetensors", "model/config.json", "config.json", "summary.json", "README.md"):
            assert sha256(run / name) == sha256(ROOT / "models" / run.name / name)

    help_text = run_installed(installed, "-m", "latentcode.cli", "demo", "--help", cwd=tmp_path)
    assert help_text.returncode == 0 and "--models DIR" in help_text.stdout
    script_help = subprocess.run([str(installed / "bin" / "latentcode"), "demo", "--help"], capture_output=True,
                                 text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(installed)})
    assert script_help.returncode == 0 and "--models DIR" in script_help.stdout


@pytest.mark.slow
def test_the_installed_demo_runs_from_the_shipped_checkpoints(installed, tmp_path):
    result = run_installed(installed, "-m", "latentcode.cli", "demo", "--n-codes", "96", "--quiet", "--out",
                           str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "report:" in result.stdout and (tmp_path / "demo" / "report.html").is_file()
    for attention in ("softmax", "linear", "hyla"):  # copied from the installed checkpoints, not trained
        copied = tmp_path / "demo" / "runs" / attention
        assert sha256(copied / "model" / "model.safetensors") == sha256(
            ROOT / "models" / f"fuzzy_logic-{attention}" / "model" / "model.safetensors")
        assert not (copied / "checkpoints").exists()
