"""Time one training step (forward + backward + AdamW step) of the paper's models on this machine.

Sizes as in the paper: SRAVEN (4 layers, d_model 128, 16 heads, kqv 64, d_mlp 256, 36 tokens of
width 8) and fuzzy logic (2 layers, d_model 128, 8 heads, kqv 16, d_mlp 256, 32 tokens of width 5),
batch 128, attention dropout 0.1, training mode. Prints the median and interquartile range of the
step time in milliseconds for each attention preset, eager and (with --compile) torch.compile'd.

    python benchmarks/bench_model_step.py [--steps 30] [--compile] [--threads 2]

Reference (the paper's JAX implementation on a 2-core machine of this kind, median ms per step):
SRAVEN 341 / 345 / 587 and fuzzy logic 119 / 103 / 168 for softmax / linear / hyla.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from latentcode import ModelConfig, build_model

SIZES = {
    "sraven": dict(n_layers=4, d_model=128, n_heads=16, kqv_dim=64, d_mlp=256, n_ctx=36, d_in=8, d_out=8),
    "fuzzy_logic": dict(n_layers=2, d_model=128, n_heads=8, kqv_dim=16, d_mlp=256, n_ctx=32, d_in=5, d_out=1),
}
REFERENCE_MS = {
    ("sraven", "softmax"): 341, ("sraven", "linear"): 345, ("sraven", "hyla"): 587,
    ("fuzzy_logic", "softmax"): 119, ("fuzzy_logic", "linear"): 103, ("fuzzy_logic", "hyla"): 168,
}


def time_steps(task: str, attention: str, steps: int, warmup: int, compile_model: bool) -> list[float]:
    config = ModelConfig(attention=attention, attn_dropout=0.1, **SIZES[task])
    model = build_model(config, seed=0).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    forward = torch.compile(model) if compile_model else model
    generator = torch.Generator().manual_seed(0)
    inputs = torch.rand(128, config.n_ctx, config.d_in, generator=generator)
    targets = torch.randn(128, config.n_ctx, config.d_out, generator=generator)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(forward(inputs), targets)
        loss.backward()
        optimizer.step()
        if step >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    parser.add_argument("--attention", nargs="+", default=["softmax", "linear", "hyla"])
    parser.add_argument("--task", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch 128, {args.steps} timed steps")
    print(f"{'task':12s} {'attention':10s} {'mode':8s} {'median ms':>10s} {'IQR ms':>14s} {'reference':>10s} {'speed-up':>9s}")
    modes = ["eager"] + (["compiled"] if args.compile else [])
    for task in args.task:
        for attention in args.attention:
            for mode in modes:
                times = time_steps(task, attention, args.steps, args.warmup, mode == "compiled")
                quartiles = statistics.quantiles(times, n=4)
                median = statistics.median(times)
                reference = REFERENCE_MS.get((task, attention))
                speedup = f"{reference / median:.2f}x" if reference else "-"
                print(
                    f"{task:12s} {attention:10s} {mode:8s} {median:10.1f} "
                    f"{quartiles[0]:6.1f}-{quartiles[2]:6.1f} {reference or '-':>10} {speedup:>9s}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
