"""The fused kernels' extension (`latentcode.models.kernel_ops`), built once per test session into the
session's cache (tests/conftest.py sets LATENTCODE_CACHE to a temporary directory): about 20 s of one
core on a quiet machine, a minute or more on a busy one. Every kernel test takes the `kernels` fixture."""

import time

import pytest


@pytest.fixture(scope="session")
def kernels():
    """`torch.ops.latentcode` once the extension is loaded (built first where needed), or the test skips."""
    from latentcode.models.kernel_ops import EXTENSION

    start = time.perf_counter()
    ops = EXTENSION.load()
    if ops is None:
        pytest.skip(f"the fused kernels could not be built here: {EXTENSION.failure()}")
    print(f"\nlatentcode kernels loaded (built where needed) in {time.perf_counter() - start:.1f} s")
    return ops
