"""How fast the task generators and the SRAVEN ambiguity check run.

Prints generated instances per second (median over repeats) for SRAVEN (M=4, K=8) and fuzzy
logic (L=4, K=2, N=32) at batch sizes 128 and 4096, then the Monte Carlo ambiguity estimate
for M=4 and K in {4, 8, 16} under both criteria, with the seconds each took.

    PYTHONPATH=. python benchmarks/bench_tasks.py [--repeats 7] [--ambiguity-instances 4096]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from latentcode.tasks import get_task
from latentcode.tasks.sraven_counts import estimate_ambiguity

GENERATORS = {
    "sraven M=4 K=8": ("sraven", {"n_features": 4, "n_values": 8}),
    "fuzzy_logic L=4 K=2 N=32": ("fuzzy_logic", {"n_variables": 4, "n_terms": 2, "seq_len": 32}),
}
BATCH_SIZES = (128, 4096)
INSTANCES_PER_REPEAT = 65_536


def instances_per_second(task, batch_size: int, repeats: int) -> float:
    """Median over ``repeats`` of the rate of ``sample`` calls generating ~65k instances each."""
    calls = max(1, INSTANCES_PER_REPEAT // batch_size)
    task.sample(batch_size, seed=0)  # warm up
    rates = []
    for repeat in range(repeats):
        start = time.perf_counter()
        for step in range(calls):
            task.sample(batch_size, "train", seed=(repeat, step))
        rates.append(calls * batch_size / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ambiguity-instances", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()

    machine = platform.processor() or platform.machine()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPU cores, {machine}")
    print(f"\ngeneration (instances/s, median of {arguments.repeats} repeats)")
    for label, (name, params) in GENERATORS.items():
        task = get_task(name, **params)
        for batch_size in BATCH_SIZES:
            rate = instances_per_second(task, batch_size, arguments.repeats)
            print(f"  {label:<26} batch {batch_size:>5}: {rate:>12,.0f}")

    n = arguments.ambiguity_instances
    print(f"\nSRAVEN ambiguity, M=4, {n} instances, seed {arguments.seed}")
    for n_values in (4, 8, 16):
        for criterion in ("all_features", "any_feature"):
            start = time.perf_counter()
            fraction, standard_error = estimate_ambiguity(4, n_values, n, arguments.seed, criterion)
            seconds = time.perf_counter() - start
            print(
                f"  K={n_values:<3} {criterion:<13} {100 * fraction:6.2f}%"
                f" +- {100 * standard_error:.2f}%  ({seconds:.2f} s)"
            )


if __name__ == "__main__":
    main()
