"""latentcode's fused CPU kernels: one PyTorch C++ extension whose operators are `torch.ops.latentcode.*`.

The sources ship in the package beside this file: `kernel_ops.cpp` registers the operators
(`TORCH_LIBRARY(latentcode, m)`, CPU implementations that check float32 / CPU / contiguity) around the
kernels of `kernels_gelu.h`, `kernels_short.h` and `kernels_hyper.h` (C with GCC vector extensions).
Python registers each operator's fake implementation and autograd formula (`fused_gelu`, `fused_short`,
`fused_hyper`, through `on_load`), so autograd, fake tensors and `torch.compile` see them as operators.

Built on first use by `torch.utils.cpp_extension.load` (its JIT: ninja, and its `FileBaton` lock in the
build directory so that concurrent processes build once), with `-O3 -march=native -fopenmp` (the
kernels split their work over torch's own OpenMP threads), `is_python_module=False` (the library only
registers operators). About 20 s of one core the first time on a machine (a fresh clone, a new CPU or
torch version), then read from the cache:
`$LATENTCODE_CACHE/kernels/latentcode_kernels-HASH/` (default `~/.cache/latentcode/kernels/...`), named
by the hash of the sources, the flags, torch's and Python's versions and the CPU, so that a cache shared
by machines of other CPUs never loads a library built for instructions this CPU lacks. A build that
fails is tried again by the next process (each says why in its run record, `latentcode.training.compute`).

Nothing is loaded before `latentcode.models.kernel_cache` checks it: the cache and the build directory
are directories (not links) owned by the user and writable by nobody else, and a built library is
loaded only where its SHA-256 equals the digest recorded after our own build. A refusal is said in one
warning line and the torch formula runs. The formula also runs, without a warning (the run record says
why), under `LATENTCODE_KERNELS=formula` (`latentcode.switches`), where the build fails (no compiler,
no OpenMP, no ninja), and for every dtype and device but float32 on the CPU: every user of a kernel
keeps the torch computation of the same numbers (to float tolerance).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from latentcode.models.kernel_cache import (
    DIGEST_SUFFIX,
    UntrustedKernel,
    cpu_description,
    kernel_directory,
    loadable_path,
    open_trusted_directory,
    open_verified,
    record_digest,
    warn_once,
)
from latentcode.switches import switch

KERNELS_SWITCH = "LATENTCODE_KERNELS"
NAME = "latentcode_kernels"
HERE = Path(__file__).parent
SOURCE = HERE / "kernel_ops.cpp"
HEADERS = tuple(HERE / name for name in ("kernels_gelu.h", "kernels_short.h", "kernels_hyper.h"))
CFLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-fopenmp")
"""No `-ffast-math` or `-fassociative-math`: the exponentials' rounding step (adding and subtracting
1.5 * 2^23) must stay as written; the sums are written as vectors already."""
LDFLAGS = ("-fopenmp",)


def build_name() -> str:
    """The build directory's name: by the hash of the sources, the flags, torch's version and the CPU."""
    digest = hashlib.sha256()
    for path in (SOURCE, *HEADERS):
        digest.update(path.read_bytes())
    digest.update(" ".join((*CFLAGS, *LDFLAGS, torch.__version__, sys.version, cpu_description())).encode())
    return f"{NAME}-{digest.hexdigest()[:16]}"


def _ops_registered() -> bool:
    return hasattr(torch.ops.latentcode, "gelu_tanh")


class Extension:
    """The extension as its users see it: `load()` -> `torch.ops.latentcode` where the operators are
    loaded (built first where needed), else None (`failure()` says why)."""

    def __init__(self):
        self._after_load: list[Callable[[], None]] = []
        self._descriptors: list[int] = []  # open for the process's life: the loader knows a library by its fd
        self.forget()

    def forget(self) -> None:
        """Look at the cache (and the compiler) again at the next `load()`; for tests. A library loaded stays
        loaded (a process cannot unload one): where the checks pass again, its operators are used."""
        self._loaded = False
        self._failure: str | None = None

    def on_load(self, register: Callable[[], None]) -> None:
        """Call `register` (a module's fake implementations and autograd formulas) once, when the operators
        exist (now, where they do)."""
        self._after_load.append(register)
        self._register()

    def _register(self) -> None:
        while _ops_registered() and self._after_load:
            self._after_load.pop(0)()

    def load(self):
        if switch(KERNELS_SWITCH) == "formula":
            return None
        if not self._loaded and self._failure is None:
            try:
                self._load()
                self._loaded = True
            except UntrustedKernel as error:  # said once; never built over
                self._failure = str(error)
                warn_once(self._failure)
            except Exception as error:  # the build failed: the torch formula, not a failed run
                lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
                said = next((line for line in lines if "error" in line.lower() and line != lines[0]), lines[-1])
                self._failure = f"the kernels could not be built: {said}"[:400]
                warn_once(self._failure)  # one line: a run slower than the last one says why
        return torch.ops.latentcode if self._loaded else None

    def failure(self) -> str | None:
        """Why the operators are not loaded, or None."""
        if switch(KERNELS_SWITCH) == "formula":
            return f"{KERNELS_SWITCH}=formula"
        self.load()
        return self._failure

    def library_path(self) -> Path:
        return kernel_directory() / build_name() / f"{NAME}.so"

    def _load(self) -> None:
        directory = kernel_directory()
        name = build_name()
        build_directory = directory / name
        top = open_trusted_directory(directory)
        try:
            build = open_trusted_directory(build_directory, parent_fd=top)
        finally:
            os.close(top)
        try:
            library_name = f"{NAME}.so"
            descriptor = open_verified(build, library_name, build_directory)
            if descriptor is not None:
                if not _ops_registered():
                    torch.ops.load_library(loadable_path(descriptor, build_directory / library_name))
                self._descriptors.append(descriptor)
            elif not _ops_registered():  # (a process that loaded them once never loads a second copy)
                self._build(build_directory)
        finally:
            os.close(build)
        self._register()

    def _build(self, build_directory: Path) -> None:
        """Build with cpp_extension's JIT (which loads what it built), then record the library's digest."""
        from torch.utils import cpp_extension

        print(f"latentcode: building its CPU kernels once into {build_directory} (about 20 s; later runs load them)",
              file=sys.stderr, flush=True)
        cpp_extension.load(NAME, [str(SOURCE)], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                           extra_include_paths=[str(HERE)], build_directory=str(build_directory),
                           is_python_module=False, verbose=False)
        library = build_directory / f"{NAME}.so"
        record_digest(library, library.with_name(library.name + DIGEST_SUFFIX))


EXTENSION = Extension()


class Kernel:
    """One kernel as training sees it: on or off (`use_fused`), its forward passes counted for a run's record
    (`latentcode.training.compute`); `load()` and `failure()` are the extension's."""

    def __init__(self, name: str):
        self.name = name
        self.enabled = True  # its users take their torch computation while False
        self.calls = 0

    @contextmanager
    def switched(self, enabled: bool):
        """Within the block, the kernel's users take it where they can (True) or their torch computation
        (False): for before / after measurements and tests."""
        previous, self.enabled = self.enabled, enabled
        try:
            yield
        finally:
            self.enabled = previous

    def load(self):
        return EXTENSION.load()

    def failure(self) -> str | None:
        return EXTENSION.failure()

    def count(self) -> None:
        """One forward pass more (not while torch.compile traces: a trace is not a pass)."""
        if not torch.compiler.is_compiling():
            self.calls += 1


@torch.compiler.assume_constant_result
def loaded() -> bool:
    """Whether the operators are loaded (built first where needed); torch.compile takes the answer as a constant
    of the graph instead of tracing into the build."""
    return EXTENSION.load() is not None


def ops():
    """`torch.ops.latentcode`, loaded (built first where needed); RuntimeError saying why where it cannot be."""
    if not loaded():
        raise RuntimeError(f"latentcode's kernels are not loaded: {EXTENSION.failure()}")
    return torch.ops.latentcode
