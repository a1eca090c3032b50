"""Let a subpackage be called like its main function: `latentcode.train(...)`, `latentcode.extract(...)`.

The design keeps one subpackage per pipeline stage (`latentcode/train/`, `latentcode/extract/`),
while the public API names the stage's main function after it. Once a subpackage is imported,
`latentcode.train` *is* that module, so the module itself is made callable.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable


def make_callable(module_name: str, function: Callable) -> None:
    """Calling the module `module_name` calls `function` (its docstring is the module's help)."""

    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return function(*args, **kwargs)

    sys.modules[module_name].__class__ = CallableModule
