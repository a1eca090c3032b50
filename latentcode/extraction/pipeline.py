"""`extract`: a trained model's latent codes on task instances, streamed into an HDF5 codes file.

    latentcode.extract("runs/sraven-hyla", sites="sraven-rule", split="ood", n=8192, out="codes.h5")

Instances are drawn batch by batch with `task.sample(batch, split, seed=(seed, batch_index),
variant)`; the default `seed` is the split's evaluation seed, so every model is read on the same
instances. Per example the file holds the codes of every site, every task label, the model's
prediction at the last `task.n_recorded_predictions` prediction positions, the target, the split,
and any extra arrays passed. For SRAVEN, when all sites share one query position among the last M
tokens, the label `rule` is added: the rule that governs that query position (what the paper
decodes).

Sharded: launched as several processes (`torchrun --nproc_per_node 2 ...` or `accelerate launch`;
the launcher's RANK and WORLD_SIZE, or a running torch.distributed process group, say so), each
process records a contiguous share of the batches, rank by rank, into its own shard
`OUT.shard-RANK-of-WORLD.h5` beside `out`; after all have finished, rank 0 writes `out` as one codes
file of virtual datasets over the shards (`latentcode.store.write_sharded_file`). Batch `i` is drawn
from `(seed, i)` whichever process records it, so the file equals a one-process extraction row for
row. A failure in any process is raised in every process. A pretrained model's extraction
(`latentcode.extraction.pretrained_extract`) is sharded the same way (`record_in_shards`).

    torchrun --standalone --nproc_per_node 2 -m latentcode.cli -- extract RUN --n 8192 --out codes.h5

(`--`: torchrun would take extract's `--n` for an abbreviation of its own options; `--standalone`
picks a free port.) On CPU `accelerate launch` starts one process unless it is told to use MPI;
torchrun starts several.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from latentcode.errors import LatentcodeError, UsageError, about
from latentcode.extraction.plan import ExtractPlan, plan_extract
from latentcode.extraction.recorder import Recorder
from latentcode.progress import Progress
from latentcode.rundir import ModelSource
from latentcode.sources.sites import Selector
from latentcode.store import (
    DEFAULT_COMPRESSION,
    CodeWriter,
    InMemoryCodes,
    Site,
    shard_path,
    write_sharded_file,
)
from latentcode.subject import resolve_model, task_of
from latentcode.tasks import Batch, Task, eval_seed
from latentcode.validation import check_split, place


class ShardFailed(LatentcodeError):
    """Another process of a sharded extraction failed; says which and why."""


def distributed_position() -> tuple[int, int]:
    """(rank, world size) of this process among the processes of one launch: torch.distributed's
    when a process group is running, else what torchrun and accelerate launch set in the
    environment (RANK, WORLD_SIZE), else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    world_size, rank = os.environ.get("WORLD_SIZE", "1"), os.environ.get("RANK", "0")
    try:
        world_size, rank = int(world_size), int(rank)
    except ValueError:
        raise UsageError(f"the environment sets WORLD_SIZE={world_size!r} and RANK={rank!r}; expected integers, "
                         "as torchrun and accelerate launch set them") from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"the environment sets WORLD_SIZE={world_size} and RANK={rank}; expected "
                         "0 <= RANK < WORLD_SIZE")
    return rank, world_size


@contextlib.contextmanager
def _process_group():
    """The default torch.distributed process group: the running one, else one started here from the
    launcher's environment (gloo: only small Python objects pass through it) and ended on leaving."""
    distributed = torch.distributed
    if distributed.is_initialized():
        yield
        return
    if not distributed.is_available():
        raise UsageError("a sharded extraction needs torch.distributed, which this torch build lacks")
    distributed.init_process_group("gloo")
    try:
        yield
    finally:
        distributed.destroy_process_group()


def _raise_if_any_failed(error: BaseException | None, what: str) -> None:
    """Every process says whether its step failed; a failure anywhere is raised everywhere (the
    process that failed raises its own error), so that no process goes on, or waits, alone."""
    distributed = torch.distributed
    messages: list[str | None] = [None] * distributed.get_world_size()
    distributed.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    for rank, message in enumerate(messages):
        if message:
            raise ShardFailed(f"process {rank} of {len(messages)} failed {what}: {message}")




def resolve_task(task: Task | Mapping[str, Any] | None, info: Mapping[str, Any], split: str | None
                 ) -> tuple[Task, str]:
    """The task to read: `task` (a Task or its config), else the run's own (`info` from
    `resolve_model`); and the split: `split`, or None for the task's held-out split (`ood`, or
    language's `validation`); refuses a split the task does not have."""
    with about("task"):
        task = task_of(ModelSource("object", None, task_config=info["task_config"]), task)
    with about("split"):
        split = check_split(task.analysis.held_out_split if split is None else split, task)
    return task, split


def extract(
    run_or_model: str | Path | nn.Module,
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
    extra: Mapping[str, np.ndarray] | None = None,
    progress: bool = True,
    compression: str | None = DEFAULT_COMPRESSION,
    wait_for_lock: float | None = 0.0,
    device: str | Any | None = None,
    dtype: str | Any | None = None,
) -> Path | InMemoryCodes:
    """Record the latent codes of `n` instances of `split` at `sites` into `out`, or in memory.

    run_or_model: a run directory, a saved model directory, or a model object.
    task: a Task, a task config dict, or None to use the run's task.
    split: a split of the task; None: its held-out split (`ood`; `validation` for language).
    sites: see `latentcode.sources.sites` (`last-self`, `sraven-rule`, `all-pairs:L`, lists).
    variant: the task variant (default: the sites', e.g. `unpermuted` for `sraven-rule`, else
        the task's default).
    batch_size: instances per forward pass (None: 256; 1 window for a pretrained model).
    extra: further per-example arrays of length n to store beside the codes.
    compression: of a new file: "gzip" (default; any HDF5 tool reads it), "lzf" or "none".
    wait_for_lock: seconds to wait while another process writes `out` (default: refuse at once).
    out: the codes file to write; None (default): nothing is written, and the codes come back in
        memory as an `InMemoryCodes` (read like a `CodeFile`; `.save(path)` writes the file); codes
        in memory with append=True: a new `InMemoryCodes`, them and the new examples.
    device, dtype: where and in what the model runs ("cpu", "cuda", "cuda:1"; "float32", "bfloat16",
        "float16"); None: a model loaded here on the CPU in float32, a model object where and as it is
        (given, the object is moved and cast, as `nn.Module.to` does). Codes are float32 whatever the
        dtype; the file's root attribute `model_dtype` says which the model ran in.
    Returns the path of the written file, or the `InMemoryCodes`.

    Everything is checked first by `plan_extract` (the command line's check builds the same plan),
    then `run_extraction` records it.

    A pretrained causal LM (`latentcode.pretrained`: a Hugging Face directory, a .gguf file or
    "smollm2") is read on windows of the language corpus (`task` may give their length, e.g.
    {"seq_len": 2048}; default 512) into a file with a compact store of every pair of every layer
    (`latentcode.extraction.pretrained_extract`; split: train or validation, default validation).
    """
    model = None
    if isinstance(run_or_model, nn.Module):
        model, info = resolve_model(run_or_model)
        run_or_model = ModelSource("object", None, model_config=info["model_config"])
    plan = plan_extract(run_or_model, task, sites, split, n, out, variant=variant, score=score, batch_size=batch_size,
                        seed=seed, append=append, overwrite=overwrite, extra=extra, compression=compression,
                        wait_for_lock=wait_for_lock, device=device, dtype=dtype)
    return run_extraction(plan, model, progress=progress)


def run_extraction(plan: ExtractPlan, model: nn.Module | None = None, *, progress: bool = True
                   ) -> Path | InMemoryCodes:
    """Record what `plan` (from `plan_extract`) says; `model`: the model object of a plan made for one."""
    if plan.source.kind == "pretrained":
        from latentcode.extraction.pretrained_extract import extract_pretrained

        return extract_pretrained(
            plan.source.path, plan.split, plan.n, plan.seq_len, plan.out, selector=plan.sites_given,
            batch_size=plan.batch_size, seed=0 if plan.seed is None else plan.seed, score=plan.score,
            append=plan.append, overwrite=plan.overwrite, compression=plan.compression, progress=progress,
            wait_for_lock=plan.wait_for_lock, device=plan.device, dtype=plan.dtype)
    if model is None:
        model, info = resolve_model(plan.source)
    else:
        info = resolve_model(model)[1]
    place(model, plan.device, plan.dtype)  # checked by the plan (check_placement)
    task, split, variant, parsed, sites = plan.task, plan.split, plan.variant, plan.selector, list(plan.sites)
    n, batch_size, out, extra = plan.n, plan.batch_size, plan.out, plan.extra
    append, overwrite, compression, wait_for_lock = plan.append, plan.overwrite, plan.compression, plan.wait_for_lock
    seed = eval_seed(split) if plan.seed is None else plan.seed
    n_heads = model.config.sizes.n_heads
    recorder = Recorder(model, sites, score=plan.score)

    metadata = {
        **info,
        "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "task_config": task.config(),
        "selector": {"spec": plan.sites_given if isinstance(plan.sites_given, str) else parsed.name,
                     **parsed.to_dict(), "sites": [[s.layer, s.query, s.key] for s in sites], "variant": variant},
        "score": plan.score,
        "source": recorder.source.name,
        "task_analysis": task.analysis.to_dict(),
        "value_names": task.value_names(),
        "column_names": task.column_names(),
        "prediction_kind": task.prediction_kind(),
        "split_descriptions": getattr(task, "split_descriptions", {}),
        "position_names": task.position_names(),
        "token_names": task.token_names(),
        "seed": seed,
    }
    model.eval()

    def record(path: Path | bytes | None, batches: range, append: bool, progress: bool) -> bytes | None:
        writer = CodeWriter(path, sites, n_heads, metadata, append=append, overwrite=overwrite,
                            compression=compression, wait_for_lock=wait_for_lock)
        with writer:
            # Only once the writer has accepted `path`, so that a refusal prints nothing.
            tracker = Progress(len(batches), f"extract {split}", unit="batch", enabled=progress)
            instances = min(n, batches.stop * batch_size) - batches.start * batch_size
            tracker.announce(f"{instances} instances ({variant}) in {len(batches)} batches of up to {batch_size} "
                             f"sequences of {task.seq_len}, {len(sites)} sites x {n_heads} heads of float32 codes "
                             f"({_size(4 * instances * len(sites) * n_heads)}) -> {'memory' if path is None or isinstance(path, bytes) else path}")
            with recorder, torch.no_grad():
                for index in tracker.track(batches):
                    start = index * batch_size
                    size = min(batch_size, n - start)
                    batch = task.sample(size, split, seed=(seed, index), variant=variant)
                    record_batch(model, task, batch, recorder, writer, sites, {
                        name: np.asarray(values)[start : start + size] for name, values in (extra or {}).items()})
        return writer.image

    return record_in_shards(out, math.ceil(n / batch_size), record, append=append, overwrite=overwrite,
                            wait_for_lock=wait_for_lock, progress=progress)


def check_sharded_output(out: str | Path | InMemoryCodes | None, append: bool, overwrite: bool) -> None:
    """Refuse, in a launch of several processes, what a sharded file cannot do: append to `out`, or
    replace it without `overwrite`. Every process refuses alike, before any of them waits for another
    (call it before loading anything slow)."""
    world_size = distributed_position()[1]
    if world_size == 1:
        return
    if out is None or isinstance(out, InMemoryCodes):
        raise UsageError(f"out={out!r} keeps the codes in memory, but this launch has {world_size} processes, each of "
                         "which writes a shard file; give out, the file to write")
    if append:
        raise UsageError(f"append=True (--append) with {world_size} processes: a sharded file cannot be appended to; "
                         "extract into a new file")
    if Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it, or choose "
                              "another path")


def record_in_shards(out: str | Path | InMemoryCodes | None, n_batches: int,
                     record: Callable[[Path | bytes | None, range, bool, bool], bytes | None], *,
                     append: bool, overwrite: bool, wait_for_lock: float | None, progress: bool
                     ) -> Path | InMemoryCodes:
    """Record batches `0 .. n_batches - 1` into `out` with `record(path, batches, append, progress)`:
    in one process, all of them into `out`; in a launch of several, each process a contiguous share
    (rank by rank) into its shard `shard_path(out, rank, world)` (rank 0 alone shows progress), then
    rank 0 writes `out` over the shards. A failure in any process is raised in every process."""
    rank, world_size = distributed_position()
    if out is None or isinstance(out, InMemoryCodes):  # codes in memory: the writer's image, read back
        check_sharded_output(out, append, overwrite)
        image = record(None if out is None else out.image, range(n_batches), append, progress)
        assert image is not None, "a writer in memory leaves its image"
        return InMemoryCodes(image)
    out = Path(out)
    if world_size == 1:
        record(out, range(n_batches), append, progress)
        return out
    check_sharded_output(out, append, overwrite)

    def share(of_rank: int) -> range:  # contiguous batches; a rank left without any writes no shard
        return range(of_rank * n_batches // world_size, (of_rank + 1) * n_batches // world_size)

    shards = [shard_path(out, of_rank, world_size) for of_rank in range(world_size) if share(of_rank)]
    with _process_group():
        error = None
        try:
            if share(rank):
                record(shard_path(out, rank, world_size), share(rank), False, progress and rank == 0)
        except Exception as failure:  # noqa: BLE001 - raised below, in every process
            error = failure
        _raise_if_any_failed(error, "recording its shard")
        error = None
        if rank == 0:
            try:
                write_sharded_file(out, shards, overwrite=overwrite, wait_for_lock=wait_for_lock)
            except Exception as failure:  # noqa: BLE001 - raised below, in every process
                error = failure
        _raise_if_any_failed(error, f"writing {out} over the shards")
    return out


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e3:.0f} kB" if n_bytes < 1e6 else f"{n_bytes / 1e6:.1f} MB" if n_bytes < 1e9 else \
        f"{n_bytes / 1e9:.2f} GB"


def record_batch(
    model: nn.Module,
    task: Task,
    batch: Batch,
    recorder: Recorder,
    writer: CodeWriter,
    sites: list[Site],
    extra: Mapping[str, np.ndarray] | None = None,
) -> None:
    """One forward pass under `recorder` (call under torch.no_grad) and one append to `writer`."""
    device = next(model.parameters()).device
    output = model(torch.from_numpy(batch.x).to(device))
    vocabulary = task.token_names()
    if vocabulary:  # the input tokens, so that a key can be named by its token (the smallest integer type)
        extra = {**(extra or {}), "token_ids": batch.x.astype(np.uint8 if len(vocabulary) <= 256 else np.int32)}
    writer.append(
        codes=recorder.pop(),
        labels={**batch.labels, **task.derived_labels(batch, sites)},
        split=batch.split,
        prediction=output[:, -task.n_recorded_predictions:, :].float().cpu().numpy(),
        target=batch.y,
        extra=extra,
    )

