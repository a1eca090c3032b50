"""Argument checks that several commands share: standard library, JSON and h5py only, so that a
mistake is answered before torch or scikit-learn is imported.

Inputs (`check_input_file`, `read_json_file`, `model_config_of`, `open_codes_files`, labels and splits
of codes files), outputs (`check_output`, `check_stem_free`, `command_outputs`) and resources
(`check_fits_in_memory`, `check_fits_on_disk`). Task splits and variants are checked by
`latentcode.validation`, as the Python API checks them.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from latentcode.errors import UsageError
from latentcode.validation import (  # noqa: F401 - shared with the plan steps of the Python API; named here too
    check_fits_in_memory,
    check_fits_on_disk,
    check_output,
    forward_pass_bytes,
    machine_memory,
)


# -- inputs ----------------------------------------------------------------------------------------
def check_input_file(path: str | Path, what: str) -> Path:
    """An existing, readable file (not a directory)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory; expected a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{what} {path} cannot be read (no read permission)")
    return path


def read_json_file(path: str, flag: str, fields: str = "TrainConfig") -> dict:
    """The JSON object in the file `path` names, refused in one line naming the file otherwise."""
    text = check_input_file(path, flag).read_bytes()
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{flag} {path} is not a JSON file ({error})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{flag} {path} holds a JSON {type(data).__name__}; expected an object of {fields} fields")
    return data


def model_config_of(path: Path) -> dict:
    """The model config of a run directory or a saved model directory, from JSON (no torch), checked
    as the plan steps check it (`latentcode.extraction.plan.checked_model_config`), named RUN_DIR."""
    from latentcode.errors import LatentcodeError
    from latentcode.extraction.plan import checked_model_config
    from latentcode.rundir import locate_model

    try:
        return checked_model_config(locate_model(path))
    except LatentcodeError as error:
        raise UsageError(f"RUN_DIR {error}") from None


def open_codes_files(paths: Sequence[str | Path], what: str = "codes file") -> list:
    """The `CodeFile`s of `paths` (h5py only), each checked to exist and to be a readable codes file."""
    for path in paths:
        check_input_file(path, what)
    from latentcode.store import CodeFile

    return [CodeFile(path) for path in paths]


def capped(code_files: Sequence, max_rows: int, seed: int = 0, command: str = "") -> list:
    """Views of `code_files` that read at most `max_rows` examples of each split (`CodeFile.subsample`),
    with a note on stdout for each split that is cut: the cap is never silent."""
    views = [code_file.subsample(max_rows, seed) for code_file in code_files]
    for view in views:
        for split, (total, kept) in view.subsampled.items():
            print(f"note: {view.path}: split {split!r} has {total:,} examples; {command or 'this command'} reads a "
                  f"random {kept:,} of them (seed {seed}; --max-rows sets the cap)", flush=True)
    return views


def note_in_sample(fit_split: str, test_split: str) -> None:
    """Say so when a probe is scored on the split it was fitted on: its test score is not held out."""
    if fit_split == test_split:
        print(f"note: --fit-split and --test-split are both {fit_split!r}: the test score is in-sample (the probe "
              "is scored on the examples it was fitted on), not a held-out score; the validation column is "
              "held out (cross-validation folds)", flush=True)


def _available_labels(code_file) -> list[str]:
    present = [name for name, has in (("prediction", code_file.has_prediction), ("target", code_file.has_target))
               if has]
    return list(dict.fromkeys([*code_file.label_names, *present, *code_file.extra_names]))  # each name once


def label_name(spec: str) -> str:
    """The label a spec such as `term_present[2]` reads."""
    return str(spec).split("[", 1)[0].strip()


def default_label(code_files: Sequence, label: str | None, flag: str = "--label", kind: str = "probe_label") -> str:
    """`label`, else the one the files' task analysis names (`probe_label` or `picture_label`)."""
    if label:
        return label
    labels = {code_file.task_analysis.get(kind, code_file.task_analysis.get("probe_label")) for code_file in code_files}
    if len(labels) == 1 and None not in labels:
        return labels.pop()
    tasks = sorted({str(code_file.task_config.get("name")) for code_file in code_files})
    raise UsageError(f"give {flag}: the files (tasks {tasks}) name no single label the task's analysis decodes")


def check_label(code_file, spec: str, flag: str) -> None:
    """The label spec names a per-example array of the file (its index is checked when read)."""
    if label_name(spec) not in _available_labels(code_file):
        raise UsageError(f"{flag} {spec}: {code_file.path} has no label {label_name(spec)!r}; "
                         f"its labels are {_available_labels(code_file)}")


def check_one_column(code_file, spec: str, flag: str) -> None:
    """A label that colours points: one value per example (a multi-column label needs an index)."""
    name = label_name(spec)
    if spec.strip() != name or name not in code_file.label_names:
        return  # one column of a label, or a prediction: checked when read
    import h5py

    with h5py.File(code_file.path, "r") as file:
        shape = file[f"labels/{name}"].shape[1:]
    if shape:
        raise UsageError(f"{flag} {spec}: label {name!r} has shape [N, {', '.join(map(str, shape))}]: colour by one "
                         f"column, e.g. {name}[0]")


def check_decodable(code_file, spec: str, flag: str, split: str) -> None:
    """A label a probe can learn: not one value for every example of the fitting split (for a
    multi-column label such as term_present, not one value per column: nothing to decode)."""
    name = label_name(spec)
    if spec.strip() != name or name not in code_file.label_names:
        return  # one column of a label, or a prediction: the probe checks it when it reads it
    values = code_file.labels(name, split)
    rows = values.reshape(len(values), -1)
    if len(rows) and (rows == rows[:1]).all():
        same = (f"in each of its {rows.shape[1]} columns" if rows.shape[1] > 1 else f"({rows[0, 0]})")
        raise UsageError(
            f"{flag} {spec}: every example of split {split!r} in {code_file.path} has the same value {same}; "
            f"a probe needs at least two classes to learn from (choose another {flag} or --fit-split)"
        )


def check_splits(code_file, splits: Mapping[str, str | None]) -> None:
    """Each `{flag: split}` names a split of the codes file."""
    for flag, split in splits.items():
        if split is not None and split not in code_file.splits:
            raise UsageError(f"{flag} {split}: {code_file.path} has no split {split!r}; its splits are {code_file.splits}")


# -- outputs ---------------------------------------------------------------------------------------
def check_stem_free(stem: str | Path, suffixes: Sequence[str], overwrite: bool, flag: str = "--out") -> None:
    """Refuse to replace files already written at `stem` + each suffix (tables, figures) unless
    --overwrite: a result written earlier is never lost by running a command again."""
    from latentcode.files import check_replaceable

    stem = Path(stem)
    for suffix in suffixes:
        check_replaceable(stem.with_name(stem.name + suffix), flag)
    existing = [str(stem.with_name(stem.name + suffix)) for suffix in suffixes
                if stem.with_name(stem.name + suffix).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{flag} {stem}: {', '.join(existing)} already exist; add --overwrite to replace "
                              f"them, or choose another {flag}")


@contextlib.contextmanager
def command_outputs(stem: str | Path, suffixes: Sequence[str], overwrite: bool, purpose: str) -> Iterator:
    """One command's outputs at `stem` as one set (latentcode.files.AtomicOutputs: every writer inside
    joins it; all renamed at the end, or none), its lock held throughout. Under the lock the stem is
    checked again: a second command to the same --out, started beside the first, finds its files
    and is refused instead of replacing them."""
    from latentcode.files import AtomicOutputs

    with AtomicOutputs(lock=stem, purpose=purpose) as outputs:
        check_stem_free(stem, suffixes, overwrite)
        yield outputs
