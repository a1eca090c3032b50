"""`extract`: a trained model's latent codes on task instances, streamed into an HDF5 codes file.

    latentcode.extract("runs/sraven-hyla", selector="sraven-rule", split="ood", n=8192, out="codes.h5")

Instances are drawn batch by batch with `task.sample(batch, split, seed=(seed, batch_index),
variant)`; the default `seed` is the split's evaluation seed, so every model is read on the same
instances. Per example the file holds the codes of every site, every task label, the model's
prediction at the last `task.n_recorded_predictions` prediction positions, the target, the split,
and any extra arrays passed. For SRAVEN, when all sites share one query position among the last M
tokens, the label `rule` is added: the rule that governs that query position (what the paper
decodes).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from latentcode.errors import UsageError
from latentcode.extraction.recorder import Recorder
from latentcode.extraction.sites import MAX_ALL_PAIRS, Selector, SiteError, parse_selector
from latentcode.rundir import RunDirectory, RunRecord
from latentcode.store import DEFAULT_COMPRESSION, CodeWriter, Site, check_compression
from latentcode.tasks import Batch, Task, eval_seed, get_task


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of_state(model: nn.Module) -> str:
    """SHA-256 of a model's weights as safetensors bytes (for models that were never saved)."""
    from safetensors.torch import save

    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    return hashlib.sha256(save(state)).hexdigest()


def resolve_model(run_or_model: str | Path | nn.Module) -> tuple[nn.Module, dict[str, Any]]:
    """The model and what the codes file records about it: name, config, checkpoint hash, task."""
    from latentcode.models import load_model
    from latentcode.models.persistence import WEIGHTS_FILE
    from latentcode.models.transformer import Transformer

    if isinstance(run_or_model, nn.Module):
        model = run_or_model
        if not isinstance(model, Transformer):
            raise TypeError(
                f"extract() reads latentcode models, got a {type(model).__name__}; for other models use "
                "latentcode.extraction.Recorder (it detects the source)"
            )
        return model, {
            "model_name": model.config.attention_name,
            "model_config": model.config.to_dict(),
            "checkpoint_sha256": sha256_of_state(model),
            "task_config": None,
        }
    path = Path(run_or_model)
    run = RunDirectory(path)
    if run.looks_like_a_run():
        model = load_model(run.model_path)
        weights = run.weights_path
        task_config = RunRecord.read(path).task_config
    elif (path / WEIGHTS_FILE).is_file():  # a saved model directory
        model = load_model(path)
        weights = path / WEIGHTS_FILE
        task_config = None
    else:
        raise FileNotFoundError(
            f"{path} is neither a finished run directory (with model/{WEIGHTS_FILE}) nor a model directory "
            f"(with {WEIGHTS_FILE})"
        )
    return model, {
        "model_name": model.config.attention_name,
        "model_config": model.config.to_dict(),
        "checkpoint_sha256": sha256_of_file(weights),
        "task_config": task_config,
    }


def resolve_task(task: Task | Mapping[str, Any] | None, info: Mapping[str, Any], split: str | None
                 ) -> tuple[Task, str]:
    """The task to read: `task` (a Task or its config), else the run's own (`info` from
    `resolve_model`); and the split: `split`, or None for the task's held-out split (`ood`, or
    language's `validation`); refuses a split the task does not have."""
    if task is None:
        if not info["task_config"]:
            raise UsageError("no task given and the model comes without a run directory; pass task=")
        task = get_task(**info["task_config"])
    elif isinstance(task, Mapping):
        task = get_task(**task)
    split = task.analysis.held_out_split if split is None else split
    if split not in task.splits:
        raise UsageError(f"unknown split {split!r} for task {task.name!r}; valid splits: {list(task.splits)}")
    return task, split


def extract(
    run_or_model: str | Path | nn.Module,
    task: Task | Mapping[str, Any] | None = None,
    selector: str | Selector | list = "last-self",
    split: str | None = None,
    n: int = 8192,
    out: str | Path = "codes.h5",
    *,
    variant: str | None = None,
    score: str = "pattern",
    batch_size: int = 256,
    seed: int | None = None,
    append: bool = False,
    overwrite: bool = False,
    extra: Mapping[str, np.ndarray] | None = None,
    progress: bool = True,
    compression: str | None = DEFAULT_COMPRESSION,
    wait_for_lock: float | None = 0.0,
) -> Path:
    """Record the latent codes of `n` instances of `split` at the `selector`'s sites into `out`.

    run_or_model: a run directory, a saved model directory, or a model object.
    task: a Task, a task config dict, or None to use the run's task.
    split: a split of the task; None: its held-out split (`ood`; `validation` for language).
    selector: see `latentcode.extraction.sites` (`last-self`, `sraven-rule`, `all-pairs:L`, lists).
    variant: the task variant (default: the selector's, e.g. `unpermuted` for `sraven-rule`, else
        the task's default).
    extra: further per-example arrays of length n to store beside the codes.
    compression: of a new file: "gzip" (default; any HDF5 tool reads it), "lzf" or "none".
    wait_for_lock: seconds to wait while another process writes `out` (default: refuse at once).
    Returns the path of the written file.
    """
    model, info = resolve_model(run_or_model)
    task, split = resolve_task(task, info, split)
    if n < 1:
        raise UsageError(f"n must be a positive number of instances, got {n}")
    if batch_size < 1:
        raise UsageError(f"batch_size must be positive, got {batch_size}")
    check_compression(compression)
    for name, values in (extra or {}).items():
        if len(values) != n:
            raise UsageError(f"extra array {name!r} has {len(values)} rows; expected n={n}, one per instance")

    parsed = parse_selector(selector, task)
    variant = variant or parsed.default_variant or task.variants[0]
    if variant not in task.variants:
        raise UsageError(f"unknown variant {variant!r} for task {task.name!r}; valid variants: {list(task.variants)}")
    seed = eval_seed(split) if seed is None else seed
    if task.seq_len > model.config.n_ctx:
        raise UsageError(f"the task's seq_len={task.seq_len} is longer than the model accepts (n_ctx="
                         f"{model.config.n_ctx}); expected seq_len <= {model.config.n_ctx}")
    sites = parsed.resolve(model.config.n_layers, task.seq_len)
    if len(sites) > MAX_ALL_PAIRS:
        raise SiteError(
            f"{parsed.spec()!r} selects {len(sites)} sites; a codes file holds one dataset per site, at most "
            f"{MAX_ALL_PAIRS}: select fewer (a layer, a row, a block), or record them in memory with Recorder, or "
            "sweep them with latentcode patch"
        )
    n_heads = model.config.sizes.n_heads
    recorder = Recorder(model, sites, score=score)

    metadata = {
        **info,
        "task_config": task.config(),
        "selector": {"spec": selector if isinstance(selector, str) else parsed.name, **parsed.to_dict(),
                     "sites": [[s.layer, s.query, s.key] for s in sites], "variant": variant},
        "score": score,
        "source": recorder.source.name,
        "task_analysis": task.analysis.to_dict(),
        "value_names": task.value_names(),
        "column_names": task.column_names(),
        "prediction_kind": task.prediction_kind(),
        "split_descriptions": getattr(task, "split_descriptions", {}),
        "seed": seed,
    }
    model.eval()
    batches = range(math.ceil(n / batch_size))
    with CodeWriter(out, sites, n_heads, metadata, append=append, overwrite=overwrite, compression=compression,
                    wait_for_lock=wait_for_lock) as writer:
        if progress:  # only once the writer has accepted `out`, so a refusal prints no bar
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc=f"extract {split}", unit="batch")
        with recorder, torch.no_grad():
            for index in batches:
                start = index * batch_size
                size = min(batch_size, n - start)
                batch = task.sample(size, split, seed=(seed, index), variant=variant)
                record_batch(model, task, batch, recorder, writer, sites,
                             {name: np.asarray(values)[start : start + size] for name, values in (extra or {}).items()})
    return Path(out)


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
    output = model(torch.from_numpy(batch.x))
    writer.append(
        codes=recorder.pop(),
        labels={**batch.labels, **task.derived_labels(batch, sites)},
        split=batch.split,
        prediction=output[:, -task.n_recorded_predictions:, :].float().numpy(),
        target=batch.y,
        extra=extra,
    )

