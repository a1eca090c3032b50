"""The kernels as PyTorch operators (issue 46) against the ctypes kernels they replaced, in one process.

`--old PATH` is a checkout from before the change (e.g. `git worktree add /tmp/old 2037877`): its
`latentcode` package is copied to a temporary directory as `latentcode_old` (every `latentcode` name,
operator namespace included, renamed), so that both import side by side. Each part times forward +
backward, one thread, in interleaved rounds (each round times every mode, starting with the next one:
the mode timed first in a round was seen to lose up to 10% on a busy machine), medians in ms and the
ratio mode / new (above 1: the operators are faster):

    gelu        [4608, 256] (SRAVEN's MLP): new operator, old ctypes kernel, F.gelu(approximate="tanh")
    attention   one HYLA layer in training, batch 128 of SRAVEN (T=36, 16 heads of 4) or fuzzy logic
                (T=32, 8 of 2): the fused short-sequence kernel, new and old, and the full path (formula)
    hyper       the blockwise tile (codes [2, 4, 256, 256], values of width 64): new, old, batched products
    step        a SRAVEN HYLA model's training step (4 layers, batch 128, AdamW), new and old

    python benchmarks/bench_kernels_old_new.py --old /tmp/old [--rounds 5] [--steps 5] [--parts gelu ...]

On a busy machine only the ratios within one run compare; the load average is printed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

SIZES = {
    "sraven": dict(d_model=128, n_heads=16, kqv_dim=64, n_ctx=36),
    "fuzzy_logic": dict(d_model=128, n_heads=8, kqv_dim=16, n_ctx=32),
}


def import_old(checkout: Path):
    """The checkout's `latentcode` package, renamed `latentcode_old`, imported."""
    target = Path(tempfile.mkdtemp(prefix="latentcode-old-"))
    shutil.copytree(checkout / "latentcode", target / "latentcode_old")
    for path in (target / "latentcode_old").rglob("*.py"):
        path.write_text(re.sub(r"\blatentcode\b", "latentcode_old", path.read_text()))
    sys.path.insert(0, str(target))
    return importlib.import_module("latentcode_old")


def compare(label: str, modes: dict, rounds: int, steps: int) -> None:
    for function in modes.values():  # warm-up: builds, first calls
        for _ in range(2):
            function()
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    names = list(modes)
    for round_index in range(rounds):  # each round starts with the next mode: none always runs first
        for mode in names[round_index % len(names):] + names[:round_index % len(names)]:
            function = modes[mode]
            for _ in range(steps):
                start = time.perf_counter()
                function()
                times[mode].append((time.perf_counter() - start) * 1000)
    new = statistics.median(times["new"])
    print(f"{label:36s} " + "  ".join(f"{mode} {statistics.median(t):8.2f} ms ({statistics.median(t) / new:4.2f}x)"
                                       for mode, t in times.items()), flush=True)


def gelu_modes(old) -> dict:
    from latentcode.models import fused_gelu

    old_gelu = importlib.import_module("latentcode_old.models.fused_gelu")
    x = torch.randn(4608, 256, generator=torch.Generator().manual_seed(0)).requires_grad_()
    grad = torch.randn(4608, 256, generator=torch.Generator().manual_seed(1))

    def step(function):
        def run():
            x.grad = None
            function(x).backward(grad)
        return run

    return {"new": step(fused_gelu.gelu), "old": step(old_gelu.gelu),
            "formula": step(lambda t: F.gelu(t, approximate="tanh"))}


def layers(module_root: str, task: str):
    attention = importlib.import_module(f"{module_root}.models.attention")
    config = importlib.import_module(f"{module_root}.models.config")
    torch.manual_seed(0)
    return attention.Attention(config.ModelConfig(attention="hyla", attn_dropout=0.1, n_layers=1, d_mlp=256, d_in=8,
                                                  d_out=8, **SIZES[task])).train()


def attention_modes(task: str) -> dict:
    new, old, full = layers("latentcode", task), layers("latentcode_old", task), layers("latentcode", task)
    full.path = "full"
    x = torch.randn(128, SIZES[task]["n_ctx"], SIZES[task]["d_model"], generator=torch.Generator().manual_seed(0))

    def step(module):
        parameters = list(module.parameters())

        def run():
            for parameter in parameters:
                parameter.grad = None
            module(x).sum().backward()
        return run

    return {"new": step(new), "old": step(old), "formula": step(full)}


def hyper_modes() -> dict:
    from latentcode.models import fused_hyper

    old_hyper = importlib.import_module("latentcode_old.models.fused_hyper")
    generator = torch.Generator().manual_seed(0)
    codes = torch.rand(2, 4, 256, 256, generator=generator) / 16
    values = torch.randn(2, 256, 4, 64, generator=generator)
    grad_z = torch.randn(2, 256, 4, 64, generator=generator)
    network = next(module for module in layers("latentcode", "sraven").modules() if hasattr(module, "forward_tile"))

    def kernel(module):
        def run():
            module.forward(codes, values, relu=True)
            module.backward(codes, values, grad_z, relu=True)
        return run

    def batched_products():
        with fused_hyper.use_fused(False):
            network.forward_tile(codes, values)
            network.backward_tile(codes, values, grad_z)

    return {"new": kernel(fused_hyper), "old": kernel(old_hyper), "formula": batched_products}


def step_modes() -> dict:
    modes = {}
    for mode, root in (("new", "latentcode"), ("old", "latentcode_old")):
        config = importlib.import_module(f"{root}.models.config").ModelConfig(
            attention="hyla", attn_dropout=0.1, n_layers=4, d_mlp=256, d_in=8, d_out=8, **SIZES["sraven"])
        model = importlib.import_module(f"{root}.models.transformer").build_model(config, seed=0).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(0)
        inputs, targets = torch.rand(128, 36, 8, generator=generator), torch.randn(128, 36, 8, generator=generator)

        def run(model=model, optimizer=optimizer, inputs=inputs, targets=targets):
            optimizer.zero_grad(set_to_none=True)
            F.mse_loss(model(inputs), targets).backward()
            optimizer.step()
        modes[mode] = run
    return modes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="a checkout from before the operators")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed calls per mode per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parts", nargs="+", default=["gelu", "attention", "hyper", "step"],
                        choices=["gelu", "attention", "hyper", "step"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    old = import_old(args.old)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average {os.getloadavg()}", flush=True)
    print("ratio = mode / new median (above 1: the operators are faster)")
    if "gelu" in args.parts:
        compare("gelu [4608, 256] fwd+bwd", gelu_modes(old), args.rounds, args.steps)
    if "attention" in args.parts:
        for task in SIZES:
            compare(f"attention {task} hyla fwd+bwd", attention_modes(task), args.rounds, args.steps)
    if "hyper" in args.parts:
        compare("hyper tile [2,4,256,256] d64 fwd+bwd", hyper_modes(), args.rounds, args.steps)
    if "step" in args.parts:
        compare("sraven hyla training step", step_modes(), args.rounds, max(1, args.steps // 2))
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
