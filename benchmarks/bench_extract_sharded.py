"""Sharded extraction: wall time of `latentcode extract` in one process versus the same extraction
sharded over 2 processes with torchrun (gloo, CPU), each process one torch thread.

    python benchmarks/bench_extract_sharded.py [--model models/sraven-hyla] [--n 4096] [--repeats 3]
                                                [--processes 2] [--sites sraven-rule]

Each measurement is a whole command, as a user runs it: process start, torch import, model load,
extraction, and for the sharded run the rendezvous and the virtual file over the shards. The two
commands alternate (so both see the same machine load), each repeated; prints the median of each,
the speed-up, and the load average before and after. The sharded file is checked to hold the same
codes as the one-process file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from latentcode.store import CodeFile

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "models" / "sraven-hyla"))
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sites", default="sraven-rule")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    extract = ["extract", args.model, "--n", str(args.n), "--batch-size", str(args.batch_size), "--sites", args.sites,
               "--quiet", "--overwrite"]
    one_process = [sys.executable, "-m", "latentcode.cli", *extract]
    # "--": torchrun would read extract's --n as an abbreviation of its own options
    sharded = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(args.processes), "-m", "latentcode.cli", "--", *extract]

    def timed(command: list[str], out: Path) -> float:
        start = time.perf_counter()
        subprocess.run([*command, "--out", str(out)], check=True, env=environment, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start

    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"1 process": [], f"{args.processes} processes": []}
    with tempfile.TemporaryDirectory() as directory:
        one_file, sharded_file = Path(directory) / "one.h5", Path(directory) / "sharded.h5"
        for _ in range(args.repeats):
            times["1 process"].append(timed(one_process, one_file))
            times[f"{args.processes} processes"].append(timed(sharded, sharded_file))
        one, two = CodeFile(one_file), CodeFile(sharded_file)
        assert len(one.sites) and all(np.array_equal(one.codes(site), two.codes(site)) for site in one.sites)
    load_after = os.getloadavg()

    print(f"extract {Path(args.model).name}, n={args.n}, sites {args.sites}, batch {args.batch_size}, "
          f"one torch thread per process, {os.cpu_count()} cores, median of {args.repeats}:")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"  {name:>12}: {medians[name]:6.2f} s  (runs {', '.join(f'{v:.2f}' for v in values)})")
    first, second = medians.values()
    print(f"  speed-up {first / second:.2f}x; sharded file equals the one-process file")
    print(f"  load average (1, 5, 15 min) before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")


if __name__ == "__main__":
    main()
