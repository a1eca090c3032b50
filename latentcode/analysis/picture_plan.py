"""`plan_picture`: what a figure of codes needs (an embedding, a similarity heatmap, a grid of code
samples), resolved and checked before matplotlib or scikit-learn is imported.

    plan = plan_picture("codes.h5", "rule", "figures/tsne", kind="tsne", split="ood")
    plot_embedding(plan.code_files[0], plan.label, plan.out, split=plan.split)

`latentcode plot`, `heatmap` and `samples` build this plan, and so do `plot_embedding`,
`plot_similarity` and `plot_code_samples` before they read any codes: a mistake gets the same
message from both (`latentcode.analysis.checks`). Checked here: the codes file(s), the label (each file has it; one
value per example for an embedding's colours), the split, the layer, and the figure's stem
(writable, no link followed, nothing replaced unless `overwrite`). h5py only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from latentcode.analysis.checks import (
    check_label,
    check_one_column,
    check_splits,
    code_files_to_read,
    default_label,
    label_name,
)
from latentcode.errors import UsageError, about
from latentcode.store import CodeFile
from latentcode.validation import check_output_stem

KINDS = ("tsne", "umap", "similarity", "samples")


@dataclass(frozen=True)
class PicturePlan:
    """A figure of `label` on `split` (None: every split) of `code_files`, at the stem `out` in
    `suffixes` (one file per format); `layer` for a grid of samples (None: the last)."""

    code_files: tuple[CodeFile, ...]
    label: str
    out: Path
    suffixes: tuple[str, ...]
    split: str | None = None
    layer: int | None = None
    overwrite: bool = False


def default_stem(code_file: CodeFile | str | Path, kind: str, label: str) -> Path:
    """FILE_<kind>_<label> beside the codes file: where a figure goes when no stem is given."""
    path = Path(code_file.path if isinstance(code_file, CodeFile) else code_file)
    return Path(str(path.with_suffix("")) + f"_{kind}_{label_name(label)}")


def plan_picture(
    code_files: str | Path | CodeFile | Iterable[str | Path | CodeFile],
    label: str | None = None,
    out: str | Path | None = None,
    *,
    kind: str,
    split: str | None = None,
    layer: int | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    formats: Sequence[str] = ("png",),
    overwrite: bool = False,
) -> PicturePlan:
    """The plan of one figure of `kind` ("tsne", "umap", "similarity" or "samples"), or the first mistake
    in its arguments.

    label: a label spec (None: the one the files' task colours by, `picture_label`). out: the figure's
    stem (None: `default_stem`), in `formats`. max_rows: read at most this many examples of each split,
    drawn with `seed` (None: all). overwrite: False refuses to replace a figure already there (the
    command line's default; the plotting functions always replace theirs)."""
    if kind not in KINDS:
        raise UsageError(f"kind={kind!r}; expected one of {list(KINDS)}")
    files = code_files_to_read(code_files, max_rows, seed, "one or several")
    label = default_label(files, label, f"a label (label=, or {'--color' if kind in ('tsne', 'umap') else '--label'})",
                          kind="picture_label")
    for code_file in files:
        with about("split"):
            check_splits(code_file, {"": split})
        with about("label"):
            check_label(code_file, label, "")
            if kind in ("tsne", "umap"):
                check_one_column(code_file, label, "")
        if layer is not None and layer not in code_file.layers:
            with about("layer"):
                raise UsageError(f"{layer}: {code_file.path} has no layer {layer}; its layers are {code_file.layers}")
    suffixes = tuple(f".{fmt}" for fmt in formats)
    with about("out"):
        out = check_output_stem(default_stem(files[0], kind, label) if out is None else out, suffixes, overwrite)
    return PicturePlan(tuple(files), label, out, suffixes, split, layer, overwrite)
