"""The package's shape (issue 25): no module over 500 lines, and the stages import only the stages
to their left (shared/DESIGN.md), read from the source's import statements."""

import ast
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "latentcode"
MAX_LINES = 500
# Generated data, not code: none today. A file named here must say why.
GENERATED: set[str] = set()


def python_files(*roots: Path) -> list[Path]:
    return sorted(path for root in roots for path in root.rglob("*.py"))


@pytest.mark.parametrize("path", python_files(PACKAGE, REPOSITORY / "analyses"),
                         ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_no_module_is_over_500_lines(path):
    if str(path.relative_to(REPOSITORY)) in GENERATED:
        pytest.skip("generated data")
    n_lines = len(path.read_text().splitlines())
    assert n_lines <= MAX_LINES, f"{path.relative_to(REPOSITORY)} has {n_lines} lines; split it (one concept per file)"


def imported_stages(path: Path) -> set[str]:
    """The `latentcode` subpackages or modules `path` imports at module level (not inside functions,
    where an import is deliberately lazy)."""
    stages = set()
    for node in ast.parse(path.read_text()).body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "latentcode" and len(parts) > 1:
                stages.add(parts[1])
    return stages


# Each stage and what it may import at module level (DESIGN.md: a stage imports only the stages to
# its left; errors, files, safe_reads, lazy, progress and validation are shared helpers of every stage).
SHARED = {"errors", "files", "lazy", "progress", "safe_reads", "validation"}
ALLOWED = {
    "tasks": set(),
    "models": set(),
    "store": set(),
    "rundir": set(),
    "training": {"tasks", "models", "rundir"},
    "sources": {"tasks", "models", "store"},
    "extraction": {"tasks", "models", "store", "rundir", "provenance", "sources"},
    "intervention": {"tasks", "models", "store", "rundir", "provenance", "sources", "extraction", "training"},
    "analysis": {"store", "rundir", "provenance"},
}


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_a_stage_imports_only_the_stages_to_its_left(stage):
    root = PACKAGE / stage
    files = python_files(root) if root.is_dir() else [root.with_suffix(".py")]
    wrong = {}
    for path in files:
        extra = imported_stages(path) - ALLOWED[stage] - SHARED - {stage}
        if extra:
            wrong[str(path.relative_to(REPOSITORY))] = sorted(extra)
    assert not wrong, f"module-level imports against the pipeline's direction: {wrong}"
