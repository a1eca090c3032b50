"""`plan_probe`: everything a probe needs, resolved and checked before scikit-learn is imported.

    plan = plan_probe(["hyla.h5", "softmax.h5"], "rule", fit_split="train", test_split="ood")
    plan.code_files, plan.label          # what is decoded (views of at most max_rows rows a split)
    decode(plan.code_files, plan.label, plan.fit_split, plan.test_split)

`latentcode probe` builds this plan, and so do `decode` and `regress` before they read any codes: a
mistake gets the same message from both (`latentcode.analysis.checks`). Checked here: the codes files (there,
readable, of one task), the label (each file has it, and it is not one value for every example of
the fitting split), both splits, the folds and the output stem (writable, nothing replaced unless
`overwrite`). h5py only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from latentcode.analysis.checks import check_decodable, check_label, check_splits, code_files_to_read, default_label
from latentcode.errors import about
from latentcode.provenance import check_one_task
from latentcode.store import CodeFile
from latentcode.validation import check_output_stem


@dataclass(frozen=True)
class ProbePlan:
    """Probes of `label` fitted on `fit_split` and scored on `test_split` of `code_files`; the table
    (.csv, .json) and the plot (one file per format) at the stem `out` (None: nothing written)."""

    code_files: tuple[CodeFile, ...]
    label: str
    fit_split: str = "train"
    test_split: str = "ood"
    cv: int = 3
    seed: int = 0
    out: Path | None = None
    suffixes: tuple[str, ...] = ()
    overwrite: bool = False


def plan_probe(
    code_files: str | Path | CodeFile | Iterable[str | Path | CodeFile],
    label: str | None = None,
    fit_split: str = "train",
    test_split: str = "ood",
    *,
    cv: int = 3,
    seed: int = 0,
    max_rows: int | None = None,
    out: str | Path | None = None,
    formats: Sequence[str] = ("png",),
    overwrite: bool = False,
) -> ProbePlan:
    """The plan of `decode` or `regress` with these arguments (and of `latentcode probe`), or the first
    mistake in them.

    label: a label spec (None: the one the files' task decodes, `probe_label`). max_rows: read at most
    this many examples of each split of each file, drawn with `seed` (None: all). out: the stem of the
    table and plot to write (None: nothing is written), in `formats`."""
    files = code_files_to_read(code_files, max_rows, seed, "one or several (models side by side)")
    check_one_task(files)  # one label decoded in files of different tasks means different things
    label = default_label(files, label, "a label (label=, or --label)")
    for code_file in files:
        for parameter, split in (("fit_split", fit_split), ("test_split", test_split)):
            with about(parameter):
                check_splits(code_file, {"": split})
        with about("label"):
            check_label(code_file, label, "")
            check_decodable(code_file, label, "", fit_split, "choose another label or fit_split (--label, --fit-split)")
    suffixes = (".csv", ".json", *(f".{fmt}" for fmt in formats))
    if out is not None:
        with about("out"):
            out = check_output_stem(out, suffixes, overwrite)
    return ProbePlan(tuple(files), label, fit_split, test_split, cv, seed, out, suffixes, overwrite)
