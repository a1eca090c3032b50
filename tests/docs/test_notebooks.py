"""The tutorial notebooks are committed without outputs: the site's build executes them (mkdocs.yml,
mkdocs-jupyter `execute`), so what a page shows was computed by the build, never pasted by hand. Each is
also in the site's navigation."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.ipynb"))


def test_the_tutorials_are_committed_without_outputs():
    assert len(TUTORIALS) >= 5
    for path in TUTORIALS:
        cells = json.loads(path.read_text())["cells"]
        code = [cell for cell in cells if cell["cell_type"] == "code"]
        assert code, f"{path.name} has no code to execute"
        dirty = [index for index, cell in enumerate(code) if cell.get("outputs") or cell.get("execution_count")]
        assert dirty == [], f"{path.name}: code cells {dirty} carry outputs; strip them (the build executes them)"


def test_every_tutorial_is_in_the_navigation():
    navigation = (ROOT / "mkdocs.yml").read_text()
    assert [path.name for path in TUTORIALS if f"tutorials/{path.name}" not in navigation] == []
