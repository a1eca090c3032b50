"""C kernels compiled once per machine with the system C compiler and loaded with ctypes.

A `CompiledLibrary` holds one C source. Its first `load()` compiles it (`cc` with the source's
flags, `-march=native` among them, in under a second) into `$LATENTCODE_CACHE/kernels/` (default
`~/.cache/latentcode/kernels`), named by the hash of the source, the flags and the machine, so that a
cache shared by machines of other CPUs never loads a library built for instructions this CPU lacks;
later loads read the cached library, only from a directory of the user's own and only a file whose
digest matches the one recorded when it was built (`latentcode.models.kernel_cache`: a refused cache
or library is said in one warning line and the torch formula runs). `LATENTCODE_KERNELS=formula`
(`latentcode.switches`) builds and loads nothing. ctypes releases the GIL during a call. Where there is no
compiler or the build fails, `load()` returns None and `failure()` says why: every user of a kernel
keeps a torch computation of the same numbers (to float tolerance) for that case.

A library may ask for OpenMP (`openmp=True`): it is built with `-fopenmp` where the compiler has it
(else without, its `#pragma omp` lines ignored) and `uses_openmp(library)` says which. Loaded after
torch, its NEEDED `libgomp.so.1` is the copy torch's own build already loaded (the loader matches the
name), so a kernel's `#pragma omp parallel` runs on torch's threads: no second pool spinning against
torch's on the same cores. Without OpenMP, `run_in_threads` splits the work over a Python pool.

Used by `latentcode.models.fused_hyper` (the hyper value networks' blockwise kernels),
`latentcode.models.fused_short` (the attention of short sequences in training) and
`latentcode.models.fused_gelu` (the MLP's GELU in training).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from latentcode.files import ExclusiveLock, LockHeld, new_temporary_file
from latentcode.models.kernel_cache import (
    DIGEST_SUFFIX,
    UntrustedKernel,
    loadable_path,
    open_trusted_directory,
    open_verified,
    record_digest,
    warn_once,
)
from latentcode.switches import switch

KERNELS_SWITCH = "LATENTCODE_KERNELS"
CACHE_FORMAT = "digest-recorded "
"""In the hash of a library's name: libraries built before digests were recorded get other names, never
looked at (a library under a current name without its digest is refused)."""

_pool: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)  # a forked child has none of the parent's threads


def run_in_threads(calls: Sequence[Callable[[], None]]) -> None:
    """Run `calls` (kernel calls through ctypes, which release the GIL) side by side: the first in this
    thread, the others in one process-wide pool of a thread per core but one (made on first use), and
    return when all have; a call's exception is raised here."""
    global _pool
    if len(calls) > 1 and _pool is None:
        _pool = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1), thread_name_prefix="latentcode-kernels")
    pending = [_pool.submit(call) for call in calls[1:]]
    calls[0]()
    for future in pending:
        future.result()


OPENMP_PROBE = """
int latentcode_uses_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
"""


def uses_openmp(library: ctypes.CDLL) -> bool:
    """Whether `library` (of a CompiledLibrary with openmp=True) was built with OpenMP."""
    return bool(library.latentcode_uses_openmp())


def kernel_directory() -> Path:
    """`$LATENTCODE_CACHE/kernels` (default `~/.cache/latentcode/kernels`)."""
    return Path(os.environ.get("LATENTCODE_CACHE") or Path.home() / ".cache" / "latentcode") / "kernels"


def _cpu_flags() -> str:
    """The CPU's model and instruction-set flags (Linux), so that a cache shared by machines of one name
    but other CPUs (containers) never loads a library built for instructions this CPU lacks."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return " ".join(dict.fromkeys(line for line in lines if line.startswith(("model name", "flags"))))


class CompiledLibrary:
    """One C source, compiled on first use: `load()` -> the `ctypes.CDLL` (its functions declared by
    `declare`), or None where it cannot be built (`failure()` says why)."""

    def __init__(self, name: str, source: str, flags: tuple[str, ...], declare: Callable[[ctypes.CDLL], None],
                 openmp: bool = False, kernel: bool = True):
        self.name, self.source, self.flags, self.declare = name, source, flags, declare
        self.kernel = kernel  # a kernel with a torch formula beside it: LATENTCODE_KERNELS=formula turns it off
        self.calls = 0  # forward passes through its kernels (its users count them), for a run's record
        if openmp:
            self.source += OPENMP_PROBE
        self.flag_choices = ((*flags, "-fopenmp"), flags) if openmp else (flags,)
        self.enabled = True  # its users take their torch computation while False
        self.forget()

    @contextmanager
    def switched(self, enabled: bool):
        """Within the block, the library's users take its kernels where they can (True) or their torch
        computation (False): for before / after measurements and tests."""
        previous, self.enabled = self.enabled, enabled
        try:
            yield
        finally:
            self.enabled = previous

    def forget(self) -> None:
        """Drop the loaded library and any failure: the next `load()` looks at the cache (and the
        compiler) again. For tests."""
        self._library: ctypes.CDLL | None = None
        self._failure: str | None = None

    def load(self) -> ctypes.CDLL | None:
        if self._switched_off():
            return None
        if self._library is None and self._failure is None:
            for flags in self.flag_choices:  # with OpenMP first where asked
                try:
                    self._library, self._failure = self._build(flags), None
                    break
                except UntrustedKernel as error:  # said once; never built again over it
                    self._failure = str(error)
                    warn_once(self._failure)
                    break
                except OSError as error:
                    self._failure = str(error)
        return self._library

    def failure(self) -> str | None:
        """Why the library could not be built, or None."""
        if self._switched_off():
            return f"{KERNELS_SWITCH}=formula"
        self.load()
        return self._failure

    def _switched_off(self) -> bool:
        return self.kernel and switch(KERNELS_SWITCH) == "formula"

    def file_name(self, flags: tuple[str, ...]) -> str:
        """The library's name in the cache, built with `flags`: by the hash of the source, the flags and the
        machine."""
        machine = f"{platform.node()} {platform.machine()} {_cpu_flags()}"
        digest = hashlib.sha256((CACHE_FORMAT + self.source + " ".join(flags) + machine).encode()).hexdigest()[:16]
        return f"{self.name}-{digest}.so"

    def _build(self, flags: tuple[str, ...]) -> ctypes.CDLL:
        """The compiled library: from the cache, else compiled now (to a temporary, its digest recorded,
        then renamed), one builder at a time (a lock beside it). Loaded only after the checks of
        `latentcode.models.kernel_cache`: a refused cache or library raises UntrustedKernel."""
        directory = kernel_directory()
        name = self.file_name(flags)
        library_path = directory / name
        directory_fd = open_trusted_directory(directory)
        try:
            descriptor = open_verified(directory_fd, name, directory)
            if descriptor is None:
                try:
                    with ExclusiveLock(library_path, wait=300, purpose="building a kernel"):
                        descriptor = open_verified(directory_fd, name, directory)  # built meanwhile by another
                        if descriptor is None:
                            self._compile(flags, library_path)
                            descriptor = open_verified(directory_fd, name, directory)
                except LockHeld as error:  # another build held it for minutes: the formula, not a failed run
                    raise OSError(str(error)) from None
            if descriptor is None:
                raise OSError(f"{library_path} vanished after it was built")
        finally:
            os.close(directory_fd)
        # the descriptor stays open: the loader knows the library by its /proc/self/fd name
        library = ctypes.CDLL(loadable_path(descriptor, library_path))
        self.declare(library)
        return library

    def _compile(self, flags: tuple[str, ...], library_path: Path) -> None:
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise OSError("no C compiler (cc or gcc) on PATH")
        source_path = new_temporary_file(library_path.with_suffix(".c"))
        temporary = new_temporary_file(library_path)
        try:
            source_path.write_text(self.source)
            subprocess.run([compiler, *flags, "-x", "c", str(source_path), "-o", str(temporary)],
                           check=True, capture_output=True, text=True)
            record_digest(temporary, library_path.with_name(library_path.name + DIGEST_SUFFIX))
            os.replace(temporary, library_path)
        except FileNotFoundError:
            raise OSError(f"the C compiler {compiler!r} does not exist") from None
        except subprocess.CalledProcessError as error:
            raise OSError(f"{compiler} failed: {error.stderr.strip()[-300:]}") from None
        finally:
            source_path.unlink(missing_ok=True)
            temporary.unlink(missing_ok=True)
