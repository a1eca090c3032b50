"""Training runs: the loss goes down, kill-and-resume equals uninterrupted, faults are handled."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from latentcode.models import build_model
from latentcode.models.config import ConfigError
from latentcode.tasks import get_task
from latentcode.training import CheckpointError, Run, RunDirectoryError, TrainingDiverged, train
from latentcode.training.evaluate import eval_sets_of, evaluate


def max_parameter_difference(run_a: Run, run_b: Run) -> float:
    a, b = run_a.load_model(), run_b.load_model()
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("preset", ["fuzzy_logic", "sraven"])
def test_a_tiny_run_lowers_the_loss(tmp_path, small_config, preset):
    config = small_config(preset, n_train_instances=60 * 128, learning_rate=3e-3)
    task = get_task(**config.task)
    eval_sets = {"train": eval_sets_of(task, 512)["train"]}
    before = evaluate(build_model(config.model_config(), seed=config.seed), task, eval_sets)["train"]["loss"]
    run = train(config, tmp_path / "run", progress=False)
    after = run.final_metrics["train"]["loss"]
    if preset == "fuzzy_logic":  # 60 steps take fuzzy logic far below its initial MSE
        assert after < 0.8 * before, (before, after)
    else:
        # SRAVEN's cross-entropy per feature drops from an untrained model's (worse than guessing) to
        # the uniform guess over the n_values values, ln(n_values) (ln 8 = 2.08), which is all 60
        # steps can do: the exact figure, not only "lower".
        uniform = math.log(task.n_values)
        assert before > uniform + 0.1 and after == pytest.approx(uniform, abs=0.05), (before, after, uniform)
    records = run.metrics()
    assert {"train", "eval"} <= {r["event"] for r in records}
    train_record = next(r for r in records if r["event"] == "train")
    assert {"step", "loss", "lr", "instances_per_second"} <= set(train_record)
    eval_record = [r for r in records if r["event"] == "eval"][-1]
    assert set(eval_record["splits"]) == set(task.splits)
    config_json = json.loads((run.path / "config.json").read_text())
    assert config_json["train"]["seed"] == 0 and config_json["latentcode_version"]
    assert config_json["resolved_model_config"]["attention"] == "hyla"


def test_training_and_evaluation_draw_from_the_configured_variant(tmp_path, small_config, monkeypatch):
    from latentcode.tasks.sraven import SRaven

    drawn = []
    original = SRaven.sample

    def recording_sample(self, n, split, seed=0, variant=None):
        batch = original(self, n, split, seed, variant)
        drawn.append((split, batch.variant))
        return batch

    monkeypatch.setattr(SRaven, "sample", recording_sample)
    config = small_config("sraven", n_train_instances=4 * 128, variant="unpermuted")
    train(config, tmp_path / "run", progress=False)
    assert {split for split, _ in drawn} == {"train", "test", "ood"}
    assert {variant for _, variant in drawn} == {"unpermuted"}
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["variant"] == "unpermuted"


def test_kill_and_resume_ends_with_the_same_parameters(tmp_path, small_config):
    config = small_config(n_train_instances=30 * 128, checkpoint_every=7, eval_every=10)
    uninterrupted = train(config, tmp_path / "whole", progress=False)
    train(config, tmp_path / "killed", progress=False, stop_after_step=17)  # dies 3 steps after a checkpoint
    assert not (tmp_path / "killed" / "model").exists()
    resumed = train(resume=tmp_path / "killed", progress=False)
    assert max_parameter_difference(uninterrupted, resumed) <= 1e-7
    assert resumed.summary["resumed_from_step"] == 14
    steps = [r["step"] for r in resumed.metrics("train")]
    assert steps == sorted(steps) and len(steps) == len(set(steps)), "records after the checkpoint are not repeated"


@pytest.mark.slow
def test_a_process_killed_with_sigkill_resumes_to_the_same_parameters(tmp_path, small_config):
    config = small_config(n_train_instances=150 * 128, checkpoint_every=20, eval_every=1000, log_every=1000,
                          eval_instances=64)
    config_file = tmp_path / "config.json"
    config_file.write_text(config.to_json())
    command = [sys.executable, "-m", "latentcode.cli", "train", "--config", str(config_file), "--quiet"]
    process = subprocess.Popen([*command, "--out", str(tmp_path / "killed")])
    deadline = time.time() + 120
    while not (tmp_path / "killed" / "checkpoints" / "step_00000020").exists():
        assert process.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "killed" / "summary.json").exists()
    subprocess.run([sys.executable, "-m", "latentcode.cli", "train", "--resume", str(tmp_path / "killed"), "--quiet"],
                   check=True)
    uninterrupted = train(config, tmp_path / "whole", progress=False)
    assert max_parameter_difference(uninterrupted, Run(tmp_path / "killed")) <= 1e-7


def test_run_directory_is_never_reused_for_another_run(tmp_path, small_config):
    config = small_config()
    run = train(config, tmp_path / "run", progress=False)
    before = (run.path / "model" / "model.safetensors").read_bytes()
    with pytest.raises(RunDirectoryError, match="already holds a different run .*learning_rate"):
        train(config.replace(learning_rate=5e-3), tmp_path / "run", progress=False)
    with pytest.raises(RunDirectoryError, match="already holds this run, finished"):
        train(config, tmp_path / "run", progress=False)
    assert (run.path / "model" / "model.safetensors").read_bytes() == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirectoryError, match="not empty and holds no latentcode run"):
        train(config, tmp_path / "other", progress=False)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_corrupt_checkpoint_is_reported(tmp_path, small_config):
    config = small_config(checkpoint_every=5)
    train(config, tmp_path / "run", progress=False, stop_after_step=12)
    latest = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    (latest / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"cannot load checkpoint .*step_00000010.*remove it to resume"):
        train(resume=tmp_path / "run", progress=False)


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(tmp_path, small_config, monkeypatch):
    import latentcode.training.trainer as trainer

    real_loss = trainer.task_loss
    calls = {"n": 0}

    def loss_that_breaks(*args):
        calls["n"] += 1
        loss = real_loss(*args)
        return loss * float("nan") if calls["n"] == 9 else loss

    monkeypatch.setattr(trainer, "task_loss", loss_that_breaks)
    config = small_config(checkpoint_every=4)
    with pytest.raises(TrainingDiverged, match=r"the loss became nan at step 9 of 24"):
        train(config, tmp_path / "run", progress=False)
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints[-1] == "step_00000008"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1] == {"event": "diverged", "step": 9, "loss": records[-1]["loss"]}

    # The kept checkpoint loads into the run's model and holds the weights of step 8, untouched by
    # the NaN: those of a run without the fault, stopped after the same checkpoint.
    monkeypatch.undo()
    healthy = train(config, tmp_path / "healthy", progress=False, stop_after_step=9)
    kept = load_file(tmp_path / "run" / "checkpoints" / "step_00000008" / "model.safetensors")
    expected = load_file(healthy.path / "checkpoints" / "step_00000008" / "model.safetensors")
    build_model(config.model_config()).load_state_dict(kept, strict=True)
    assert kept.keys() == expected.keys()
    assert all(torch.equal(kept[name], expected[name]) for name in kept), "the kept weights are not step 8's"
    initial = build_model(config.model_config(), seed=config.seed).state_dict()
    assert any(not torch.equal(kept[name], initial[name]) for name in kept), "the checkpoint holds untrained weights"


@pytest.mark.slow
def test_two_cpu_processes_train_like_one_process_accumulating_two_micro_batches(tmp_path, small_config):
    """A torchrun launch on CPU is one data-parallel run: rank 0 alone writes the run directory,
    and its averaged gradients equal those of one process accumulating the same two half-batches."""
    config = small_config(n_train_instances=12 * 128, checkpoint_every=6, eval_every=1000, eval_instances=64,
                          attn_dropout=0.0)
    config_file = tmp_path / "config.json"
    config_file.write_text(config.to_json())
    # --standalone: the rendezvous takes a free port, so parallel runs of this test never collide.
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
              "-m", "latentcode.cli", "train", "--config", str(config_file), "--quiet", "--out", str(tmp_path / "ddp")]
    finished = subprocess.run(launch, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert finished.stdout.count("run finished") == 1
    distributed = Run(tmp_path / "ddp")
    assert distributed.summary["processes"] == 2
    accumulated = train(config.replace(gradient_accumulation_steps=2), tmp_path / "accumulated", progress=False)
    assert max_parameter_difference(distributed, accumulated) <= 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 autocast exists on this machine")
def test_fp16_without_a_gpu_is_refused_rather_than_silently_float32(tmp_path, small_config):
    with pytest.raises(ConfigError, match=r"mixed_precision='fp16' is not available on cpu; use 'bf16' or 'no'"):
        train(small_config(mixed_precision="fp16"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists(), "nothing is written for a refused run"


def test_bf16_autocast_trains_on_cpu(tmp_path, small_config):
    config = small_config(n_train_instances=4 * 128)
    bf16 = train(config.replace(mixed_precision="bf16"), tmp_path / "bf16", progress=False)
    float32 = train(config.replace(mixed_precision="no"), tmp_path / "float32", progress=False)
    assert math.isfinite(bf16.final_metrics["train"]["loss"])
    assert 0 < max_parameter_difference(bf16, float32) < 0.05, "bf16 autocast was not applied, or broke training"


@pytest.mark.parametrize("asked", [False, True])
def test_training_answers_mkls_cpu_check_only_where_asked_and_before_its_first_product(tmp_path, small_config,
                                                                                    monkeypatch, asked):
    """MKL keeps the code path of its first product for the process: train answers the check
    (latentcode.models.mkl_on_amd) before it builds the model, and only with LATENTCODE_MKL_ON_AMD=1."""
    from latentcode.models import mkl_on_amd
    from latentcode.training import trainer

    calls = []
    if asked:
        monkeypatch.setenv("LATENTCODE_MKL_ON_AMD", "1")
    monkeypatch.setattr(mkl_on_amd, "use_mkl_fast_paths", lambda: calls.append("answer") or "recorded")
    real_build = trainer.build_model
    monkeypatch.setattr(trainer, "build_model", lambda *a, **k: calls.append("build") or real_build(*a, **k))
    train(small_config(n_train_instances=2 * 128), tmp_path / "run", progress=False)
    assert calls[:2] == (["answer", "build"] if asked else ["build"]) and calls.count("answer") == int(asked)
