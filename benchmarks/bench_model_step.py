"""Time one training step (forward + backward + AdamW step) of the paper's models on this machine,
eager against the other ways of running it, measured in the same run.

Sizes as in the paper: SRAVEN (4 layers, d_model 128, 16 heads, kqv 64, d_mlp 256, 36 tokens of
width 8) and fuzzy logic (2 layers, d_model 128, 8 heads, kqv 16, d_mlp 256, 32 tokens of width 5),
batch 128, attention dropout 0.1, training mode. For each attention preset it prints the median
and interquartile range of the step time in milliseconds of each mode, and the ratio of the eager
median to each mode's median (above 1: faster than eager):

    eager       what `latentcode train` runs: the "auto" attention path, which in training takes the
                fused kernel of `latentcode.models.fused_short` where it can
    full        the full attention path forced (`Attention.path = "full"`): what training ran before
                the fused kernel, and what evaluation runs
    blockwise   the blockwise attention path forced (`Attention.path = "blockwise"`)
    compiled    torch.compile'd model (with --compile): since issue 46 the kernels are operators
                (`latentcode.models.kernel_ops`) that stay in the compiled graph

    python benchmarks/bench_model_step.py [--steps 30] [--compile] [--threads 1] [--allocator glibc] [--mkl own]

As `latentcode train` does, the process keeps freed memory in glibc's heap
(`latentcode.allocator.keep_freed_memory`); `--allocator glibc` leaves glibc's thresholds as they are
(before), to compare in a second run (it is set once per process). MKL's CPU check is left as MKL
answers it, as `latentcode train` does unless asked (`--mkl-on-amd`); `--mkl answered` answers it on AMD
CPUs (`latentcode.models.mkl_on_amd`; MKL keeps its first choice of code path for the process, so the two
compare only between processes: benchmarks/bench_mkl_on_amd.py).

The modes of one configuration run in interleaved rounds (each round times every mode for
`--steps / --rounds` steps), so that a change of machine load hits them alike. Only ratios within
one run compare: an earlier version printed reference times of the paper's JAX implementation
measured on another day, which is no comparison: `bench_train_step_reference.py` runs both side
by side. Two torch jobs with default threads on the same 2 cores slow each other down (up to 6x,
OpenMP threads spinning): on a shared machine give `--threads 1`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from latentcode import ModelConfig, build_model
from latentcode.allocator import keep_freed_memory
from latentcode.models.attention import Attention
from latentcode.models.mkl_on_amd import use_mkl_fast_paths
from latentcode.training.optimizer import build_optimizer

SIZES = {
    "sraven": dict(n_layers=4, d_model=128, n_heads=16, kqv_dim=64, d_mlp=256, n_ctx=36, d_in=8, d_out=8),
    "fuzzy_logic": dict(n_layers=2, d_model=128, n_heads=8, kqv_dim=16, d_mlp=256, n_ctx=32, d_in=5, d_out=1),
}


class Stepper:
    """One model, optimizer and batch in one mode; `run(n)` returns the milliseconds of n steps."""

    def __init__(self, task: str, attention: str, mode: str):
        self.mode = mode
        config = ModelConfig(attention=attention, attn_dropout=0.1, **SIZES[task])
        self.model = build_model(config, seed=0).train()
        self.optimizer = build_optimizer(self.model, learning_rate=1e-3, weight_decay=0.1)
        self.forward = torch.compile(self.model) if mode == "compiled" else self.model
        if mode in ("full", "blockwise"):
            for layer in self.model.modules():
                if isinstance(layer, Attention):
                    layer.path = mode
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.rand(128, config.n_ctx, config.d_in, generator=generator)
        self.targets = torch.randn(128, config.n_ctx, config.d_out, generator=generator)

    def run(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(self.forward(self.inputs), self.targets)
            loss.backward()
            self.optimizer.step()
            times.append((time.perf_counter() - start) * 1000)
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    parser.add_argument("--attention", nargs="+", default=["softmax", "linear", "hyla"])
    parser.add_argument("--task", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--modes", nargs="+", default=["eager", "full", "blockwise"],
                        choices=["eager", "full", "blockwise", "compiled"])
    parser.add_argument("--allocator", choices=("kept", "glibc"), default="kept",
                        help="kept: keep_freed_memory as `latentcode train` does (default); glibc: glibc's thresholds")
    parser.add_argument("--mkl", choices=("answered", "own"), default="own",
                        help="own: MKL's own answer, as `latentcode train` without --mkl-on-amd (default); answered: "
                             "MKL's CPU check answered on AMD CPUs. Per process: benchmarks/bench_mkl_on_amd.py compares")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = args.allocator == "kept" and keep_freed_memory()
    print(use_mkl_fast_paths() if args.mkl == "answered" else "MKL's CPU check left as it is (--mkl own)")
    modes = list(dict.fromkeys(["eager", *args.modes] + (["compiled"] if args.compile else [])))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch 128, {args.steps} timed steps "
          f"per mode in {args.rounds} interleaved rounds; freed memory {'kept' if kept else 'as glibc does'}; "
          f"load {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'task':12s} {'attention':10s} {'mode':10s} {'median ms':>10s} {'IQR ms':>14s} {'eager / mode':>13s}")
    for task in args.task:
        for attention in args.attention:
            steppers = {mode: Stepper(task, attention, mode) for mode in modes}
            for stepper in steppers.values():
                stepper.run(args.warmup)  # compiles the compiled one
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            for _ in range(args.rounds):
                for mode, stepper in steppers.items():
                    times[mode] += stepper.run(max(args.steps // args.rounds, 1))
            eager = statistics.median(times["eager"])
            for mode in modes:
                quartiles = statistics.quantiles(times[mode], n=4)
                median = statistics.median(times[mode])
                print(f"{task:12s} {attention:10s} {mode:10s} {median:10.1f} {quartiles[0]:6.1f}-{quartiles[2]:6.1f} "
                      f"{eager / median:12.2f}x", flush=True)


if __name__ == "__main__":
    main()
