"""`plan_extract`: everything an extraction needs, resolved and checked before torch is imported.

    plan = plan_extract("runs/sraven-hyla", sites="sraven-rule", split="ood", n=8192, out="codes.h5")
    plan.task, plan.split, plan.variant, plan.sites        # what will be recorded
    latentcode.extraction.pipeline.run_extraction(plan)    # records it (torch)

The command line's check builds this plan and its run executes it; `latentcode.extract` builds the
same plan, so a mistake gets the same message from both (`errors.about` names the argument; the
command line shows it as the flag the user typed). Checked here: the model (one loader:
`rundir.locate_model`), its config, the task, the split, the variant, the sites, the sizes (a
forward pass in memory, the codes on disk) and the output (writable, not there already unless
appended to or replaced, a codes file if appended to). JSON, numpy and h5py only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latentcode.errors import OutputExistsError, UsageError, about
from latentcode.rundir import ModelSource, locate_model
from latentcode.sources.sites import MAX_ALL_PAIRS, Selector, SiteError, parse_selector
from latentcode.store import DEFAULT_COMPRESSION, InMemoryCodes, Site, check_compression
from latentcode.subject import checked_model_config, task_of
from latentcode.tasks import Task
from latentcode.validation import (
    check_fits_in_memory,
    check_fits_on_disk,
    check_integer,
    check_output,
    check_placement,
    check_split,
    check_variant,
    forward_pass_bytes,
)

BATCH_SIZE = 256  # instances per forward pass, unless given
PRETRAINED_BATCH_SIZE = 1  # windows (of thousands of tokens) per forward pass of a pretrained model, unless given
PRETRAINED_SEQ_LEN = 512  # tokens per window of a pretrained model, unless the task says


@dataclass(frozen=True)
class ExtractPlan:
    """One extraction, resolved: `n` instances of `task`'s `split` (`variant`) at `sites` into `out`.

    For a pretrained model `task` is None, `variant` is None and `seq_len` is the window length
    (its sites are resolved when the model is loaded: `selector` holds them as given)."""

    source: ModelSource
    task: Task | None
    split: str
    variant: str | None
    sites_given: Any  # as the caller gave them (recorded in the file as the selector's spec)
    selector: Selector
    sites: tuple[Site, ...]
    n: int
    out: Path | InMemoryCodes | None  # None: new codes in memory; codes in memory: appended to
    score: str = "pattern"
    batch_size: int = 256
    seed: int | None = None
    append: bool = False
    overwrite: bool = False
    compression: str | None = DEFAULT_COMPRESSION
    wait_for_lock: float | None = 0.0
    extra: Mapping[str, Any] | None = None
    seq_len: int | None = None
    device: str | None = None  # None: cpu for a model loaded here, where it is for a model object
    dtype: str | None = None  # None: float32 for a model loaded here, its own for a model object


def plan_extract(
    run_or_model: str | Path | ModelSource,
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
    wait_for_lock: float | None = 0.0,
    device: str | None = None,
    dtype: str | None = None,
) -> ExtractPlan:
    """The plan of `latentcode.extract` with these arguments (see there), or the first mistake in
    them. `run_or_model`: a path or name (`rundir.locate_model`), or a `ModelSource` already located
    (a model object's). compression None: gzip, or none for a pretrained model's compact store;
    batch_size None: 256, or 1 window for a pretrained model."""
    with about("run_or_model"):
        source = run_or_model if isinstance(run_or_model, ModelSource) else locate_model(run_or_model)
    with about("n"):
        n = check_integer("n", n, minimum=1)
    device, dtype = check_placement(device, dtype)
    with about("batch_size"):
        if batch_size is None:  # a pretrained model's windows one at a time: memory, and a shard per process
            batch_size = PRETRAINED_BATCH_SIZE if source.kind == "pretrained" else BATCH_SIZE
        batch_size = check_integer("batch_size", batch_size, minimum=1)
    if append and overwrite:
        raise UsageError("append=True (--append) adds to the output and overwrite=True (--overwrite) replaces it: "
                         "give one of them")
    if source.kind == "pretrained":
        return _plan_pretrained(source, task, sites, split, n, out, score=score, batch_size=batch_size, seed=seed,
                                append=append, overwrite=overwrite, extra=extra, compression=compression,
                                wait_for_lock=wait_for_lock, device=device, dtype=dtype)
    with about("compression"):
        compression = DEFAULT_COMPRESSION if compression is None else compression
        check_compression(compression)
    with about("task"):
        task = task_of(source, task)
    with about("split"):
        split = check_split(task.analysis.held_out_split if split is None else split, task)
    for name, values in (extra or {}).items():
        if len(values) != n:
            raise UsageError(f"extra array {name!r} has {len(values)} rows; expected n={n}, one per instance")
    with about("sites"):
        selector = parse_selector(sites, task)
    with about("variant"):
        variant = check_variant(variant or selector.default_variant or task.variants[0], task)
        selector.check_variant(variant, task)
    model_config = checked_model_config(source)
    if task.seq_len > model_config.get("n_ctx", task.seq_len):
        with about("task"):
            raise UsageError(f"the task's seq_len={task.seq_len} is longer than the model accepts (n_ctx="
                             f"{model_config['n_ctx']}); expected seq_len <= {model_config['n_ctx']}")
    with about("sites"):
        resolved = selector.resolve(model_config["n_layers"], task.seq_len)
        if len(resolved) > MAX_ALL_PAIRS:
            raise SiteError(
                f"{selector.spec()!r} selects {len(resolved)} sites; a codes file holds one dataset per site, at "
                f"most {MAX_ALL_PAIRS}: select fewer (a layer, a row, a block), or record them in memory with "
                "Recorder, or sweep them with latentcode patch")
    batch = min(batch_size, n)
    n_heads = int(model_config.get("n_heads") or 1)
    check_fits_in_memory(forward_pass_bytes(batch, task.seq_len, model_config) + 4 * batch * len(resolved) * n_heads,
                         f"a forward pass of {batch} sequences of {task.seq_len} (the smaller of n and batch size)")
    out = _checked_out(out, append, overwrite)
    size = f"{n} instances x {len(resolved)} sites x {n_heads} heads of float32 codes"
    with about("n"):
        if out is None or isinstance(out, InMemoryCodes):
            check_fits_in_memory(4 * n * len(resolved) * n_heads, size + " in memory")
        else:
            check_fits_on_disk(4 * n * len(resolved) * n_heads, out, compression, size)
    return ExtractPlan(source, task, split, variant, sites, selector, tuple(resolved), n, out, score=score,
                       batch_size=batch_size, seed=seed, append=append, overwrite=overwrite, compression=compression,
                       wait_for_lock=wait_for_lock, extra=extra, device=device, dtype=dtype)






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


def pretrained_seq_len(task: Task | Mapping[str, Any] | None, default: int = PRETRAINED_SEQ_LEN) -> int:
    """The window length a pretrained extraction reads: `task["seq_len"]` (a mapping with nothing else
    but the language task's name), else `default`."""
    if task is None:
        return default
    if not isinstance(task, Mapping) or set(task) - {"seq_len", "name"} or task.get("name", "language") != "language":
        raise UsageError(f"a pretrained model reads windows of the language corpus: the task may give only seq_len "
                         f"(e.g. {{'seq_len': 2048}}, --task seq_len=2048), got {task!r}")
    return check_integer("seq_len", task.get("seq_len", default), minimum=1)  # "long", 64.5: refused, not cut


def _plan_pretrained(source: ModelSource, task, sites, split, n, out, **options) -> ExtractPlan:
    """A pretrained causal LM: its file or package, the split, the window length, the sites, the output."""
    from latentcode.pretrained import attention_shape, check_model_directory, resolve

    with about("run_or_model"):
        path = resolve(source.path)  # a missing SmolLM2 package is one line here
        if not path.exists():
            raise UsageError(f"{path} does not exist; expected a run directory, a model directory or a .gguf file")
        if path.is_dir():
            check_model_directory(path)  # weights, heads, no auto_map: one line before torch
        n_ctx = attention_shape(source.path).n_ctx  # a damaged .gguf header is one line here
    split = "validation" if split is None else split
    if split not in ("train", "validation"):
        with about("split"):
            raise UsageError(f"unknown split {split!r} for a pretrained model: it reads the language corpus's train "
                             "or validation split")
    with about("task"):
        seq_len = pretrained_seq_len(task)
        if n_ctx and seq_len > n_ctx:
            raise UsageError(f"seq_len={seq_len} is beyond the context of {source.path} ({n_ctx} positions); "
                             f"expected <= {n_ctx}")
    with about("sites"):
        selector = parse_selector(sites)
    if options["compression"] is None:
        options["compression"] = "none"
    with about("compression"):
        check_compression(options["compression"])
    out = _checked_out(out, options["append"], options["overwrite"])
    return ExtractPlan(source, None, split, None, sites, selector, (), n, out, seq_len=seq_len, **options)
