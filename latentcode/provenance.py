"""Which codes files and runs belong together: one task per comparison, codes shown with their runs.

A codes file records the SHA-256 of the weights it came from (`checkpoint_sha256`: `safe_reads.sha256_of_file`
of a saved weights file, `sha256_of_state` of a model never saved) and its task's config (`task_config`). A
report showing a run beside codes of another checkpoint, or a probe table comparing files of different
tasks under one label, would print numbers that mean nothing, so both are refused in one line naming the
two inputs. JSON and HDF5 attributes only (`sha256_of_state` imports safetensors when called): the command
line checks its arguments with it before any heavy import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latentcode.errors import LatentcodeError
from latentcode.rundir import RunDirectory, RunRecord
from latentcode.safe_reads import sha256_of_file
from latentcode.store import CodeFile

if TYPE_CHECKING:
    from torch import nn


class MismatchError(LatentcodeError, ValueError):
    """Codes files or runs that do not belong together (another task, another checkpoint)."""


def task_name_of(item: CodeFile | RunRecord) -> str:
    return str(item.task_config.get("name")) if item.task_config else "unknown"


def _describe(item: CodeFile | RunRecord) -> str:
    kind = "codes file" if isinstance(item, CodeFile) else "run"
    name = item.model_name if isinstance(item, CodeFile) else item.name
    return f"{kind} {item.path} ({name} on task {task_name_of(item)!r})"


def codes_of_runs(runs: Sequence[RunRecord]) -> list[Path]:
    """The codes files stored with `runs` (each run's `codes/*.h5`): a report's default."""
    return [path for run in runs for path in sorted((run.path / "codes").glob("*.h5"))]


def check_one_task(code_files: Sequence[CodeFile] = (), runs: Sequence[RunRecord] = ()) -> str | None:
    """The task name all `code_files` and `runs` share (None if there are none); raises
    `MismatchError` naming the first two that differ. Files that record no task pass."""
    items = [item for item in [*runs, *code_files] if task_name_of(item) != "unknown"]
    for item in items[1:]:
        if task_name_of(item) != task_name_of(items[0]):
            raise MismatchError(f"{_describe(items[0])} and {_describe(item)} come from different tasks; compare the "
                                "codes and runs of one task at a time")
    return task_name_of(items[0]) if items else None


def sha256_of_state(model: nn.Module) -> str:
    """SHA-256 of a model's weights as safetensors bytes (for models that were never saved)."""
    from safetensors.torch import save

    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    return hashlib.sha256(save(state)).hexdigest()


def sha256_of_weights(run: RunRecord) -> str | None:
    """SHA-256 of a run's final weights file, as extraction records it; None before the run saved one."""
    weights = RunDirectory(run.path).weights_path
    return sha256_of_file(weights) if weights.is_file() else None


def task_differences(run_task: Mapping[str, Any], codes_task: Mapping[str, Any]) -> list[str]:
    """The task parameters a run sets that a codes file's task config sets otherwise (except the
    task's `reading_parameters`, such as language's window length, which read the same task)."""
    from latentcode.tasks import task_class, task_names

    name = run_task.get("name")
    reading = task_class(name).reading_parameters if name in task_names() else ()
    return [f"{key}={codes_task.get(key)!r} in the codes, {value!r} in the run"
            for key, value in sorted(run_task.items()) if codes_task.get(key) != value and key not in reading]


def check_codes_from_runs(runs: Sequence[RunRecord], code_files: Sequence[CodeFile]) -> dict[Path, RunRecord]:
    """Which run each codes file comes from: the run whose weights have the file's
    `checkpoint_sha256` (where the file records one, else a run of the same task) and whose task
    config the file's agrees with. Raises `MismatchError` naming the codes file and the runs
    where there is none; with no runs, there is nothing to match."""
    if not runs:
        return {}
    weights = {run.path: sha256_of_weights(run) for run in runs}
    matched: dict[Path, RunRecord] = {}
    for code_file in code_files:
        checkpoint = str(code_file.attrs.get("checkpoint_sha256", "") or "")
        candidates = [run for run in runs if weights[run.path] == checkpoint] if checkpoint else list(runs)
        if not candidates:
            listed = "; ".join(f"{_describe(run)}: checkpoint {(weights[run.path] or 'none saved')[:12]}"
                               for run in runs)
            raise MismatchError(
                f"{_describe(code_file)} holds the codes of checkpoint {checkpoint[:12]}, which is not the "
                f"model of any run given ({listed}); give the runs the codes were extracted from, or codes "
                "extracted from these runs"
            )
        for run in candidates:
            if task_name_of(run) == task_name_of(code_file) and not task_differences(
                    run.task_config, code_file.task_config):
                matched[code_file.path] = run
                break
        else:
            run = candidates[0]
            differences = "; ".join(task_differences(run.task_config, code_file.task_config))
            raise MismatchError(f"{_describe(code_file)} was extracted on another task than {_describe(run)} was "
                                f"trained on ({differences}); give codes extracted on the run's task")
    return matched
