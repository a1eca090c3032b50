"""The Python snippets of README.md run as written, one after the other in one namespace, as a
reader pastes them into a session (issue 11: tasks return numpy, models need tensors)."""

import json
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def trains(snippet: str) -> bool:
    return "latentcode.train(" in snippet


def run_in_order(snippets: list[str], folder: Path, monkeypatch) -> dict:
    monkeypatch.chdir(folder)  # the snippets write runs/, codes.h5 and my-model/ where they run
    namespace: dict = {}
    for index, snippet in enumerate(snippets):
        exec(compile(snippet, f"README.md python snippet {index + 1}", "exec"), namespace)
    return namespace


def test_the_readme_has_the_snippets_this_test_expects():
    snippets = python_snippets()
    assert len(snippets) >= 4 and sum(map(trains, snippets)) == 1, "update this test with the README"


def test_the_snippets_without_training_run_as_written(tmp_path, monkeypatch):
    namespace = run_in_order([snippet for snippet in python_snippets() if not trains(snippet)], tmp_path, monkeypatch)
    batch, logits, codes = namespace["batch"], namespace["logits"], namespace["codes"]
    assert tuple(logits.shape) == (128, 36, 8) and batch.x.shape == (128, 36, 8)
    assert type(batch.x).__module__ == "numpy", "tasks hand out numpy; batch.torch() converts"
    # "last-self" on the 4-layer model: one site per layer, the last token to itself, 16 heads.
    assert sorted((site.layer, site.query, site.key) for site in codes) == [(layer, 35, 35) for layer in range(4)]
    assert all(tuple(value.shape) == (128, 16) for value in codes.values())
    assert (tmp_path / "my-model").is_dir()


@pytest.mark.slow
def test_every_snippet_runs_as_written_training_included(tmp_path, monkeypatch):
    namespace = run_in_order(python_snippets(), tmp_path, monkeypatch)
    table = namespace["table"]
    # one row per layer of the model the snippet trained (the tiny scale builds a small one)
    trained = json.loads((tmp_path / "runs" / "sraven-hyla-tiny" / "config.json").read_text())["resolved_model_config"]
    assert set(table["metric"]) >= {"accuracy"} and set(table["layer"]) == set(range(trained["n_layers"]))
    assert (tmp_path / "codes.h5").is_file() and (tmp_path / "runs" / "sraven-hyla-tiny" / "summary.json").is_file()
