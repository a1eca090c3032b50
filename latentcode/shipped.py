"""The shipped checkpoints (the repository's `models/`), found after any kind of install.

Where they are looked for, in order:

1. a directory named explicitly: `models_dir=` (`latentcode demo --models DIR`), else the
   environment variable `LATENTCODE_MODELS`; used as given, never replaced by a guess;
2. `models/` beside the package, in a source checkout (an editable install reads it in place);
3. `latentcode/shipped_models/` inside the installed package, where the wheel carries a copy
   (setup.py's build step puts it there; pyproject.toml holds everything else).

Each shipped checkpoint is a run directory `<task>-<attention>/` (config.json, metrics.jsonl,
summary.json, model/) with its model card (README.md). A task may ship a second trio, named
`<task>-<checkpoints>-<attention>/`: SRAVEN's `permuted` trio was trained on the paper's permuted
task (M = 2 features), its default trio on the unpermuted variant (M = 4).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from latentcode.errors import LatentcodeError
from latentcode.rundir import MODEL_DIR, WEIGHTS_FILE

MODELS_ENV = "LATENTCODE_MODELS"
SHIPPED_ATTENTIONS = ("softmax", "linear", "hyla")  # each demo task ships one checkpoint of each
SOURCE_TREE_MODELS = Path(__file__).resolve().parents[1] / "models"
INSTALLED_MODELS = Path(__file__).resolve().parent / "shipped_models"


class ShippedModelsNotFound(LatentcodeError):
    """The shipped checkpoints asked for are not where they were looked for; says where it looked."""


def find_models_directory(models_dir: str | Path | None = None) -> Path | None:
    """The directory of the shipped checkpoints (see the module docstring), or None where no
    place holds any. An explicit `models_dir` (or LATENTCODE_MODELS) is returned as given."""
    explicit = models_dir or os.environ.get(MODELS_ENV)
    if explicit:
        return Path(explicit)
    for candidate in (SOURCE_TREE_MODELS, INSTALLED_MODELS):
        if any(candidate.glob(f"*/{MODEL_DIR}/{WEIGHTS_FILE}")):
            return candidate
    return None


def shipped_name(task: str, attention: str, checkpoints: str | None = None) -> str:
    """`<task>-<attention>`, or `<task>-<checkpoints>-<attention>` for a task's other trio."""
    return f"{task}-{checkpoints}-{attention}" if checkpoints else f"{task}-{attention}"


def missing_checkpoints(directory: Path, task: str, attentions: Sequence[str], checkpoints: str | None = None
                        ) -> list[str]:
    """The names of the checkpoints of `task` for `attentions` that `directory` lacks."""
    names = [shipped_name(task, attention, checkpoints) for attention in attentions]
    return [name for name in names if not (directory / name / MODEL_DIR / WEIGHTS_FILE).is_file()]


def other_checkpoints(directory: Path, task: str) -> list[str]:
    """The `checkpoints` names of the other trios of `task` that `directory` ships (those named
    `<task>-<checkpoints>-hyla`), sorted; e.g. ['permuted'] for sraven."""
    prefix, suffix = shipped_name(task, "hyla", "*").split("*")
    return sorted({path.name.removeprefix(prefix).removesuffix(suffix)
                   for path in directory.glob(shipped_name(task, "hyla", "*"))})


def searched() -> str:
    return f"{MODELS_ENV} unset, {SOURCE_TREE_MODELS} and {INSTALLED_MODELS}"


def shipped_run(task: str, attention: str, models_dir: str | Path | None = None, checkpoints: str | None = None
                ) -> Path:
    """The shipped run directory of `task` with `attention`; raises `ShippedModelsNotFound`
    naming where it looked and how to point at the checkpoints."""
    directory = find_models_directory(models_dir)
    if directory is None:
        raise ShippedModelsNotFound(
            f"the shipped checkpoints are not installed (looked in: {searched()}); pass models_dir= or set "
            f"{MODELS_ENV} to the models/ directory of a latentcode checkout, or train new models (train=True)"
        )
    missing = missing_checkpoints(directory, task, [attention], checkpoints)
    if missing:
        raise ShippedModelsNotFound(
            f"{directory} holds no shipped checkpoint {missing[0]} ({MODEL_DIR}/{WEIGHTS_FILE} is missing); "
            "pass models_dir= the directory that holds it, or train new models (train=True)"
        )
    return directory / shipped_name(task, attention, checkpoints)
