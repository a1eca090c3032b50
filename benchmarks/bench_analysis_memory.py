"""Peak memory of `latentcode probe` and `latentcode report` against the rows of a codes file, at
the default cap (`--max-rows`, 20,000 examples of each split): it should stay flat, since the
analysis reads a seeded subsample and the file is opened in 2 bytes a row.

    python benchmarks/bench_analysis_memory.py [--rows 100000 1000000 5000000] [--dir /tmp]

For each size it writes a synthetic codes file (2 layers x 1 site x 8 heads of float32 codes, a
planted 8-valued `rule` label, half the rows `train` and half `ood`) into a temporary directory
under --dir, runs each command in a fresh interpreter (`python -m latentcode.cli`, one thread),
and prints its peak resident memory (the child's ru_maxrss, from os.wait4) and wall time; the
files are deleted at the end. A 5-million-row file is about 0.4 GB on disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from latentcode.store import CodeWriter, Site

REPOSITORY = Path(__file__).resolve().parents[1]
SITES = [Site(0, 35, 35), Site(1, 35, 35)]
N_HEADS = 8
ANALYSIS = {"probe_label": "rule", "picture_label": "rule", "selector": "sraven-rule", "variant": "unpermuted",
            "headline_metric": "accuracy"}


def write_codes(path: Path, rows: int, block: int = 250_000) -> None:
    """`rows` examples, half train and half ood; the rule is planted in head `rule` of layer 1."""
    rng = np.random.default_rng(0)
    metadata = {"model_name": "hyla", "model_config": {"attention": "hyla"}, "task_config": {"name": "sraven"},
                "task_analysis": ANALYSIS, "seed": 0}
    with CodeWriter(path, SITES, N_HEADS, metadata) as writer:
        for split in ("train", "ood"):
            left = rows // 2
            while left:
                n = min(block, left)
                rule = rng.integers(0, 8, n)
                codes = {site: rng.normal(size=(n, N_HEADS)).astype(np.float32) for site in SITES}
                codes[SITES[1]][np.arange(n), rule] += 2.0
                writer.append(codes=codes, labels={"rule": rule}, split=split)
                left -= n


def peak_memory(arguments: list[str], cwd: Path) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of `python -m latentcode.cli ARGUMENTS` in a fresh process."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPOSITORY)}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "latentcode.cli", *arguments], cwd=cwd, env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # wait4 gives this child's own rusage (RUSAGE_CHILDREN would keep the maximum over all children)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    output, errors = process.stdout.read().decode(), process.stderr.read().decode()
    if process.returncode:
        raise SystemExit(f"{arguments[0]} failed ({process.returncode}): {errors[-2000:]}")
    notes = [line for line in output.splitlines() if line.startswith("note:")]
    if notes:
        print(f"    {notes[0]}", flush=True)
    return usage.ru_maxrss / 1024, seconds  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    parser.add_argument("--commands", nargs="+", choices=("probe", "report"), default=["probe", "report"])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the codes files go (deleted at the end)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_analysis_memory_", dir=args.dir))
    results = []
    try:
        for rows in args.rows:
            path = work / f"codes_{rows}.h5"
            started = time.perf_counter()
            write_codes(path, rows)
            print(f"{rows:>10,} rows: wrote {path.stat().st_size / 2**20:,.0f} MiB in {time.perf_counter() - started:.0f} s", flush=True)
            probe = report = (float("nan"), float("nan"))
            if "probe" in args.commands:
                probe = peak_memory(["probe", str(path), "--quiet"], work)
                print(f"    probe  peak {probe[0]:7.0f} MiB  {probe[1]:6.1f} s", flush=True)
            if "report" in args.commands:
                report = peak_memory(["report", "--codes", str(path), "--out", str(work / f"report_{rows}.html"),
                                      "--quiet"], work)
                print(f"    report peak {report[0]:7.0f} MiB  {report[1]:6.1f} s", flush=True)
            results.append((rows, probe[0], report[0]))
            path.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nrows        probe MiB   report MiB", flush=True)
    for rows, probe, report in results:
        print(f"{rows:>10,}  {probe:9.0f}  {report:11.0f}", flush=True)
    if len(results) > 1:
        for column, name in ((1, "probe"), (2, "report")):
            values = [result[column] for result in results]
            print(f"{name}: largest / smallest peak = {max(values) / min(values):.2f}", flush=True)


if __name__ == "__main__":
    main()
