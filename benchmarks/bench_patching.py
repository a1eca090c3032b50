"""Cost of causal localisation (issue 22), on the paper's SRAVEN model at batch 256, one thread:

1. a patching sweep over every site group of one layer (query row x key block: 36 rows x 9 blocks
   of 4 keys = 324 groups) against (number of groups x a bare forward pass); goal <= 1.5 (issue 37;
   issue 22's was 2); its user and system CPU time (allocator churn shows as system time);
2. attribution patching for every (layer, head, query, key) against one bare forward pass;
   goal <= 2.5 (issue 37; issue 22's was 3). Timed given the donor's codes (`donor_codes=`, from `record_codes`: one forward and
   one backward pass of the base), and the donor pass (`record_codes`) separately, so the total
   from donor inputs is printed too;
3. how fast `latentcode patch` and `latentcode intervene` answer a bad argument (a fresh
   interpreter each time, as a user runs them); goal < 0.5 s.

    python benchmarks/bench_patching.py [--repeats 3] [--groups 324]

The model is untrained (speed does not depend on the weights); inputs are task instances generated
before timing. The bare forward pass is timed between the measured calls, repeat by repeat, and
medians are printed with the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from latentcode import ModelConfig, build_model
from latentcode.intervention.patching import (
    attribution_patching,
    patching_sweep,
    record_codes,
    site_grid,
)
from latentcode.tasks import get_task

REPOSITORY = Path(__file__).resolve().parents[1]


def sraven_patching_setup(batch_size: int, n_groups: int):
    """The paper's SRAVEN HYLA model (seed 0, untrained), `batch_size` OOD base and donor inputs, the
    log-probability of the donor's answer as the metric, and the first `n_groups` of layer 2's 324 groups
    (rows x 9 key blocks): what both patching benchmarks time."""
    config = ModelConfig(attention="hyla", n_layers=4, d_model=128, n_heads=16, kqv_dim=64, d_mlp=256, n_ctx=36,
                         d_in=8, d_out=8, positions="relative", causal=False)
    model = build_model(config, seed=0).eval()
    task = get_task("sraven", n_features=4, n_values=8)
    base = torch.as_tensor(task.sample(batch_size, "ood", seed=1, variant="unpermuted").x)
    donor = torch.as_tensor(task.sample(batch_size, "ood", seed=2, variant="unpermuted").x)
    answer = torch.as_tensor(task.sample(batch_size, "ood", seed=2, variant="unpermuted").y[:, -1])

    def metric(output):
        return output[:, -1].gather(1, answer[:, None])[:, 0] - output[:, -1].logsumexp(-1)

    return model, base, donor, metric, site_grid(4, 36, layers=[2], key_blocks=9)[:n_groups]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--groups", type=int, default=324, help="site groups of layer 2 in the sweep (at most 324)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, base, donor, metric, groups = sraven_patching_setup(args.batch_size, args.groups)

    def bare() -> float:
        with torch.no_grad():
            start = time.perf_counter()
            model(base)
            return time.perf_counter() - start

    bare()  # warm-up
    bare_times, sweep_times, attribution_times, donor_times, sweep_cpu = [], [], [], [], []
    for _ in range(args.repeats):
        bare_times.append(bare())
        start, cpu = time.perf_counter(), os.times()
        patching_sweep(model, base, donor, groups, metric)
        sweep_times.append(time.perf_counter() - start)
        sweep_cpu.append((os.times().user - cpu.user, os.times().system - cpu.system))
        bare_times.append(bare())
        start = time.perf_counter()
        donor_codes, _ = record_codes(model, donor, "*:*:*")
        donor_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        attribution_patching(model, base, None, metric, sites="*:*:*", donor_codes=donor_codes)
        attribution_times.append(time.perf_counter() - start)
        bare_times.append(bare())
    forward = statistics.median(bare_times)
    sweep = statistics.median(sweep_times)
    attribution = statistics.median(attribution_times)
    donor_pass = statistics.median(donor_times)
    print(f"bare forward pass, batch {args.batch_size}: {forward * 1000:.1f} ms (median of {len(bare_times)})")
    print(f"sweep of {len(groups)} groups of layer 2: {sweep:.2f} s = {sweep / (len(groups) * forward):.2f} x "
          f"(groups x bare forward) [goal <= 1.5]")
    user, system = (statistics.median(times) for times in zip(*sweep_cpu, strict=True))
    print(f"  its CPU time: user {user:.2f} s, system {system:.2f} s ({system / user:.1%} of user; median of "
          f"{len(sweep_cpu)})")
    print(f"attribution, every (layer, head, query, key), given the donor's codes: {attribution * 1000:.0f} ms = "
          f"{attribution / forward:.2f} x a bare forward [goal <= 2.5]")
    print(f"  its donor pass (record_codes, every pair): {donor_pass * 1000:.0f} ms = {donor_pass / forward:.2f} x; "
          f"total from donor inputs {(attribution + donor_pass) / forward:.2f} x")
    print(f"  load average at the end: {Path('/proc/loadavg').read_text().split()[0] if Path('/proc/loadavg').exists() else '?'}")

    arguments = {
        "patch": ["patch", str(REPOSITORY / "models" / "sraven-hyla"), "--layers", "7", "--out", "/tmp/bench-patch"],
        "intervene": ["intervene", str(REPOSITORY / "models" / "sraven-hyla"), "--sites", "9:0:0", "--zero-ablate",
                      "all", "--out", "/tmp/bench-intervene"],
    }
    for command, argv in arguments.items():
        times = []
        for _ in range(5):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "latentcode.cli", *argv], capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            assert done.returncode == 2, done.stderr
        print(f"latentcode {command} refuses a bad argument in {statistics.median(times):.2f} s (median of 5) "
              f"[goal < 0.5 s]: {done.stderr.strip()[:90]}")


if __name__ == "__main__":
    main()
