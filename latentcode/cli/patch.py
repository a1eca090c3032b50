"""`latentcode patch`: where does patching latent codes transfer the donor's sub-task? A sweep over
site groups of a trained model on counterfactual pairs from its task, each group read against the
third-sub-task donor baseline (`latentcode.intervention.transfer`), optionally beside attribution
patching's estimate; a pretrained causal LM, which has no pairs, by resample ablation (its map: the
loss change per layer x head or offset band). One plan and one loop for both (`plan_patch`, `patch`);
the table's effect column (`plan.inputs.effect`: transfer, or change) says what the map and the closing
line show. Examples: docs/how-to/patch.md and the epilog.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from latentcode.cli.arguments import POSITIVE_NUMBER, SEED, add_placement_arguments, integer, parse_assignments
from latentcode.cli.command import Command, command_parser
from latentcode.intervention.patching.plan import MAX_GROUPS
from latentcode.token_windows import DEFAULT_SEQ_LEN


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = command_parser(
        subparsers, "patch",
        help="sweep site groups: where does patching codes from a donor transfer its sub-task (vs a baseline)?",
        description="Patch the latent codes of each site group from donor instances into base instances of the "
        "model's task (counterfactual pairs: the donor's sub-task differs, and its answer on the base is well-posed) "
        "and measure how often the prediction becomes the donor sub-task's answer ('follow'), beside the same count "
        "for donors of a third sub-task (the baseline); 'transfer' is the difference. Writes a table (.csv), a "
        "summary (.json) and a map (.png). Beside each transfer, the damage: how often patching from a donor of the "
        "base's own sub-task breaks the model's answer.",
        epilog="groups: --search (find them: whole layers, then the task's blocks, then cuts of the best block; "
        "chosen on --n selection pairs, every number reported on --confirm-n fresh pairs), --grid PARTITION or "
        "QUERY_PARTITION/KEY_PARTITION (every query part x key part of the task's partitions of its positions, per "
        "layer; --per-head; SRAVEN: slot, panel, row, column, context), --grid rows (per layer x query row x key "
        "block; --layers, --queries, --key-blocks), --grid heads (per layer x head, over --sites), or --group SPEC "
        "repeated (each a selector such as 2:*:* or *:35:0..8).\n\nexamples:\n"
        "  latentcode patch models/sraven-hyla --search --out results/search\n"
        "  latentcode patch models/sraven-hyla --grid slot --layers 2 --out results/slots\n\n"
        "a pretrained causal LM has no counterfactual pairs; it is patched by resample ablation: each window takes "
        "another window's codes (a seeded derangement) at one (layer, head) at a time, and the change of its "
        "next-token loss is read beside a control (another head of the same layer, drawn at random):\n"
        "  latentcode patch smollm2 --task seq_len=128 --n 16 --layers 0 5 10 15 20 25 29 --grid heads "
        "--out results/smollm2-heads\n"
        "  latentcode patch smollm2 --task seq_len=64 --n 8 --layers 0 5 10 --grid offsets "
        "--out results/smollm2-offsets"
        "\n(--grid offsets: each band's control is as many random pairs of the layer outside it)")
    parser.add_argument("run", metavar="RUN_DIR", help="a finished run directory (its task gives the pairs), or a "
                        "pretrained causal LM (a Hugging Face directory, a .gguf file or smollm2: resample ablation "
                        "per (layer, head) on windows of the language corpus, read on the next-token loss)")
    parser.add_argument("--search", action="store_true", help="find the group without being told (coarse to fine; "
                        "see below)")
    parser.add_argument("--grid", help="a grid of groups: rows, heads, or the task's partitions PARTITION or "
                        "QUERY_PARTITION/KEY_PARTITION (default rows unless --group or --search is given); a "
                        "pretrained model: heads (default) or offsets (per layer, each relative-offset band of every "
                        "head: sink k=0, self k=q, previous k=q-1, k=q-4..q-2, further)")
    parser.add_argument("--per-head", action="store_true", help="partition grids: one group per head as well")
    parser.add_argument("--group", action="append", metavar="SPEC", help="one group of sites (repeatable)")
    parser.add_argument("--layers", nargs="+", help="layers of the rows, heads, offsets and partition grids and of "
                        "--search, e.g. 0,2 or 0 2 (default all)")
    parser.add_argument("--queries", default="*", help="query positions of the rows grid: *, an integer, A..B or "
                        "A|B|C (default *)")
    parser.add_argument("--key-blocks", type=integer(1), default=1, help="contiguous key blocks per query row "
                        "(default 1: the whole row)")
    parser.add_argument("--sites", default="*:*:*", help="sites of each head in the heads grid (default *:*:*)")
    parser.add_argument("--n", type=integer(2), help="base/donor pairs (default 256; with --search, the selection "
                        "pairs that choose the groups; a pretrained model: base windows, default 32, each with a "
                        "donor)")
    parser.add_argument("--task", action="append", metavar="seq_len=T", help="a pretrained model: the window length "
                        f"(default {DEFAULT_SEQ_LEN} tokens)")
    parser.add_argument("--confirm-n", type=integer(2), default=512, help="--search: fresh pairs (seed + 1) on which "
                        "the groups found are measured (default 512)")
    parser.add_argument("--tolerance", type=POSITIVE_NUMBER, default=1.0, help="--search: a cut holds the effect "
                        "when its transfer is within this many s.e. of the best so far (default 1)")
    parser.add_argument("--max-groups", type=integer(1), default=MAX_GROUPS, help=f"refuse a grid of more groups "
                        f"(default {MAX_GROUPS}; each costs 3 x --n forward passes)")
    parser.add_argument("--split", help="task split of the pairs (default the task's held-out split)")
    parser.add_argument("--variant", help="task variant (default the run's training variant)")
    parser.add_argument("--prediction", type=int, default=-1, help="the measured prediction position among the "
                        "task's predictions (default -1, the last)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the pairs (default 0)")
    parser.add_argument("--attribution", action="store_true", help="also attribution patching's estimate per group "
                        "(one backward pass), and its correlation with the exact sweep")
    parser.add_argument("--out", required=True, help="path stem of the table (.csv), summary (.json) and map (.png)")
    parser.add_argument("--overwrite", action="store_true", help="replace the outputs if --out has them")
    add_placement_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no cost line, progress or summary (by default a bar on a "
                        "terminal, else lines on stderr)")
    return parser


def check(args: argparse.Namespace) -> None:
    """Everything that can be checked before torch: the plan `latentcode.intervention.patching.patch`
    makes too (`args.plan`: output, run, task, split, variant, groups and their cost)."""
    from latentcode.intervention.patching.plan import plan_patch

    args.plan = plan_patch(args.run, task=parse_assignments(args.task, "--task") or None, search=args.search,
                           grid=args.grid, groups=args.group, per_head=args.per_head,
                           layers=None if args.layers is None else ",".join(args.layers), queries=args.queries,
                           key_blocks=args.key_blocks, sites=args.sites,
                           n=args.n, confirm_n=args.confirm_n, tolerance=args.tolerance, max_groups=args.max_groups,
                           split=args.split, variant=args.variant, prediction=args.prediction, seed=args.seed,
                           attribution=args.attribution, out=args.out, overwrite=args.overwrite, device=args.device,
                           dtype=args.dtype)
    # what the map's title and layout read
    args.effect = args.plan.inputs.effect  # transfer (counterfactual pairs) or change (of the next-token loss)
    args.grid, args.partition_grid = args.plan.grid, args.plan.partition_grid
    args.split, args.variant = args.plan.split, args.plan.variant


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity as None, so that the JSON has null, never NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def run(args: argparse.Namespace) -> None:
    from latentcode.allocator import keep_freed_memory
    from latentcode.files import AtomicOutputs
    from latentcode.intervention.patching import patch

    keep_freed_memory()  # the passes reuse the heap: this process's choice, made here, never by patching_sweep
    started = time.time()
    say = (lambda text: None) if args.quiet else (lambda text: print(text, flush=True))
    result = patch(args.plan, progress=not args.quiet, say=say)
    tables, summary = result.tables, result.summary
    summary["run"] = str(args.run)
    summary["seconds"] = time.time() - started
    table = tables[0]
    effect = args.effect
    figure = _draw_search(table, args, summary) if args.search else _draw(table, args, summary)
    stem = Path(args.out)
    paths = [stem.with_name(stem.name + suffix) for suffix in args.plan.suffixes if suffix != ".png"]
    with AtomicOutputs(lock=stem, purpose="latentcode patch") as outputs:
        for path, each in zip(paths, tables, strict=False):
            each.attrs = {}
            # tables as CSV only: <stem>.json is the run's summary, not a table's records
            outputs.write_text(path, each.to_csv(index=False))
        outputs.write_text(paths[-1], json.dumps(_finite(summary), indent=2, default=str, allow_nan=False) + "\n")
        outputs.write_figure(stem, figure, ("png",), dpi=130)
    if args.search:
        _say_found(say, table.iloc[-1], effect)
    elif effect == "change":
        best = table.loc[table["change"].idxmax()]
        control = ("no control" if not isinstance(best.get("control"), str) or not best["control"]
                   else f"control {best['control']}: {best['control change']:+.4f} ± {best['control change se']:.4f}")
        say(f"largest loss change: {best['group']}: {best['change']:+.4f} ± {best['change se']:.4f} nats ({control}"
            f"; loss unpatched "
            f"{best['before']:.3f}, n={summary['n']} windows of {summary['seq_len']} tokens)")
    else:
        best = table.loc[table["transfer"].idxmax()]
        say(f"largest transfer: {best['group']}: follow {best['follow (different)']:.3f} vs third-sub-task donor "
            f"{best['follow (third)']:.3f} (transfer {best['transfer']:.3f} ± {best['transfer se']:.3f}, damage "
            f"{best['damage']:.3f} ± {best['damage se']:.3f}, n={summary['n']})"
            + ("" if _clear(best) else "; not above 2 s.e. of zero: no group given transfers the sub-task"))
    say(f"wrote {', '.join(str(path) for path in paths)}, {stem}.png ({summary['seconds']:.0f} s)")


UNMEASURED = "0.45"  # the map's colour of a cell with no group (mid grey: neither 0's white nor a sign)


def transfer_colormap():
    """Red-white-blue for transfer, white exactly at 0 (the middle of RdBu_r is a light grey, which
    reads as 'a little' rather than 'none'); cells with no group (NaN) in UNMEASURED grey."""
    from matplotlib import colormaps
    from matplotlib.colors import LinearSegmentedColormap

    reds_and_blues = colormaps["RdBu_r"]
    colours = [reds_and_blues(0.0), reds_and_blues(0.25), (1.0, 1.0, 1.0, 1.0), reds_and_blues(0.75),
               reds_and_blues(1.0)]
    colormap = LinearSegmentedColormap.from_list("transfer", colours, N=255)  # odd N: one entry is 0 itself
    return colormap.with_extremes(bad=UNMEASURED)


def _draw(table, args, summary):
    """The map: rows grid -> per layer, query x key block; partition grid -> per layer, query part x key
    part (or head); heads grid -> layer x head; offsets grid -> layer x band; groups -> bars. The effect
    (`args.effect`: a run's transfer, a causal LM's loss change) on one signed scale, symmetric about 0
    and white at 0; a cell with no group is grey, and the colour bar's label says so."""
    import numpy as np
    from matplotlib.figure import Figure

    from latentcode.analysis.captions import wrap_lines
    from latentcode.intervention.patching.site_groups import BANDS

    effect = getattr(args, "effect", "transfer")
    limit = max(0.1 if effect == "transfer" else 0.0, float(np.nanmax(np.abs(table[effect])))) or 1.0
    colormap = transfer_colormap()
    if effect == "transfer":
        title_lines = [f"{Path(args.run).name}: transfer = follow (r' donor) - follow (third donor)",
                       f"{args.split} ({args.variant}), n = {summary['n']} pairs per group, "
                       f"prediction {summary['prediction']}"]
    else:
        title_lines = [f"{summary['model']}: resample ablation, next-token loss change (nats)",
                       f"T = {summary['seq_len']}, {args.split} split, n = {summary['n']} windows, "
                       f"positions {summary['positions']}"]
    if args.grid == "rows":
        figure = _layer_panels(table.assign(effect=table["transfer"]), "query", "key_start", colormap, limit,
                               (3.2 * table["layer"].nunique() + 1.4, 3.6), _key_block_labels, ("keys", "query"))
    elif args.partition_grid:
        if args.per_head:
            table = table.assign(row=table["query_part"] + " x " + table["key_part"], column=table["head"])
        else:
            table = table.assign(row=table["query_part"], column=table["key_part"])
        rows, columns = list(dict.fromkeys(table["row"])), list(dict.fromkeys(table["column"]))
        columns = sorted(columns) if args.per_head else columns
        size = (max(7.0, (min(0.3 * len(columns), 8) + 1.6) * table["layer"].nunique() + 1.2),
                min(0.25 * len(rows), 10) + 1.8)
        figure = _layer_panels(table.assign(effect=table[effect]), "row", "column", colormap, limit, size,
                               lambda part: [str(column) for column in columns],
                               ("head" if args.per_head else f"keys ({args.partition_grid[1]})",
                                f"queries ({args.partition_grid[0]})"), rows, columns)
    elif args.grid in ("heads", "offsets"):
        heads, layers = args.grid == "heads", sorted(table["layer"].unique())
        columns = list(range(int(table["head"].max()) + 1)) if heads else list(BANDS)
        grid = _grid(table, "layer", "head" if heads else "band", effect, layers, columns)
        figure = Figure(figsize=((0.35 if heads else 0.9) * len(columns) + 2.5, 0.45 * len(layers) + 1.6),
                        layout="constrained")
        axis = figure.subplots()
        image = axis.imshow(grid, cmap=colormap, vmin=-limit, vmax=limit, aspect="auto")
        axis.set_yticks(range(len(layers)), [f"layer {layer}" for layer in layers], fontsize=7)
        if not heads:
            axis.set_xticks(range(len(columns)), columns, fontsize=7, rotation=30)
        axis.set_xlabel("head" if heads else "relative-offset band (every head)", fontsize=8)
        figure.colorbar(image, ax=axis, label=_bar_label([grid], effect))
    else:
        figure = Figure(figsize=(7, 0.45 * len(table) + 1.6), layout="constrained")
        _transfer_and_damage(figure.subplots(), table, table["group"])
    figure.suptitle(wrap_lines(title_lines, figure.get_figwidth() - 0.4, fontsize_points=8), fontsize=8)
    return figure


def _grid(table, index: str, column: str, values: str, rows: list, columns: list):
    """`table[values]` as a [row, column] array over `rows` x `columns`; NaN where no row of the table is."""
    return (table.pivot_table(index=index, columns=column, values=values, aggfunc="last")
            .reindex(index=rows, columns=columns).to_numpy(dtype=float))


def _layer_panels(table, row: str, column: str, colormap, limit: float, size: tuple, column_labels, axis_labels,
                  rows: list | None = None, columns: list | None = None):
    """One panel per layer: `table["effect"]` on the grid of its `row` x `column` values (every layer's
    sorted values, unless `rows`, `columns` are given), x ticks named `column_labels(the layer's rows)`,
    on the signed scale; `axis_labels`: (x, y)."""
    from matplotlib.figure import Figure

    layers = sorted(table["layer"].unique())
    rows = rows if rows is not None else sorted(table[row].unique())
    columns = columns if columns is not None else sorted(table[column].unique())
    figure = Figure(figsize=size, layout="constrained")
    axes = figure.subplots(1, len(layers), squeeze=False)[0]
    grids, image = [], None
    for axis, layer in zip(axes, layers, strict=True):
        part = table[table["layer"] == layer]
        grids.append(_grid(part, row, column, "effect", rows, columns))
        image = axis.imshow(grids[-1], cmap=colormap, vmin=-limit, vmax=limit, aspect="auto")
        axis.set_title(f"layer {layer}", fontsize=9)
        axis.set_yticks(range(len(rows)), [str(value) for value in rows], fontsize=6)
        axis.set_xticks(range(len(columns)), column_labels(part), fontsize=6, rotation=90)
        axis.set_xlabel(axis_labels[0], fontsize=8)
        axis.set_ylabel(axis_labels[1], fontsize=8)
    figure.colorbar(image, ax=list(axes), shrink=0.8, label=_bar_label(grids))
    return figure


def _key_block_labels(part) -> list[str]:
    """The rows grid's key blocks, as first–last key."""
    return [f"{int(start)}–{int(stop) - 1}" for start, stop in part.groupby("key_start")["key_stop"].first().items()]


def _bar_label(grids, effect: str = "transfer") -> str:
    """The colour bar's label: the effect, and what the grey cells are where the map has any."""
    import numpy as np

    unmeasured = any(np.isnan(grid).any() for grid in grids)
    return f"{effect} (0 = white)" + ("\ngrey: no group measured" if unmeasured else "")


def _transfer_and_damage(axis, table, labels) -> None:
    """Per group, transfer and damage (± s.e.) side by side on one axis (both are fractions of pairs); a
    causal LM's table: its next-token loss change alone."""
    import numpy as np

    positions = np.arange(len(table))
    if "damage" in table:
        axis.barh(positions - 0.2, table["transfer"], height=0.4, xerr=table["transfer se"], color="tab:blue",
                  label="transfer: follow (r' donor) - follow (third donor)")
        axis.barh(positions + 0.2, table["damage"], height=0.4, xerr=table["damage se"], color="tab:gray",
                  label="damage: keep (unpatched) - keep (same-sub-task donor)")
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2, frameon=False)
    else:
        axis.barh(positions, table["change"], xerr=table["change se"], color="tab:blue")
    axis.axvline(0, color="0.5", linewidth=0.8)
    axis.set_yticks(positions, [label if len(label) <= 60 else label[:57] + "..." for label in labels], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("fraction of pairs (± s.e.)" if "damage" in table else "next-token loss change (nats, ± s.e.)",
                    fontsize=8)


def _draw_search(table, args, summary):
    """The route of the search on the fresh pairs: transfer beside damage per step, coarse to fine."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 0.5 * len(table) + 2.0), layout="constrained")
    labels = [f"{step} ({int(row['n_queries'])} x {int(row['n_keys'])}, layer {int(row['layer'])})"
              for step, (_, row) in zip(table["step"], table.iterrows(), strict=True)]
    _transfer_and_damage(figure.subplots(), table, labels)
    what = (f"{args.split} ({args.variant}), prediction {summary['prediction']}" if "damage" in table
            else f"{args.split} split, resample ablation")
    figure.suptitle(f"{Path(args.run).name}: patch --search route, coarse to fine; {what}\nchosen on "
                    f"{summary['n']} selection {args.plan.inputs.unit}s (seed {args.seed}), measured on "
                    f"{int(table['n'].iloc[0])} fresh ones (seed {args.seed + 1})", fontsize=8)
    return figure


def _say_found(say, found, effect: str) -> None:
    """The closing line of a search: the group found, its effect on the fresh bases."""
    if effect == "change":
        say(f"found: {found['group']} ({found['step']}): loss change {found['change']:+.4f} ± "
            f"{found['change se']:.4f} nats on {int(found['n'])} fresh windows")
        return
    say(f"found: {found['group']} ({found['step']}): transfer {found['transfer']:.3f} ± {found['transfer se']:.3f}, "
        f"damage {found['damage']:.3f} ± {found['damage se']:.3f} on {int(found['n'])} fresh pairs"
        + ("" if _clear(found) else "; not above 2 s.e. of zero: nothing this search weighed transfers the "
           "sub-task on these pairs (the route ends in noise)"))


COMMAND = Command(register, check, run, order=60, parameters={"run_or_model": "run", "groups": "group"})


def _clear(row) -> bool:
    """A transfer more than 2 (paired) standard errors above zero."""
    return bool(row["transfer"] > 2 * row["transfer se"])
