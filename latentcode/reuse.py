"""`code_reuse`: the code-reuse score of a trained model, its three parts measured end to end.

    from latentcode.reuse import code_reuse
    table = code_reuse("runs/fuzzy-hyla", codes="runs/fuzzy-hyla/codes/reuse.h5")
    table[["part", "value", "baseline", "excess"]]; table.attrs["score"]

What the parts and the combined score mean: `latentcode.analysis.reuse`. Here (a) decodability and (b)
reconstruction read the codes of the task's analysis sites on its analysis variant (fuzzy logic:
``last-self`` on ``fixed_query``), `n_codes` instances of ``train`` and of ``ood`` each, extracted into
`codes` (or read from it when it has both splits); (c) transplant patches the same sites from donor to base
in `n_pairs` pairs of `Task.transplant_pairs` on the run's training variant (`transfer_sweep`). It combines
extraction, intervention and analysis, as `latentcode.demo` does, so it lives at the package's top level.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latentcode.errors import LatentcodeError, about
from latentcode.validation import SEED_LIMIT, check_integer, check_output, check_output_stem

if TYPE_CHECKING:
    from latentcode.store import CodeFile

__all__ = ["ReusePlan", "code_reuse", "plan_reuse", "reuse_task_problem"]

SUFFIXES = (".csv", ".json")  # of the table `latentcode reuse --out STEM` writes


class CodeReuseError(LatentcodeError, ValueError):
    """A run or codes file the code-reuse score cannot be measured on; says why."""


@dataclass(frozen=True)
class ReusePlan:
    """The score of the finished run `run` (its `task`), its codes read from or extracted into `codes`;
    the table written at the stem `out` (None: returned only)."""

    run: Path
    task: Any
    codes: Path | CodeFile  # a path (read, or extracted into), or codes read already (a file's or in memory)
    n_codes: int = 2048
    n_pairs: int = 256
    seed: int = 0
    batch_size: int = 256
    out: Path | None = None
    overwrite: bool = False


def plan_reuse(run: str | Path, *, codes: str | Path | CodeFile, n_codes: int = 2048, n_pairs: int = 256, seed: int = 0,
               batch_size: int = 256, out: str | Path | None = None, overwrite: bool = False) -> ReusePlan:
    """The plan of `code_reuse` (and of `latentcode reuse`) with these arguments, or the first mistake in
    them, without torch: a finished run with weights, of a task the score applies to; sizes; a codes
    path that can be written, or codes already there of this run's model and sites; the table's stem."""
    from latentcode.provenance import check_codes_from_runs
    from latentcode.rundir import RunDirectory, RunRecord
    from latentcode.store import CodeFile
    from latentcode.tasks import get_task

    path = Path(run)
    with about("run"):
        if not (path.is_dir() and RunDirectory(path).looks_like_a_run()):
            raise CodeReuseError(f"{path} is not a run directory (config.json, model/); expected a finished run")
        record = RunRecord.read(path)
        task = get_task(**record.task_config)
        problem = reuse_task_problem(task)
        if problem:
            raise CodeReuseError(f"{path}: {problem}")
    sizes = [check_integer(name, value, 1, error=CodeReuseError)
             for name, value in (("n_codes", n_codes), ("n_pairs", n_pairs), ("batch_size", batch_size))]
    seed = check_integer("seed", seed, 0, SEED_LIMIT - 1, error=CodeReuseError)
    with about("codes"):
        given = codes if isinstance(codes, CodeFile) else None  # a codes file read, or codes in memory
        if given is not None and not {"train", "ood"} <= set(given.splits):
            raise CodeReuseError(f"{given.path} holds splits {given.splits}; the score reads train and ood codes: "
                                 "extract both into it, or give a path to extract them into")
        codes = given if given is not None else check_output(codes)
        if given is not None or codes.exists():  # codes of this run only (its weights' checksum, task, sites)
            existing, analysis = given or CodeFile(codes), task.analysis
            check_codes_from_runs([record], [existing])
            if existing.selector.get("name") not in (None, analysis.selector) or existing.selector.get(
                    "variant") not in (None, analysis.variant):
                raise CodeReuseError(f"{codes} holds codes of {existing.selector}; the score reads the task's "
                                     f"{analysis.selector} sites on its {analysis.variant} variant: give another "
                                     "codes path")
    if out is not None:
        with about("out"):
            out = check_output_stem(out, SUFFIXES, overwrite)
    return ReusePlan(path, task, codes, *sizes[:2], seed, sizes[2], out, overwrite)


def reuse_task_problem(task) -> str:
    """Why the score cannot be measured on `task` ("" if it can): it needs compositions that are sets
    of constituents, a multi-hot probe label, and held-out compositions."""
    if not task.provides("transplant_pairs"):
        from latentcode.tasks import task_class, task_names

        having = [name for name in task_names() if task_class(name).provides("transplant_pairs")]
        return (f"the code-reuse score needs a task whose compositions are sets of constituents "
                f"({', '.join(having)}); got {task.name!r}")
    if "ood" not in task.splits:
        return f"the code-reuse score needs held-out compositions (an 'ood' split); {task.name!r} has {task.splits}"
    return ""


def _arrays(code_file, label: str, split: str):
    import numpy as np

    codes = np.concatenate([code_file.layer_codes(layer, split) for layer in code_file.layers], axis=1)
    return codes.astype(np.float64), code_file.labels(label, split)


def code_reuse(run: str | Path, *, codes: str | Path | CodeFile, n_codes: int = 2048, n_pairs: int = 256, seed: int = 0,
               batch_size: int = 256, progress: bool = False):
    """The three parts and the combined score of the run `run` (module docstring), after the checks of
    `plan_reuse` (the command line's, too), as a pandas table with one row per part (columns of
    `ReusePart.row`, detail in ``note``); ``table.attrs``: ``score`` (the combined score), ``ood_r2`` (the
    run's final OOD R² where recorded), ``codes`` (the codes file), ``pairs`` (the transplant pairs' counts)."""
    import numpy as np
    import pandas as pd

    import latentcode
    from latentcode.analysis.reuse import combined_score, decodability_part, reconstruction_part, transplant_part
    from latentcode.intervention.patching import SiteGroup
    from latentcode.intervention.transfer import per_example, transfer_sweep
    from latentcode.sources.sites import parse_selector
    from latentcode.store import CodeFile

    plan = plan_reuse(run, codes=codes, n_codes=n_codes, n_pairs=n_pairs, seed=seed, batch_size=batch_size)
    record, task, codes = latentcode.Run(run), plan.task, plan.codes
    analysis = task.analysis
    if isinstance(codes, CodeFile):  # both splits are there (plan_reuse)
        code_file = codes
    else:
        splits_there = set(CodeFile(codes).splits) if codes.exists() else set()
        for split in ("train", "ood"):
            if split not in splits_there:
                latentcode.extract(run, sites=analysis.selector, split=split, n=n_codes, out=codes,
                                   variant=analysis.variant, append=codes.exists(), batch_size=batch_size,
                                   progress=progress)
        code_file = CodeFile(codes)
    codes_fit, constituents_fit = _arrays(code_file, analysis.probe_label, "train")
    codes_test, constituents_test = _arrays(code_file, analysis.probe_label, "ood")
    parts = [decodability_part(codes_fit, constituents_fit, codes_test, constituents_test, seed=seed),
             reconstruction_part(codes_fit, constituents_fit, codes_test, constituents_test, seed=seed)]

    model = record.load_model()
    model.eval()
    pairs = task.transplant_pairs(n_pairs, seed=seed, variant=record.config.variant)
    group = SiteGroup(parse_selector(analysis.selector, task))
    table = transfer_sweep(model, task, pairs, [group], relations=("different", "third"))
    follow_different = per_example(table, "different", "follow")[0]
    follow_third = per_example(table, "third", "follow")[0]
    row = table.iloc[0]
    parts.append(transplant_part(
        follow_different, follow_third, len(np.unique(pairs.base_part)),
        f"transfer {row['transfer']:.3f} ± {row['transfer se']:.3f} (s.e.); unpatched follow "
        f"{row['follow (unpatched)']:.3f}; sites {group.name}"))
    result = pd.DataFrame([part.row() for part in parts])
    result.insert(0, "model", Path(run).name)
    result.attrs.update(score=combined_score(parts), codes=str(code_file.path), pairs=dict(pairs.counts),
                        ood_r2=(record.summary or {}).get("final_metrics", {}).get("ood", {}).get("r2"))
    return result
