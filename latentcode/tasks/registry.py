"""Which tasks there are: found, not listed.

A task is a `Task` subclass decorated with `@register_task`. The registry's first question imports
every module of ``latentcode.tasks`` once (`discover_tasks`), so their decorators run; a task defined
outside the package registers when its module is imported. Discovery never imports torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from latentcode.tasks.base import AnalysisDefaults, Task, TaskError

__all__ = ["discover_tasks", "get_task", "register_task", "task_class", "task_names"]

_TASK_CLASSES: dict[str, type[Task]] = {}
_DISCOVERED = False


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make ``cls`` available to :func:`get_task` under ``cls.name``."""
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"register_task takes a Task subclass, got {cls!r}")
    if not isinstance(getattr(cls, "analysis", None), AnalysisDefaults):
        raise TypeError(f"task class {cls.__name__} must set `analysis = AnalysisDefaults(...)`")
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise TypeError(f"task class {cls.__name__} must set `name` to a non-empty string")
    known = _TASK_CLASSES.get(cls.name)
    if known is not None and _qualified(known) != _qualified(cls):  # the same class again: a reloaded module
        raise TypeError(f"two task classes are named {cls.name!r}: {_qualified(known)} and {_qualified(cls)}")
    _TASK_CLASSES[cls.name] = cls
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def discover_tasks() -> None:
    """Import every module of ``latentcode.tasks`` (once), registering the tasks they define."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True  # first: a task module that asks the registry while it is imported does not recurse
    package = importlib.import_module("latentcode.tasks")
    try:
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{package.__name__}.{module.name}")
    except BaseException:
        _DISCOVERED = False  # a broken module fails every question, not only the first
        raise


def task_names() -> tuple[str, ...]:
    """The names :func:`get_task` accepts, sorted."""
    discover_tasks()
    return tuple(sorted(_TASK_CLASSES))


def task_class(name: str) -> type[Task]:
    """The class registered as ``name`` (its class attributes describe the task without building it)."""
    discover_tasks()
    if name not in _TASK_CLASSES:
        raise TaskError(f"unknown task {name!r}; valid names: {list(task_names())}")
    return _TASK_CLASSES[name]


#: the longest sequence a task may ask for (a [T, T] float32 attention map per head is 4 TiB at 2^20)
MAX_SEQ_LEN = 2**20


def get_task(name: str, **params: Any) -> Task:
    """Build the task called ``name`` with keyword ``params`` (see each task's ``__init__``)."""
    cls = task_class(name)
    valid = cls.parameter_names()
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise TaskError(f"unknown parameter(s) {unknown} for task {name!r}; valid parameters: {list(valid)}")
    seq_len = params.get("seq_len")
    if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > MAX_SEQ_LEN:
        # Checked before the task is built, which may allocate seq_len rows (fuzzy_logic's fixed inputs).
        raise TaskError(f"seq_len={seq_len} for task {name!r} is beyond {MAX_SEQ_LEN:,} tokens; expected at most "
                        f"{MAX_SEQ_LEN:,} (attention keeps [heads, T, T] scores: 4 TiB per head at that length)")
    return cls(**params)
