"""Training throughput of the full training loop (data generation, forward, backward, AdamW,
scheduler, logging) in instances per second, for the paper's SRAVEN model (or fuzzy logic).

    python benchmarks/bench_train_throughput.py [--preset sraven] [--steps 60] [--attention softmax linear hyla]

Each attention preset trains for `--steps` steps at batch 128 in a temporary run directory (no
evaluation or checkpoint inside the timed steps); the figure is the median of the per-interval
rates the run logs to metrics.jsonl, leaving out the first interval (warm-up).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

import latentcode
from latentcode.training import build_train_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="sraven")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--attention", nargs="+", default=["softmax", "linear", "hyla"])
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; preset {args.preset}, batch 128, "
          f"{args.steps} steps, rate logged every {args.log_every} steps")
    for attention in args.attention:
        # the paper's model (the tiny scale shrinks it); steps, cadence and evaluation set here
        config = build_train_config(
            args.preset, "paper", attention, n_train_instances=args.steps * 128, warmup_steps=args.steps // 10,
            log_every=args.log_every, eval_every=10**9, checkpoint_every=10**9, eval_instances=128,
        )
        with tempfile.TemporaryDirectory() as directory:
            run = latentcode.train(config, Path(directory) / "run", progress=False)
            rates = [record["instances_per_second"] for record in run.metrics("train")][1:]
        print(f"{attention:10s} {statistics.median(rates):8.0f} instances/s  "
              f"(median of {len(rates)} intervals; range {min(rates):.0f}-{max(rates):.0f})", flush=True)


if __name__ == "__main__":
    main()
