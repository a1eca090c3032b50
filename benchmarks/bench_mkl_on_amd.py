"""MKL's CPU check answered (`latentcode.models.mkl_on_amd`, what `latentcode train` does) against MKL's
own answer: matrix products of the paper's shapes and whole training steps, one core.

MKL keeps the code path it chose at its first product for the rest of the process, so the two
settings run in separate processes: each round starts one child per setting (in alternating order),
pinned to `--core` with torch on one thread, which times `--steps` training steps of every
configuration (`bench_model_step.Stepper`, what `latentcode train` runs) after `--warmup` steps, and
the products `[n, d_in] x [d_in, d_out]` of a SRAVEN layer (n = 128 x 36). Medians over all rounds'
steps; ratio = own / answered (above 1: answering is faster). Off AMD CPUs both settings are MKL's own
and the ratios are about 1 (the first line says).

    python benchmarks/bench_mkl_on_amd.py [--rounds 4] [--steps 10] [--core 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

PRODUCTS = {  # name: (rows, d_in, d_out) of one SRAVEN layer at batch 128
    "qkv [4608,128]x[128,192]": (4608, 128, 192),
    "mlp in [4608,128]x[128,256]": (4608, 128, 256),
    "mlp out [4608,256]x[256,128]": (4608, 256, 128),
    "grad W [256,4608]x[4608,128]": (256, 4608, 128),
}


def child(setting: str, configurations: list[str], steps: int, warmup: int) -> None:
    import torch

    from latentcode.allocator import keep_freed_memory
    from latentcode.models.mkl_on_amd import use_mkl_fast_paths

    torch.set_num_threads(1)
    keep_freed_memory()
    outcome = use_mkl_fast_paths() if setting == "answered" else "MKL's own answer"
    from bench_model_step import Stepper

    times: dict[str, list[float]] = {}
    for name, (rows, d_in, d_out) in PRODUCTS.items():
        a, b = torch.randn(rows, d_in), torch.randn(d_in, d_out)
        for _ in range(3):
            a @ b
        samples = []
        for _ in range(20):
            start = time.perf_counter()
            a @ b
            samples.append((time.perf_counter() - start) * 1000)
        times[name] = samples
    for configuration in configurations:
        task, attention = configuration.split("/")
        stepper = Stepper(task, attention, "eager")
        stepper.run(warmup)
        times[configuration] = stepper.run(steps)
    print(json.dumps({"outcome": outcome, "times": times}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--configurations", nargs="+",
                        default=["sraven/softmax", "sraven/linear", "sraven/hyla",
                                 "fuzzy_logic/softmax", "fuzzy_logic/linear", "fuzzy_logic/hyla"])
    parser.add_argument("--child", choices=("answered", "own"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.configurations, args.steps, args.warmup)
        return
    environment = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    collected: dict[str, dict[str, list[float]]] = {"answered": {}, "own": {}}
    print(f"core {args.core}, {args.rounds} rounds, {args.steps} steps per configuration per child; "
          f"load before {open('/proc/loadavg').read().split()[:3]}", flush=True)
    for round_index in range(args.rounds):
        order = ("answered", "own") if round_index % 2 == 0 else ("own", "answered")
        for setting in order:
            command = [sys.executable, __file__, "--child", setting, "--steps", str(args.steps),
                       "--warmup", str(args.warmup), "--configurations", *args.configurations]
            answer = subprocess.run(command, capture_output=True, text=True, env=environment, check=True,
                                    preexec_fn=lambda: os.sched_setaffinity(0, {args.core}))
            result = json.loads(answer.stdout.strip().splitlines()[-1])
            if round_index == 0:
                print(f"{setting}: {result['outcome']}")
            for name, samples in result["times"].items():
                collected[setting].setdefault(name, []).extend(samples)
    print(f"load after {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'':34s} {'own ms':>8s} {'answered ms':>12s} {'own / answered':>15s}")
    for name in collected["own"]:
        own, answered = statistics.median(collected["own"][name]), statistics.median(collected["answered"][name])
        print(f"{name:34s} {own:8.2f} {answered:12.2f} {own / answered:14.2f}x")


if __name__ == "__main__":
    main()
