"""`plan_report`: everything a report needs, resolved and checked before pandas or matplotlib is imported.

    plan = plan_report(["runs/fuzzy-hyla"], out="report.html")
    plan.runs, plan.code_files, plan.patches, plan.out     # what the page shows, where it goes
    latentcode.analysis.report.run_report(plan)           # draws and writes it

`latentcode report` and `build_report(...)` build this plan, so a mistake gets the same message
from both (`latentcode.analysis.checks`). Checked here: that there is something to report, the run
directories and codes files (there, readable, of one task, the codes of the runs given), the outputs
of `latentcode patch` to show (whole, of the same task and model), the label to decode, the options,
and the page and its files' directory (writable, nothing already there replaced unless `overwrite`,
no link followed). JSON and h5py only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from latentcode.analysis.checks import MissingInput, check_input_file, check_label, default_label, open_codes_files
from latentcode.analysis.patch_outputs import PatchOutput, check_patch_provenance, read_patch_output
from latentcode.errors import LatentcodeError, OutputExistsError, about
from latentcode.files import check_replaceable
from latentcode.provenance import check_codes_from_runs, check_one_task, codes_of_runs
from latentcode.rundir import PRETRAINED_NAMES, RunRecord, is_pretrained
from latentcode.store import DEFAULT_MAX_ROWS, CodeFile
from latentcode.validation import check_integer, check_output

METHODS = ("tsne", "umap")
SEED = 0  # of the rows a report reads from a file larger than max_rows (`CodeFile.subsample`)


class ReportError(LatentcodeError, ValueError):
    """Inputs a report cannot be made from; says which and why."""


@dataclass(frozen=True)
class ReportPlan:
    """One report, resolved: `runs` and `code_files` (views of at most `max_rows` rows a split) drawn
    into the page `out`, its figures and tables in `files_dir`. `label` as given (None: each task's
    own label to decode and to colour by). `picture_label`: the label spec the pictures colour by, where
    it is not `label` (None: `label`, else the task's `picture_label`)."""

    runs: tuple[RunRecord, ...]
    run_dirs: tuple[Path, ...]
    code_files: tuple[CodeFile, ...]
    patches: tuple[PatchOutput, ...]
    out: Path
    files_dir: Path
    label: str | None = None
    fit_split: str = "train"
    test_split: str = "ood"
    embedding_split: str | None = None
    methods: tuple[str, ...] = ("tsne",)
    max_points: int = 1000
    title: str = "latentcode report"
    overwrite: bool = False
    notes: tuple[str, ...] = ()
    picture_label: str | None = None


def html_path(out: str | Path) -> Path:
    """`out`, with .html added unless it ends in .html or .htm (or is a directory): a page a browser opens."""
    out = Path(out)
    return out if out.suffix.lower() in (".html", ".htm") or out.is_dir() else out.with_name(out.name + ".html")


def files_dir_of(out: Path) -> Path:
    """Where the report at `out` keeps its figures and tables: NAME_files/ beside it."""
    return out.with_name(f"{out.stem}_files")


def check_report_outputs_free(out: Path, overwrite: bool) -> None:
    """The page and its files' directory replace nothing unless `overwrite` (checked by the plan, and
    again by `run_report` under the lock of `out`)."""
    files_dir = files_dir_of(out)
    with about("out"):
        if out.exists() and not overwrite:
            raise OutputExistsError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it, or "
                                    "choose another out")
        if files_dir.is_symlink() or (files_dir.exists() and not files_dir.is_dir()):
            raise ReportError(f"{out}: {files_dir} (where the report's figures go) is not a directory; remove it or "
                              "choose another out")
        if files_dir.is_dir() and any(files_dir.iterdir()) and not overwrite:
            raise OutputExistsError(f"{out}: {files_dir} already holds files; pass overwrite=True (--overwrite) to "
                                    "replace the report's files in it, or choose another out")


def plan_report(
    run_dirs: Sequence[str | Path] = (),
    codes_files: Sequence[str | Path] = (),
    out: str | Path = "report.html",
    *,
    label: str | None = None,
    fit_split: str = "train",
    test_split: str = "ood",
    embedding_split: str | None = None,
    methods: Sequence[str] = ("tsne",),
    max_points: int = 1000,
    title: str = "latentcode report",
    overwrite: bool = False,
    notes: Sequence[str] = (),
    patches: Sequence[str | Path] = (),
    max_rows: int = DEFAULT_MAX_ROWS,
    picture_label: str | None = None,
) -> ReportPlan:
    """The plan of `build_report` with these arguments, or the first mistake in them (arguments as
    `build_report` takes them)."""
    if not isinstance(title, str):
        raise ReportError(f"title={title!r}; expected the page's title as text")
    run_dirs, codes_files, patches = (_as_list(value) for value in (run_dirs, codes_files, patches))
    with about("methods"):
        unknown = [method for method in methods if method not in METHODS]
        if unknown or isinstance(methods, str):
            raise ReportError(f"methods={methods!r}; expected a list of embeddings among {list(METHODS)}")
    max_points = check_integer("max_points", max_points, 1, error=ReportError)
    max_rows = check_integer("max_rows", max_rows, 1, error=ReportError)
    models, run_dirs = _check_inputs_exist(run_dirs, codes_files, patches)
    with about("run_dirs"):
        runs = [RunRecord.read(run_dir) for run_dir in run_dirs]
    with about("codes_files" if codes_files else "run_dirs"):
        files = open_codes_files(codes_files, "") if codes_files else open_codes_files(codes_of_runs(runs))
    code_files = [code_file.subsample(max_rows, SEED) for code_file in files]
    # Numbers side by side must be comparable: one task, and codes of the runs they are shown with.
    check_one_task(code_files, runs)
    check_codes_from_runs(runs, code_files)
    with about("run_dirs"):
        for model in models:
            check_codes_from_pretrained(model, code_files)
    notes = (*notes, *(f"The codes come from the pretrained model {model}: it has no training run, hence no training "
                       "curves or metrics." for model in models))
    with about("patches"):  # damaged, or of another task or model: refused before any work
        outputs = [read_patch_output(stem, "") for stem in patches]
        for output in outputs:
            check_patch_provenance(output, code_files, runs, "")
    if code_files:
        for what, spec in (("label", default_label(code_files, label, "a label (label=, or --label)")),
                           ("picture_label", picture_label)):
            for code_file in code_files if spec is not None else ():
                with about(what):
                    check_label(code_file, spec, what)
    out = html_path(out)
    with about("out"):
        check_output(out)
    for output in outputs:  # where the map's copy goes: never through a planted link
        with about("patches"):
            check_replaceable(files_dir_of(out) / f"patch_{output.stem.name}.png", "")
    check_report_outputs_free(out, overwrite)
    return ReportPlan(tuple(runs), tuple(map(Path, run_dirs)), tuple(code_files), tuple(outputs), out,
                      files_dir_of(out), label, fit_split, test_split, embedding_split, tuple(methods), max_points,
                      title, overwrite, tuple(notes), picture_label)


def _check_inputs_exist(run_dirs: list, codes_files: list, patches: list) -> tuple[list[str], list]:
    """The pretrained models among `run_dirs` and the training runs; refuses inputs that do not exist
    (a pretrained model without codes files: it has nothing to show without them)."""
    if not run_dirs and not codes_files:
        raise ReportError("latentcode report needs RUN_DIR arguments, --codes files, or both (in Python: run_dirs, "
                          "codes_files or both)")
    with about("run_dirs"):
        models = [str(run_dir) for run_dir in run_dirs if is_pretrained(run_dir)]
        run_dirs = [run_dir for run_dir in run_dirs if not is_pretrained(run_dir)]
        if models and not codes_files:
            raise ReportError(f"{models[0]} is a pretrained model: it has no training run, so its report shows its "
                              f"codes; extract them (latentcode extract {models[0]} --task seq_len=T --n N --out "
                              "CODES.h5) and give them with --codes CODES.h5 (in Python: codes_files)")
        for run_dir in run_dirs:
            if not Path(run_dir).exists():
                raise MissingInput(f"{run_dir} does not exist")
    with about("codes_files"):
        for path in codes_files:
            check_input_file(path, "")
    with about("patches"):
        for stem in patches:
            for suffix in (".csv", ".json"):
                check_input_file(f"{stem}{suffix}", "")
    return models, run_dirs


def check_codes_from_pretrained(model: str, code_files: Sequence[CodeFile]) -> None:
    """Each codes file shown beside the pretrained model `model` (a known name, a .gguf file or a
    Hugging Face directory, as `latentcode extract` takes it) was extracted from it: the name the
    extraction recorded, and where it recorded the model's path, that path."""
    path = Path(model)
    name = model if model in PRETRAINED_NAMES else path.stem if path.suffix == ".gguf" else path.name
    for code_file in code_files:
        recorded_path = str(code_file.attrs.get("model_path") or "")
        same_path = not recorded_path or model in PRETRAINED_NAMES or Path(recorded_path) == path.resolve()
        if code_file.model_name != name or not same_path:
            raise ReportError(f"{code_file.path} holds codes of {code_file.model_name!r}"
                              + (f" ({recorded_path})" if recorded_path else "")
                              + f", not of the pretrained model {model}; give codes files extracted from it "
                              f"(latentcode extract {model} ... --out CODES.h5)")


def _as_list(value) -> list:
    """One path, or several."""
    return [value] if isinstance(value, (str, Path)) else list(value or ())
