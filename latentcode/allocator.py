"""Keep freed memory in the process: glibc's heap reuses it instead of the kernel faulting it in again.

glibc returns a freed block above its mmap threshold to the kernel at once and trims the heap's free top,
so the next pass or training step faults the same pages in again, one by one (measured:
docs/how-to/train.md). `keep_freed_memory()` sets the mmap threshold to its maximum (32 MB) and trims the
heap only beyond 1 GiB free; the process keeps its peak heap until it exits. glibc only; elsewhere nothing
changes. It changes malloc for the whole process, so no library function calls it: the command-line entry
points do (`latentcode train`, `latentcode patch`), a Python user may (`latentcode.keep_freed_memory()`),
and a run's record says which setting it ran with (`freed_memory_setting()`).
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
KEPT_MMAP_THRESHOLD, KEPT_TRIM_THRESHOLD = 32 * 2**20, 2**30
_memory_kept: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds as above, once per process; whether it did."""
    global _memory_kept
    if _memory_kept is None:
        _memory_kept = False
        if sys.platform.startswith("linux"):
            mallopt = _mallopt()
            if mallopt is None:
                return False
            _memory_kept = bool(mallopt(M_MMAP_THRESHOLD, KEPT_MMAP_THRESHOLD)) and bool(
                mallopt(M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD))
    return _memory_kept


def _mallopt():
    """glibc's `mallopt`, or None (not glibc: musl has none)."""
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def one_arena_returning_memory():
    """For a long-lived server process (`latentcode view --serve`): with glibc, one malloc arena for the
    process and a function that hands freed memory back to the system (`malloc_trim`); elsewhere a
    function that does nothing. Each connection's thread otherwise gets an arena of its own, kept after
    the thread ends (SmolLM2 at T = 8,192: 480 -> 706 MB after 20 rows and 5 overviews over new
    connections; 488 MB with one arena). Called by the command line only, never by a library function."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_ARENA_MAX, 1)
        return lambda: libc.malloc_trim(0)
    except (OSError, AttributeError):
        return lambda: None


def freed_memory_setting() -> str:
    """The allocator setting of this process, for a run's record."""
    if _memory_kept:
        return (f"freed memory kept (glibc mallopt: mmap threshold {KEPT_MMAP_THRESHOLD // 2**20} MiB, "
                f"trim at {KEPT_TRIM_THRESHOLD // 2**30} GiB)")
    return "the C library's own thresholds (keep_freed_memory not called)"
