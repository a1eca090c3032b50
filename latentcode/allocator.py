"""Keep freed memory in the process: glibc's heap reuses it instead of the kernel faulting it in again.

glibc returns a freed block above its mmap threshold (at most 32 MB) to the kernel at once, and trims
the heap's free top beyond its trim threshold; the next use of that much memory faults its pages in
again, one by one. On the virtual machines we measure on that costs about 3 µs a page: allocating and
filling a `[128, 16, 36, 36]` float tensor (10.6 MB) took 8.4 ms against 0.3 ms to fill one already
mapped. Every training step and every patching pass allocates such tensors afresh:
- a patching sweep's passes of `[1024, 16, 36, 36]` codes (85 MB) spent as much time in the kernel as
  in user code (benchmarks/bench_patching_allocator.py);
- a training step of the paper's models spent a quarter of its time faulting its activations in
  (benchmarks/bench_model_step.py --allocator glibc against kept).

`keep_freed_memory()` sets the mmap threshold to its maximum (blocks under 32 MB come from the heap)
and trims the heap only beyond 1 GiB free, so a pass or step reuses the last one's pages; the process
keeps its peak heap until it exits. glibc only; elsewhere nothing changes.

It changes malloc for the whole process, so no library function calls it: the command-line entry points
do (`latentcode train`, `latentcode patch`), and a Python user who wants the same speed calls
`latentcode.keep_freed_memory()` once. A run's record says which setting it ran with
(`freed_memory_setting()`).
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
