"""`latentcode patch`: where does patching latent codes transfer the donor's sub-task? A sweep over
site groups of a trained model on counterfactual pairs from its task, each group read against the
third-sub-task donor baseline (`latentcode.intervention.transfer`), optionally beside attribution
patching's estimate.

    latentcode patch runs/sraven-hyla --grid rows --layers 2 --key-blocks 9 --n 256 --out results/patch-l2
    latentcode patch runs/sraven-hyla --grid heads --sites "2:3|7|11|15|19|23|27|31|35:3|7|11|15|19|23|27|31" --out results/heads
    latentcode patch runs/sraven-hyla --group "2:*:*" --group "*:35:*" --attribution --out results/two

The arguments are checked with the standard library, JSON and numpy only (the run's config, the
task, the sites), so a mistake is answered before torch is imported.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from latentcode.cli.arguments import SEED, integer
from latentcode.cli.checks import check_output, check_stem_free, model_config_of
from latentcode.cli.command import Command
from latentcode.errors import UsageError
from latentcode.validation import check_split, check_variant

GRIDS = ("rows", "heads")


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "patch",
        help="sweep site groups: where does patching codes from a donor transfer its sub-task (vs a baseline)?",
        description="Patch the latent codes of each site group from donor instances into base instances of the "
        "model's task (counterfactual pairs: the donor's sub-task differs, and its answer on the base is well-posed) "
        "and measure how often the prediction becomes the donor sub-task's answer ('follow'), beside the same count "
        "for donors of a third sub-task (the baseline); 'transfer' is the difference. Writes a table (.csv), a "
        "summary (.json) and a map (.png).",
        epilog="groups: --grid rows (per layer x query row x key block; --layers, --queries, --key-blocks), --grid "
        "heads (per layer x head, over --sites), or --group SPEC repeated (each a selector such as 2:*:* or "
        "*:35:0..8).\n\nexample:\n  latentcode patch models/sraven-hyla --grid rows --layers 2 --queries 32..36 "
        "--key-blocks 9 --out results/patch",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN_DIR", help="a finished run directory (its task gives the pairs)")
    parser.add_argument("--grid", choices=GRIDS, help="a grid of groups (default rows unless --group is given)")
    parser.add_argument("--group", action="append", metavar="SPEC", help="one group of sites (repeatable)")
    parser.add_argument("--layers", help="layers of the rows grid, e.g. 0,2 (default all)")
    parser.add_argument("--queries", default="*", help="query positions of the rows grid: *, an integer, A..B or "
                        "A|B|C (default *)")
    parser.add_argument("--key-blocks", type=integer(1), default=1, help="contiguous key blocks per query row "
                        "(default 1: the whole row)")
    parser.add_argument("--sites", default="*:*:*", help="sites of each head in the heads grid (default *:*:*)")
    parser.add_argument("--n", type=integer(2), default=256, help="base/donor pairs (default 256)")
    parser.add_argument("--split", help="task split of the pairs (default the task's held-out split)")
    parser.add_argument("--variant", help="task variant (default the run's training variant)")
    parser.add_argument("--prediction", type=int, default=-1, help="the measured prediction position among the "
                        "task's predictions (default -1, the last)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the pairs (default 0)")
    parser.add_argument("--attribution", action="store_true", help="also attribution patching's estimate per group "
                        "(one backward pass), and its correlation with the exact sweep")
    parser.add_argument("--out", required=True, help="path stem of the table (.csv), summary (.json) and map (.png)")
    parser.add_argument("--overwrite", action="store_true", help="replace the outputs if --out has them")
    parser.add_argument("--quiet", action="store_true")
    return parser


def _read_run(run: str) -> tuple[int, int, dict, str | None]:
    """(n_layers, n_heads, task config, training variant) of a finished run directory, from its JSON."""
    from latentcode.rundir import RunDirectory, RunRecord

    directory = RunDirectory(run)
    if not Path(run).is_dir() or not directory.looks_like_a_run():
        raise UsageError(f"RUN_DIR {run} is not a finished run directory (config.json and model/model.safetensors); "
                         "patch reads the task of the run to draw its pairs")
    record = RunRecord.read(run)
    model = model_config_of(Path(run))
    return int(model["n_layers"]), int(model["n_heads"]), dict(record.task_config), record.config["train"].get("variant")


def _layers(text: str | None, n_layers: int) -> list[int]:
    if text is None:
        return list(range(n_layers))
    try:
        layers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--layers expects layer indices such as 0,2; got {text!r}") from None
    bad = [layer for layer in layers if not -n_layers <= layer < n_layers]
    if not layers or bad:
        raise UsageError(f"--layers {text!r}: the model has {n_layers} layers (0..{n_layers - 1}); got {bad or 'none'}")
    return [layer % n_layers for layer in layers]


def check(args: argparse.Namespace) -> None:
    """Everything that can be checked before torch: output, run, task, split, variant, groups."""
    from latentcode.tasks import get_task

    if args.grid is not None and args.group:
        raise UsageError("give either --grid or --group, not both")
    args.grid = args.grid or (None if args.group else "rows")
    n_layers, n_heads, task_config, training_variant = _read_run(args.run)
    task = get_task(**task_config)
    if not hasattr(task, "counterfactual_pairs"):
        raise UsageError(f"task {task.name!r} draws no counterfactual pairs (Task.counterfactual_pairs); patch needs "
                         "them: sraven and fuzzy_logic have them")
    args.split = check_split(task.analysis.held_out_split if args.split is None else args.split, task, "--split")
    args.variant = check_variant(args.variant or training_variant or task.variants[0], task, "--variant")
    if not -task.n_predictions <= args.prediction < task.n_predictions:
        raise UsageError(f"--prediction {args.prediction}: the task has {task.n_predictions} prediction positions "
                         f"(0..{task.n_predictions - 1}, or negative from the end)")
    from latentcode.extraction.sites import (
        SiteError,
        parse_positions,
        parse_selector,
        resolve_positions,
    )

    try:
        if args.grid == "rows":
            args.layers = _layers(args.layers, n_layers)
            try:
                queries = parse_positions(args.queries)
                args.query_positions = list(resolve_positions((queries,), task.seq_len) if isinstance(queries, int)
                                            else queries.resolve(task.seq_len))
            except ValueError as error:
                raise UsageError(f"--queries {args.queries!r}: {error}" if isinstance(error, SiteError) else
                                 f"--queries expects *, an integer, START..STOP or A|B|C; got {args.queries!r}") from None
            if args.key_blocks > task.seq_len:
                raise UsageError(f"--key-blocks {args.key_blocks}: the sequence has {task.seq_len} keys, so at most "
                                 f"{task.seq_len} blocks")
        elif args.grid == "heads":
            parse_selector(args.sites, task).resolve(n_layers, task.seq_len)
        else:
            for spec in args.group:
                parse_selector(spec, task).resolve(n_layers, task.seq_len)
    except ValueError as error:  # SiteError, and int() of a bad --queries
        raise UsageError(f"{error}") from None
    args.n_layers, args.n_heads = n_layers, n_heads
    check_output(args.out, "--out", kind="stem")
    check_stem_free(args.out, (".csv", ".json", ".png"), args.overwrite)


def run(args: argparse.Namespace) -> None:
    import torch

    import latentcode
    from latentcode.extraction.sites import parse_selector
    from latentcode.intervention.patching import (
        SiteGroup,
        attribution_patching,
        head_grid,
        site_grid,
    )
    from latentcode.intervention.transfer import (
        counterfactual_metrics,
        output_position,
        per_example,
        transfer_sweep,
    )

    started = time.time()
    record = latentcode.Run(args.run)
    model = record.load_model().eval()
    task = record.task()
    if args.grid == "rows":
        groups = site_grid(args.n_layers, task.seq_len, layers=args.layers, queries=args.query_positions,
                           key_blocks=args.key_blocks)
    elif args.grid == "heads":
        groups = head_grid(args.n_layers, args.n_heads, sites=args.sites)
    else:
        groups = [SiteGroup(parse_selector(spec, task), coordinates={"spec": spec}) for spec in args.group]
    pairs = task.counterfactual_pairs(args.n, args.split, seed=args.seed, variant=args.variant, prediction=args.prediction)
    if not args.quiet:
        print(f"{len(groups)} groups x {len(pairs)} pairs x 2 donors (r', third) on {args.split} ({args.variant})", flush=True)
    with torch.no_grad():
        table = transfer_sweep(model, task, pairs, groups)
    summary: dict[str, Any] = {
        "run": str(args.run), "task": task.config(), "split": args.split, "variant": args.variant, "n": len(pairs),
        "prediction": pairs.prediction, "groups": len(groups), "pairs": pairs.counts,
        "forward_passes": table.attrs["forward_passes"],
    }
    from latentcode.provenance import sha256_of_file

    summary["checkpoint_sha256"] = sha256_of_file(record.directory.weights_path)  # a report shows it with this model only
    if args.attribution:
        metrics = counterfactual_metrics(pairs, task.objective, output_position(task, pairs.prediction))
        attribution = attribution_patching(model, pairs.base.torch().x, pairs.donors["different"].torch().x,
                                           metrics["logit_difference"], sites="*:*:*")
        estimate = attribution.for_groups(groups)
        exact = per_example(table, "different", "logit_difference") - table["logit_difference (unpatched)"].iloc[0]
        table["logit_difference effect"] = exact.mean(1)
        table["attribution estimate"] = estimate.mean(1)
        from scipy.stats import pearsonr, spearmanr

        if len(groups) >= 3:
            summary["attribution_vs_exact"] = {"pearson": float(pearsonr(exact.mean(1), estimate.mean(1))[0]),
                                               "spearman": float(spearmanr(exact.mean(1), estimate.mean(1))[0])}
    summary["seconds"] = time.time() - started
    from latentcode.files import AtomicOutputs

    figure = _draw(table, args, task, summary)
    stem = Path(args.out)
    csv, summary_json = (stem.with_name(stem.name + suffix) for suffix in (".csv", ".json"))
    with AtomicOutputs(lock=stem, purpose="latentcode patch") as outputs:
        table.attrs = {}
        # the table as CSV only: <stem>.json is the run's summary, not the table's records
        outputs.write_text(csv, table.to_csv(index=False))
        outputs.write_text(summary_json, json.dumps(summary, indent=2, default=str) + "\n")
        outputs.write_figure(stem, figure, ("png",), dpi=130)
    best = table.loc[table["transfer"].idxmax()]
    if not args.quiet:
        print(f"largest transfer: {best['group']}: follow {best['follow (different)']:.3f} vs third-sub-task donor "
              f"{best['follow (third)']:.3f} (transfer {best['transfer']:.3f} ± {best['transfer se']:.3f}, n={len(pairs)})")
        print(f"wrote {stem}.csv, {stem}.json, {stem}.png ({summary['seconds']:.0f} s)")


def _draw(table, args, task, summary):
    """The map: rows grid -> per layer, query x key block; heads grid -> layer x head; groups -> bars.
    Transfer on one signed scale, symmetric about 0."""
    import numpy as np
    from matplotlib.figure import Figure

    limit = max(0.1, float(np.nanmax(np.abs(table["transfer"]))))
    title = (f"{Path(args.run).name}: transfer = follow (r' donor) - follow (third donor); {args.split} "
             f"({args.variant}), n = {summary['n']} pairs per group, prediction {summary['prediction']}")
    if args.grid == "rows":
        layers = sorted(table["layer"].unique())
        figure = Figure(figsize=(3.2 * len(layers) + 1.4, 3.6), layout="constrained")
        axes = figure.subplots(1, len(layers), squeeze=False)[0]
        queries = sorted(table["query"].unique())
        blocks = sorted(table["key_start"].unique())
        image = None
        for axis, layer in zip(axes, layers, strict=True):
            part = table[table["layer"] == layer]
            grid = np.full((len(queries), len(blocks)), np.nan)
            for _, row in part.iterrows():
                grid[queries.index(row["query"]), blocks.index(row["key_start"])] = row["transfer"]
            image = axis.imshow(grid, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
            axis.set_title(f"layer {layer}", fontsize=9)
            axis.set_yticks(range(len(queries)), [str(q) for q in queries], fontsize=6)
            labels = [f"{int(s)}–{int(e) - 1}" for s, e in part.groupby("key_start")["key_stop"].first().items()]
            axis.set_xticks(range(len(blocks)), labels, fontsize=6, rotation=90)
            axis.set_xlabel("keys", fontsize=8)
            axis.set_ylabel("query", fontsize=8)
        figure.colorbar(image, ax=list(axes), shrink=0.8, label="transfer")
    elif args.grid == "heads":
        layers = sorted(table["layer"].unique())
        grid = np.full((len(layers), int(table["head"].max()) + 1), np.nan)
        for _, row in table.iterrows():
            grid[layers.index(row["layer"]), int(row["head"])] = row["transfer"]
        figure = Figure(figsize=(0.35 * grid.shape[1] + 2.5, 0.45 * len(layers) + 1.6), layout="constrained")
        axis = figure.subplots()
        image = axis.imshow(grid, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
        axis.set_yticks(range(len(layers)), [f"layer {layer}" for layer in layers], fontsize=7)
        axis.set_xlabel("head", fontsize=8)
        figure.colorbar(image, ax=axis, label="transfer")
    else:
        figure = Figure(figsize=(6, 0.4 * len(table) + 1.4), layout="constrained")
        axis = figure.subplots()
        positions = np.arange(len(table))
        axis.barh(positions, table["transfer"], xerr=table["transfer se"], color="tab:blue")
        axis.axvline(0, color="0.5", linewidth=0.8)
        axis.set_yticks(positions, table["group"], fontsize=7)
        axis.set_xlabel("transfer (± s.e.)", fontsize=8)
    figure.suptitle(title, fontsize=8)
    return figure


COMMAND = Command(register, check, run, order=60)
