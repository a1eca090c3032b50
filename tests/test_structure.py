"""The package's shape (issues 25, 33 and 47): no function over ruff's complexity limits; every stage imports only the stages
to its left (shared/DESIGN.md), at module level and inside functions alike; and `analyses/` and
`examples/` use only the public API. All read from the source's import statements."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "latentcode"


def python_files(*roots: Path) -> list[Path]:
    return sorted(path for root in roots for path in ([root] if root.is_file() else root.rglob("*.py")))


COMPLEXITY_RULES = ("C901", "PLR0912", "PLR0915")  # limits in pyproject.toml: complexity 15, branches 15, statements 60
LINE_RULES = ("E501",)  # lines of at most 120 characters (line-length in pyproject.toml)
CHECKED = (PACKAGE, REPOSITORY / "analyses", REPOSITORY / "examples")


def ruff_findings(rules: tuple[str, ...], *paths: Path) -> list[str]:
    """ruff's findings of `rules` in `paths`, with the limits pyproject.toml sets, one line each."""
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                             "--select", ",".join(rules), *map(str, paths)],
                            cwd=REPOSITORY, capture_output=True, text=True, check=False)
    if result.returncode not in (0, 1):
        raise RuntimeError(f"ruff failed: {result.stderr}")
    return [line for line in result.stdout.splitlines() if any(rule in line for rule in rules)]


def test_no_function_is_too_complex():
    """One function, one idea: no function of the package, the analyses or the examples over the limits
    (a module's length is no measure of it: a long module of small functions is fine)."""
    findings = ruff_findings(COMPLEXITY_RULES, *CHECKED)
    assert not findings, "split these functions:\n" + "\n".join(findings)


def test_a_too_complex_function_is_found(tmp_path):
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(20))
    (tmp_path / "branchy.py").write_text(f"def branchy(x):\n{branches}\n    return -1\n")
    findings = ruff_findings(COMPLEXITY_RULES, tmp_path / "branchy.py")
    assert any("C901" in line for line in findings) and any("PLR0912" in line for line in findings), findings


def test_no_line_is_too_long():
    """Lines of at most 120 characters in the package, the analyses and the examples (wrap inside parentheses,
    split a long string into adjacent literals)."""
    findings = ruff_findings(LINE_RULES, *CHECKED)
    assert not findings, "wrap these lines:\n" + "\n".join(findings)


def test_a_too_long_line_is_found(tmp_path):
    (tmp_path / "long.py").write_text(f"x = {'1' * 120}\ny = {'2' * 126}\n")  # 124 and 130 characters
    findings = ruff_findings(LINE_RULES, tmp_path / "long.py")
    assert len(findings) == 2 and all("E501" in line for line in findings), findings
    (tmp_path / "long.py").write_text(f"x = {'1' * 116}\n")  # 120 characters: within the limit
    assert not ruff_findings(LINE_RULES, tmp_path / "long.py")


# --- Import direction -------------------------------------------------------------------------------
# A stage is a subpackage or a module directly under latentcode/. Each stage and what it may import,
# at module level or inside a function (a lazy import defers the cost, not the dependency). The
# shared helpers serve every stage and import only each other; `latentcode/__init__.py` is the
# public API and may name every stage.
SHARED = {"allocator", "errors", "files", "lazy", "progress", "safe_reads", "switches", "validation"}
ALLOWED = {
    "tasks": set(),
    "models": set(),
    "store": set(),
    "rundir": set(),
    "pretrained_cache": {"models"},
    "pretrained_checks": set(),
    "pretrained": {"tasks", "rundir", "pretrained_cache", "pretrained_checks"},
    "token_windows": {"tasks", "pretrained"},
    "inputs": {"tasks", "sources", "store", "token_windows"},
    "subject": {"tasks", "models", "rundir", "provenance", "pretrained", "token_windows"},
    "shipped": {"rundir"},
    "provenance": {"tasks", "store", "rundir"},
    "training": {"tasks", "models", "rundir"},
    "sources": {"tasks", "models", "store"},
    "extraction": {"inputs", "subject", "token_windows", "tasks", "models", "store", "rundir", "provenance", "pretrained", "sources"},
    "intervention": {"inputs", "subject", "token_windows", "tasks", "models", "store", "rundir", "provenance", "pretrained", "sources", "extraction",
                     "training"},
    "analysis": {"store", "rundir", "provenance"},
    "demo": {"tasks", "models", "store", "rundir", "shipped", "training", "extraction", "analysis"},
    "relations": {"inputs", "subject", "token_windows", "tasks", "pretrained", "sources", "intervention", "analysis", "demo"},
    "reuse": {"inputs", "subject", "token_windows", "tasks", "store", "rundir", "provenance", "training", "sources", "extraction", "intervention",
              "analysis"},
    "cli": {"inputs", "subject", "token_windows", "tasks", "models", "store", "rundir", "pretrained", "shipped", "provenance", "training", "sources",
            "extraction", "intervention", "analysis", "demo", "relations", "reuse"},
}
TOP_LEVEL = "__init__"


def stage_of(path: Path) -> str:
    """`latentcode/sources/sites.py` -> `sources`; `latentcode/demo.py` -> `demo`."""
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def lazy_table(tree: ast.Module) -> dict[str, str]:
    """A `_WHERE = {name: module}` table of `latentcode.lazy.lazy_exports`, read without importing."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {key.value: value.value for key, value in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(key, ast.Constant) and isinstance(value, ast.Constant)}
    return {}


TOP_LEVEL_NAMES = lazy_table(ast.parse((PACKAGE / "__init__.py").read_text()))


def attribute_chain(node: ast.Attribute) -> list[str] | None:
    """`latentcode.analysis.decode` -> ['latentcode', 'analysis', 'decode']; None if not a dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def package_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every `latentcode` module `path` depends on: imports at module level and in
    functions, names used through `import latentcode` (`latentcode.extract`: the module that defines
    it), and the modules of a lazy `_WHERE` table."""
    tree = ast.parse(path.read_text())
    found = []
    imports_top_level = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "latentcode" and alias.asname is None:
                    imports_top_level = True
                found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = path.relative_to(REPOSITORY).with_suffix("").parts[:-node.level]
                module = ".".join([*package, *([module] if module else [])])
            if module == "latentcode":  # a public name (its stage), or one of the package's own (__version__)
                found += [(node.lineno, TOP_LEVEL_NAMES.get(alias.name, "latentcode")) for alias in node.names]
            else:
                found.append((node.lineno, module))
    if imports_top_level:
        for node in ast.walk(tree):
            chain = attribute_chain(node) if isinstance(node, ast.Attribute) else None
            if chain and chain[0] == "latentcode":
                found.append((node.lineno, TOP_LEVEL_NAMES.get(chain[1], f"latentcode.{chain[1]}")))
    found += [(0, module) for module in lazy_table(tree).values()]
    return [(line, module) for line, module in found if module.startswith("latentcode.")]


def wrong_imports(stage: str, paths: list[Path], allowed: dict[str, set[str]] = ALLOWED) -> dict[str, list[str]]:
    """For each file of `stage`, `line: stage` for every import of a stage it may not import."""
    may_import = (SHARED if stage in SHARED else allowed[stage] | SHARED) | {stage}
    wrong = {}
    for path in paths:
        bad = sorted({f"{line}: {module.split('.')[1]}" for line, module in package_imports(path)
                      if module.split(".")[1] not in may_import})
        if bad:
            wrong[str(path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else path)] = bad
    return wrong


def stage_files(stage: str) -> list[Path]:
    root = PACKAGE / stage
    return python_files(root) if root.is_dir() else [root.with_suffix(".py")]


def test_every_stage_has_a_place_in_the_order():
    stages = {stage_of(path) for path in python_files(PACKAGE)} - {TOP_LEVEL}
    assert stages - set(ALLOWED) - SHARED == set(), "a new stage: say what it may import (ALLOWED above)"
    assert set(ALLOWED) - stages == set(), "ALLOWED names a stage that no longer exists"


def test_the_stages_form_an_order_without_circles():
    placed: list[str] = []
    left = dict(ALLOWED)
    while left:
        ready = sorted(stage for stage, needs in left.items() if needs <= set(placed))
        assert ready, f"the stages {sorted(left)} import each other in a circle"
        placed += ready
        for stage in ready:
            del left[stage]


@pytest.mark.parametrize("stage", sorted(set(ALLOWED) | SHARED))
def test_a_stage_imports_only_the_stages_to_its_left(stage):
    wrong = wrong_imports(stage, stage_files(stage))
    assert not wrong, f"imports against the pipeline's direction (line: stage): {wrong}"


def test_a_wrong_import_is_found_wherever_it_is_written(tmp_path):
    """Module level, inside a function, through `import latentcode`, relative, or in a lazy table:
    each is flagged for a stage that may not import what it names; what it may import is not."""
    snippets = {
        "module_level.py": "from latentcode.extraction import Recorder\n",
        "in_a_function.py": "def f():\n    from latentcode.cli import main\n    return main\n",
        "top_level_name.py": "import latentcode\n\ndef f():\n    return latentcode.extract\n",
        "lazy_table.py": "_WHERE = {'Recorder': 'latentcode.extraction.recorder'}\n",
        "allowed.py": "def f():\n    from latentcode.models import build_model\n    return build_model\n",
    }
    for name, text in snippets.items():
        (tmp_path / name).write_text(text)
    wrong = wrong_imports("sources", sorted(tmp_path.iterdir()))
    assert sorted(Path(path).name for path in wrong) == sorted(set(snippets) - {"allowed.py"})
    assert wrong[str(tmp_path / "in_a_function.py")] == ["2: cli"]
    assert wrong[str(tmp_path / "top_level_name.py")] == ["4: extraction"]


# --- analyses/ and examples/ use the public API ---------------------------------------------------
# A public name is one the `__all__` of `latentcode` or of one of its packages (a directory with an
# `__init__.py`: a stage such as `latentcode.sources`, or a part such as `latentcode.analysis.probes`)
# lists, or, for a stage that is one module (`latentcode/files.py`), a name it defines without a leading
# underscore (its `__all__` when it has one). A module inside a package is not public: what a script
# needs from it, its package exports.
SCRIPTS = python_files(REPOSITORY / "analyses", REPOSITORY / "examples")


def is_public_module(module: str) -> bool:
    parts = module.split(".")
    if parts[0] != "latentcode":
        return False
    path = PACKAGE.joinpath(*parts[1:])
    return (path / "__init__.py").is_file() or (len(parts) == 2 and path.with_suffix(".py").is_file())


def declared_all(module: str) -> set[str] | None:
    """`module`'s `__all__`, read without importing it (None if it has none): a list of strings, each
    `*_WHERE` (the keys of its lazy table) or `*submodule.__all__`, or `sorted(_WHERE)`."""
    path = PACKAGE.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text())
    submodules = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in tree.body
                  if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}

    def names(value: ast.expr) -> set[str]:
        if isinstance(value, ast.Constant):
            return {value.value}
        if isinstance(value, ast.Starred):
            return names(value.value)
        if isinstance(value, (ast.List, ast.Tuple)):
            return set().union(*(names(element) for element in value.elts))
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "sorted":
            return names(value.args[0])
        if isinstance(value, ast.Name) and value.id == "_WHERE":
            return set(lazy_table(tree))
        if isinstance(value, ast.Attribute) and value.attr == "__all__" and isinstance(value.value, ast.Name):
            return declared_all(submodules[value.value.id]) or set()
        raise AssertionError(f"{path}: cannot read __all__ at {ast.unparse(value)}")

    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return names(node.value)
    return None


def public_names(module: str) -> set[str]:
    """The names `module` (a public module) offers."""
    path = PACKAGE.joinpath(*module.split(".")[1:])
    declared = declared_all(module)
    if path.is_dir() or declared is not None:
        return declared or set()
    defined = set()
    for node in ast.parse(path.with_suffix(".py").read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {target.id for target in targets if isinstance(target, ast.Name)}
    return {name for name in defined if not name.startswith("_")}


def private_uses(path: Path) -> list[str]:
    """`line: module.name` for every use in `path` of a latentcode name that is not public."""
    tree = ast.parse(path.read_text())
    wrong = []
    aliases = {}  # a name bound by `import latentcode...` -> the module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "latentcode":
            names = public_names(node.module) if is_public_module(node.module) else set()
            wrong += [f"{node.lineno}: {node.module}.{alias.name}" for alias in node.names if alias.name not in names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "latentcode":
                    continue
                if not is_public_module(alias.name):
                    wrong.append(f"{node.lineno}: {alias.name}")
                aliases[alias.asname or "latentcode"] = alias.asname and alias.name or "latentcode"
    for node in ast.walk(tree):
        chain = attribute_chain(node) if isinstance(node, ast.Attribute) else None
        if not chain or chain[0] not in aliases or isinstance(getattr(node, "ctx", None), ast.Store):
            continue
        module, rest = aliases[chain[0]], chain[1:]
        while rest and is_public_module(f"{module}.{rest[0]}") and rest[0] not in public_names(module):
            module, rest = f"{module}.{rest[0]}", rest[1:]
        if rest and rest[0] not in public_names(module):
            wrong.append(f"{node.lineno}: {module}.{rest[0]}")
    return sorted(set(wrong))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_analyses_and_examples_use_only_public_names(path):
    wrong = private_uses(path)
    assert not wrong, (f"{path.relative_to(REPOSITORY)} uses names its package does not export "
                       f"(add them to the package's __all__ or use the exported name): {wrong}")


def test_a_private_name_is_found(tmp_path):
    """A module inside a package, a name a package does not export, a module path through the top-level
    package, and a private name of a one-module stage are flagged; public names are not."""
    script = tmp_path / "script.py"
    script.write_text(
        "import latentcode\n"
        "from latentcode.sources.sites import block\n"                # a module inside a package
        "from latentcode.sources import SitePairs\n"                  # not in latentcode.sources.__all__
        "from latentcode.files import _same_file\n"                  # private in a one-module stage
        "from latentcode.sources import block, parse_selector\n"      # public
        "from latentcode.files import AtomicOutputs\n"                # public, one-module stage
        "latentcode.extract\n"                                        # public, top level
        "latentcode.intervention.transfer\n"                          # a module inside a package
    )
    assert private_uses(script) == [
        "2: latentcode.sources.sites.block",
        "3: latentcode.sources.SitePairs",
        "4: latentcode.files._same_file",
        "8: latentcode.intervention.transfer",
    ]
