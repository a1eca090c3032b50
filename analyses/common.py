"""What the analysis scripts share: their command line, training a grid of runs, extracting codes.

Built only on latentcode's public API. Every script takes `--scale` (tiny, demo, cpu, paper) and
writes its tables and figures under `--out` as one set (`output_set`); trained runs live in `OUT/runs/` (a sweep
directory, so a script run again skips finished runs and resumes unfinished ones). `--runs-from DIR` uses
finished runs `DIR/<task>-<attention>` (or `--run-name`) instead of training (e.g. `--runs-from models` for the
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
    parser.add_argument("--runs-from", metavar="DIR",
                        help="use finished runs DIR/<task>-<attention> instead of training")
    parser.add_argument("--run-name", default="{preset}-{attention}",
                        help="with --runs-from: the run directories' names (default {preset}-{attention}, the "
                             "shipped names; e.g. sraven-permuted-{attention})")
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
    from latentcode.training import sweep

    out = Path(args.out) / "runs"
    full_grid = {**grid, **{key: [value] for key, value in overrides(args).items()}}
    rows = sweep(preset, args.scale, full_grid, out, seeds=seeds(args), jobs=args.jobs, progress=not args.quiet)
    for row in rows:
        row["path"] = out / row["run"]
    return rows


def model_runs(args: argparse.Namespace, preset: str, extra_grid: dict | None = None) -> dict[str, Path]:
    """One finished run per attention preset (first seed): from `--runs-from`, else trained."""
    if args.runs_from:
        runs = {attention: Path(args.runs_from) / args.run_name.format(preset=preset, attention=attention)
                for attention in args.attention}
        missing = [str(path) for path in runs.values() if not (path / "summary.json").is_file()]
        if missing:
            raise SystemExit(f"--runs-from: no finished run at {', '.join(missing)}")
        return runs
    rows = train_grid(args, preset, {"attention": list(args.attention), **(extra_grid or {})})
    return {row["attention"]: row["path"] for row in rows if row["seed"] == seeds(args)[0]}


def codes_of(run: Path, selector: str, variant: str, n: int, out: str | Path,
             splits: Sequence[str] = ("train", "ood"), quiet: bool = False, name: str | None = None) -> Path:
    """The run's codes at `selector` on `splits`, extracted once into `out/codes/` and then reused
    (never into the run directory itself, which may be a shipped checkpoint under models/).
    `name` names the file in place of the selector (for long explicit site lists)."""
    import latentcode

    stem = f"{name}-{variant}-{n}-{'+'.join(splits)}" if name else f"{selector}-{variant}-{n}"
    path = Path(out) / "codes" / Path(run).name / f"{stem}.h5"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        for index, split in enumerate(splits):
            latentcode.extract(run, sites=selector, split=split, n=n, out=path, variant=variant,
                               append=index > 0, progress=not quiet)
    return path


def write_json(path: Path, data) -> Path:
    from latentcode.files import atomic_write_text

    return atomic_write_text(path, json.dumps(data, indent=2, default=str))


# --- interventions on finished runs (rule_swap, term_swap, head_ablation, topographic_similarity) ---

# The instances the intervention scripts edit are `task.sample(n, split, seed=(EXPERIMENT_SEED,))`:
# fresh draws, never the evaluation sets (`eval_seed`) from which `codes_of` extracts mean codes.
EXPERIMENT_SEED = 20_251_212


def add_intervention_arguments(parser: argparse.ArgumentParser, n: int = 2048) -> argparse.ArgumentParser:
    parser.add_argument("--n", type=int, default=n, help=f"instances intervened on per model (default {n})")
    parser.add_argument("--batch-size", type=int, default=128, help="instances per forward pass (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the random choices (other rule, donor, ...)")
    return parser


def load_run(run: str | Path):
    """`(model in eval mode, task, training variant)` of a finished run directory."""
    import latentcode

    record = latentcode.Run(run)
    model = record.load_model()
    model.eval()
    task = record.task()
    return model, task, record.config.variant or task.variants[0]


def sample(task, n: int, split: str, variant: str, seed: int = EXPERIMENT_SEED):
    """`n` fresh instances of `split` (see EXPERIMENT_SEED)."""
    return task.sample(n, split, seed=(seed,), variant=variant)


def predict(model, x, n_predictions: int, edits_for=None, sites=None, task_config=None,
            batch_size: int = 128):
    """The model's outputs at the last `n_predictions` positions, `[n, n_predictions, d_out]`, for
    inputs `x` `[n, ...]` in batches. With `edits_for(start, stop)` (the edits for examples
    start..stop, e.g. with their per-example labels) every pass runs under an Intervention whose
    default sites are `sites`."""
    import numpy as np
    import torch

    from latentcode import Intervention

    outputs = []
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            stop = min(start + batch_size, len(x))
            inputs = torch.from_numpy(np.ascontiguousarray(x[start:stop]))
            if edits_for is None:
                output = model(inputs)
            else:
                with Intervention(model, edits_for(start, stop), sites=sites, task_config=task_config):
                    output = model(inputs)
            outputs.append(output[:, -n_predictions:].float().numpy())
    return np.concatenate(outputs)


def record_codes(model, x, sites, task_config=None, batch_size: int = 128, mean: bool = False) -> dict:
    """The codes at `sites` on inputs `x`: `{Site: [n, H]}`, or with `mean` their mean `{Site: [H]}`
    (summed batch by batch, so that every pair of a layer fits in memory)."""
    import numpy as np
    import torch

    from latentcode import Recorder

    collected: dict = {}
    with Recorder(model, sites, task_config=task_config) as recorder, torch.no_grad():
        for start in range(0, len(x), batch_size):
            model(torch.from_numpy(np.ascontiguousarray(x[start:start + batch_size])))
            for site, codes in recorder.pop().items():
                if mean:
                    collected[site] = collected.get(site, 0.0) + codes.astype(np.float64).sum(axis=0)
                else:
                    collected.setdefault(site, []).append(codes)
    if mean:
        return {site: (total / len(x)).astype(np.float32) for site, total in collected.items()}
    return {site: np.concatenate(parts) for site, parts in collected.items()}


def bootstrap_se(statistic, n: int, n_boot: int = 500, seed: int = 0) -> float:
    """The bootstrap standard error of `statistic(indices)` over `n` independent instances."""
    import numpy as np

    rng = np.random.default_rng([seed, 7])
    values = [statistic(rng.integers(n, size=n)) for _ in range(n_boot)]
    return float(np.nanstd(values, ddof=1))


def binomial_se(fraction: float, n: int) -> float:
    """sqrt(p (1 - p) / n): the standard error of a fraction of n independent instances."""
    return float((fraction * (1 - fraction) / n) ** 0.5) if n else float("nan")


def markdown_table(frame, float_format: str = "{:.3f}") -> str:
    """A pandas frame as a GitHub markdown table (no tabulate needed)."""
    def cell(value) -> str:
        return float_format.format(value) if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def output_set(stem: Path, wait: float | None = 0.0):
    """The one set a script writes all its outputs in (`latentcode.files.AtomicOutputs`): each file
    into a temporary beside it, renamed over its name only when every file is written, never through
    a symbolic link; `stem` (the script's main output, e.g. OUT/rule_swap) is locked meanwhile, so that
    two commands writing one folder do not mix their files (the second is refused, or waits `wait` s).

    >>> with common.output_set(out / "rule_swap") as outputs:
    ...     common.write_tables(outputs, table, out / "rule_swap", summary)
    ...     outputs.write_figure(out / "rule_swap_query-row", figure)
    """
    from latentcode.files import AtomicOutputs

    return AtomicOutputs(lock=stem, wait=wait, purpose=f"writing {stem.name}")


def write_tables(outputs, frame, stem: Path, summary=None) -> None:
    """`stem.csv` and `stem.json` of the full table, `stem.md` of `summary` (default: the table), into
    the set `outputs` (see output_set)."""
    outputs.write_table(stem, frame)
    outputs.write_text(stem.with_name(f"{stem.name}.md"), markdown_table(frame if summary is None else summary))


def write_html(outputs, path: Path, title: str, parts: Sequence) -> None:
    """A small standalone HTML page at `path`, into the set `outputs` (see output_set): `parts` are
    strings (paragraphs; a leading '## ' makes a heading), pandas frames (tables) and paths of figures
    (shown relative to the page)."""
    import html

    import pandas as pd

    body = [f"<h1>{html.escape(title)}</h1>"]
    for part in parts:
        if isinstance(part, pd.DataFrame):
            body.append(part.to_html(index=False, float_format=lambda v: f"{v:.3f}", border=0))
        elif isinstance(part, Path):
            body.append(f'<p><img src="{html.escape(part.name)}" alt="{html.escape(part.stem)}" '
                        'style="max-width:100%"></p>')
        elif part.startswith("## "):
            body.append(f"<h2>{html.escape(part[3:])}</h2>")
        else:
            body.append(f"<p>{html.escape(part)}</p>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right}")
    outputs.write_text(path, f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
                             f"</title><style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def cached(path: Path, compute):
    """`compute()`'s JSON-able result, stored at `path` the first time and read back after, so that
    one model at a time can be measured and a last call with every model only gathers."""
    if path.is_file():
        return json.loads(path.read_text())
    return json.loads(write_json(path, compute()).read_text())


def subset(batch, mask):
    """The instances of `batch` where `mask` (bool `[n]`) holds, as a batch."""
    import dataclasses

    return dataclasses.replace(batch, x=batch.x[mask], y=batch.y[mask],
                               labels={name: values[mask] for name, values in batch.labels.items()})


def variance_explained(codes, labels) -> float:
    """The share of the codes' variance `[n, dim]` that the label `[n]` explains: between-group sum
    of squares over total sum of squares (eta², 0: the label is invisible in the codes' means)."""
    import numpy as np

    codes = np.asarray(codes, dtype=np.float64)
    centered = codes - codes.mean(axis=0)
    total = float((centered**2).sum())
    values, group = np.unique(labels, return_inverse=True)
    sums = np.zeros((len(values), codes.shape[1]))
    np.add.at(sums, group, centered)
    between = float(((sums**2).sum(axis=1) / np.bincount(group)).sum())
    return between / total if total > 0 else float("nan")


def share_of_code_variance(codes_path: Path, scopes: dict, label: str, split: str = "train") -> dict:
    """`{(site set, scope): variance_explained}` of `label` in the codes file's codes at each scope's
    sites (concatenated), on `split`: how much of the code the edits' label actually changes; and
    under the key "chance" its expectation for a label unrelated to the codes, (groups - 1) / (n - 1)."""
    import numpy as np

    import latentcode

    codes_file = latentcode.CodeFile(codes_path)
    labels = codes_file.labels(label, split)
    shares = {(site_set, scope): variance_explained(np.concatenate([codes_file.codes(site, split)
                                                                    for site in sites], 1),
                                                    labels)
              for site_set, set_scopes in scopes.items() for scope, sites in set_scopes.items()}
    return {**shares, "chance": (len(np.unique(labels)) - 1) / (len(labels) - 1)}
