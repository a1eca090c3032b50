"""Extraction overhead: examples per second of extraction (hooks + HDF5 writing) versus a bare
`torch.no_grad()` forward pass on the same batches. The goal is a ratio of at most 1.25.

    python benchmarks/bench_extract.py [--batches 32] [--batch-size 256] [--repeats 5] [--sites sraven-rule]

Model: the paper's SRAVEN model (4 layers, d_model 128, 16 heads, kqv 64, d_mlp 256, 36 tokens),
untrained (speed does not depend on the weights). Task instances are generated once, before timing,
and shared by both measurements. Prints the median over repeats of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from latentcode import ModelConfig, build_model
from latentcode.extraction import Recorder, parse_selector
from latentcode.extraction.pipeline import record_batch
from latentcode.store import CodeWriter
from latentcode.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sites", default="sraven-rule")
    parser.add_argument("--attention", default="hyla")
    args = parser.parse_args()

    task = get_task("sraven")
    config = ModelConfig(attention=args.attention, n_layers=4, d_model=128, n_heads=16, kqv_dim=64, d_mlp=256,
                         n_ctx=task.seq_len, d_in=task.d_in, d_out=task.d_out)
    model = build_model(config, seed=0).eval()
    batches = [task.sample(args.batch_size, "ood", seed=(0, i), variant="unpermuted") for i in range(args.batches)]
    inputs = [torch.from_numpy(batch.x) for batch in batches]
    sites = parse_selector(args.sites, task.config()).resolve(config.n_layers, task.seq_len)
    n_examples = args.batches * args.batch_size

    def bare() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for x in inputs:
                model(x)
        return time.perf_counter() - start

    def extraction(directory: Path, repeat: int) -> float:
        start = time.perf_counter()
        with CodeWriter(directory / f"codes{repeat}.h5", sites, config.sizes.n_heads, {"model_name": "bench"}) as writer:
            with Recorder(model, sites) as recorder, torch.no_grad():
                for batch in batches:
                    record_batch(model, task, batch, recorder, writer, sites)
        return time.perf_counter() - start

    bare()  # warm up
    bare_times, extract_times = [], []
    with tempfile.TemporaryDirectory() as directory:
        for repeat in range(args.repeats):  # interleaved, so both see the same machine load
            bare_times.append(bare())
            extract_times.append(extraction(Path(directory), repeat))
    bare_median, extract_median = statistics.median(bare_times), statistics.median(extract_times)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; SRAVEN-size {args.attention} model; "
          f"{args.batches} batches of {args.batch_size}; sites {args.sites} ({len(sites)} sites); {args.repeats} repeats")
    print(f"bare no_grad forward:        {n_examples / bare_median:10.0f} examples/s (median {bare_median:.3f} s)")
    print(f"extraction (hooks + HDF5):   {n_examples / extract_median:10.0f} examples/s (median {extract_median:.3f} s)")
    print(f"time ratio extraction / bare: {extract_median / bare_median:.3f} (goal <= 1.25)")


if __name__ == "__main__":
    main()
