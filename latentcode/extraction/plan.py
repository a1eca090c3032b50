"""`plan_extract`: everything an extraction needs, resolved and checked before torch is imported.

    plan = plan_extract("runs/sraven-hyla", sites="sraven-rule", split="ood", n=8192, out="codes.h5")
    plan.subject, plan.inputs, plan.split, plan.variant, plan.sites    # what will be recorded
    latentcode.extraction.pipeline.run_extraction(plan)                # records it (torch)

The command line's check and `latentcode.extract` build the same plan, so a mistake gets the same message
from both (`errors.about` names the argument, the command line its flag). JSON, numpy and h5py only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latentcode.errors import OutputExistsError, UsageError, about
from latentcode.inputs import CorpusWindows, TaskInstances, inputs_of
from latentcode.sources.sites import MAX_ALL_PAIRS, Selector, SiteError
from latentcode.store import DEFAULT_COMPRESSION, InMemoryCodes, Site, check_compression
from latentcode.subject import Subject, subject_of
from latentcode.tasks import Task
from latentcode.validation import (
    check_fits_in_memory,
    check_fits_on_disk,
    check_integer,
    check_output,
    check_placement,
)


@dataclass(frozen=True)
class ExtractPlan:
    """One extraction, resolved: `n` instances of `inputs` (`split`, `variant`) of `subject` at `sites`
    into `out`; `compact`: every pair of every layer kept in a compact store beside the sites."""

    subject: Subject
    inputs: TaskInstances | CorpusWindows
    split: str
    variant: str | None
    sites_given: Any  # as the caller gave them (recorded in the file as the selector's spec)
    selector: Selector
    sites: tuple[Site, ...]
    n: int
    out: Path | InMemoryCodes | None  # None: new codes in memory; codes in memory: appended to
    score: str = "pattern"
    batch_size: int = 256
    seed: int = 0
    append: bool = False
    overwrite: bool = False
    compression: str | None = DEFAULT_COMPRESSION
    compact: bool = False
    wait_for_lock: float | None = 0.0
    extra: Mapping[str, Any] | None = None
    device: str | None = None  # None: cpu for a model loaded here, where it is for a model object
    dtype: str | None = None  # None: float32 for a model loaded here, its own for a model object


def plan_extract(
    run_or_model: Any,
    task: Task | Mapping[str, Any] | None = None,
    sites: str | Selector | list = "last-self",
    split: str | None = None,
    n: int = 8192,
    out: str | Path | InMemoryCodes | None = None,
    *,
    variant: str | None = None,
    score: str = "pattern",
    batch_size: int | None = None,
    seed: int | None = None,
    append: bool = False,
    overwrite: bool = False,
    extra: Mapping[str, Any] | None = None,
    compression: str | None = None,
    compact: bool | None = None,
    wait_for_lock: float | None = 0.0,
    device: str | None = None,
    dtype: str | None = None,
) -> ExtractPlan:
    """The plan of `latentcode.extract` with these arguments (see there for their defaults), or the first
    mistake in them. `run_or_model`: what `subject_of` takes (also a `ModelSource` or a Subject)."""
    with about("run_or_model"):
        subject = subject_of(run_or_model)
    with about("n"):
        n = check_integer("n", n, minimum=1)
    device, dtype = check_placement(device, dtype)
    if append and overwrite:
        raise UsageError("append=True (--append) adds to the output and overwrite=True (--overwrite) replaces it: "
                         "give one of them")
    compact = subject.compact_store if compact is None else compact
    if compact and not subject.compact_store:
        raise UsageError(f"compact=True (--compact): {subject.name} is a latentcode model, whose codes are read at its "
                         "hook points (its sigma is not always a softmax of queries and keys), so it has no compact "
                         "store; expected compact=False or None (a causal LM's codes have one)")
    with about("compression"):
        compression = ("none" if compact else DEFAULT_COMPRESSION) if compression is None else compression
        check_compression(compression)
    inputs = inputs_of(subject.task(task))
    with about("batch_size"):
        batch_size = check_integer("batch_size", inputs.batch_size if batch_size is None else batch_size, minimum=1)
    split = inputs.check_split(split)
    for name, values in (extra or {}).items():
        if len(values) != n:
            raise UsageError(f"extra array {name!r} has {len(values)} rows; expected n={n}, one per instance")
    selector, variant = inputs.selector(sites, variant)
    seq_len = inputs.seq_len
    if subject.n_ctx and seq_len > subject.n_ctx:
        with about("task"):
            raise UsageError(f"the task's seq_len={seq_len} is longer than the model accepts (n_ctx="
                             f"{subject.n_ctx}); expected seq_len <= {subject.n_ctx}")
    with about("sites"):
        resolved = selector.resolve(subject.n_layers, seq_len)
        if len(resolved) > MAX_ALL_PAIRS:
            raise SiteError(
                f"{selector.spec()!r} selects {len(resolved)} sites; a codes file holds one dataset per site, at "
                f"most {MAX_ALL_PAIRS}: select fewer (a layer, a row, a block), or record them in memory with "
                "Recorder, or sweep them with latentcode patch" + ("; the compact store rebuilds any other pair on "
                                                                   "demand" if compact else ""))
    batch, n_heads = min(batch_size, n), subject.n_heads
    check_fits_in_memory(subject.forward_pass_bytes(batch, seq_len) + 4 * batch * len(resolved) * n_heads,
                         f"a forward pass of {batch} sequences of {seq_len} (the smaller of n and batch size)")
    out = _checked_out(out, append, overwrite)
    size = f"{n} instances x {len(resolved)} sites x {n_heads} heads of float32 codes"
    with about("n"):
        if out is None or isinstance(out, InMemoryCodes):
            check_fits_in_memory(4 * n * len(resolved) * n_heads, size + " in memory")
        else:
            check_fits_on_disk(4 * n * len(resolved) * n_heads, out, compression, size)
    seed = inputs.default_seed(split) if seed is None else seed
    return ExtractPlan(subject, inputs, split, variant, sites, selector, tuple(resolved), n, out, score=score,
                       batch_size=batch_size, seed=seed, append=append, overwrite=overwrite, compression=compression,
                       compact=compact, wait_for_lock=wait_for_lock, extra=extra, device=device, dtype=dtype)


def _checked_out(out: str | Path | InMemoryCodes | None, append: bool, overwrite: bool
                 ) -> Path | InMemoryCodes | None:
    """A codes file that can be written at `out`: not there, or there and appended to (then it must
    be a codes file) or replaced; None: new codes in memory; codes in memory: appended to (into a new
    object: they stay as they are)."""
    with about("out"):
        if out is None:
            if append:
                raise UsageError("append=True adds to codes, but out=None starts new codes in memory; give the "
                                 "codes file, or the codes in memory, to add to as out")
            return None
        if isinstance(out, InMemoryCodes):
            if not append:
                raise UsageError(f"out is {out!r}; pass append=True to add to them (a new object comes back), or "
                                 "out=None for new codes in memory")
            return out
        out = check_output(out)
        if out.exists() and not (append or overwrite):
            raise OutputExistsError(f"{out} already exists; pass append=True (--append) to add examples to it, "
                                    "overwrite=True (--overwrite) to replace it, or choose another path")
        if out.exists() and append:
            from latentcode.store import CodeFile

            CodeFile(out)  # a damaged file or one that is no codes file is refused now
    return out
