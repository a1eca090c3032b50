"""Intervention overhead: a forward pass with an intervention (mean-ablate all heads at the
sraven-rule sites) versus a bare `torch.no_grad()` forward pass on the same batches. The goal is a
time ratio of at most 1.3.

    python benchmarks/bench_intervene.py [--batches 16] [--batch-size 256] [--repeats 5] [--sites sraven-rule]

Model: the paper's SRAVEN model (4 layers, d_model 128, 16 heads, kqv 64, d_mlp 256, 36 tokens),
untrained (speed does not depend on the weights). The mean codes are random (what they are does
not change the work). Task instances are generated once, before timing, and shared by both
measurements, which are interleaved repeat by repeat. Prints the median of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from latentcode import ModelConfig, build_model
from latentcode.intervention import Intervention, MeanAblate
from latentcode.sources import parse_selector
from latentcode.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sites", default="sraven-rule")
    parser.add_argument("--attention", default="hyla")
    args = parser.parse_args()

    task = get_task("sraven")
    config = ModelConfig(attention=args.attention, n_layers=4, d_model=128, n_heads=16, kqv_dim=64, d_mlp=256,
                         n_ctx=task.seq_len, d_in=task.d_in, d_out=task.d_out)
    model = build_model(config, seed=0).eval()
    inputs = [torch.from_numpy(task.sample(args.batch_size, "ood", seed=(0, i), variant="unpermuted").x)
              for i in range(args.batches)]  # fmt: skip
    sites = parse_selector(args.sites, task.config()).resolve(config.n_layers, task.seq_len)
    rng = np.random.default_rng(0)
    edit = MeanAblate({site: rng.random(config.sizes.n_heads, dtype=np.float32) for site in sites})
    n_examples = args.batches * args.batch_size

    def bare() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for x in inputs:
                model(x)
        return time.perf_counter() - start

    def intervened() -> float:
        start = time.perf_counter()
        with torch.no_grad(), Intervention(model, edit, sites=sites):
            for x in inputs:
                model(x)
        return time.perf_counter() - start

    bare()  # warm up
    intervened()
    bare_times, intervene_times = [], []
    for _ in range(args.repeats):  # interleaved, so both see the same machine load
        bare_times.append(bare())
        intervene_times.append(intervened())
    bare_median, intervene_median = statistics.median(bare_times), statistics.median(intervene_times)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; SRAVEN-size {args.attention} model; "
          f"{args.batches} batches of {args.batch_size}; sites {args.sites} ({len(sites)} sites, mean-ablate all "
          f"{config.sizes.n_heads} heads); {args.repeats} repeats")
    print(f"bare no_grad forward:      {n_examples / bare_median:10.0f} examples/s (median {bare_median:.3f} s)")
    print(f"with the intervention:     {n_examples / intervene_median:10.0f} examples/s (median {intervene_median:.3f} s)")
    print(f"time ratio intervention / bare: {intervene_median / bare_median:.3f} (goal <= 1.3)")


if __name__ == "__main__":
    main()
