"""examples/codes_in_memory.ipynb runs as written: its code cells, in order, in one namespace (no
Jupyter needed; tests/analysis/test_viewer_notebook.py executes the viewer's notebook in a kernel)."""

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "codes_in_memory.ipynb"


@pytest.mark.slow
def test_the_codes_in_memory_notebook_runs_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = [cell for cell in json.loads(NOTEBOOK.read_text())["cells"] if cell["cell_type"] == "code"]
    namespace: dict = {}
    for index, cell in enumerate(cells):
        exec(compile("".join(cell["source"]), f"{NOTEBOOK.name} cell {index + 1}", "exec"), namespace)
    import latentcode

    assert isinstance(namespace["codes"], latentcode.InMemoryCodes) and namespace["codes"].splits == ["train", "ood"]
    assert len(namespace["table"]) > 0
    assert list(tmp_path.iterdir()) == [], "nothing written"
