"""The tasks of "Attention as a Hypernetwork": fuzzy logic, SRAVEN and byte-level language modelling.

A task owns everything known about it: its generator, splits and labels, and what later stages
need (`Task.analysis`, `Task.training_setup`, `Task.selectors`, `Task.derived_labels`, the names of
label values); a new task is one module with a `@register_task` class.

``get_task(name, **params)`` builds a task; ``task.sample(n, split, seed, variant)`` draws a
:class:`Batch` with ``x``, ``y`` and ``labels``. Numpy only: no model code, no torch.
"""

from latentcode.tasks.base import (
    AnalysisDefaults,
    Batch,
    Task,
    TrainingSetup,
    eval_seed,
    get_task,
    register_task,
    task_class,
    task_names,
)
from latentcode.tasks.corpus import corpus_split
from latentcode.tasks.fuzzy_logic import FuzzyLogic
from latentcode.tasks.language import Language
from latentcode.tasks.sraven import RULES, SRaven
from latentcode.tasks.sraven_counts import estimate_ambiguity
from latentcode.tasks.token_sequences import repeated_random_tokens

# The task of `latentcode demo`, the main job's embedded default (its models are shipped).
DEMO_TASK = "fuzzy_logic"

__all__ = [
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
