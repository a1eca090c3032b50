"""The `latentcode` command line: thin wrappers that parse arguments and call the public API.

Every subcommand imports what it needs when it runs, so `latentcode --help` and the analysis
commands stay fast. Errors the user can fix (bad arguments, files that do not match) are printed
as one line, `error: ...`, with exit status 2; set LATENTCODE_DEBUG=1 for the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from latentcode.errors import LatentcodeError

USER_ERRORS = (LatentcodeError, ValueError, FileExistsError, FileNotFoundError, IndexError, MemoryError, KeyError)

Handler = Callable[[argparse.Namespace], int | None]
_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def subcommand(register: Callable[[argparse._SubParsersAction], None]):
    """Decorator: `register(subparsers)` adds one subcommand (with `set_defaults(handler=...)`)."""
    _SUBCOMMANDS.append(register)
    return register


# -- latentcode tasks ------------------------------------------------------------------------------
@subcommand
def _tasks(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tasks", help="inspect the tasks (SRAVEN ambiguity, counts)")
    commands = parser.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")
    ambiguity = commands.add_parser(
        "ambiguity",
        help="Monte Carlo estimate of the fraction of ambiguous SRAVEN instances",
        description="Estimate the fraction of SRAVEN instances whose 8 context panels admit "
        "another rule assignment with a different answer (see latentcode.tasks.ambiguity).",
    )
    ambiguity.add_argument("--features", type=int, default=4, help="M, features per panel (default 4)")
    ambiguity.add_argument("--values", type=int, default=8, help="K, values per feature (default 8)")
    ambiguity.add_argument("--n", type=int, default=4096, help="instances to check (default 4096)")
    ambiguity.add_argument("--seed", type=int, default=0)
    ambiguity.add_argument(
        "--criterion", choices=("all_features", "any_feature"), default="all_features",
        help="all_features: the authors' criterion (default); any_feature: the paper's wording",
    )
    ambiguity.add_argument(
        "--rules", choices=("strict", "authors"), default="strict",
        help="when distribute_three fits: strict, only as the generator makes it (default); "
        "authors, the authors' looser checker (with all_features: the paper's Table A2)",
    )
    ambiguity.set_defaults(handler=_run_ambiguity)

    counts = commands.add_parser("count", help="number of possible SRAVEN tasks and instances")
    counts.add_argument("--features", type=int, default=4)
    counts.add_argument("--values", type=int, default=8)
    counts.set_defaults(handler=_run_counts)


def _run_ambiguity(args: argparse.Namespace) -> None:
    import time

    from latentcode.tasks.sraven import estimate_ambiguity

    start = time.perf_counter()
    fraction, standard_error = estimate_ambiguity(
        args.features, args.values, args.n, args.seed, args.criterion, args.rules
    )
    seconds = time.perf_counter() - start
    print(
        f"M={args.features} K={args.values} n={args.n} criterion={args.criterion} "
        f"rules={args.rules}: "
        f"ambiguous fraction {fraction:.4f} ± {standard_error:.4f} (standard error), {seconds:.2f} s"
    )


def _run_counts(args: argparse.Namespace) -> None:
    from latentcode.tasks.sraven import count_instances, count_tasks

    print(f"SRAVEN M={args.features} K={args.values}: {count_tasks(args.features):,} tasks, "
          f"{count_instances(args.features, args.values):.3e} labelled instances")


def parse_value(text: str):
    """A command-line value: JSON (numbers, true/false/null, lists) where it parses, else the string."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: Sequence[str] | None, what: str) -> dict:
    values = {}
    for item in items or []:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"{what} expects KEY=VALUE, got {item!r}")
        values[key.strip().replace("-", "_")] = parse_value(value)
    return values


# -- latentcode train -------------------------------------------------------------------------------
TRAIN_OVERRIDES = (
    # flag, field, type, help
    ("--seed", "seed", int, "training seed: initialization, data stream and dropout (default 0)"),
    ("--lr", "learning_rate", float, "peak learning rate"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay (matrices only)"),
    ("--warmup-steps", "warmup_steps", int, "linear warmup steps"),
    ("--batch-size", "batch_size", int, "global batch size"),
    ("--instances", "n_train_instances", int, "training instances (overrides the scale)"),
    ("--n-layers", "n_layers", int, "transformer blocks"),
    ("--width-factor", "width_factor", int, "multiplies d_model, kqv_dim, v_dim, d_mlp and n_heads"),
    ("--n-heads", "n_heads", int, "attention heads"),
    ("--grad-clip", "grad_clip_norm", float, "clip gradients to this global norm"),
    ("--mixed-precision", "mixed_precision", str, "auto (bf16 where supported), no, bf16 or fp16"),
    ("--gradient-accumulation-steps", "gradient_accumulation_steps", int, "micro-batches per update"),
    ("--eval-every", "eval_every", int, "steps between evaluations"),
    ("--eval-instances", "eval_instances", int, "instances per evaluation split"),
    ("--checkpoint-every", "checkpoint_every", int, "steps between checkpoints"),
    ("--log-every", "log_every", int, "steps between log lines"),
    ("--variant", "variant", str, "task input variant to train and evaluate on (default the task's first; "
     "sraven: permuted, unpermuted; fuzzy_logic: uniform, fixed_context, fixed_query)"),
)


@subcommand
def _train(subparsers: argparse._SubParsersAction) -> None:
    from latentcode.training.presets import describe_presets

    parser = subparsers.add_parser(
        "train",
        help="train a model on a task (presets from the paper)",
        description="Train a hooked transformer with the paper's recipe (AdamW, linear warmup, cosine decay to "
        "0.1x, weight decay on matrices only, attention dropout 0.1). Runs on CPU, one GPU, several GPUs with "
        "`accelerate launch -m latentcode.cli train ...`, or several CPU processes with "
        "`torchrun --nproc_per_node 2 -m latentcode.cli train ...`. Writes a run directory with config.json, "
        "metrics.jsonl, checkpoints/, model/ and summary.json.",
        epilog="presets:\n" + describe_presets() + "\n\nscales: tiny (smoke test), demo (a few minutes), cpu (under an hour on 2 CPU cores), "
        "paper (the paper's budget)\n\nexamples:\n  latentcode train --preset fuzzy_logic --attention hyla --scale cpu "
        "--out runs/fuzzy-hyla\n  latentcode train --resume runs/fuzzy-hyla",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", help="fuzzy_logic or sraven (see below)")
    parser.add_argument("--attention", default="softmax",
                        help="attention preset (softmax, linear, hyla, ... or NORMALIZATION+VALUE_NETWORK; default softmax)")
    parser.add_argument("--scale", default="cpu", help="tiny, demo, cpu or paper (default cpu)")
    parser.add_argument("--out", help="run directory (default runs/PRESET-ATTENTION-SCALE-seedSEED)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    parser.add_argument("--config", metavar="JSON", help="a TrainConfig JSON file instead of a preset")
    for flag, field, kind, text in TRAIN_OVERRIDES:
        parser.add_argument(flag, dest=field, type=kind, help=text)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override any task, model or training field, e.g. --set frac_test=0.7 --set seq_len=16")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.set_defaults(handler=_run_train)


def _run_train(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    from latentcode.training import TrainConfig, build_train_config, train

    if args.resume:
        if args.preset or args.config:
            raise ValueError("--resume continues a run with its own config; do not combine it with --preset or --config")
        run = train(resume=args.resume, progress=not args.quiet)
    else:
        overrides = {field: getattr(args, field) for _, field, _, _ in TRAIN_OVERRIDES if getattr(args, field) is not None}
        overrides |= parse_assignments(args.set, "--set")
        if args.compile:
            overrides["compile"] = True
        if args.config:
            if args.preset:
                raise ValueError("give either --preset or --config, not both")
            config = TrainConfig.from_dict(json.loads(Path(args.config).read_text()))
        elif args.preset:
            config = build_train_config(args.preset, args.scale, args.attention, **overrides)
            overrides = {}
        else:
            raise ValueError("latentcode train needs --preset (fuzzy_logic or sraven), --config or --resume")
        out = args.out or f"runs/{config.preset or config.task['name']}-{config.model_config().attention_name}-{config.scale}-seed{config.seed}"
        run = train(config, out, progress=not args.quiet)
    if int(os.environ.get("RANK", "0")) != 0:
        return  # one report per run, from the main process of a multi-process launch
    summary = run.summary or {}
    print(f"run finished: {run.path}  ({summary.get('steps')} steps, {summary.get('wall_seconds', 0):.0f} s)")
    for split, metrics in (summary.get("final_metrics") or {}).items():
        print(f"  {split:14s} " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))


# -- latentcode sweep -------------------------------------------------------------------------------
@subcommand
def _sweep(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="train a grid of runs and tabulate them",
        description="Run a grid of training runs (learning rate, weight decay, warmup, seeds, attention presets, "
        "depth, width, data size, ...) sequentially or as independent processes; write results.csv/json and "
        "best.json (chosen on the in-distribution test split, never on OOD).",
        epilog="example:\n  latentcode sweep --preset fuzzy_logic --scale tiny --grid attention=softmax,linear,hyla "
        "--grid learning_rate=1e-3,3e-3 --seeds 0,1 --out sweeps/fuzzy\n  latentcode sweep --preset sraven --grid paper "
        "--out sweeps/sraven-paper",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", required=True)
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--out", required=True, help="sweep directory (one run directory per grid point)")
    parser.add_argument("--grid", action="append", metavar="FIELD=V1,V2,...",
                        help="values of one field (any train/model/task field, or attention); 'paper' adds the "
                        "paper's grid for the preset")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (default 0)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, each in its own process (default 1)")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> None:
    from latentcode.training.presets import presets
    from latentcode.training.sweeps import best_runs, paper_grid, sweep

    grid: dict = {}
    for item in args.grid or []:
        if item == "paper":
            if args.preset not in presets():
                raise ValueError(f"unknown preset {args.preset!r}; valid presets: {', '.join(presets())}")
            grid |= paper_grid(args.preset)
            continue
        key, separator, values = item.partition("=")
        if not separator:
            raise ValueError(f"--grid expects FIELD=V1,V2,... or 'paper', got {item!r}")
        grid[key.strip().replace("-", "_")] = [parse_value(value) for value in values.split(",") if value]
    seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    rows = sweep(args.preset, args.scale, grid, args.out, seeds=seeds, jobs=args.jobs, progress=not args.quiet)
    print(f"{len(rows)} runs; table: {args.out}/results.csv")
    for attention, row in best_runs(rows, args.preset).items():
        params = {k: v for k, v in row.items() if k in grid or k == "seed"}
        print(f"  best {attention}: {params}  " + "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k.startswith(("test.", "ood.")) and isinstance(v, float)))


# -- latentcode extract -----------------------------------------------------------------------------
@subcommand
def _extract(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "extract",
        help="record latent codes of a trained model into an HDF5 file",
        description="Run a trained model on task instances and record the latent codes a[:, q, k] at the selected "
        "sites, with every task label, the prediction and the target, into a self-describing HDF5 file (schema: "
        "latentcode/store.py). Written atomically: an interrupted extraction leaves no file behind.",
        epilog="site selectors: last-self (every layer, last token to itself), sraven-rule (every layer, last query "
        "token to the same feature in the last row's context panels; unpermuted instances), all-pairs:LAYER, or "
        "LAYER:QUERY:KEY[,...] (negative positions count from the end, * as LAYER is every layer)\n\nexample:\n"
        "  latentcode extract runs/sraven-hyla --split ood --n 8192 --sites sraven-rule --out codes.h5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN_DIR", help="a run directory (or a saved model directory with --task)")
    parser.add_argument("--split", default="ood", help="task split (default ood)")
    parser.add_argument("--n", type=int, default=8192, help="instances (default 8192)")
    parser.add_argument("--sites", default="last-self", help="site selector (default last-self)")
    parser.add_argument("--out", required=True, help="the HDF5 file to write")
    parser.add_argument("--variant", help="task variant (default: the selector's, else the task's default)")
    parser.add_argument("--score", choices=("pattern", "scores"), default="pattern",
                        help="pattern: normalized latent codes (default); scores: raw scores before normalization")
    parser.add_argument("--batch-size", type=int, default=256, help="instances per forward pass (default 256)")
    parser.add_argument("--seed", type=int, help="sample seed (default: the split's evaluation seed)")
    parser.add_argument("--task", metavar="KEY=VALUE", action="append",
                        help="task config for a model directory, e.g. --task name=sraven --task n_features=4")
    parser.add_argument("--append", action="store_true", help="add examples to an existing file with the same schema")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    parser.add_argument("--compression", choices=("gzip", "lzf", "none"), default="gzip",
                        help="of a new file: gzip (default; h5dump and every HDF5 tool read it), lzf (h5py only), none")
    parser.add_argument("--wait-for-lock", type=float, default=0.0, metavar="SECONDS",
                        help="wait this long while another process writes --out (default: refuse at once)")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_extract)


def _run_extract(args: argparse.Namespace) -> None:
    from latentcode.extraction import extract
    from latentcode.store import CodeFile

    task = parse_assignments(args.task, "--task") or None
    path = extract(args.run, task, args.sites, args.split, args.n, args.out, variant=args.variant, score=args.score,
                   batch_size=args.batch_size, seed=args.seed, append=args.append, overwrite=args.overwrite,
                   progress=not args.quiet, compression=args.compression, wait_for_lock=args.wait_for_lock)
    codes = CodeFile(path)
    print(f"wrote {path}: {len(codes)} examples (splits {codes.splits}), {len(codes.sites)} sites, "
          f"{codes.n_heads} heads, labels {codes.label_names}")


# -- analysis: probe, plot, heatmap, samples, report ---------------------------------------------------
def _default_label(files: Sequence[str], label: str | None) -> str:
    if label:
        return label
    from latentcode.store import CodeFile

    labels = {CodeFile(path).task_analysis.get("probe_label") for path in files}
    if len(labels) == 1 and None not in labels:
        return labels.pop()
    tasks = sorted({str(CodeFile(path).task_config.get("name")) for path in files})
    raise ValueError(f"give --label: the files (tasks {tasks}) name no single label the task's analysis decodes")


@subcommand
def _probe(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "probe",
        help="decode a label from latent codes with linear probes",
        description="Fit a logistic regression (categorical or multi-hot labels; --ridge: ridge regression R^2) per "
        "layer on one split and score it on another, with chance levels (label-shuffled control, majority class). "
        "Several files are compared side by side (one model each).",
        epilog="example:\n  latentcode probe softmax.h5 linear.h5 hyla.h5 --label rule --fit-split train --test-split ood "
        "--out results/rule",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="CODES.h5")
    parser.add_argument("--label", help="label to decode; name, name[i] or name[-1] (default: rule for SRAVEN, "
                        "term_present for fuzzy logic)")
    parser.add_argument("--fit-split", default="train")
    parser.add_argument("--test-split", default="ood")
    parser.add_argument("--per-site", action="store_true", help="one probe per site instead of per layer")
    parser.add_argument("--ridge", action="store_true", help="ridge regression R^2 (continuous or multi-hot labels)")
    parser.add_argument("--cv", type=int, default=3, help="cross-validation folds on the fit split (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="path stem for the table (.csv, .json) and the plot (.png); default: print only")
    parser.add_argument("--format", action="append", choices=("png", "svg", "pdf"), help="plot formats (default png)")
    parser.set_defaults(handler=_run_probe)


def _run_probe(args: argparse.Namespace) -> None:
    from latentcode.analysis import decode, plot_probe_scores, regress, write_table

    label = _default_label(args.files, args.label)
    probe = regress if args.ridge else decode
    table = probe(args.files, label, fit_split=args.fit_split, test_split=args.test_split, per_site=args.per_site,
                  cv=args.cv, seed=args.seed)
    summary = table[table["metric"].isin(["accuracy", "macro_f1", "mean_f1", "r2", "mean_r2"])]
    columns = ["model", "layer", "site", "label", "metric", "value", "chance", "chance_majority", "n_fit", "n_test"]
    import pandas

    with pandas.option_context("display.width", 200, "display.max_rows", 200):
        print(summary[columns].to_string(index=False, float_format=lambda value: f"{value:.3f}"))
    if args.out:
        written = write_table(table, args.out) + plot_probe_scores(table, args.out, formats=tuple(args.format or ["png"]))
        print("wrote " + ", ".join(map(str, written)))


def _add_picture_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="CODES.h5")
    parser.add_argument("--split", help="only this split (default: all)")
    parser.add_argument("--out", help="path stem of the figure (default: next to the file)")
    parser.add_argument("--format", action="append", choices=("png", "svg", "pdf"), help="default png; repeatable")


def _draw(args: argparse.Namespace, label: str | None, kind: str, function: str, **options) -> None:
    """Draw with `latentcode.analysis.<function>(file, label, path_stem, split, formats, **options)`."""
    import importlib
    from pathlib import Path

    draw = getattr(importlib.import_module("latentcode.analysis"), function)
    label = _default_label([args.file], label)
    out = args.out or str(Path(args.file).with_suffix("")) + f"_{kind}_{label.split('[')[0]}"
    paths = draw(args.file, label, out, split=args.split, formats=tuple(args.format or ["png"]), **options)
    print("wrote " + ", ".join(map(str, paths)))


@subcommand
def _plot(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot", help="tSNE or UMAP of latent codes, one panel per layer, coloured by a label",
        description="Embed the latent codes of each layer with tSNE or UMAP (fixed seed; at most --max-points "
        "examples, subsampled with the seed) and colour them by a label.",
    )
    _add_picture_arguments(parser)
    parser.add_argument("--method", choices=("tsne", "umap"), default="tsne")
    parser.add_argument("--color", help="label to colour by (default: the task's sub-task label)")
    parser.add_argument("--max-points", type=int, default=2000, help="subsampling cap (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(handler=lambda args: _draw(
        args, args.color, args.method, "plot_embedding",
        method=args.method, max_points=args.max_points, seed=args.seed))


@subcommand
def _heatmap(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "heatmap", help="cosine similarity between the mean latent code of each label value",
        description="Cosine similarity between the mean latent code of each value of a label (the paper's "
        "rule-by-rule heatmap), rows ordered by hierarchical clustering, values annotated; one panel per layer.",
    )
    _add_picture_arguments(parser)
    parser.add_argument("--label", help="categorical label (default: rule for SRAVEN)")
    parser.set_defaults(handler=lambda args: _draw(
        args, args.label, "similarity", "plot_similarity"))


@subcommand
def _samples(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("samples", help="a grid of raw latent-code samples per label value")
    _add_picture_arguments(parser)
    parser.add_argument("--label", help="integer label (default: rule for SRAVEN)")
    parser.add_argument("--layer", type=int, help="layer (default: the last)")
    parser.set_defaults(handler=lambda args: _draw(
        args, args.label, "samples", "plot_code_samples",
        layer=args.layer))


@subcommand
def _report(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="one offline HTML page: training curves, metrics, probe tables and plots",
        description="Write one self-contained HTML page (no JavaScript) for one or several runs: training curves, "
        "final metrics per split, probe tables and figures for their codes files (RUN_DIR/codes/*.h5, or --codes).",
    )
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR")
    parser.add_argument("--codes", action="append", metavar="CODES.h5", help="codes files (default: RUN_DIR/codes/*.h5)")
    parser.add_argument("--label", help="label to decode and colour by (default: the task's sub-task label)")
    parser.add_argument("--fit-split", default="train")
    parser.add_argument("--test-split", default="ood")
    parser.add_argument("--method", action="append", choices=("tsne", "umap"), help="embeddings to draw (default tsne)")
    parser.add_argument("--max-points", type=int, default=1000)
    parser.add_argument("--title", default="latentcode report")
    parser.add_argument("--out", default="report.html")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> None:
    from latentcode.analysis.report import build_report

    report = build_report(args.runs, args.codes or (), args.out, label=args.label, fit_split=args.fit_split,
                          test_split=args.test_split, methods=tuple(args.method or ["tsne"]),
                          max_points=args.max_points, title=args.title, overwrite=args.overwrite,
                          progress=not args.quiet)
    print(f"report: {report.path.resolve()}")
    for line in report.headline():
        print("  " + line)


# -- latentcode demo -------------------------------------------------------------------------------
@subcommand
def _demo(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the main job: models, latent codes, decoding, plots and a report, in a few minutes",
        description="Take softmax, linear and HYLA models (the checkpoints shipped in models/, or --train new ones), "
        "extract their latent codes on in-distribution and OOD tasks, decode the sub-task (SRAVEN rule / fuzzy-logic "
        "terms), draw tSNE plots and the mean-code heatmap, write an HTML report and print the headline numbers.",
    )
    parser.add_argument("--task", default=None,
                        help="fuzzy_logic (default) or sraven; both start from the checkpoints shipped in models/")
    parser.add_argument("--train", action="store_true", help="train the models here instead of using the shipped ones")
    parser.add_argument("--scale", default="demo", help="training scale with --train (tiny, demo, cpu; default demo)")
    parser.add_argument("--out", default="latentcode-demo", help="output directory (a new one if it exists)")
    parser.add_argument("--n-codes", type=int, default=2048, help="instances per split to extract (default 2048)")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> None:
    from latentcode.demo import run_demo
    from latentcode.tasks import DEMO_TASK

    run_demo(task=args.task or DEMO_TASK, out=args.out, train=args.train, scale=args.scale, n_codes=args.n_codes,
             progress=not args.quiet)


# -- entry point ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from latentcode import __version__

    parser = argparse.ArgumentParser(
        prog="latentcode",
        description="Mechanistic interpretability of attention latent codes: train softmax, linear "
        "and HYLA transformers on compositional tasks, extract latent codes with hooks into HDF5, "
        "decode them with probes and draw them.",
    )
    parser.add_argument("--version", action="version", version=f"latentcode {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.handler(args)
    except USER_ERRORS as error:
        if os.environ.get("LATENTCODE_DEBUG"):
            raise
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
