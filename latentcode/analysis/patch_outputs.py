"""The outputs of `latentcode patch` as a report reads them: checked at open, like codes files.

`latentcode patch --out STEM` writes STEM.csv (one row per site group), STEM.json (the run, task,
split, variant, counts and the checkpoint's SHA-256) and STEM.png (the map). A report shows them
beside codes files and runs only when they come from the same task and model, and only when their
structure is what patch writes: a damaged file is refused in one line naming the file, what was
wrong and what is expected. Standard library only (csv, json): the command line checks with it
before pandas is imported. Every file is read as `latentcode.safe_reads` reads (no link followed).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError
from latentcode.provenance import sha256_of_weights, task_differences, task_name_of
from latentcode.rundir import RunRecord
from latentcode.safe_reads import MAX_FIGURE_BYTES, prefixed, read_png, read_regular_file
from latentcode.store import CodeFile

#: far above any patch table (a row per group: 5,184 groups of 36 key blocks are about 1 MiB)
MAX_TABLE_BYTES = 256 * 2**20
MAX_SUMMARY_BYTES = 16 * 2**20
REQUIRED_COLUMNS = ("group", "transfer")
NUMERIC_COLUMNS = ("n", "follow (different)", "follow (third)", "transfer", "transfer se", "keep (different)",
                   "attribution estimate", "logit_difference effect")


class PatchOutputError(LatentcodeError, ValueError):
    """A `latentcode patch` output that is damaged, or of another task or model than the report's inputs."""


@dataclass
class PatchOutput:
    """One checked output of `latentcode patch`: its table's text, its summary and its map's PNG bytes."""

    stem: Path
    table_csv: str
    columns: list[str]
    n_rows: int
    summary: dict[str, Any]
    png: bytes | None = field(default=None, repr=False)

    def table(self):
        """The table as a pandas DataFrame (numeric columns as floats)."""
        import pandas as pd

        return pd.read_csv(io.StringIO(self.table_csv))


def _file(stem: Path, suffix: str) -> Path:
    return stem.with_name(stem.name + suffix)


def read_patch_output(stem: str | Path, what: str = "--patch") -> PatchOutput:
    """Read and check STEM.csv, STEM.json and (where present) STEM.png; raises PatchOutputError."""
    stem = Path(stem)
    table_path, summary_path, image_path = (_file(stem, suffix) for suffix in (".csv", ".json", ".png"))
    try:
        text = read_regular_file(table_path, what, MAX_TABLE_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise PatchOutputError(f"{prefixed(what, table_path)} is not a text (CSV) file; "
                               "expected the table latentcode patch writes") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or not any(rows[0]):
        raise PatchOutputError(f"{prefixed(what, table_path)} is empty; expected a header and one row per site group")
    columns, body = rows[0], rows[1:]
    missing = [column for column in REQUIRED_COLUMNS if column not in columns]
    if missing:
        raise PatchOutputError(f"{prefixed(what, table_path)} lacks the column(s) {missing}; its columns are "
                               f"{columns[:8]}; expected the table latentcode patch writes")
    if not body:
        raise PatchOutputError(f"{prefixed(what, table_path)} holds a header and no rows; "
                               "expected one row per site group")
    for number, row in enumerate(body, start=2):
        if len(row) != len(columns):
            raise PatchOutputError(f"{prefixed(what, table_path)} line {number} has {len(row)} fields; the header has "
                                   f"{len(columns)}")
        for column in NUMERIC_COLUMNS:
            if column in columns:
                value = row[columns.index(column)]
                try:
                    float(value or "nan")  # an empty cell is a missing number
                except ValueError:
                    raise PatchOutputError(f"{prefixed(what, table_path)} line {number}: column {column!r} holds "
                                           f"{value[:40]!r}; expected a number") from None
    summary = _read_summary(summary_path, what)
    # A dangling link is refused by the read, not skipped.
    present = image_path.is_symlink() or image_path.exists()
    png = read_png(image_path, f"{what} map" if what else "", MAX_FIGURE_BYTES) if present else None
    return PatchOutput(stem, text, columns, len(body), summary, png)


def _read_summary(path: Path, what: str) -> dict[str, Any]:
    try:
        summary = json.loads(read_regular_file(path, what, MAX_SUMMARY_BYTES))
    except (UnicodeDecodeError, ValueError) as error:
        raise PatchOutputError(f"{prefixed(what, path)} is not a JSON file ({str(error)[:80]}); expected the summary "
                               "latentcode patch writes") from None
    if not isinstance(summary, dict):
        raise PatchOutputError(f"{prefixed(what, path)} holds a JSON {type(summary).__name__}; expected an object (the "
                               "summary latentcode patch writes)")
    expected = {"task": (dict, "an object (the task's config)"), "run": (str, "a run directory"),
                "n": (int, "an integer"), "groups": (int, "an integer"),
                "attribution_vs_exact": (dict, "an object of pearson and spearman")}
    for key, (kind, words) in expected.items():
        if key in summary and not (isinstance(summary[key], kind) and not isinstance(summary[key], bool)):
            raise PatchOutputError(f"{prefixed(what, path)}: {key!r} is {json.dumps(summary[key])[:40]}; "
                                   f"expected {words}")
    if "task" not in summary:
        raise PatchOutputError(f"{prefixed(what, path)} lacks 'task' (the task's config); a report shows patching "
                               "outputs only beside codes and runs of their own task")
    for name, value in summary.get("attribution_vs_exact", {}).items():
        if value is not None and not isinstance(value, (int, float)):
            raise PatchOutputError(f"{prefixed(what, path)}: attribution_vs_exact.{name} is {json.dumps(value)[:40]}; "
                                   "expected a number")
    return summary


def check_patch_provenance(output: PatchOutput, code_files: Sequence[CodeFile] = (),
                           runs: Sequence[RunRecord] = (), what: str = "--patch") -> None:
    """Refuse a patching output of another task or another model than the report's codes files and
    runs: its task config must agree with theirs, and its checkpoint (recorded in the summary, or
    the weights of the run it names) must be the model of one of them."""
    task = output.summary["task"]
    described = f"{prefixed(what, _file(output.stem, '.json'))} (task {task.get('name')!r}"
    for item in [*runs, *code_files]:
        differences = task_differences(item.task_config, task) if item.task_config else []
        if item.task_config and (task_name_of(item) != str(task.get("name")) or differences):
            kind = "codes file" if isinstance(item, CodeFile) else "run"
            detail = f"task {task_name_of(item)!r}" if task_name_of(item) != str(task.get("name")) else (
                "; ".join(differences).replace("in the codes", "in the patching output"))
            raise PatchOutputError(f"{described}) comes from another task than {kind} {item.path} ({detail}); show "
                                   "patching outputs of the report's own task and model")
    checkpoint = str(output.summary.get("checkpoint_sha256") or "")
    if not checkpoint:
        patched_run = Path(str(output.summary.get("run", "")))
        if (patched_run / "config.json").is_file():
            checkpoint = sha256_of_weights(RunRecord.read(patched_run)) or ""
    models = {str(code_file.attrs.get("checkpoint_sha256") or "") for code_file in code_files}
    models |= {sha256_of_weights(run) or "" for run in runs}
    models.discard("")
    if checkpoint and models and checkpoint not in models:
        raise PatchOutputError(f"{described}, checkpoint {checkpoint[:12]}) patched another model than the report's "
                               f"codes and runs (checkpoints {sorted(model[:12] for model in models)}); show "
                               "patching outputs of the report's own models")
