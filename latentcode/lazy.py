"""Lazy public names for a package: `from latentcode.models import build_model` imports the submodule
that defines it on first use, so importing a light submodule (a config, a preset table) never pays
for torch and TransformerLens."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str] | Callable[[], Mapping[str, str]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, which exports `name` from module `where[name]` (`where`: the
    table, or a function that returns it, called once, on the first name asked for)."""
    table: dict[str, str] = {}

    def exported() -> dict[str, str]:
        if not table:
            table.update(where() if callable(where) else where)
        return table

    def __getattr__(name: str) -> Any:
        if name in exported():
            value = getattr(importlib.import_module(table[name]), name)
            setattr(importlib.import_module(package), name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(exported())

    return __getattr__, __dir__


def type_checking_imports(source: str | Path) -> dict[str, str]:
    """name -> module of each `from MODULE import name` under `if TYPE_CHECKING:` in the Python file `source`:
    a package's public names declared once, as the imports type checkers and IDEs read."""
    import ast

    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    return {alias.name: node.module for block in tree.body
            if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
            for node in block.body if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
