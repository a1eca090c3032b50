"""The in-context learning tasks of "Attention as a Hypernetwork": fuzzy logic and SRAVEN.

``get_task(name, **params)`` builds a task; ``task.sample(n, split, seed, variant)`` draws a
:class:`Batch` with ``x``, ``y`` and ``labels``. Numpy only: no model code, no torch.
"""

from latentcode.tasks.base import Batch, Task, eval_seed, get_task, task_names
from latentcode.tasks.fuzzy_logic import FuzzyLogic
from latentcode.tasks.sraven import RULES, SRaven

__all__ = ["RULES", "Batch", "FuzzyLogic", "SRaven", "Task", "eval_seed", "get_task", "task_names"]
