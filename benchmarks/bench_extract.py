"""Extraction overhead: examples per second of extraction (hooks + HDF5 writing) versus a bare
`torch.no_grad()` forward pass on the same batches. The goal is a ratio of at most 1.25.

    python benchmarks/bench_extract.py [--batches 32] [--batch-size 256] [--repeats 5] [--sites sraven-rule]
                                       [--compression gzip lzf none]

Model: the paper's SRAVEN model (4 layers, d_model 128, 16 heads, kqv 64, d_mlp 256, 36 tokens),
untrained (speed does not depend on the weights). Task instances are generated once, before timing,
and shared by both measurements. Prints the median over repeats of each and their ratio, for each
compression of the codes file asked for (interleaved, so all see the same machine load), and the
size of the file each wrote. The HDF5 writing alone (the same rows, recorded once, appended with no
model running) is timed too, as a fraction of the bare forward: it is what compression changes, and
it is far less noisy on a loaded machine than the difference of two forward-pass timings.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from latentcode import ModelConfig, build_model
from latentcode.extraction import Recorder
from latentcode.inputs import TaskInstances
from latentcode.extraction.pipeline import record_batch
from latentcode.sources import parse_selector
from latentcode.store import COMPRESSIONS, DEFAULT_COMPRESSION, CodeWriter
from latentcode.subject import subject_of
from latentcode.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sites", default="sraven-rule")
    parser.add_argument("--attention", default="hyla")
    parser.add_argument("--compression", nargs="+", choices=COMPRESSIONS, default=[DEFAULT_COMPRESSION])
    args = parser.parse_args()

    task = get_task("sraven")
    config = ModelConfig(attention=args.attention, n_layers=4, d_model=128, n_heads=16, kqv_dim=64, d_mlp=256,
                         n_ctx=task.seq_len, d_in=task.d_in, d_out=task.d_out)
    model = build_model(config, seed=0).eval()
    sites = parse_selector(args.sites, task.config()).resolve(config.n_layers, task.seq_len)
    loaded = subject_of(model).load()
    n_predictions = task.n_recorded_predictions
    batches = list(TaskInstances(task).batches(loaded, "ood", args.batches * args.batch_size, 0, "unpermuted",
                                               args.batch_size, range(args.batches), sites))
    inputs = [torch.from_numpy(x) for x, _ in batches]
    n_examples = args.batches * args.batch_size

    def bare() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for x in inputs:
                model(x)
        return time.perf_counter() - start

    sizes: dict[str, int] = {}

    class Rows:
        """Stands in for a CodeWriter to keep what record_batch appends."""

        def __init__(self):
            self.appended = []

        def append(self, **rows):
            self.appended.append(rows)

    rows = Rows()
    with Recorder(model, sites) as recorder, torch.no_grad():
        for x, kept in batches:
            record_batch(loaded, x, kept, recorder, rows, n_predictions)

    def writing(directory: Path, repeat: int, compression: str) -> float:
        path = directory / f"rows-{compression}-{repeat}.h5"
        start = time.perf_counter()
        with CodeWriter(path, sites, config.sizes.n_heads, {"model_name": "bench"}, compression=compression) as writer:
            for appended in rows.appended:
                writer.append(**appended)
        seconds = time.perf_counter() - start
        path.unlink()
        return seconds

    def extraction(directory: Path, repeat: int, compression: str) -> float:
        path = directory / f"codes-{compression}-{repeat}.h5"
        start = time.perf_counter()
        with CodeWriter(path, sites, config.sizes.n_heads, {"model_name": "bench"}, compression=compression) as writer:
            with Recorder(model, sites) as recorder, torch.no_grad():
                for x, kept in batches:
                    record_batch(loaded, x, kept, recorder, writer, n_predictions)
        seconds = time.perf_counter() - start
        sizes[compression] = path.stat().st_size
        path.unlink()
        return seconds

    bare()  # warm up
    bare_times, extract_times = [], {compression: [] for compression in args.compression}
    write_times = {compression: [] for compression in args.compression}
    with tempfile.TemporaryDirectory() as directory:
        for repeat in range(args.repeats):  # interleaved, so all see the same machine load
            bare_times.append(bare())
            for compression in args.compression:
                extract_times[compression].append(extraction(Path(directory), repeat, compression))
                write_times[compression].append(writing(Path(directory), repeat, compression))
    bare_median = statistics.median(bare_times)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; SRAVEN-size {args.attention} model; "
          f"{args.batches} batches of {args.batch_size}; sites {args.sites} ({len(sites)} sites); {args.repeats} repeats")
    print(f"bare no_grad forward:        {n_examples / bare_median:10.0f} examples/s (median {bare_median:.3f} s)")
    for compression, times in extract_times.items():
        extract_median = statistics.median(times)
        print(f"extraction, {compression:5s}:         {n_examples / extract_median:10.0f} examples/s "
              f"(median {extract_median:.3f} s; file {sizes[compression] / 2**20:.1f} MiB); "
              f"time ratio extraction / bare {extract_median / bare_median:.3f} (goal <= 1.25)")
    for compression, times in write_times.items():
        write_median = statistics.median(times)
        print(f"HDF5 writing alone, {compression:5s}: median {write_median:.3f} s = "
              f"{write_median / bare_median:.3f} of the bare forward")


if __name__ == "__main__":
    main()
