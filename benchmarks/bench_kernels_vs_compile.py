"""Does torch.compile (or the plain torch formula) come within 10% of each compiled C kernel? (issue 46)

A kernel that a formula under `torch.compile` matches is not worth its C, its cache and its loading
code. For each kernel, forward + backward of the shapes training runs, one thread, interleaved rounds
(each round times every mode), medians in ms, and the ratio mode / kernel (below 1.10: matched):

    gelu        fused_gelu on [4608, 256] (SRAVEN's MLP)         against F.gelu(approximate="tanh") eager and
                                                                  under torch.compile
    attention   one HYLA (or softmax) attention layer, training mode, batch 128 of SRAVEN (T=36, 16
                heads of 4) or fuzzy logic (T=32, 8 of 2): the fused_short kernel (path "auto")
                against the full path eager ("full") and the layer under torch.compile with the kernel
                turned off (`fused_short.use_fused(False)`: the compiled formula; since issue 46 the
                kernel is an operator that torch.compile would otherwise keep in its graph)
    hyper       fused_hyper's blockwise tile (codes [2, 4, 256, 256], values of width 64) against the
                batched-product tile (`use_fused(False)`) and the einsum formula under torch.compile

    python benchmarks/bench_kernels_vs_compile.py [--rounds 5] [--steps 10] [--parts gelu attention hyper]

On a busy machine only the ratios within one run compare; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.nn import functional as F

from latentcode.models import fused_gelu, fused_hyper, fused_short
from latentcode.models.attention import Attention
from latentcode.models.config import ModelConfig

SIZES = {
    "sraven": dict(d_model=128, n_heads=16, kqv_dim=64, n_ctx=36),
    "fuzzy_logic": dict(d_model=128, n_heads=8, kqv_dim=16, n_ctx=32),
}


def timed(function, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1000)
    return times


def compare(label: str, modes: dict, rounds: int, steps: int) -> None:
    for function in modes.values():  # warm-up: builds, compiles
        for _ in range(3):
            function()
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, function in modes.items():
            times[mode] += timed(function, steps)
    kernel = statistics.median(times["kernel"])
    print(f"{label:34s} " + "  ".join(f"{mode} {statistics.median(t):7.2f} ms ({statistics.median(t) / kernel:4.2f}x)"
                                       for mode, t in times.items()), flush=True)


def gelu_modes() -> dict:
    x = torch.randn(4608, 256, generator=torch.Generator().manual_seed(0)).requires_grad_()
    grad = torch.randn(4608, 256, generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(lambda t: F.gelu(t, approximate="tanh"))

    def step(function):
        def run():
            x.grad = None
            function(x).backward(grad)
        return run

    return {"kernel": step(fused_gelu.gelu), "eager": step(lambda t: F.gelu(t, approximate="tanh")),
            "compiled": step(compiled)}


def attention_modes(task: str, attention: str) -> dict:
    config = ModelConfig(attention=attention, attn_dropout=0.1, n_layers=1, d_mlp=256, d_in=8, d_out=8, **SIZES[task])
    torch.manual_seed(0)
    layer = Attention(config).train()
    full = Attention(config).train()
    full.load_state_dict(layer.state_dict())
    full.path = "full"
    compiled_layer = Attention(config).train()
    compiled_layer.load_state_dict(layer.state_dict())
    compiled = torch.compile(compiled_layer)
    x = torch.randn(128, config.n_ctx, config.d_model, generator=torch.Generator().manual_seed(0))

    def step(module, parameters, fused=True):
        def run():
            for parameter in parameters:
                parameter.grad = None
            with fused_short.use_fused(fused):
                module(x).sum().backward()
        return run

    return {"kernel": step(layer, list(layer.parameters())), "full": step(full, list(full.parameters())),
            "compiled": step(compiled, list(compiled_layer.parameters()), fused=False)}


def hyper_modes() -> dict:
    generator = torch.Generator().manual_seed(0)
    codes = torch.rand(2, 4, 256, 256, generator=generator) / 16
    values = torch.randn(2, 256, 4, 64, generator=generator)
    grad_z = torch.randn(2, 256, 4, 64, generator=generator)

    def formula(a, v):  # z[b, q, h] = sum_k a[b,h,q,k] relu(sum_h' a[b,h',q,k] v[b,k,h'])
        hidden = torch.einsum("bhqk,bkhd->bqkd", a, v).relu()
        return torch.einsum("bhqk,bqkd->bqhd", a, hidden)

    compiled = torch.compile(formula)
    a, v = codes.clone().requires_grad_(), values.clone().requires_grad_()

    def kernel():
        fused_hyper.forward(codes, values, relu=True)
        fused_hyper.backward(codes, values, grad_z, relu=True)

    network = None
    for module in Attention(ModelConfig(attention="hyla", n_layers=1, d_model=256, n_heads=4, kqv_dim=256,
                                        d_mlp=256, n_ctx=256, d_in=8, d_out=8)).modules():
        if hasattr(module, "forward_tile"):
            network = module

    def kernel_free_tile():
        with fused_hyper.use_fused(False):
            network.forward_tile(codes, values)
            network.backward_tile(codes, values, grad_z)

    def compiled_step():
        a.grad = v.grad = None
        compiled(a, v).backward(grad_z)

    return {"kernel": kernel, "bmm": kernel_free_tile, "compiled": compiled_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed calls per mode per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parts", nargs="+", default=["gelu", "attention", "hyper"],
                        choices=["gelu", "attention", "hyper"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average {os.getloadavg()}", flush=True)
    print("ratio = mode / kernel median (below 1.10: the kernel is matched within 10%)")
    if "gelu" in args.parts:
        compare("gelu [4608, 256] fwd+bwd", gelu_modes(), args.rounds, args.steps)
    if "attention" in args.parts:
        for task in SIZES:
            for attention in ("hyla", "softmax"):
                compare(f"attention {task} {attention} fwd+bwd", attention_modes(task, attention), args.rounds,
                        args.steps)
    if "hyper" in args.parts:
        compare("hyper tile [2,4,256,256] d64 fwd+bwd", hyper_modes(), args.rounds, args.steps)
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
