"""benchmarks/bench_train_step_reference.py's header (issue 52): versions, CPU model, the allocator of
both sides and the thread settings; the reference's environment carries the same allocator and only
real XLA flags; bench_speed_goals.py carries the header into its summary."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_train_step_reference

    yield bench_train_step_reference
    sys.modules.pop("bench_train_step_reference", None)


CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\nflags\t: fpu\n"


def test_the_cpu_model_is_read_from_cpuinfo(bench):
    assert bench.cpu_model(CPUINFO) == "AMD EPYC 7B13 64-Core Processor"
    assert bench.cpu_model("processor\t: 0\n") == "unknown"


def test_the_header_names_versions_cpu_allocator_and_threads(bench):
    versions = {"jax": "0.4.30", "jaxlib": "0.4.31", "flax": "0.8.5", "optax": "0.2.3"}
    lines = bench.header("2.13.0+cpu", versions, "AMD EPYC 7B13", "kept", True,
                         {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"})
    text = "\n".join(lines)
    assert "torch 2.13.0+cpu; jax 0.4.30, jaxlib 0.4.31, flax 0.8.5, optax 0.2.3" in text
    assert "cpu: AMD EPYC 7B13" in text
    assert f"MALLOC_MMAP_THRESHOLD_={32 * 2**20} MALLOC_TRIM_THRESHOLD_={2**30}" in text
    assert "latentcode freed memory kept (mallopt: mmap threshold 33554432, trim threshold 1073741824)" in text
    assert "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE MKL_NUM_THREADS=(unset) XLA_FLAGS=(unset)" in text
    glibc = "\n".join(bench.header("2.13.0", None, "x", "glibc", False, {}))
    assert "reference not run" in glibc and "latentcode glibc defaults; reference glibc defaults" in glibc


def test_the_reference_gets_the_same_allocator_and_only_real_xla_flags(bench):
    given = {"PATH": "/bin", "MALLOC_TRIM_THRESHOLD_": "7"}
    kept = bench.reference_environment(given, "kept", n_cores=1)
    assert kept["MALLOC_MMAP_THRESHOLD_"] == str(32 * 2**20) and kept["MALLOC_TRIM_THRESHOLD_"] == str(2**30)
    assert kept["XLA_FLAGS"] == "--xla_cpu_multi_thread_eigen=false" and kept["JAX_PLATFORMS"] == "cpu"
    assert all(flag.startswith("--xla_") for flag in kept["XLA_FLAGS"].split())
    glibc = bench.reference_environment(given, "glibc", n_cores=2)
    assert "MALLOC_MMAP_THRESHOLD_" not in glibc and "MALLOC_TRIM_THRESHOLD_" not in glibc
    assert "XLA_FLAGS" not in glibc and glibc["PATH"] == "/bin"


def test_the_speed_goals_summary_carries_the_header(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_speed_goals

    output = ["versions: torch 2.13; jax 0.4.30, jaxlib 0.4.30, flax 0.8.5, optax 0.2.3\n", "cpu: AMD EPYC\n",
              "allocator: latentcode glibc defaults; reference glibc defaults\n",
              "thread settings in the environment: OMP_NUM_THREADS=(unset)\n", "batch 128, ...\n",
              "\n", "[pinned] cores [0], torch 1 thread(s), reference XLA_FLAGS --xla_cpu_multi_thread_eigen=false\n",
              "fuzzy_logic  softmax ...\n"]
    assert bench_speed_goals.header_lines(output) == [line.strip() for line in output[:4] + output[6:7]]
    sys.modules.pop("bench_speed_goals", None)
