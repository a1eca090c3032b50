"""What the analysis scripts share: their command line, training a grid of runs, extracting codes.

Built only on latentcode's public API. Every script takes `--scale` (tiny, demo, cpu, paper) and
writes its table and figure under `--out`; trained runs live in `OUT/runs/` (a sweep directory,
so a script run again skips finished runs and resumes unfinished ones). `--runs-from DIR` uses
finished runs `DIR/<task>-<attention>` instead of training (e.g. `--runs-from models` for the
shipped checkpoints).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

ATTENTIONS = ("softmax", "linear", "hyla")


def parser(description: str, default_out: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="demo", choices=("tiny", "demo", "cpu", "paper"),
                        help="training budget of every run (default demo; the paper's figures need paper)")
    parser.add_argument("--out", default=f"analyses/output/{default_out}", help="where the table, figure and runs go")
    parser.add_argument("--attention", nargs="+", default=list(ATTENTIONS), help="attention presets to compare")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (default 0)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override a model/task/training field of every run, e.g. --set n_layers=1")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at a time, each in its own process")
    parser.add_argument("--runs-from", metavar="DIR", help="use finished runs DIR/<task>-<attention> instead of training")
    parser.add_argument("--n-codes", type=int, default=2048, help="instances per split whose codes are extracted")
    parser.add_argument("--quiet", action="store_true")
    return parser


def overrides(args: argparse.Namespace) -> dict:
    from latentcode.cli import parse_assignments

    return parse_assignments(args.set, "--set")


def seeds(args: argparse.Namespace) -> list[int]:
    return [int(seed) for seed in args.seeds.split(",") if seed]


def train_grid(args: argparse.Namespace, preset: str, grid: dict[str, list]) -> list[dict]:
    """Train (or find) every run of `grid` x `--set` x seeds; returns the sweep's result rows with
    a `path` to each run directory."""
    from latentcode.training.sweeps import sweep

    out = Path(args.out) / "runs"
    full_grid = {**grid, **{key: [value] for key, value in overrides(args).items()}}
    rows = sweep(preset, args.scale, full_grid, out, seeds=seeds(args), jobs=args.jobs, progress=not args.quiet)
    for row in rows:
        row["path"] = out / row["run"]
    return rows


def model_runs(args: argparse.Namespace, preset: str, extra_grid: dict | None = None) -> dict[str, Path]:
    """One finished run per attention preset (first seed): from `--runs-from`, else trained."""
    if args.runs_from:
        runs = {attention: Path(args.runs_from) / f"{preset}-{attention}" for attention in args.attention}
        missing = [str(path) for path in runs.values() if not (path / "summary.json").is_file()]
        if missing:
            raise SystemExit(f"--runs-from: no finished run at {', '.join(missing)}")
        return runs
    rows = train_grid(args, preset, {"attention": list(args.attention), **(extra_grid or {})})
    return {row["attention"]: row["path"] for row in rows if row["seed"] == seeds(args)[0]}


def codes_of(run: Path, selector: str, variant: str, n: int, out: str | Path,
             splits: Sequence[str] = ("train", "ood"), quiet: bool = False) -> Path:
    """The run's codes at `selector` on `splits`, extracted once into `out/codes/` and then reused
    (never into the run directory itself, which may be a shipped checkpoint under models/)."""
    import latentcode

    path = Path(out) / "codes" / Path(run).name / f"{selector}-{variant}-{n}.h5"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        for index, split in enumerate(splits):
            latentcode.extract(run, selector=selector, split=split, n=n, out=path, variant=variant,
                               append=index > 0, progress=not quiet)
    return path


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path
