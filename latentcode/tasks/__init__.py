"""The tasks of "Attention as a Hypernetwork": fuzzy logic, SRAVEN and byte-level language modelling.

A task owns everything known about it: its generator, splits and labels, and what later stages
need (`Task.analysis`, `Task.training_setup`, `Task.selectors`, the names of label values, and the
optional capabilities it provides: `Task.provides`); a new task is one module of this package with a
`@register_task` class, found by the registry (`latentcode.tasks.registry`), listed nowhere.

``get_task(name, **params)`` builds a task; ``task.sample(n, split, seed, variant)`` draws a
:class:`Batch` with ``x``, ``y`` and ``labels``. Numpy only: no model code, no torch. Importing this
package imports no task module: the registry imports them on its first question, the task classes
below on first use.
"""

from latentcode.lazy import lazy_exports
from latentcode.tasks.base import CAPABILITIES, AnalysisDefaults, Batch, Task, TrainingSetup, eval_seed
from latentcode.tasks.registry import get_task, register_task, task_class, task_names

# The task of `latentcode demo`, the main job's embedded default (its models are shipped).
DEMO_TASK = "fuzzy_logic"

__getattr__, __dir__ = lazy_exports(__name__, {
    "FuzzyLogic": "latentcode.tasks.fuzzy_logic",
    "Language": "latentcode.tasks.language",
    "RULES": "latentcode.tasks.sraven_rules",
    "SRaven": "latentcode.tasks.sraven",
    "corpus_split": "latentcode.tasks.corpus",
    "estimate_ambiguity": "latentcode.tasks.sraven_counts",
    "repeated_random_tokens": "latentcode.tasks.token_sequences",
})

__all__ = [
    "CAPABILITIES",
    "DEMO_TASK",
    "RULES",
    "AnalysisDefaults",
    "Batch",
    "FuzzyLogic",
    "Language",
    "SRaven",
    "Task",
    "TrainingSetup",
    "corpus_split",
    "estimate_ambiguity",
    "eval_seed",
    "get_task",
    "register_task",
    "repeated_random_tokens",
    "task_class",
    "task_names",
]
