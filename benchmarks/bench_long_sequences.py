"""Long sequences: peak memory and time of one forward+backward for softmax, linear and HYLA, through
the full path (every [batch, head, query, key] tensor whole: the computation before issue 15) and the
path `Attention.path = "auto"` chooses (sdpa for softmax, the associative form for linear,
blockwise for HYLA; see `latentcode.models.attention`), printed as ratios to softmax.

    python benchmarks/bench_long_sequences.py [--lengths 256 512 1024 2048] [--repeats 3]
                                              [--compile-length 1024] [--hyla-kernel fused|bmm]
                                              [--paths full auto]

Model: 2 layers, d_model 256, 4 heads of width 64, d_mlp 1024, byte tokens (d_vocab 256), causal,
rotary positions, batch 2, training mode, attn_dropout 0 (the language-modelling setting; with
dropout, softmax and linear take the blockwise path instead, as HYLA always does). Loss: mean
square of the output.

How it is measured, and why:
- Each configuration runs in fresh subprocesses with one torch thread, one for memory and one for
  time, each after a warm-up step. Peak memory is the growth of the resident set during one
  forward+backward: Linux's high-water mark of the resident set (`VmHWM`), reset just before the
  step (`echo 5 > /proc/self/clear_refs`), minus the resident set then. The memory process runs
  with `MALLOC_MMAP_THRESHOLD_=65536`, so that glibc maps every block of 64 KiB or more on its own
  and returns it when freed: the resident set then follows the live tensors (by default glibc
  keeps freed blocks of up to 32 MiB for reuse, and a step after the warm-up would reuse them
  without growing). tracemalloc sees no torch tensors; psutil samples would miss short peaks.
- Time is the median CPU time of the time process over `--repeats` steps (one thread, so CPU time
  equals wall time on an idle machine, and on a shared machine it does not count the time slices
  other processes take; contention for caches and memory bandwidth still slows every figure).
- The full path's HYLA holds several [batch, query, key, d_head_v] tensors: where its peak,
  extrapolated from the previous length (x4 per doubling), would exceed `--max-full-gb` it is
  skipped, and the reason printed.
- `--hyla-kernel bmm`: HYLA's blockwise path without the fused C kernels (`latentcode.models.fused_hyper`),
  through the batched-product kernels they fall back to, for a before / after in one run.
- `--compile-length T`: also times the auto path of each attention under `torch.compile` at that
  length (compile time, without inductor's caches, reported separately; 0 skips). The blockwise
  path itself runs eagerly under torch.compile (`torch.compiler.disable`): compiled, its unrolled
  blocks took 519 s to compile at T=1024 for a step no faster (1.44 s against 1.2-1.6 s eager).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ATTENTIONS = ("softmax", "linear", "hyla")
PATHS = ("full", "auto")


def resident_bytes(field: str) -> int:
    """`VmRSS` (now) or `VmHWM` (the high-water mark) of this process, from /proc/self/status."""
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1)) * 1024


def measure(attention: str, path: str, length: int, repeats: int, compile_model: bool, fused: bool = True) -> dict:
    """One configuration, in this (fresh) process: peak MB of one step, median s of `repeats` more."""
    import torch

    from latentcode import ModelConfig, build_model
    from latentcode.models import fused_hyper
    from latentcode.models.attention import attention_path

    torch.set_num_threads(1)
    config = ModelConfig(
        attention=attention, n_layers=2, d_model=256, n_heads=4, kqv_dim=256, d_mlp=1024, n_ctx=length,
        d_vocab=256, positions="rotary", causal=True, attn_dropout=0.0,
    )
    model = build_model(config, seed=0).train()
    tokens = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))
    forward = torch.compile(model) if compile_model else model

    def step() -> None:
        forward(tokens).square().mean().backward()
        model.zero_grad(set_to_none=True)

    result: dict = {}
    with attention_path(model, path), fused_hyper.use_fused(fused):
        if compile_model:
            start = time.perf_counter()
            step()
            result["compile_s"] = time.perf_counter() - start
        step()  # warm-up: first calls allocate caches that later steps reuse
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # reset the high-water mark of the resident set
        before = resident_bytes("VmRSS")
        step()
        result["peak_mb"] = (resident_bytes("VmHWM") - before) / 1e6
        result["path_taken"] = model.blocks[0].attn.last_path
        times = []
        for _ in range(repeats):
            start = time.process_time()
            step()
            times.append(time.process_time() - start)
    if times:
        result["seconds"] = statistics.median(times)
    return result


def run_child(attention: str, path: str, length: int, repeats: int, compile_model: bool = False,
              kernel: str = "fused") -> dict:
    """Peak MB (from a process whose allocator returns freed blocks) and median s (from another)."""
    result: dict = {}
    for what, child_repeats in (("memory", 0), ("time", repeats)):
        command = [sys.executable, __file__, "--child", attention, path, str(length), str(child_repeats),
                   "--hyla-kernel", kernel]
        if compile_model:
            command.append("--child-compile")
        # No inductor caches: the compile time is that of a first compilation.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
        if what == "memory":
            env["MALLOC_MMAP_THRESHOLD_"] = "65536"
        finished = subprocess.run(command, capture_output=True, text=True, env=env)
        if finished.returncode != 0:
            return {"error": (finished.stderr.strip().splitlines() or [f"exit code {finished.returncode}"])[-1]}
        measured = json.loads(finished.stdout.strip().splitlines()[-1])
        if what == "memory":
            result.update(peak_mb=measured["peak_mb"], path_taken=measured["path_taken"])
        else:
            result.update(seconds=measured["seconds"], compile_s=measured.get("compile_s"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-full-gb", type=float, default=8.0)
    parser.add_argument("--compile-length", type=int, default=1024)
    parser.add_argument("--hyla-kernel", choices=("fused", "bmm"), default="fused")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                        help="paths to measure (default both; auto alone gives the HYLA/softmax ratios in a third of the time)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--child-compile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        attention, path, length, repeats = args.child
        print(json.dumps(measure(attention, path, int(length), int(repeats), args.child_compile,
                                 args.hyla_kernel == "fused")))
        return

    import torch

    from latentcode.models import fused_hyper

    kernel = args.hyla_kernel if args.hyla_kernel == "bmm" or fused_hyper.library() else f"bmm ({fused_hyper.build_failure()})"
    print(f"HYLA blockwise kernels: {kernel}; load average {open('/proc/loadavg').read().split()[:3]}")
    print(f"torch {torch.__version__}, 1 thread, batch 2, 2 layers, d_model 256, 4 heads x 64, causal, rotary; "
          f"peak MB of one forward+backward after a warm-up, median CPU s of {args.repeats} more")
    header = (f"{'T':>5s} {'attention':9s} {'path':5s} {'runs as':11s} {'peak MB':>8s} {'s':>7s} "
              f"{'MB/softmax':>10s} {'s/softmax':>9s}   (ratios to softmax on the same path)")
    print(header)
    previous_peak: dict[tuple[str, str], tuple[int, float]] = {}  # (length, peak MB) last measured
    for length in args.lengths:
        results = {}
        for attention in ATTENTIONS:
            for path in args.paths:
                measured_length, measured_peak = previous_peak.get((attention, path), (length, 0.0))
                extrapolated = measured_peak * (length / measured_length) ** 2  # T^2 tensors dominate
                if path == "full" and extrapolated / 1e3 > args.max_full_gb:
                    results[attention, path] = {"skipped": f"skipped: its peak would be about "
                                                           f"{extrapolated / 1e3:.0f} GB (> {args.max_full_gb:g} GB)"}
                    continue
                results[attention, path] = run_child(attention, path, length, args.repeats, kernel=args.hyla_kernel)
                if "peak_mb" in results[attention, path]:
                    previous_peak[attention, path] = (length, results[attention, path]["peak_mb"])
        for attention in ATTENTIONS:
            for path in args.paths:
                result, softmax = results[attention, path], results["softmax", path]
                if "peak_mb" not in result:
                    print(f"{length:5d} {attention:9s} {path:5s} {result.get('skipped') or result.get('error')}")
                    continue
                ratios = (f"{result['peak_mb'] / softmax['peak_mb']:10.2f} {result['seconds'] / softmax['seconds']:9.2f}"
                          if "peak_mb" in softmax else f"{'-':>10s} {'-':>9s}")
                print(f"{length:5d} {attention:9s} {path:5s} {result['path_taken']:11s} {result['peak_mb']:8.0f} "
                      f"{result['seconds']:7.3f} {ratios}", flush=True)
        hyla, softmax_full = results.get(("hyla", "auto"), {}), results.get(("softmax", "full"), {})
        if "peak_mb" in hyla and "peak_mb" in softmax_full:
            print(f"{length:5d} hyla auto / softmax full: memory {hyla['peak_mb'] / softmax_full['peak_mb']:.2f}x, "
                  f"time {hyla['seconds'] / softmax_full['seconds']:.2f}x", flush=True)
    if args.compile_length:
        print(f"\ntorch.compile at T={args.compile_length} (auto path; compile time = first step):")
        for attention in ATTENTIONS:
            eager = run_child(attention, "auto", args.compile_length, args.repeats)
            compiled = run_child(attention, "auto", args.compile_length, args.repeats, compile_model=True)
            if "seconds" not in compiled:
                print(f"  {attention:9s} compiled: {compiled.get('error')}")
                continue
            print(f"  {attention:9s} eager {eager['seconds']:.3f} s, compiled {compiled['seconds']:.3f} s "
                  f"({eager['seconds'] / compiled['seconds']:.2f}x faster), compile {compiled['compile_s']:.0f} s, "
                  f"peak MB eager {eager['peak_mb']:.0f} compiled {compiled['peak_mb']:.0f}", flush=True)


if __name__ == "__main__":
    main()
