"""What several commands share after their plan's checks (standard library only): notes on what
they read (`note_caps`, `note_in_sample`), and outputs at a stem written as one set, refused where
they would replace a result unless --overwrite (`check_stem_free`, `command_outputs`). Inputs are
checked by `latentcode.analysis.checks`, outputs and resources by `latentcode.validation`, as the
Python API checks them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path


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
