"""The Python snippets of README.md and of the documentation pages in `PAGES` run as written, one
after the other in one namespace, as a reader pastes them into a session (tasks return numpy, models
need tensors), and run again in the same directory without an error and without losing what the first
run wrote. The snippet marked ``<!-- transformer-lens 3.x -->`` needs transformer-lens 3.x: it runs
where that is importable (`.ci/run` installs it beside the 4.x of the environment)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The pages whose snippets continue the README's, in the order a reader meets them (each uses names
# the ones before define: `model`, `batch`, `task`).
PAGES = [README] + [ROOT / "docs" / page for page in (
    "concepts/latent-codes.md", "concepts/tasks.md", "concepts/sources.md", "how-to/intervene.md", "how-to/patch.md")]
TRANSFORMER_LENS_3 = "<!-- transformer-lens 3.x -->"


def marked_snippets() -> list[tuple[str, str]]:
    """``(marker, code)`` of every python block; the marker is the HTML comment on the line before it."""
    return [snippet for page in PAGES
            for snippet in re.findall(r"(<!-- [^\n]* -->\n)?```python\n(.*?)```", page.read_text(), flags=re.DOTALL)]


def python_snippets() -> list[str]:
    """The snippets for the environment as installed (transformer-lens 4.x)."""
    return [code for marker, code in marked_snippets() if marker.strip() != TRANSFORMER_LENS_3]


def transformer_lens_3_snippets() -> list[str]:
    return [code for marker, code in marked_snippets() if marker.strip() == TRANSFORMER_LENS_3]


def trains(snippet: str) -> bool:
    return "latentcode.train(" in snippet


def run_in_order(snippets: list[str], folder: Path, monkeypatch) -> dict:
    monkeypatch.chdir(folder)  # the snippets write runs/ and my-model/ where they run
    namespace: dict = {}
    for index, snippet in enumerate(snippets):
        exec(compile(snippet, f"README.md python snippet {index + 1}", "exec"), namespace)
    return namespace


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 150, "the README says what it is and points into docs/"
    for marker in ("<!-- main-command -->\n```bash\n", "<!-- test-command -->\n```bash\n"):
        assert marker in text, f".ci/run and the CI read the command after {marker.splitlines()[0]}"
    assert 'pip install -e ".[docs]"' in text and "mkdocs build --strict" in text, "the docs build command"


def test_the_readme_links_to_pages_that_exist():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    assert targets, "the README links into docs/"
    assert [target for target in targets if not (ROOT / target).exists()] == []


def test_the_readme_has_the_snippets_this_test_expects():
    snippets = python_snippets()
    assert len(snippets) >= 4 and sum(map(trains, snippets)) == 1, "update this test with the README"
    assert len(transformer_lens_3_snippets()) == 1 and "HookedTransformer(" in transformer_lens_3_snippets()[0]
    assert any("TransformerBridge.boot_native(" in snippet for snippet in snippets), "the offline 4.x recipe"


def test_the_snippets_without_training_run_as_written_twice(tmp_path, monkeypatch):
    if not hasattr(pytest.importorskip("transformer_lens"), "TransformerBridge"):
        pytest.skip("the README's TransformerBridge recipe needs transformer-lens 4.x")
    snippets = [snippet for snippet in python_snippets() if not trains(snippet)]
    for _ in range(2):  # a reader runs them again where they ran: nothing refuses, nothing is lost
        namespace = run_in_order(snippets, tmp_path, monkeypatch)
        batch, logits, codes = namespace["batch"], namespace["logits"], namespace["codes"]
        assert tuple(logits.shape) == (128, 36, 8) and batch.x.shape == (128, 36, 8)
        assert type(batch.x).__module__ == "numpy", "tasks hand out numpy; batch.torch() converts"
        # "last-self" on the 4-layer model: one site per layer, the last token to itself, 16 heads.
        assert sorted((site.layer, site.query, site.key) for site in codes) == [(layer, 35, 35) for layer in range(4)]
        assert all(tuple(value.shape) == (128, 16) for value in codes.values())
        assert (tmp_path / "my-model").is_dir()
        # the bridge of 2 layers and 4 heads, 7 tokens: the last token to itself in each layer
        bridge_codes = namespace["bridge_codes"]
        assert sorted((site.layer, site.query, site.key) for site in bridge_codes) == [(0, 6, 6), (1, 6, 6)]
        assert all(tuple(value.shape) == (2, 4) for value in bridge_codes.values())


def test_the_transformer_lens_3_recipe_runs_as_written(tmp_path, monkeypatch):
    transformer_lens = pytest.importorskip("transformer_lens")
    try:
        transformer_lens.HookedTransformer  # noqa: B018 (4.x raises on access)
    except (AttributeError, ImportError):
        pytest.skip("transformer-lens 3.x is not importable here (.ci/run installs it for this test)")
    namespace = run_in_order(transformer_lens_3_snippets(), tmp_path, monkeypatch)
    hooked_codes = namespace["hooked_codes"]
    assert sorted((site.layer, site.query, site.key) for site in hooked_codes) == [(0, 6, 6), (1, 6, 6)]
    assert all(tuple(value.shape) == (2, 4) for value in hooked_codes.values())


@pytest.mark.slow
def test_every_snippet_runs_as_written_training_included_twice(tmp_path, monkeypatch):
    runs = []
    for _ in range(2):  # the second time into a fresh run directory, the first one kept
        namespace = run_in_order(python_snippets(), tmp_path, monkeypatch)
        run_dir, table = namespace["run"].path, namespace["table"]
        runs.append(run_dir.resolve())
        # one row per layer of the model the snippet trained (the tiny scale builds a small one)
        trained = json.loads((run_dir / "config.json").read_text())["resolved_model_config"]
        assert set(table["metric"]) >= {"accuracy"} and set(table["layer"]) == set(range(trained["n_layers"]))
        assert (run_dir / "codes" / "sraven-rule.h5").is_file() and (run_dir / "summary.json").is_file()
    assert runs == [tmp_path / "runs" / "sraven-hyla-tiny", tmp_path / "runs" / "sraven-hyla-tiny-1"]
    assert all((run / "summary.json").is_file() for run in runs), "the first run is still there"
