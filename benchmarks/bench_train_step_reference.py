"""One training step (forward + backward + AdamW step) of latentcode beside the authors' JAX code,
in one run: fuzzy logic and SRAVEN x softmax / linear / HYLA at the paper's sizes (those of
`bench_model_step.py`), batch 128, attention dropout 0.1, training mode, MSE loss.

The reference is smonsays/hypernetwork-attention (MIT licence; never copied into this repository).
To run it, clone it and give it a Python of its own with JAX on the CPU:

    git clone https://github.com/smonsays/hypernetwork-attention /path/to/hypernetwork-attention
    python -m venv /path/to/jax-venv
    /path/to/jax-venv/bin/pip install "jax[cpu]" flax optax chex
    python benchmarks/bench_train_step_reference.py \\
        --reference /path/to/hypernetwork-attention --reference-python /path/to/jax-venv/bin/python

Only its model files are used (`hyla/models/{transformer,attention,feedforward,position}.py`,
unchanged): `CausalTransformer` with `sequence_mixer` softmax_attention / linear_attention /
linear_hypatt, no causal mask, relative position biases, `optax.adamw(1e-3, weight_decay=0.1)` with
the authors' weight-decay mask (their `run.py` with `mask_weight_decay=True`, as in their configs:
every parameter but the one-dimensional ones, biases and layer-norm scales, is decayed), the whole step `jax.jit`-compiled (compile time excluded from the step times, printed apart). Its
configs give the fuzzy-logic model 128 relative-position buckets; here both sides use `n_ctx`
buckets (32), so that the parameter counts match (both are printed). Without `--reference` and
`--reference-python` (or when the reference cannot start) it says why and prints latentcode alone.

Each configuration runs in interleaved rounds: a round times `--steps` steps of latentcode, then
`--steps` steps of the reference (a subprocess waiting on a pipe meanwhile), so a change of machine
load hits both; medians over the rounds' steps. Settings:

    pinned    both on one core (`--core`, set with sched_setaffinity as `taskset -c N` does), torch
              with 1 thread, XLA with --xla_cpu_multi_thread_eigen=false (this flag alone still
              uses two cores: pin)
    2 threads both on cores 0,1, torch with 2 threads, XLA with its defaults (`--settings
              two-threads`, or both settings with `--settings pinned two-threads`). On a busy
              machine torch's OpenMP threads spin at every barrier while the other thread waits
              for a core: run this setting with OMP_WAIT_POLICY=PASSIVE as well (it must be in the
              environment before torch starts) and compare.

latentcode's side is `bench_model_step.Stepper` in its "eager" mode: what `latentcode train` runs (the
fused short-sequence attention of `latentcode.models.fused_short`, the project's AdamW parameter groups,
MKL's CPU check as MKL answers it unless `--mkl-on-amd`: `latentcode.models.mkl_on_amd`).

The allocator is the same on both sides (`--allocator`): "kept" (the default, what `latentcode train`
does) keeps freed memory in glibc's heap, in latentcode's process by `latentcode.allocator.keep_freed_memory`
(mallopt) and in the reference's by the same two thresholds in its environment (glibc reads
MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ at start); "glibc" leaves both at glibc's defaults.
The header of every run prints the versions (torch, JAX, jaxlib, flax, optax), the CPU model, the
allocator of each side and the thread settings (OMP_NUM_THREADS, OMP_WAIT_POLICY, MKL_NUM_THREADS,
XLA_FLAGS as given to the reference); each setting's line adds its cores, threads and XLA flags.

ratio = reference median / latentcode median (above 1: latentcode faster; the goal is >= 2).
Quote the load average it prints: only ratios within one run compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REFERENCE_MIXER = {"softmax": "softmax_attention", "linear": "linear_attention", "hyla": "linear_hypatt"}
REFERENCE_MODEL_FILE = Path("hyla") / "models" / "transformer.py"
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false"  # a real XLA flag; the core is pinned as well
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "XLA_FLAGS")
ALLOCATORS = ("kept", "glibc")
BATCH = 128


def serve_reference(reference: str) -> None:
    """Reference side (runs under --reference-python). Reads one JSON line (sizes, attention), builds
    and compiles the step, answers {"parameters", "compile_s", "jax"}; then for each line `n` runs n
    steps and answers the list of their milliseconds."""
    sys.path.insert(0, reference)
    import jax
    import jax.numpy as jnp
    import optax
    from hyla.models.transformer import CausalTransformer, TransformerConfig

    request = json.loads(sys.stdin.readline())
    size = request["size"]
    config = TransformerConfig(
        num_heads=size["n_heads"], num_layers=size["n_layers"], emb_dim=size["d_model"],
        qk_dim=size["kqv_dim"], v_dim=size["kqv_dim"], mlp_dim=size["d_mlp"], output_dim=size["d_out"],
        dropout_rate=0.0, attention_dropout_rate=0.1, sequence_mixer=REFERENCE_MIXER[request["attention"]],
        use_causal_mask=False, use_relative_position=True, relative_position_max_dist=size["n_ctx"])
    model = CausalTransformer(config)
    key_inputs, key_targets, key_params, key_dropout = jax.random.split(jax.random.PRNGKey(0), 4)
    inputs = jax.random.uniform(key_inputs, (BATCH, size["n_ctx"], size["d_in"]))
    targets = jax.random.normal(key_targets, (BATCH, size["n_ctx"], size["d_out"]))
    params = model.init(key_params, inputs, deterministic=True)["params"]
    # The authors' mask (run.py, mask_weight_decay=True in their configs): no decay of biases and norms.
    optimizer = optax.adamw(1e-3, weight_decay=0.1,
                            mask=lambda params: jax.tree_util.tree_map(lambda leaf: leaf.ndim != 1, params))
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, rng, inputs, targets):
        rng, dropout = jax.random.split(rng)

        def loss_fn(params):
            outputs = model.apply({"params": params}, inputs, deterministic=False, rngs={"dropout": dropout})
            return jnp.mean((outputs - targets) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, rng, loss

    start = time.perf_counter()
    params, state, rng, loss = step(params, state, key_dropout, inputs, targets)
    loss.block_until_ready()
    compile_s = time.perf_counter() - start
    parameters = sum(leaf.size for leaf in jax.tree_util.tree_leaves(params))
    decayed = sum(leaf.size for leaf in jax.tree_util.tree_leaves(params) if leaf.ndim != 1)
    print(json.dumps({"parameters": int(parameters), "decayed": int(decayed), "compile_s": compile_s}), flush=True)
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            start = time.perf_counter()
            params, state, rng, loss = step(params, state, rng, inputs, targets)
            loss.block_until_ready()
            times.append((time.perf_counter() - start) * 1000)
        print(json.dumps(times), flush=True)


class ReferenceStepper:
    """The reference's step in a subprocess of `python`, pinned to `cores`; `run(n)` as Stepper's."""

    def __init__(self, python: str, reference: str, size: dict, attention: str, cores: set[int], allocator: str):
        environment = reference_environment(os.environ, allocator, len(cores))
        self.process = subprocess.Popen(
            [python, __file__, "--serve-reference", reference], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
            preexec_fn=lambda: os.sched_setaffinity(0, cores))
        self.info = self._ask(json.dumps({"size": size, "attention": attention}))

    def _ask(self, line: str):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            error = self.process.stderr.read().strip().splitlines()
            raise RuntimeError(error[-1] if error else f"exit status {self.process.wait()}")
        return json.loads(answer)

    def run(self, steps: int) -> list[float]:
        return self._ask(str(steps))

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def reference_environment(environment, allocator: str, n_cores: int) -> dict[str, str]:
    """The reference's environment: JAX on the CPU, the allocator of `allocator` (glibc's variables
    for the thresholds `keep_freed_memory` sets with mallopt, or none of them), and on one core
    the single-thread XLA flag."""
    from latentcode.allocator import KEPT_MMAP_THRESHOLD, KEPT_TRIM_THRESHOLD

    environment = {name: value for name, value in environment.items()
                   if name not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    environment["JAX_PLATFORMS"] = "cpu"
    if allocator == "kept":
        environment["MALLOC_MMAP_THRESHOLD_"] = str(KEPT_MMAP_THRESHOLD)
        environment["MALLOC_TRIM_THRESHOLD_"] = str(KEPT_TRIM_THRESHOLD)
    if n_cores == 1:
        environment["XLA_FLAGS"] = SINGLE_THREAD_XLA
    return environment


def reference_versions(python: str) -> dict[str, str]:
    """The versions of JAX, jaxlib, flax and optax in the reference's Python (or why they are unknown)."""
    code = ("import json, importlib.metadata as m; print(json.dumps({name: m.version(name) "
            "for name in ('jax', 'jaxlib', 'flax', 'optax')}))")
    try:
        result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(result.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as error:
        return {"jax": f"unknown ({type(error).__name__})"}


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo (the first "model name" line), or "unknown"."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def header(torch_version: str, versions: dict[str, str] | None, cpu: str, allocator: str, memory_kept: bool,
           environment: dict[str, str]) -> list[str]:
    """The header's lines: versions, CPU, each side's allocator and the thread variables as set in
    this process's environment (the reference's own XLA_FLAGS are printed per setting)."""
    if versions is None:
        reference = "reference not run"
    else:
        reference = ", ".join(f"{name} {versions.get(name, '?')}" for name in ("jax", "jaxlib", "flax", "optax"))
    if allocator == "kept":
        from latentcode.allocator import KEPT_MMAP_THRESHOLD, KEPT_TRIM_THRESHOLD

        ours = "freed memory kept (mallopt: mmap threshold {}, trim threshold {}){}".format(
            KEPT_MMAP_THRESHOLD, KEPT_TRIM_THRESHOLD, "" if memory_kept else " -- mallopt FAILED: glibc defaults")
        theirs = f"MALLOC_MMAP_THRESHOLD_={KEPT_MMAP_THRESHOLD} MALLOC_TRIM_THRESHOLD_={KEPT_TRIM_THRESHOLD}"
    else:
        ours, theirs = "glibc defaults", "glibc defaults (no MALLOC_* variables)"
    threads = " ".join(f"{name}={environment.get(name, '(unset)')}" for name in THREAD_VARIABLES)
    return [f"versions: torch {torch_version}; {reference}",
            f"cpu: {cpu}",
            f"allocator: latentcode {ours}; reference {theirs}",
            f"thread settings in the environment: {threads}"]


def reference_missing(args) -> str | None:
    """Why the reference cannot run, or None."""
    if not args.reference or not args.reference_python:
        return "no --reference / --reference-python given"
    if not (Path(args.reference) / REFERENCE_MODEL_FILE).is_file():
        return f"--reference {args.reference!r} has no {REFERENCE_MODEL_FILE} (expected the cloned repository)"
    if not os.access(args.reference_python, os.X_OK):
        return f"--reference-python {args.reference_python!r} is not an executable"
    return None


def summary(times: list[float]) -> str:
    quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return f"{statistics.median(times):8.1f} {quartiles[0]:6.1f}-{quartiles[2]:6.1f}"


def measure(args, cores: set[int], threads: int, label: str, reference_skip: str | None) -> None:
    import torch
    from bench_model_step import SIZES, Stepper

    from latentcode.models.mkl_on_amd import mkl_setting, use_mkl_fast_paths

    mkl = use_mkl_fast_paths() if args.mkl_on_amd else mkl_setting()  # off unless asked, as in `latentcode train`
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    xla = reference_environment({}, args.allocator, len(cores)).get("XLA_FLAGS", "(its defaults)")
    print(f"\n[{label}] cores {sorted(cores)}, torch {threads} thread(s), reference XLA_FLAGS {xla}, "
          f"load before: {loadavg()}\n{mkl}")
    print(f"{'task':12s} {'attention':10s} {'params ours/ref':>17s} {'ours ms':>8s} {'IQR':>13s} "
          f"{'ref ms':>8s} {'IQR':>13s} {'ratio':>6s} {'compile s':>9s}")
    for task in args.task:
        for attention in args.attention:
            ours = Stepper(task, attention, "eager")
            parameters = sum(p.numel() for p in ours.model.parameters())
            reference = None
            if reference_skip is None:
                try:
                    reference = ReferenceStepper(args.reference_python, args.reference, SIZES[task],
                                                 attention, cores, args.allocator)
                except (RuntimeError, OSError, ValueError) as error:
                    reference_skip = f"the reference did not start: {error}"
                    print(f"reference skipped: {reference_skip}")
            ours.run(args.warmup)
            if reference:
                reference.run(args.warmup)
            times: dict[str, list[float]] = {"ours": [], "reference": []}
            for _ in range(args.rounds):
                times["ours"] += ours.run(args.steps)
                if reference:
                    times["reference"] += reference.run(args.steps)
            line = f"{task:12s} {attention:10s} {parameters:8d}/"
            if reference:
                reference.close()
                ratio = statistics.median(times["reference"]) / statistics.median(times["ours"])
                print(f"{line}{reference.info['parameters']:<8d} {summary(times['ours'])} "
                      f"{summary(times['reference'])} {ratio:5.2f}x {reference.info['compile_s']:9.1f}", flush=True)
            else:
                print(f"{line}{'-':8s} {summary(times['ours'])}", flush=True)
    print(f"[{label}] load after: {loadavg()}")


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-reference":
        serve_reference(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", help="the cloned hypernetwork-attention repository")
    parser.add_argument("--reference-python", help="a python with jax, flax, optax and chex")
    parser.add_argument("--steps", type=int, default=10, help="steps per implementation per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--core", type=int, default=0, help="the core of the pinned setting")
    parser.add_argument("--settings", nargs="+", default=["pinned"], choices=["pinned", "two-threads"],
                        help="pinned: one core each; two-threads: cores 0,1 and 2 threads each")
    parser.add_argument("--attention", nargs="+", default=list(REFERENCE_MIXER), choices=list(REFERENCE_MIXER))
    parser.add_argument("--task", nargs="+", default=["fuzzy_logic", "sraven"], choices=["fuzzy_logic", "sraven"])
    parser.add_argument("--allocator", choices=ALLOCATORS, default="kept",
                        help="kept: freed memory kept in the heap on both sides (as `latentcode train`); "
                             "glibc: glibc's defaults on both sides")
    parser.add_argument("--mkl-on-amd", action="store_true",
                        help="answer MKL's CPU check on AMD CPUs, as `latentcode train --mkl-on-amd` (default: off)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    reference_skip = reference_missing(args)
    if reference_skip:
        print(f"reference skipped: {reference_skip}; latentcode alone")
    import torch

    from latentcode.allocator import keep_freed_memory

    memory_kept = keep_freed_memory() if args.allocator == "kept" else False  # as `latentcode train` does
    has_python = bool(args.reference_python) and os.access(args.reference_python, os.X_OK)
    versions = reference_versions(args.reference_python) if has_python else None
    for line in header(torch.__version__, versions, cpu_model(), args.allocator, memory_kept, dict(os.environ)):
        print(line)
    print(f"batch {BATCH}, {args.rounds} interleaved rounds x {args.steps} steps "
          f"per implementation (after {args.warmup} warm-up steps); ratio = reference / latentcode median")
    if "pinned" in args.settings:
        measure(args, {args.core}, 1, "pinned", reference_skip)
    if "two-threads" in args.settings:
        measure(args, {0, 1}, 2, "2 threads", reference_skip)


if __name__ == "__main__":
    main()
