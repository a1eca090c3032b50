"""`extract`: a model's latent codes on what it reads, streamed into an HDF5 codes file or kept in memory.

    latentcode.extract("runs/sraven-hyla", sites="sraven-rule", split="ood", n=8192, out="codes.h5")
    latentcode.extract("smollm2", task={"seq_len": 2048}, n=4, out="smollm2.h5")   # compact store too

One loop for every model (`run_extraction`): the plan's inputs (`latentcode.inputs`) are read batch by
batch, each forward pass runs under a `Recorder`, and its codes, labels, prediction and target go to the
writer. With `compact`, each layer's post-RoPE queries and keys go to the writer as its attention call
returns (`CompactWriting`), so memory never holds `[H, T, T]`. Launched as several processes, each records
a contiguous share of the batches into its own shard and rank 0 writes `out` over them (`record_in_shards`;
docs/how-to/extract.md, "Several processes").
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from latentcode.errors import LatentcodeError, UsageError
from latentcode.extraction.plan import ExtractPlan, plan_extract
from latentcode.extraction.recorder import Recorder
from latentcode.progress import Progress
from latentcode.sources.compact_capture import CompactAttentionSource, CompactError, CompactLayer
from latentcode.sources.sites import Selector
from latentcode.store import CodeWriter, InMemoryCodes, shard_path, write_sharded_file
from latentcode.store.compact import COMPACT_VERSION, KEY_VALID, key_name, query_name
from latentcode.subject import Loaded
from latentcode.tasks import Task


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


def _in_every_process(step: Callable[[], Any] | None, what: str) -> None:
    """Run `step` (None: nothing to do in this process), then every process says whether its step failed:
    a failure anywhere is raised everywhere (the process that failed raises its own error), so that no
    process goes on, or waits, alone."""
    error = None
    try:
        if step is not None:
            step()
    except Exception as failure:  # noqa: BLE001 - raised below, in every process
        error = failure
    distributed = torch.distributed
    messages: list[str | None] = [None] * distributed.get_world_size()
    distributed.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    for rank, message in enumerate(messages):
        if message:
            raise ShardFailed(f"process {rank} of {len(messages)} failed {what}: {message}")


def extract(
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
    extra: Mapping[str, np.ndarray] | None = None,
    progress: bool = True,
    compression: str | None = None,
    compact: bool | None = None,
    wait_for_lock: float | None = 0.0,
    device: str | Any | None = None,
    dtype: str | Any | None = None,
) -> Path | InMemoryCodes:
    """Record the latent codes of `n` instances of `split` at `sites` into `out`, or in memory.

    run_or_model: a run directory, a saved model directory, a latentcode model object, or a causal LM
        (`latentcode.pretrained`: a Hugging Face directory, a .gguf file, "smollm2", or a `Pretrained`).
    task: a Task, a task config dict, or None to use the run's task; a causal LM reads windows of the
        language corpus, whose length `task` may give (e.g. {"seq_len": 2048}; default 512).
    split: a split of the task; None: its held-out split (`ood`; `validation` for language and a
        causal LM's windows).
    sites: see `latentcode.sources.sites` (`last-self`, `sraven-rule`, `all-pairs:L`, lists).
    variant: the task variant (default: the sites', e.g. `unpermuted` for `sraven-rule`, else
        the task's default).
    batch_size: instances per forward pass (None: 256; 1 window for a causal LM).
    extra: further per-example arrays of length n to store beside the codes.
    compact: keep every pair of every layer in a compact store (/compact: queries and keys) beside the
        sites; None: where the model has one (a causal LM; not a latentcode Transformer).
    compression: of a new file: "gzip" (any HDF5 tool reads it), "lzf" or "none"; None: none for a
        compact store (queries and keys barely compress, and a row reads back faster), else gzip.
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
    """
    plan = plan_extract(run_or_model, task, sites, split, n, out, variant=variant, score=score, batch_size=batch_size,
                        seed=seed, append=append, overwrite=overwrite, extra=extra, compression=compression,
                        compact=compact, wait_for_lock=wait_for_lock, device=device, dtype=dtype)
    return run_extraction(plan, progress=progress)


def run_extraction(plan: ExtractPlan, *, progress: bool = True) -> Path | InMemoryCodes:
    """Record what `plan` (from `plan_extract`) says, for every model alike."""
    check_sharded_output(plan.out, plan.append, plan.overwrite)  # before the model loads: in every process alike
    loaded = plan.subject.load(plan.device, plan.dtype, progress=progress)
    inputs, split, n, batch_size, sites = plan.inputs, plan.split, plan.n, plan.batch_size, list(plan.sites)
    n_heads, n_layers = plan.subject.n_heads, plan.subject.n_layers
    writers: list[CodeWriter] = []  # the writer of the shard being recorded, for the compact store's layers
    compact = CompactWriting(loaded, inputs.seq_len, lambda: writers[-1]) if plan.compact else None
    recorder = Recorder(loaded.model, sites, score=plan.score, source=compact.source if compact else None)
    metadata = {
        **loaded.identity,
        "model_dtype": loaded.dtype_name,
        **inputs.description(loaded, split),
        "selector": inputs.selector_record(plan.sites_given, plan.selector, [[s.layer, s.query, s.key] for s in sites],
                                           plan.variant),
        "score": plan.score,
        "source": recorder.source.name,
        "seed": plan.seed,
        "compact": compact.info if compact else {},
    }

    def record(path: Path | bytes | None, batches: range, append: bool, progress: bool) -> bytes | None:
        writer = CodeWriter(path, sites, n_heads, metadata, append=append, overwrite=plan.overwrite,
                            compression=plan.compression, wait_for_lock=plan.wait_for_lock)
        writers.append(writer)
        with writer:
            # Only once the writer has accepted `path`, so that a refusal prints nothing.
            tracker = Progress(len(batches), f"extract {split}", unit="batch", enabled=progress)
            instances = min(n, batches.stop * batch_size) - batches.start * batch_size
            where = "memory" if path is None or isinstance(path, bytes) else path
            tracker.announce(f"{instances} instances{f' ({plan.variant})' if plan.variant else ''} in {len(batches)} "
                             f"batches of up to {batch_size} sequences of {inputs.seq_len}, {len(sites)} sites x "
                             f"{n_heads} heads of float32 codes ({_size(4 * instances * len(sites) * n_heads)}) -> "
                             f"{where}" + (", every pair of every layer in a compact store" if compact else ""))
            rows = inputs.batches(loaded, split, n, plan.seed, plan.variant, batch_size, batches, sites)
            with recorder, torch.no_grad():
                for index, (x, kept) in zip(tracker.track(batches), rows, strict=True):
                    start = index * batch_size
                    extra = {name: np.asarray(values)[start : start + len(x)] for name, values in
                             (plan.extra or {}).items()}
                    record_batch(loaded, x, kept, recorder, writer, inputs.n_predictions, extra)
                    _check_every_layer_read(loaded, recorder.source.n_layers(), n_layers)
        return writer.image

    return record_in_shards(plan.out, math.ceil(n / batch_size), record, append=plan.append, overwrite=plan.overwrite,
                            wait_for_lock=plan.wait_for_lock, progress=progress)


def record_batch(loaded: Loaded, x: np.ndarray, kept: Mapping[str, Any], recorder: Recorder, writer: Any,
                 n_predictions: int = 0, extra: Mapping[str, np.ndarray] | None = None) -> None:
    """One forward pass of inputs `x` under `recorder` (call under torch.no_grad) and one append to
    `writer`: the codes, what `kept` holds of the batch (labels, split, target, extra) and the
    prediction at the last `n_predictions` positions (none if 0)."""
    logits = loaded.last_logits(torch.from_numpy(x).to(loaded.device), max(n_predictions, 1))
    writer.append(codes=recorder.pop(), **{**kept, "extra": {**(extra or {}), **kept.get("extra", {})}},
                  prediction=logits.float().cpu().numpy() if n_predictions else None)


class CompactWriting:
    """The compact store as an option of the loop: `source` (a `CompactAttentionSource` on `loaded`'s
    model) hands every layer's queries and keys to the writer `writer()` as its attention call returns;
    `info`, the file's `compact` attribute. For a causal LM (`loaded.pretrained`) read at SDPA calls or
    transformers' eager registry."""

    def __init__(self, loaded: Loaded, seq_len: int, writer: Callable[[], CodeWriter]):
        pretrained = loaded.pretrained
        implementation = getattr(pretrained.model.config, "_attn_implementation", "sdpa")
        if implementation not in ("sdpa", "eager"):  # load_pretrained loads one of these; a Pretrained built by hand
            raise CompactError(f"{pretrained.name} runs with {implementation!r} attention; latentcode reads "
                               "scaled_dot_product_attention and transformers' eager attention exactly: load it with "
                               "attn_implementation='sdpa' or 'eager'")
        self.info = {"version": COMPACT_VERSION, "layers": list(range(pretrained.n_layers)),
                     "n_heads": pretrained.n_heads, "n_kv_heads": pretrained.n_kv_heads,
                     "head_dim": pretrained.head_dim, "seq_len": seq_len}
        self.writer = writer
        self.source = CompactAttentionSource(loaded.model, self.on_layer)

    def on_layer(self, layer: int, call: CompactLayer) -> None:
        info = self.info
        if call.query.shape[1:] != (info["n_heads"], info["seq_len"], info["head_dim"]) or \
                call.key.shape[1] != info["n_kv_heads"]:
            raise CompactError(f"attention call {layer}: queries {list(call.query.shape)}, keys "
                               f"{list(call.key.shape)}; expected {info['n_heads']} query and {info['n_kv_heads']} "
                               f"key/value heads of {info['head_dim']} over {info['seq_len']}")
        writer = self.writer()
        writer.write_compact(query_name(layer), call.query, call.mask.attributes())
        writer.write_compact(key_name(layer), call.key)
        if layer == 0:
            writer.write_compact(KEY_VALID, call.key_valid)


def _check_every_layer_read(loaded: Loaded, layers_read: int | None, n_layers: int) -> None:
    """One line where a forward pass made fewer attention calls than the model has layers (attention that
    latentcode does not read), which would otherwise shift the layers of the codes."""
    if layers_read is not None and layers_read != n_layers:
        config = loaded.model.config
        raise CompactError(
            f"{loaded.name} ({getattr(config, 'model_type', '?')}, {getattr(config, '_attn_implementation', '?')} "
            f"attention): {layers_read} of its {n_layers} layers made an attention call latentcode reads "
            "(scaled_dot_product_attention, or transformers' eager attention through its registry); the others "
            "compute attention in a way that is not read exactly, so no codes are recorded")


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
        _in_every_process(partial(record, shard_path(out, rank, world_size), share(rank), False, progress and rank == 0)
                          if share(rank) else None, "recording its shard")
        _in_every_process(partial(write_sharded_file, out, shards, overwrite=overwrite, wait_for_lock=wait_for_lock)
                          if rank == 0 else None, f"writing {out} over the shards")
    return out


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e3:.0f} kB" if n_bytes < 1e6 else f"{n_bytes / 1e6:.1f} MB" if n_bytes < 1e9 else \
        f"{n_bytes / 1e9:.2f} GB"
