"""The public API (issue 47 item 5): every name of `latentcode/__init__.py` is imported statically
under TYPE_CHECKING (so IDEs and type checkers see it) and lazily at run time (so `import latentcode`
stays cheap), the two lists and `__all__` agree, each public function and method is annotated, and
`mypy --strict` passes on the package's `__init__` and on a file that calls every public name."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import latentcode

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "latentcode" / "__init__.py"


def type_checking_imports() -> dict[str, str]:
    """name -> module of every `from M import name` under `if TYPE_CHECKING:` in __init__.py."""
    found: dict[str, str] = {}
    for node in ast.parse(INIT.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module
                found.update({alias.name: statement.module for alias in statement.names})
    return found


def test_static_imports_lazy_table_and_all_name_the_same_things():
    static = type_checking_imports()
    lazy = latentcode._WHERE
    assert static.keys() == lazy.keys()
    for name, module in static.items():  # the lazy table may name a package that re-exports it
        assert module == lazy[name] or module.startswith(lazy[name] + "."), name
    assert set(latentcode.__all__) == set(lazy) | {"__version__"}
    for name in ("decode", "build_viewer", "patch", "intervention_effects", "InMemoryCodes", "load_pretrained"):
        assert name in latentcode.__all__


def test_every_public_name_imports_and_is_what_its_module_defines():
    for name, module in type_checking_imports().items():
        value = getattr(latentcode, name)
        assert value is getattr(importlib.import_module(module), name), name


def test_import_latentcode_loads_neither_torch_nor_h5py():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, latentcode; print(sorted(m for m in ('torch', 'h5py', 'numpy', 'pandas') "
         "if m in sys.modules))"], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    assert loaded == "[]"


def _annotation_gaps(function, where: str) -> list[str]:
    gaps = []
    signature = inspect.signature(function)
    for parameter in signature.parameters.values():
        if parameter.name not in ("self", "cls") and parameter.annotation is inspect.Parameter.empty:
            gaps.append(f"{where}: parameter {parameter.name}")
    if signature.return_annotation is inspect.Signature.empty and function.__name__ != "__init__":
        gaps.append(f"{where}: return")
    return gaps


def test_every_public_function_and_method_is_annotated():
    gaps = []
    for name in latentcode.__all__:
        value = getattr(latentcode, name)
        if inspect.isfunction(value):
            gaps += _annotation_gaps(value, name)
        elif inspect.isclass(value):
            for klass in value.__mro__:
                if not klass.__module__.startswith("latentcode"):
                    continue
                for attribute, member in vars(klass).items():
                    if attribute.startswith("_") and attribute != "__init__":
                        continue
                    member = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                    if inspect.isfunction(member):
                        gaps += _annotation_gaps(member, f"{name}.{attribute}")
    assert not gaps, gaps


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[dev]')")
def test_mypy_strict_passes_on_the_public_api(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "tests/typing/mypy.ini", "--cache-dir", str(tmp_path),
         "latentcode/__init__.py", "tests/typing/public_api_calls.py"],
        capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr
