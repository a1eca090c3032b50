"""How the blockwise attention path should recompute its blocks in the backward: one custom
autograd Function for the whole layer (what `latentcode.models.attention_paths` ships) against
`torch.utils.checkpoint` around each query block (the same block code, the recompute left to
autograd). Prints the median CPU seconds of a forward+backward of the model of
bench_long_sequences.py (2 layers, d_model 256, 4 heads of width 64, batch 2, causal, rotary) at
each sequence length, for softmax (blockwise forced) and HYLA.

    python benchmarks/bench_blockwise_recompute.py [--lengths 512 1024] [--repeats 3]

CPU time of the process (one thread), not wall time: the machine is shared, and a single-threaded
process's CPU time does not count the time slices other processes take.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.checkpoint import checkpoint

from latentcode import ModelConfig, build_model
from latentcode.models import attention as attention_module
from latentcode.models.attention import attention_path
from latentcode.models.attention_paths import query_blocks


def checkpointed_z(step, value_network, plan, q, k, v, keep):
    """blockwise_z with torch.utils.checkpoint around each query block instead of the Function."""

    def block(q_block, keys, values, keep_block, query_start, n_keys):
        codes = step.codes(step.scores(q_block, keys, query_start), query_start)
        if keep_block is not None:
            codes = codes * keep_block
        z = None
        for key_start in range(0, n_keys, plan.key_tile):
            key_end = key_start + plan.key_tile
            part = value_network(codes[..., key_start:key_end], values[:, key_start:key_end])
            z = part if z is None else z + part
        return z

    blocks = []
    for query_start, query_end, n_keys in query_blocks(q.shape[1], plan, step.allowed is not None):
        keep_block = None if keep is None else keep[..., query_start:query_end, :n_keys]
        blocks.append(checkpoint(
            block, q[:, query_start:query_end], k[:, :n_keys], v[:, :n_keys], keep_block, query_start, n_keys,
            use_reentrant=False, preserve_rng_state=False,
        ))
    return torch.cat(blocks, dim=1)


def step_seconds(model, tokens) -> float:
    start = time.process_time()
    model(tokens).square().mean().backward()
    model.zero_grad(set_to_none=True)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    function_z = attention_module.blockwise_z
    print(f"torch {torch.__version__}, 1 thread; median CPU s of forward+backward over {args.repeats} repeats")
    print(f"{'attention':10s} {'T':>5s} {'Function':>9s} {'checkpoint':>11s} {'ratio':>6s}")
    for attention in ("softmax", "hyla"):
        for length in args.lengths:
            config = ModelConfig(attention=attention, n_layers=2, d_model=256, n_heads=4, kqv_dim=256, d_mlp=1024,
                                 n_ctx=length, d_vocab=256, positions="rotary", causal=True, attn_dropout=0.0)
            model = build_model(config, seed=0).train()
            tokens = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))
            times = {"Function": [], "checkpoint": []}
            with attention_path(model, "blockwise"):
                for z in (function_z, checkpointed_z):  # warm-up: first calls allocate
                    attention_module.blockwise_z = z
                    step_seconds(model, tokens)
                attention_module.blockwise_z = function_z
                for _ in range(args.repeats):  # interleaved, so that load changes hit both alike
                    for name, z in (("Function", function_z), ("checkpoint", checkpointed_z)):
                        attention_module.blockwise_z = z
                        try:
                            times[name].append(step_seconds(model, tokens))
                        finally:
                            attention_module.blockwise_z = function_z
            function, checkpointed = (statistics.median(times[name]) for name in times)
            print(f"{attention:10s} {length:5d} {function:9.3f} {checkpointed:11.3f} {checkpointed / function:6.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
