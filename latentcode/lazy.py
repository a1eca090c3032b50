"""Lazy public names for a package: `from latentcode.models import build_model` imports the submodule
that defines it on first use, so importing a light submodule (a config, a preset table) never pays
for torch and TransformerLens."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, where: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, which exports `name` from module `where[name]`."""

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(where[name]), name)
            setattr(importlib.import_module(package), name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__
