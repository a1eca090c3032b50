"""How many CPU threads a training process uses, and how many fewer when other processes keep cores busy.

PyTorch's CPU kernels run one OpenMP thread per core by default. Two such processes on the same
cores fight over them: an OpenMP thread that waits for its team spins instead of sleeping, so
each job can run several times slower than it would alone, and slower than two one-thread jobs
side by side (benchmarks/results/ holds the measurement). So `latentcode sweep --jobs N` gives each
process its share of the cores (`thread_environment`), and `latentcode train` without a thread count
uses the cores other processes leave free (`choose_threads`), saying so in one line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def threads_per_job(jobs: int, cores: int | None = None) -> int:
    """Threads for each of `jobs` processes sharing `cores` (default: this machine's), at least 1."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, cores // max(1, jobs))


def thread_environment(jobs: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for one of `jobs` training processes: `environ` (default os.environ) with
    OMP_NUM_THREADS and MKL_NUM_THREADS set to `threads_per_job(jobs)`, unless the user set
    OMP_NUM_THREADS already (their choice wins)."""
    environ = dict(os.environ if environ is None else environ)
    if "OMP_NUM_THREADS" in environ:
        return environ
    threads = str(threads_per_job(jobs))
    return environ | {variable: threads for variable in THREAD_VARIABLES}


def busy_cores_elsewhere(interval: float = 0.3) -> float:
    """Cores that other processes keep busy: system-wide CPU use over `interval` seconds, during
    which this process sleeps, so the use is theirs."""
    import psutil

    return psutil.cpu_percent(interval=interval) / 100 * (os.cpu_count() or 1)


def threads_that_fit(threads: int, busy_cores: float, cores: int | None = None) -> int | None:
    """The threads to use instead of `threads` when they and the `busy_cores` other processes use
    would need more than `cores` (half a core of slack for background noise): the cores left free,
    rounded, at least 1; None when `threads` fit."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if threads <= 1 or threads + busy_cores <= cores + 0.5:
        return None
    return max(1, min(threads - 1, round(cores - busy_cores)))


def contention_note(threads: int, chosen: int, busy_cores: float, cores: int | None = None) -> str:
    """The line `latentcode train` prints when it runs `chosen` threads instead of `threads`."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return (f"note: other processes keep about {busy_cores:.1f} of this machine's {cores} cores busy, so this run "
            f"uses {chosen} thread{'s' if chosen > 1 else ''} instead of {threads} (threads that share cores spin "
            f"against each other and make every job several times slower); --threads N (or OMP_NUM_THREADS=N) "
            "chooses the count")


def choose_threads(threads: int | None) -> Callable[[int, float], None] | None:
    """`threads` (--threads) sets this process's CPU threads. Without it (and without OMP_NUM_THREADS),
    measure how busy the cores are before training starts and, where other processes already keep
    them busy, use `threads_that_fit` threads; return an `on_step` that says so in one line at the
    first step: at the first step, so that a run refused before it starts (a held lock, a finished
    run) prints only its error."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
        return None
    if "OMP_NUM_THREADS" in os.environ or int(os.environ.get("RANK", "0")) != 0:
        return None
    default, busy_cores = torch.get_num_threads(), busy_cores_elsewhere()
    chosen = threads_that_fit(default, busy_cores)
    if chosen is None:
        return None
    torch.set_num_threads(chosen)
    unsaid = [contention_note(default, chosen, busy_cores)]

    def say_once(step: int, loss: float) -> None:
        while unsaid:
            print(unsaid.pop(), file=sys.stderr, flush=True)

    return say_once
