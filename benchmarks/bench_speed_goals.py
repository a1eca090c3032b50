"""Issue 37's speed goals in one run: the training step against the authors' JAX code, HYLA against
softmax at long sequences, and the patching sweep's time and its user and system CPU time.

It runs three benchmarks one after the other, each in its own process, prints their whole output, then
a summary of every goal with the figure measured and whether it is met:

    bench_train_step_reference.py --settings pinned two-threads
                    the six training steps (fuzzy logic, SRAVEN x softmax, linear, HYLA), pinned to one
                    core each and with two threads each; goal: reference / latentcode >= 2 each
    bench_long_sequences.py --lengths 1024 4096 --paths auto
                    HYLA's auto path (blockwise, fused kernels) against softmax's (sdpa) at T = 1,024 and
                    4,096, forward + backward; goal: time <= 2x
    bench_patching.py
                    the sweep of layer 2's groups (goal <= 1.5 x groups x a forward), attribution
                    (goal <= 2.5 x a forward) and the sweep's user and system CPU time

    python benchmarks/bench_speed_goals.py --reference /path/to/hypernetwork-attention \\
        --reference-python /path/to/jax-venv/bin/python [--quick]

(see bench_train_step_reference.py for installing the reference; without it the training step is
measured alone and its goals are reported as not measured). `--quick`: fewer steps, repeats and
groups (about 10 minutes on 2 idle cores instead of about 25). Only ratios measured within one run
compare; the load average is printed before and after every part. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_LINE = re.compile(r"^(fuzzy_logic|sraven)\s+(softmax|linear|hyla)\s.*\s(\d+\.\d+)x\s")
SETTING_LINE = re.compile(r"^\[(pinned|2 threads)\] cores")
HYLA_LINE = re.compile(r"^\s*(\d+) hyla\s+auto\s+\S+\s+\d+\s+[\d.]+\s+([\d.]+)\s+([\d.]+)")  # ratios to softmax auto
SWEEP_LINE = re.compile(r"^sweep of (\d+) groups.*= ([\d.]+) x")
CPU_LINE = re.compile(r"its CPU time: user ([\d.]+) s, system ([\d.]+) s")
ATTRIBUTION_LINE = re.compile(r"^attribution, every .* = ([\d.]+) x a bare forward")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(arguments: list[str]) -> list[str]:
    """Run a benchmark of this folder with one torch thread, echo its output as it comes; its lines."""
    command = [sys.executable, str(HERE / arguments[0]), *arguments[1:]]
    print(f"\n$ {' '.join(command)}   (load {loadavg()})", flush=True)
    environment = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
    lines = []
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    if process.wait() != 0:
        print(f"(exit status {process.returncode})")
    return lines


def train_ratios(lines: list[str]) -> dict[tuple[str, str, str], float]:
    ratios, setting = {}, None
    for line in lines:
        if match := SETTING_LINE.match(line):
            setting = match.group(1)
        elif (match := TRAIN_LINE.match(line)) and setting:
            ratios[setting, match.group(1), match.group(2)] = float(match.group(3))
    return ratios


HEADER_PREFIXES = ("versions:", "cpu:", "allocator:", "thread settings", "[pinned] cores", "[2 threads] cores")


def header_lines(lines: list[str]) -> list[str]:
    """The header lines of bench_train_step_reference.py's output (versions, CPU, allocator, thread
    settings, each setting's cores and XLA flags), in their order."""
    return [line.strip() for line in lines if line.strip().startswith(HEADER_PREFIXES)]


def verdict(value: float | None, goal: float, at_least: bool) -> str:
    if value is None:
        return "not measured"
    met = value >= goal if at_least else value <= goal
    return "met" if met else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", help="the cloned hypernetwork-attention repository")
    parser.add_argument("--reference-python", help="a python with jax, flax, optax and chex")
    parser.add_argument("--quick", action="store_true", help="fewer steps, repeats and groups")
    args = parser.parse_args()
    reference = []
    if args.reference and args.reference_python:
        reference = ["--reference", args.reference, "--reference-python", args.reference_python]
    steps = ["--steps", "4", "--rounds", "3", "--warmup", "2"] if args.quick else ["--steps", "8", "--rounds", "3"]
    train = run(["bench_train_step_reference.py", *reference, *steps, "--settings", "pinned", "two-threads"])
    long = run(["bench_long_sequences.py", "--lengths", "1024", "4096", "--paths", "auto",
                "--repeats", "1" if args.quick else "3", "--compile-length", "0"])
    patching = run(["bench_patching.py", "--repeats", "1" if args.quick else "3",
                    *(["--groups", "108"] if args.quick else [])])

    print(f"\nsummary (issue 37's goals; load at the end {loadavg()}):")
    for line in header_lines(train):  # versions, CPU, allocator and thread settings of the training step
        print(f"  {line}")
    ratios = train_ratios(train)
    for setting in ("pinned", "2 threads"):
        for task in ("fuzzy_logic", "sraven"):
            for attention in ("softmax", "linear", "hyla"):
                ratio = ratios.get((setting, task, attention))
                shown = f"{ratio:.2f}x" if ratio is not None else "-"
                print(f"  train step {setting:9s} {task:11s} {attention:8s} reference / latentcode {shown:>6s} "
                      f"(goal >= 2): {verdict(ratio, 2.0, at_least=True)}")
    hyla = {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in map(HYLA_LINE.match, long) if m}
    for length in (1024, 4096):
        memory, time = hyla.get(length, (None, None))
        shown = f"time {time:.2f}x, memory {memory:.2f}x" if time is not None else "-"
        print(f"  HYLA / softmax at T = {length}: {shown} (goal: time <= 2): {verdict(time, 2.0, at_least=False)}")
    sweep = next((m for m in map(SWEEP_LINE.match, patching) if m), None)
    cpu = next((m for m in map(CPU_LINE.search, patching) if m), None)
    attribution = next((m for m in map(ATTRIBUTION_LINE.match, patching) if m), None)
    sweep_ratio = float(sweep.group(2)) if sweep else None
    print(f"  patching sweep of {sweep.group(1) if sweep else '?'} groups: {sweep_ratio}x groups x a forward "
          f"(goal <= 1.5): {verdict(sweep_ratio, 1.5, at_least=False)}")
    if cpu:
        user, system = float(cpu.group(1)), float(cpu.group(2))
        print(f"  its CPU time: user {user:.1f} s, system {system:.1f} s ({system / user:.1%} of user)")
    attribution_ratio = float(attribution.group(1)) if attribution else None
    print(f"  attribution of every site: {attribution_ratio}x a forward (goal <= 2.5): "
          f"{verdict(attribution_ratio, 2.5, at_least=False)}")


if __name__ == "__main__":
    main()
