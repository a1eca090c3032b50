"""A run directory says which compute settings its sessions ran with (issue 46): config.json's `compute`,
a `compute` record in metrics.jsonl per session, and summary.json's `compute` with the forward passes
each compiled kernel ran, counted here independently (steps x layers)."""

import json

import pytest
import torch

from latentcode import allocator
from latentcode.training import train


def read(path):
    return json.loads(path.read_text())


def test_a_run_records_threads_kernels_allocator_mkl_torch_device_and_dtype(tmp_path, small_config, monkeypatch):
    monkeypatch.setattr(allocator, "_memory_kept", None)  # train() leaves the allocator as the caller set it
    config = small_config()
    run = train(config, tmp_path / "run", progress=False)
    compute = read(run.path / "config.json")["compute"]
    assert compute["torch_version"] == torch.__version__
    assert compute["device"] == "cpu" and compute["dtype"] == "float32" and compute["mixed_precision"] == "no"
    assert compute["torch_threads"] == torch.get_num_threads()
    assert compute["allocator"] == "the C library's own thresholds (keep_freed_memory not called)"
    assert compute["mkl"] == "MKL's own CPU check (the answer on AMD CPUs not asked for)"
    assert compute["kernels"] == {"fused_short": "fused", "fused_gelu": "fused", "fused_hyper": "fused"}
    events = [record for record in run.metrics() if record.get("event") == "compute"]
    assert events == [{"event": "compute", "step": 0, **compute}]
    summary = read(run.path / "summary.json")["compute"]
    layers = config.model_config().n_layers
    # training passes only (evaluation keeps the formula); short sequences: no blockwise hyper kernel
    assert summary.pop("kernel_passes") == {"fused_short": config.steps * layers, "fused_gelu": config.steps * layers,
                                            "fused_hyper": 0}
    assert summary == compute


def test_the_formula_switch_and_the_kept_allocator_are_recorded_and_a_resume_adds_its_session(
        tmp_path, small_config, monkeypatch):
    monkeypatch.setenv("LATENTCODE_KERNELS", "formula")
    monkeypatch.setattr(allocator, "_memory_kept", True)  # as after `latentcode train`'s keep_freed_memory()
    config = small_config(checkpoint_every=2)
    train(config, tmp_path / "run", progress=False, stop_after_step=3)  # its last checkpoint: step 2
    monkeypatch.delenv("LATENTCODE_KERNELS")
    run = train(resume=tmp_path / "run", progress=False)
    first = read(run.path / "config.json")["compute"]
    assert first["kernels"] == dict.fromkeys(("fused_short", "fused_gelu", "fused_hyper"),
                                             "formula: LATENTCODE_KERNELS=formula")
    assert first["allocator"].startswith("freed memory kept (glibc mallopt: mmap threshold 32 MiB")
    sessions = [record for record in run.metrics() if record.get("event") == "compute"]
    assert [session["step"] for session in sessions] == [0, 2]
    assert sessions[1]["kernels"] == {"fused_short": "fused", "fused_gelu": "fused", "fused_hyper": "fused"}
    passes = read(run.path / "summary.json")["compute"]["kernel_passes"]
    layers = config.model_config().n_layers
    assert passes["fused_short"] == passes["fused_gelu"] == (config.steps - 2) * layers


def test_a_bad_kernel_switch_is_refused_in_one_line(tmp_path, small_config, monkeypatch):
    from latentcode.switches import SwitchError

    monkeypatch.setenv("LATENTCODE_KERNELS", "off")
    with pytest.raises(SwitchError, match=r"^LATENTCODE_KERNELS='off' is not a value it takes; expected fused or "
                                          r"formula \(or unset\)$"):
        train(small_config(), tmp_path / "run", progress=False)
