"""The training loop: accelerate drives devices, precision, accumulation and data parallelism.

    run = train(build_train_config(preset, scale="cpu", attention="hyla"), "runs/hyla")

The same code runs on a laptop CPU, one GPU, `accelerate launch -m latentcode.cli train ...` on
several GPUs or machines, or `torchrun --nproc_per_node N -m latentcode.cli train ...` as N CPU
processes. Each process draws its own shards of the on-the-fly data stream,
`task.sample(batch_size / processes / accumulation, "train", seed=(seed, step, 0, shard))` with
shard = process * accumulation + micro, so no data is stored, the stream position is the step
number, and 2 processes draw the same batch as 1 process accumulating 2 micro-batches.

Reproducibility: the model is initialized from `seed`, and every step reseeds torch's RNG (which
drives attention dropout) from `(seed, step, process)`. A run killed and resumed from a checkpoint
therefore takes exactly the steps an uninterrupted run takes: with the loop's own progress in its
checkpoints (`checkpoint.py`), a run killed at any moment resumes to the same weights, metrics rows,
final metrics and summary; one killed before its first checkpoint resumes from step 0.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from latentcode.errors import UsageError, about
from latentcode.files import give_umask_mode, write_error
from latentcode.models import build_model, mkl_on_amd
from latentcode.models.config import ConfigError
from latentcode.rundir import RunDirectory, RunDirectoryError
from latentcode.tasks import get_task
from latentcode.training.checkpoint import (
    CheckpointError,
    LoopState,
    load_checkpoint,
    recorded_train_config,
    refuse_pickles,
    save_checkpoint,
)
from latentcode.training.compute import compute_settings, kernel_passes
from latentcode.training.config import TrainConfig
from latentcode.training.evaluate import eval_sets_of, evaluate
from latentcode.training.objective import prediction_positions, task_loss, to_tensors
from latentcode.training.optimizer import build_optimizer
from latentcode.training.run import Run, read_train_config, run_record
from latentcode.training.schedule import build_scheduler
from latentcode.validation import check_output


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run stopped and its last good checkpoint is kept."""


def _make_accelerator(config: TrainConfig, device: str | None = None):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    mixed_precision = config.mixed_precision
    if mixed_precision == "auto":
        mixed_precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    if not os.environ.get("ACCELERATE_MIXED_PRECISION") and "LOCAL_RANK" not in os.environ:
        # Several runs in one process (tests, sequential sweeps) may ask for different settings.
        AcceleratorState._reset_state(reset_partial_state=True)
    handlers = []
    if config.model_config().ffn == "moe":
        from accelerate import DistributedDataParallelKwargs

        # Experts no token was routed to get no gradient in a step; DDP must expect that.
        handlers.append(DistributedDataParallelKwargs(find_unused_parameters=True))
    # accelerate treats several processes without a GPU (torchrun) as one unless told they are CPU workers.
    cpu_workers = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = Accelerator(mixed_precision=mixed_precision, kwargs_handlers=handlers,
                              cpu=cpu_workers or device == "cpu",
                              gradient_accumulation_steps=config.gradient_accumulation_steps)
    if device is not None and accelerator.device.type != device.partition(":")[0]:
        raise UsageError(f"device {device!r}: accelerate placed this process on {accelerator.device} (its launch "
                         "configuration decides); expected the device asked for")
    if accelerator.mixed_precision != "no" and not accelerator.native_amp:
        # accelerate would silently train in float32 (fp16 autocast needs a GPU).
        raise ConfigError(f"mixed_precision={config.mixed_precision!r} is not available on {accelerator.device.type}; "
                          "use 'bf16' or 'no' there")
    return accelerator


def _step_seed(seed: int, step: int, process: int) -> int:
    return int(np.random.SeedSequence([seed, step, process]).generate_state(1)[0])


class _Progress:
    """A tqdm bar on a terminal, plain log lines otherwise; nothing where not enabled."""

    def __init__(self, total: int, initial: int, enabled: bool):
        self.enabled, self.total, self.bar = enabled, total, None
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, step: int, loss: float, rate: float, lr: float) -> None:
        if self.bar is None:
            self.message(f"step {step}/{self.total}  loss {loss:.5g}  lr {lr:.3e}  {rate:.0f} instances/s")
        else:
            self.bar.n = step
            self.bar.set_postfix(loss=f"{loss:.4g}", inst_per_s=f"{rate:.0f}", lr=f"{lr:.2e}")

    def message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        elif self.enabled:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _format_metrics(metrics: dict[str, dict[str, float]]) -> str:
    shown = {split: [f"{key} {values[key]:.4f}" for key in ("r2", "accuracy", "loss") if key in values][:2]
             for split, values in metrics.items()}
    return " | ".join(f"{split}: {', '.join(parts)}" for split, parts in shown.items())


def train(
    config: TrainConfig | dict | str | Path | None = None,
    out: str | Path | None = None,
    *,
    resume: str | Path | None = None,
    progress: bool = True,
    stop_after_step: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
    device: str | None = None,
    dtype: str | None = None,
) -> Run:
    """Train a model as `config` says, into the run directory `out`; or continue `resume`.

    config: a TrainConfig (e.g. `build_train_config(preset, scale, attention)`), a dict of its fields
    or the path of a JSON file of them. out: None is runs/PRESET-ATTENTION-SCALE-seedSEED. Every
    argument is checked first, as `latentcode train` checks it (`training.plan.plan_train`).
    The run directory is locked for the whole run (`RunDirectory.lock`): a second `train` or
    `--resume` into it is refused with `latentcode.files.LockHeld`, naming the first.
    stop_after_step: stop (as if killed) once this many steps are done, without the final
        evaluation, checkpoint or model; for tests of resuming.
    on_step: called with (step, loss) after every optimizer step.
    device: "cpu" or "cuda" (None: accelerate's choice, a GPU where there is one). dtype: "bfloat16"
    or "float16" trains under autocast (the config's mixed_precision "bf16"/"fp16"; parameters and
    optimizer state stay float32), "float32" without; config.json and the compute record say which.
    """
    from latentcode.training.plan import plan_train

    plan = plan_train(config, out, resume=resume, device=device, dtype=dtype)
    return run_training(plan, progress=progress, stop_after_step=stop_after_step, on_step=on_step)


def run_training(plan, *, progress: bool = True, stop_after_step: int | None = None,
                 on_step: Callable[[int, float], None] | None = None) -> Run:
    """Train as `plan` (`training.plan.TrainPlan`) says: build its TrainConfig, lock the run
    directory, train. The arguments are `train`'s."""
    from latentcode.training.plan import default_run_directory

    config = plan.train_config()
    out = plan.out
    if plan.resume is None and out is None:
        with about("out"):
            out = check_output(default_run_directory(config), kind="directory")
    target = plan.resume if plan.resume is not None else out
    # Process 0 of a run holds the lock for all of its processes (torchrun / accelerate set RANK).
    holds_lock = os.environ.get("RANK", "0") == "0"
    with RunDirectory(target).lock(new=plan.resume is None) if holds_lock else contextlib.nullcontext():
        return _train(config, out, resume=plan.resume, progress=progress, stop_after_step=stop_after_step,
                      on_step=on_step, device=plan.device)


def _train(config, out, *, resume, progress, stop_after_step, on_step, device=None) -> Run:
    config, directory = _run_directory(config, out, resume)
    task = get_task(**config.task)
    accelerator = _make_accelerator(config, device)
    if mkl_on_amd.requested():  # asked for (LATENTCODE_MKL_ON_AMD=1): before the first product, which MKL keeps
        mkl_on_amd.use_mkl_fast_paths()
    # the allocator is the caller's: `latentcode train` keeps freed memory, a library call never changes it
    compute = compute_settings(accelerator.device, torch.get_default_dtype(), accelerator.mixed_precision)
    passes_before = kernel_passes()
    if resume is None and accelerator.is_main_process:
        directory.create(run_record(config) | {"compute": compute})
    accelerator.wait_for_everyone()
    started_with = directory.read_raw_config()["train"]  # recorded in every checkpoint

    model, optimizer, scheduler, loop = _model_and_optimizer(config, accelerator, directory, resume)
    forward = torch.compile(model) if config.compile else model
    start_step = loop.step
    if accelerator.is_main_process:  # every session's settings, a resumed one's too
        directory.append_metrics({"event": "compute", "step": start_step, **compute})

    n_processes = accelerator.num_processes
    micro_batch = config.batch_size // (n_processes * config.gradient_accumulation_steps)
    if micro_batch < 1:
        raise UsageError(f"batch_size={config.batch_size} is too small for {n_processes} processes x "
                         f"{config.gradient_accumulation_steps} accumulation steps")
    eval_sets = eval_sets_of(task, config.eval_instances, config.variant) if accelerator.is_main_process else {}
    bar = _Progress(config.steps, start_step, enabled=progress and accelerator.is_main_process)
    if start_step:
        bar.message(f"resuming {directory.path} at step {start_step} of {config.steps}")

    model.train()
    # Time counts training only, summed over the sessions of a resumed run.
    started = time.perf_counter() - loop.elapsed_seconds
    interval_start = time.perf_counter() - loop.interval_seconds
    interval_instances, interval_losses = loop.interval_instances, list(loop.interval_losses)
    last_metrics = loop.last_eval
    try:
        for step in range(start_step, config.steps):
            torch.manual_seed(_step_seed(config.seed, step, accelerator.process_index))
            step_loss = _step(config, task, accelerator, model, forward, optimizer, directory, step, micro_batch)
            scheduler.step()
            done = step + 1
            interval_instances += config.batch_size
            interval_losses.append(step_loss)
            if on_step is not None:
                on_step(done, step_loss)

            if done % config.log_every == 0 or done == config.steps:
                _log_interval(accelerator, directory, bar, optimizer, done, interval_start, interval_instances,
                              interval_losses, started)
                interval_start, interval_instances, interval_losses = time.perf_counter(), 0, []

            if stop_after_step is not None and done >= stop_after_step:
                return Run(directory.path)

            pause = time.perf_counter()
            if done % config.eval_every == 0 or done == config.steps:
                if accelerator.is_main_process:
                    last_metrics = evaluate(accelerator.unwrap_model(model), task, eval_sets, config.eval_batch_size)
                    directory.append_metrics({"event": "eval", "step": done, "splits": last_metrics})
                    bar.message(f"eval at step {done}: {_format_metrics(last_metrics)}")
                accelerator.wait_for_everyone()
            if done % config.checkpoint_every == 0 or done == config.steps:
                progress_now = LoopState(done, last_metrics, list(interval_losses), interval_instances,
                                         pause - interval_start, pause - started)
                _save_checkpoint(accelerator, directory, model, optimizer, scheduler, progress_now,
                                 config.keep_checkpoints, started_with)
            interval_start += time.perf_counter() - pause  # evaluation and checkpoints are not throughput
    finally:
        bar.close()

    if accelerator.is_main_process:
        _finish(accelerator, model, directory, config, resume, started, start_step, last_metrics, compute,
                passes_before)
    accelerator.wait_for_everyone()
    return Run(directory.path)


def _run_directory(config, out, resume):
    """The run's config and directory: a resumed run's own (unfinished, its config unchanged since it
    started), else a new directory at `out`."""
    if resume is None:
        return config, RunDirectory(out)
    directory = RunDirectory(resume)
    if directory.is_finished:  # checked by the plan too; here again under the run's lock
        raise RunDirectoryError(f"{resume} has already finished; nothing to resume")
    _check_config_unchanged(directory)
    return read_train_config(directory), directory


def _model_and_optimizer(config, accelerator, directory: RunDirectory, resume):
    """The model, optimizer and schedule, prepared by `accelerator`, and the loop's state: a fresh one,
    or a resumed run's latest checkpoint (its metrics cut back to that step)."""
    model = build_model(config.model_config(), seed=config.seed)
    optimizer = build_optimizer(model, config.learning_rate, config.weight_decay)
    scheduler = build_scheduler(optimizer, config.warmup_steps, config.steps, config.lr_final_fraction)
    model, optimizer = accelerator.prepare(model, optimizer)
    loop = LoopState()
    if resume is not None:
        loop = _load_latest_checkpoint(accelerator, directory, model, optimizer, scheduler, config.steps)
        if accelerator.is_main_process:
            _check_checkpoints_writable(directory)  # before hours of training, not at the next checkpoint
            directory.truncate_metrics(loop.step)
    return model, optimizer, scheduler, loop


def _log_interval(accelerator, directory: RunDirectory, bar, optimizer, done: int, interval_start: float,
                  interval_instances: int, interval_losses: list[float], started: float) -> None:
    """The interval's mean loss, learning rate and instances per second: in metrics.jsonl and on the bar."""
    seconds = time.perf_counter() - interval_start
    rate = interval_instances / seconds if seconds > 0 else float("nan")
    mean_loss = float(np.mean(interval_losses))
    lr = optimizer.param_groups[0]["lr"]
    if accelerator.is_main_process:
        directory.append_metrics({"event": "train", "step": done, "loss": mean_loss, "lr": lr,
                                  "instances_per_second": rate, "elapsed_seconds": time.perf_counter() - started})
    bar.update(done, mean_loss, rate, lr)


def _step(config, task, accelerator, model, forward, optimizer, directory: RunDirectory, step: int,
          micro_batch: int) -> float:
    """One optimisation step of `config.batch_size` instances (this process's shards of it, in
    `gradient_accumulation_steps` micro-batches); its mean loss. A loss that is not finite stops the run."""
    step_loss = 0.0
    for micro in range(config.gradient_accumulation_steps):
        # Shards of the batch are numbered across processes and accumulation steps alike, so a
        # run's data does not depend on how its batch is split (the 0 keeps older runs' seeds).
        shard = accelerator.process_index * config.gradient_accumulation_steps + micro
        batch = task.sample(micro_batch, "train", seed=(config.seed, step, 0, shard), variant=config.variant)
        x, y = to_tensors(batch, accelerator.device)
        with accelerator.accumulate(model):
            with accelerator.autocast():
                predictions = prediction_positions(forward(x), task.n_predictions)
            loss = task_loss(task.objective, predictions, y)
            if not torch.isfinite(loss):
                if accelerator.is_main_process:
                    directory.append_metrics({"event": "diverged", "step": step + 1, "loss": loss.item()})
                raise TrainingDiverged(
                    f"the loss became {loss.item()} at step {step + 1} of {config.steps}; the run stopped "
                    f"and its last good checkpoint is kept in {directory.checkpoints_path} "
                    "(lower the learning rate or set grad_clip_norm, then start a new run)"
                )
            accelerator.backward(loss)
            if accelerator.sync_gradients and config.grad_clip_norm is not None:
                accelerator.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        step_loss += loss.item() / config.gradient_accumulation_steps
    return step_loss


def _finish(accelerator, model, directory: RunDirectory, config, resume, started: float, start_step: int,
            last_metrics, compute: dict, passes_before: dict) -> None:
    """The main process saves the final model and writes summary.json (the kernels' passes this session)."""
    # A resumed run may find the model/ its killed session saved: the same weights, replaced.
    accelerator.unwrap_model(model).save(directory.model_path, overwrite=resume is not None)
    directory.write_summary({
        "steps": config.steps,
        "instances": config.steps * config.batch_size,
        "wall_seconds": time.perf_counter() - started,
        "resumed_from_step": start_step,
        "final_metrics": last_metrics,
        "processes": accelerator.num_processes,
        "compute": compute | {"kernel_passes": {name: count - passes_before[name]
                                                for name, count in kernel_passes().items()}},
    })


def _check_config_unchanged(directory: RunDirectory) -> None:
    """Refuse to resume a run whose config.json was edited since it started: the edit would be
    ignored by the checkpoint's optimizer state, or half applied, while the file claims it."""
    checkpoints = directory.checkpoints()
    recorded = recorded_train_config(checkpoints[-1]) if checkpoints else None
    if recorded is None:  # no checkpoint yet (resuming starts afresh), or one from before it was recorded
        return
    current = directory.read_raw_config()["train"]
    changed = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key, "(absent)"), current.get(key, "(absent)")
        if key == "notes" or old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changed += [f"{key}.{inner}: {old.get(inner, '(absent)')!r} -> {new.get(inner, '(absent)')!r}"
                        for inner in sorted(set(old) | set(new)) if old.get(inner) != new.get(inner)]
        else:
            changed.append(f"{key}: {old!r} -> {new!r}")
    if changed:
        raise RunDirectoryError(
            f"{directory.config_path} was changed since the run started ({'; '.join(changed)}); a resume continues "
            "the run with the settings it started with: restore them, or start a new run with the new settings"
        )


def _save_checkpoint(accelerator, directory: RunDirectory, model, optimizer, scheduler, loop: LoopState,
                     keep: int, train_config: dict | None = None) -> None:
    """The main process writes the checkpoint into a temporary directory of a random name, renamed
    into place when complete (every process holds the same model and optimizer state)."""
    if accelerator.is_main_process:
        final = directory.checkpoint_path(loop.step)
        directory.checkpoints_path.mkdir(parents=True, exist_ok=True)
        for dead in directory.checkpoints_path.glob(".tmp-*"):  # of a killed session: the run's lock is ours
            if dead.is_dir() and not dead.is_symlink():
                shutil.rmtree(dead, ignore_errors=True)
        # mkdtemp: a new directory of a random name, never a planted link; the umask's mode survives the rename
        try:
            temporary = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}.", dir=directory.checkpoints_path))
        except OSError as error:  # an immutable or read-only checkpoints directory
            raise write_error(error, final) from None
        give_umask_mode(temporary, directory=True)
        try:
            save_checkpoint(temporary, accelerator.unwrap_model(model), optimizer, scheduler, accelerator.scaler,
                            loop, train_config)
            if final.is_symlink() or (final.exists() and not final.is_dir()):
                raise RunDirectoryError(f"{final} is not a checkpoint directory; remove it to resume")
            if final.exists():
                shutil.rmtree(final)
            os.replace(temporary, final)
        except BaseException as error:
            shutil.rmtree(temporary, ignore_errors=True)
            if isinstance(error, OSError):
                raise write_error(error, final) from None
            raise
        directory.prune_checkpoints(keep)
    accelerator.wait_for_everyone()


def _check_checkpoints_writable(directory: RunDirectory) -> None:
    """A resumed run writes its next checkpoint beside the old ones: refuse now, in one line, a
    checkpoints directory that cannot take one (immutable, read-only, another owner's)."""
    try:
        directory.checkpoints_path.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".tmp-probe.", dir=directory.checkpoints_path))
    except OSError as error:
        raise write_error(error, directory.checkpoints_path) from None


def _load_latest_checkpoint(accelerator, directory: RunDirectory, model, optimizer, scheduler,
                            total_steps: int) -> LoopState:
    """Load the latest checkpoint into the live objects; a run without one starts again at step 0
    (its model is initialized from the seed, as the first session's was)."""
    refuse_pickles(directory.path)
    checkpoints = directory.checkpoints()
    if not checkpoints:
        return LoopState()
    latest = checkpoints[-1]
    try:
        loop = load_checkpoint(latest, accelerator.unwrap_model(model), optimizer, scheduler, accelerator.scaler)
        if loop.step > total_steps:
            raise CheckpointError(f"it records step {loop.step}, but the run has {total_steps} steps")
    except Exception as error:  # safetensors, torch and our own checks raise many types for bad files
        reason = " ".join(f"{type(error).__name__}: {error}".split())  # one line
        raise CheckpointError(
            f"cannot load checkpoint {latest}: it is corrupt or does not match this run's model and optimizer "
            f"({reason}); remove it to resume from an earlier checkpoint"
        ) from error
    return loop
