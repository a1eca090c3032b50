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
from collections.abc import Iterator, Sequence
from pathlib import Path

from latentcode.analysis.checks import (  # noqa: F401 - shared with the plan steps of the analyses; named here too
    check_decodable,
    check_input_file,
    check_label,
    check_one_column,
    check_splits,
    default_label,
    label_name,
    open_codes_files,
)
from latentcode.errors import UsageError
from latentcode.validation import (  # noqa: F401 - shared with the plan steps of the Python API; named here too
    check_fits_in_memory,
    check_fits_on_disk,
    check_output,
    forward_pass_bytes,
    machine_memory,
)


# -- inputs ---------------------------------------------------------------------------------------
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
    as the plan steps check it (`latentcode.subject.checked_model_config`), named RUN_DIR."""
    from latentcode.errors import LatentcodeError
    from latentcode.rundir import locate_model
    from latentcode.subject import checked_model_config

    try:
        return checked_model_config(locate_model(path))
    except LatentcodeError as error:
        raise UsageError(f"RUN_DIR {error}") from None


def capped(code_files: Sequence, max_rows: int, seed: int = 0, command: str = "") -> list:
    """Views of `code_files` that read at most `max_rows` examples of each split (`CodeFile.subsample`),
    with a note on stdout for each split that is cut: the cap is never silent."""
    return note_caps([code_file.subsample(max_rows, seed) for code_file in code_files], seed, command)


def note_caps(views: Sequence, seed: int = 0, command: str = "") -> list:
    """A note on stdout for each split the views (`CodeFile.subsample`) cut; the views."""
    for view in views:
        for split, (total, kept) in view.subsampled.items():
            print(f"note: {view.path}: split {split!r} has {total:,} examples; {command or 'this command'} reads a "
                  f"random {kept:,} of them (seed {seed}; --max-rows sets the cap)", flush=True)
    return list(views)


def note_in_sample(fit_split: str, test_split: str) -> None:
    """Say so when a probe is scored on the split it was fitted on: its test score is not held out."""
    if fit_split == test_split:
        print(f"note: --fit-split and --test-split are both {fit_split!r}: the test score is in-sample (the probe "
              "is scored on the examples it was fitted on), not a held-out score; the validation column is "
              "held out (cross-validation folds)", flush=True)


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
        raise FileExistsError(f"{flag} {stem}: {', '.join(existing)} already exist; pass overwrite=True "
                              f"(--overwrite) to replace them, or choose another {flag}")


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
