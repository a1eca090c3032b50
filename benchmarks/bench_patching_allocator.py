"""Allocator churn of the patching sweep (issue 37): user vs system CPU time and minor page faults
of `patching_sweep` on the paper's SRAVEN model, by examples per pass, in interleaved rounds.

A pass of E examples holds tensors `[E, 16 heads, 36, 36]` float32 (E x 83 kB: 85 MB at 1,024). glibc
serves blocks above its mmap threshold (at most 32 MB) with fresh mmaps and returns them on free, so
every pass faults those pages in again, in the kernel: system time. Passes whose largest tensors
stay under the threshold reuse the heap.

    python benchmarks/bench_patching_allocator.py [--groups 36] [--repeats 3] [--passes 1024,256] [--allocator glibc]

Prints per setting the medians of wall, user and system seconds and minor faults, and the load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch
from bench_patching import sraven_patching_setup  # benchmarks/ is the script's directory

from latentcode.intervention.patching import patching_sweep


def usage() -> tuple[float, float, int]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime, own.ru_stime, own.ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--groups", type=int, default=36, help="site groups of layer 2 (at most 324)")
    parser.add_argument("--passes", default="default,1024,256",
                        help="max_examples_per_pass settings, comma-separated ('default': the sweep's own)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--allocator", choices=("kept", "glibc"), default="kept",
                        help="kept: keep_freed_memory, as `latentcode patch` calls it (default); glibc: glibc's own "
                        "thresholds, as a Python caller of patching_sweep has unless it calls keep_freed_memory")
    args = parser.parse_args()
    if args.allocator == "kept":
        from latentcode import keep_freed_memory

        keep_freed_memory()
    torch.set_num_threads(args.threads)

    model, base, donor, metric, groups = sraven_patching_setup(args.batch_size, args.groups)
    settings = args.passes.split(",")
    figures: dict[str, list[tuple[float, float, float, int]]] = {setting: [] for setting in settings}
    passes: dict[str, int] = {}
    patching_sweep(model, base, donor, groups[:2], metric)  # warm-up
    for _ in range(args.repeats):
        for setting in settings:
            options = {} if setting == "default" else {"max_examples_per_pass": int(setting)}
            user, system, faults = usage()
            start = time.perf_counter()
            sweep = patching_sweep(model, base, donor, groups, metric, **options)
            wall = time.perf_counter() - start
            user_after, system_after, faults_after = usage()
            figures[setting].append((wall, user_after - user, system_after - system, faults_after - faults))
            passes[setting] = sweep.forward_passes
    print(f"patching sweep of {len(groups)} groups of layer 2, batch {args.batch_size}, {args.threads} thread(s), "
          f"allocator {args.allocator}, "
          f"medians of {args.repeats} interleaved rounds; load average {os.getloadavg()[0]:.2f} at the end")
    for setting, rounds in figures.items():
        wall, user, system, faults = (statistics.median(values) for values in zip(*rounds, strict=True))
        print(f"  max_examples_per_pass {setting:>7}: wall {wall:6.2f} s  user {user:6.2f} s  system {system:6.2f} s "
              f"(system/user {system / max(user, 1e-9):.2f})  minor faults {faults:,.0f}  {passes[setting]} passes")


if __name__ == "__main__":
    main()
