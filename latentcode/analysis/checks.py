"""The checks of the inputs of an analysis, written once for the plans (`plan_probe`, `plan_picture`,
`plan_report`) and the command line: input files, codes files, their labels
and splits. Standard library, JSON and h5py only, so that a mistake is answered before pandas,
scikit-learn or matplotlib is imported.

`what` names the value as the caller's user wrote it: a plan step passes its parameter's name
(`label`, `fit_split`) inside `errors.about`, and the command line shows its flag in its place
(`--label nope: ...`, `--fit-split test: ...`), so both say the same words.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from latentcode.analysis.labels import available_labels
from latentcode.errors import LatentcodeError, UsageError
from latentcode.safe_reads import prefixed


class MissingInput(LatentcodeError, FileNotFoundError):
    """An input file or directory that is not there."""


def check_input_file(path: str | Path, what: str) -> Path:
    """An existing, readable file (not a directory); `what` ("" for none) starts each message."""
    path = Path(path)
    named = prefixed(what, path)
    if not path.exists():
        raise MissingInput(f"{named} does not exist")
    if path.is_dir():
        raise UsageError(f"{named} is a directory; expected a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{named} cannot be read (no read permission)")
    return path


def open_codes_files(paths: Sequence[str | Path], what: str = "codes file") -> list:
    """The `CodeFile`s of `paths` (h5py only), each checked to exist, to be a readable codes file and
    to hold at least one example (a probe, picture or report of none has nothing to show)."""
    for path in paths:
        check_input_file(path, what)
    from latentcode.store import CodeFile

    files = [CodeFile(path) for path in paths]
    for file in files:
        if len(file) == 0:
            raise UsageError(f"{file.path} holds no examples (0 rows); expected a codes file with at least one "
                             "example (extract some, or --append them)")
    return files


def code_files_to_read(code_files, max_rows: int | None, seed: int, expected: str) -> list:
    """One codes file or several (paths or `CodeFile`s) opened and checked, each subsampled to at most
    `max_rows` examples per split with `seed` (None: all); none given is refused, saying `expected`."""
    from latentcode.store import CodeFile
    from latentcode.validation import check_integer

    files = [code_files] if isinstance(code_files, (str, Path, CodeFile)) else list(code_files)
    if not files:
        raise UsageError(f"no codes files given; expected {expected}")
    opened = open_codes_files([file for file in files if not isinstance(file, CodeFile)])
    files = [file if isinstance(file, CodeFile) else opened.pop(0) for file in files]
    if max_rows is not None:
        files = [file.subsample(check_integer("max_rows", max_rows, 1), seed) for file in files]
    return files


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


def check_label(code_file, spec: str, what: str) -> None:
    """The label spec names a per-example array of the file (its index is checked when read)."""
    if label_name(spec) not in available_labels(code_file):
        raise UsageError(f"{prefixed(what, spec)}: {code_file.path} has no label {label_name(spec)!r}; "
                         f"its labels are {available_labels(code_file)}")


def check_one_column(code_file, spec: str, what: str) -> None:
    """A label that colours points: one value per example (a multi-column label needs an index)."""
    name = label_name(spec)
    if spec.strip() != name or name not in code_file.label_names:
        return  # one column of a label, or a prediction: checked when read
    with code_file.open_hdf5() as file:  # a file, or codes in memory
        shape = file[f"labels/{name}"].shape[1:]
    if shape:
        raise UsageError(f"{prefixed(what, spec)}: label {name!r} has shape [N, {', '.join(map(str, shape))}]: colour "
                         f"by one column, e.g. {name}[0]")


def check_decodable(code_file, spec: str, what: str, split: str,
                    advice: str = "choose another --label or --fit-split") -> None:
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
            f"{prefixed(what, spec)}: every example of split {split!r} in {code_file.path} has the same value {same}; "
            f"a probe needs at least two classes to learn from ({advice})"
        )


def check_splits(code_file, splits: Mapping[str, str | None]) -> None:
    """Each `{what: split}` names a split of the codes file."""
    for what, split in splits.items():
        if split is not None and split not in code_file.splits:
            raise UsageError(f"{prefixed(what, split)}: {code_file.path} has no split {split!r}; its splits are "
                             f"{code_file.splits}")
