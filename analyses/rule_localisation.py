"""Where does the rule live? A causal map of the latent codes of a shipped model (issue 22).

For SRAVEN models: base instances of the held-out (OOD) rule multisets are paired with donors
(`SRaven.counterfactual_pairs`, well-posed pairs only: the donor's rule r' completes the base's last
row of the queried feature into a valid row of r', and r''s answer differs from the true one). The
codes of one site group are patched from the donor into the base (`patching_sweep`), and we count
how often the prediction at the queried position becomes r''s answer ("follow r'"). Read against
the baseline: the same count when the donor has a THIRD rule r'' (neither r nor r'), i.e. how often a
damaged code lands on r''s answer without carrying r'. The third donor's own answer is never r''s.

    map     every layer x query slot x key slot (a feature slot: position j of every panel; fuzzy logic: blocks of 4
            tokens), and named site sets per layer: the queried feature's 8 context cells among themselves and the
            9 x 9 with the query cell (unpermuted models), the old `sraven-rule` sites, the query's whole row, the
            whole layer. On pairs drawn with seed 0 (the selection set).
    select  the group with the largest follow(r') - follow(third), on the selection set only.
    table   on fresh pairs (seed 1, the evaluation set): the selected group, the named groups and the
            whole model: follow r' (different donor), follow r' (third donor), keep (same-rule
            donor), per target rule r' as well.
    attribution   gradient x (donor code - base code) of the logit difference logit[r''s answer] -
            logit[true answer] for every (layer, head, query, key) in one backward pass, summed
            over each map group, against the exact patch of that group (Pearson, Spearman).
    subspace      a rank-k subspace of the code space at the selected group, trained on pairs of
            the TRAINING rule multisets to carry r' (cross-entropy to r''s answer), scored on
            held-out training-multiset pairs and on the OOD evaluation pairs, beside a random
            subspace of the same rank and full interchange.

Fuzzy-logic models: the same with term sets for rules (donor task T' whose function differs from
the base's at the query by > 0.1; third task T''), "follow" = the prediction is closer to T''s value
than to the true one; blocks of 4 tokens instead of panels.

    python analyses/rule_localisation.py --runs-from models --model sraven-hyla      # ~6 min on one thread
    python analyses/rule_localisation.py --runs-from models --model all               # every shipped model
    python analyses/rule_localisation.py --gather                                     # page from the per-model files

Writes under --out (default analyses/results/interventions/localisation): per model
`MODEL/map.csv`, `MODEL/table.csv`, `MODEL/attribution.csv`, `MODEL/subspace.csv`, `MODEL/summary.json`,
`MODEL/map.png`, `MODEL/attribution.png`; `--gather` writes `README.md` and `maps.png`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import common
import numpy as np
from common import binomial_se

SRAVEN_MODELS = ("sraven-softmax", "sraven-linear", "sraven-hyla",
                 "sraven-permuted-softmax", "sraven-permuted-linear", "sraven-permuted-hyla")
FUZZY_MODELS = ("fuzzy_logic-softmax", "fuzzy_logic-linear", "fuzzy_logic-hyla")
OUT = Path(__file__).parent / "results" / "interventions" / "localisation"


def output_set(args):
    """The set (common.output_set) each command of this script writes its files in, all under one lock,
    the page's: --gather redraws every model's figures, and models measured in parallel (a command each)
    wait for one another's writing (seconds) instead of failing after minutes of work."""
    return common.output_set(Path(args.out) / "README.md", wait=120.0)


# -- site groups -----------------------------------------------------------------------------------
def map_units(task, is_sraven: bool) -> list[list[int]]:
    """The positions of each row/column of the map. SRAVEN: one unit per feature slot j, the
    positions j, j + M, j + 2M, ... (slot j of all nine panels; on unpermuted instances that is
    feature j), so a cell is one slot's cells attending to another's. Fuzzy logic: blocks of 4
    tokens."""
    if is_sraven:
        return [list(range(slot, task.seq_len, task.n_features)) for slot in range(task.n_features)]
    return [list(range(start, min(start + 4, task.seq_len))) for start in range(0, task.seq_len, 4)]


def map_groups(task, n_layers: int, is_sraven: bool):
    """layer x query unit x key unit (see `map_units`)."""
    from latentcode.intervention.patching import SiteGroup
    from latentcode.sources import block

    units = map_units(task, is_sraven)
    groups = []
    for layer in range(n_layers):
        for query_unit, queries in enumerate(units):
            for key_unit, keys in enumerate(units):
                groups.append(SiteGroup(block(layer, queries, keys), coordinates={
                    "kind": "map", "layer": layer, "query_unit": query_unit, "key_unit": key_unit,
                    "name": f"layer {layer}"}))
    return groups


def named_groups(task, n_layers: int, prediction: int, feature_cells: bool):
    """Per layer and for all layers: the queried feature's cells among themselves (unpermuted SRAVEN),
    the old sraven-rule sites, the query's whole row, the whole layer."""
    from latentcode.intervention.patching import SiteGroup
    from latentcode.sources import block

    query = task.seq_len - task.n_predictions + prediction
    sets = {}
    if feature_cells:
        cells = list(range(prediction, task.seq_len, task.n_features))  # feature f in every panel, query included
        # The context cells among themselves transfer about twice what the 9 x 9 with the query cell does
        # (issue 31): the query cell's codes only damage. Both are kept, the first named as what it is.
        sets["feature context cells x themselves (8 x 8)"] = lambda layers: block(layers, cells[:-1], cells[:-1])
        sets["feature cells x feature cells, query included (9 x 9)"] = lambda layers: block(layers, cells, cells)
    if "sraven-rule" in task.selectors():
        (_, rule_query, first), (_, _, second) = task.selectors()["sraven-rule"]
        sets["sraven-rule (old sites)"] = lambda layers: block(layers, rule_query, [first, second])
    sets["query row"] = lambda layers: block(layers, query, None)
    sets["whole layer"] = lambda layers: block(layers, None, None)
    groups = []
    for name, make in sets.items():
        for layer in [*range(n_layers), None]:
            layers = list(range(n_layers)) if layer is None else layer
            groups.append(SiteGroup(make(layers), coordinates={"kind": "named",
                                                               "layer": "all" if layer is None else layer,
                                                              "name": name}))
    return groups


# -- one model -------------------------------------------------------------------------------------
def measure_model(name: str, run_dir: Path, args) -> dict:
    import pandas as pd
    import torch

    import latentcode
    from latentcode.intervention import (
        METRICS,
        counterfactual_metrics,
        output_position,
        per_example,
        transfer_sweep,
    )
    from latentcode.intervention.patching import attribution_patching

    started = time.time()
    torch.manual_seed(0)
    run = latentcode.Run(run_dir)
    model = run.load_model().eval()
    task = run.task()
    variant = run.config.variant or task.variants[0]
    is_sraven = task.name == "sraven"
    prediction = task.n_predictions - 1
    position = output_position(task, prediction)
    unit = "feature slot" if is_sraven else "block of 4 tokens"
    pairs_options = {"variant": variant, "prediction": prediction}
    selection = task.counterfactual_pairs(args.n, "ood", seed=0, **pairs_options)
    evaluation = task.counterfactual_pairs(args.n, "ood", seed=1, **pairs_options)
    n_layers = model.config.n_layers

    # the map and the named groups on the selection set
    groups = map_groups(task, n_layers, is_sraven)
    groups += named_groups(task, n_layers, prediction, feature_cells=is_sraven and variant == "unpermuted")
    map_table = transfer_sweep(model, task, selection, groups)
    unpatched = {metric: float(map_table[f"{metric} (unpatched)"].iloc[0]) for metric in METRICS}

    # select on the selection set: the group with the largest transfer
    best = int(map_table["transfer"].idxmax())
    selected_row, selected = map_table.loc[best], groups[best]

    # the evaluation set: the selected group and the named groups, overall and per target rule
    evaluation_groups = [selected] + [g for g in groups if g.coordinates["kind"] == "named"]
    evaluated = transfer_sweep(model, task, evaluation, evaluation_groups, relations=("different", "third", "same"))
    table_rows = []
    target = evaluation.donor_parts["different"]
    for index, group in enumerate(evaluation_groups):
        label = ("selected: " + group.name if index == 0
                 else f"{group.coordinates['name']}, layer {group.coordinates['layer']}")
        for part in [None, *np.unique(target)]:
            mask = np.ones(len(target), bool) if part is None else target == part
            n = int(mask.sum())
            follow = float(per_example(evaluated, "different", "follow")[index][mask].mean())
            third = float(per_example(evaluated, "third", "follow")[index][mask].mean())
            table_rows.append({
                "group": label, "target r'": "all" if part is None else evaluation.part_names[int(part)], "n": n,
                "follow r' (different donor)": follow, "follow r' (third donor)": third,
                "transfer": follow - third, "se": binomial_se(follow, n) + binomial_se(third, n),
                "keep (different donor)": float(per_example(evaluated, "different", "keep")[index][mask].mean()),
                "keep (same-rule donor)": float(per_example(evaluated, "same", "keep")[index][mask].mean()),
            })
    table = pd.DataFrame(table_rows)

    # attribution vs exact on the map groups (logit difference, different donors, selection set)
    metrics = counterfactual_metrics(selection, task.objective, position)
    attribution = attribution_patching(model, selection.base.torch().x, selection.donors["different"].torch().x,
                                       metrics["logit_difference"], sites="*:*:*")
    map_index = [i for i, g in enumerate(groups) if g.coordinates["kind"] == "map"]
    map_groups_only = [groups[i] for i in map_index]
    exact = (per_example(map_table, "different", "logit_difference")[map_index]
             - map_table["logit_difference (unpatched)"].iloc[0])
    estimate = attribution.for_groups(map_groups_only)
    from scipy.stats import pearsonr, spearmanr

    exact_mean, estimate_mean = exact.mean(1), estimate.mean(1)
    correlation = {"pearson": float(pearsonr(exact_mean, estimate_mean)[0]),
                   "spearman": float(spearmanr(exact_mean, estimate_mean)[0]), "groups": len(map_groups_only)}
    attribution_table = pd.DataFrame({**{k: [g.coordinates[k] for g in map_groups_only]
                                         for k in ("layer", "query_unit", "key_unit")},
                                      "exact": exact_mean, "attribution": estimate_mean})

    # a learned subspace at the selected group
    subspace_rows = fit_subspaces(model, task, selected, evaluation, position, is_sraven, variant, prediction, args)

    summary = {
        "model": name, "task": task.name, "variant": variant, "n_pairs": len(selection), "layers": n_layers,
        "heads": model.config.n_heads, "map_unit": unit, "unpatched": unpatched,
        "pairs_selection": selection.counts, "pairs_evaluation": evaluation.counts,
        "selected_group": selected.name, "selected_on_selection_set": {
            "transfer": float(selected_row["transfer"]), "transfer se": float(selected_row["transfer se"]),
            "follow (different)": float(selected_row["follow (different)"]),
            "follow (third)": float(selected_row["follow (third)"])},
        "attribution_vs_exact": correlation, "minutes": (time.time() - started) / 60,
        "command": f"python analyses/rule_localisation.py --runs-from {args.runs_from} --model {name} --n {args.n}",
    }
    out = Path(args.out) / name
    with output_set(args) as outputs:  # CSV files only: not write_table, which adds a JSON of each
        outputs.write_text(out / "map.csv", map_table.to_csv(index=False))
        outputs.write_text(out / "table.csv", table.to_csv(index=False))
        outputs.write_text(out / "attribution.csv", attribution_table.to_csv(index=False))
        outputs.write_text(out / "subspace.csv", pd.DataFrame(subspace_rows).to_csv(index=False))
        outputs.write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        draw_model(outputs, out, name, summary, map_table, attribution_table)
    return summary


def fit_subspaces(model, task, selected, evaluation, position, is_sraven, variant, prediction, args) -> list[dict]:
    """Rank 1, 2, 4 subspaces at the selected group, fitted on training-multiset pairs."""
    import torch

    from latentcode.intervention import (
        counterfactual_metrics,
        learn_subspace,
        patched_outputs,
        random_basis,
    )

    options = {"variant": variant, "prediction": prediction}
    fit_pairs = task.counterfactual_pairs(args.n_fit, "train", seed=2, **options)
    held_out = task.counterfactual_pairs(args.n, "train", seed=3, **options)
    sites = selected.selector

    def targets(pairs):
        values = torch.as_tensor(pairs.counterfactual_answer)
        return values.long() if is_sraven else values.float()

    def loss(output, target):
        if is_sraven:
            return torch.nn.functional.cross_entropy(output[:, position], target)
        return ((output[:, position, 0] - target) ** 2).mean()

    def score(pairs, basis, relation):
        outputs = patched_outputs(model, pairs.base.torch().x, pairs.donors[relation].torch().x, sites, basis)
        return float(counterfactual_metrics(pairs, task.objective, position)["follow"](outputs).mean())

    n_heads = model.config.n_heads
    rows = []
    for rank in args.ranks:
        fit = learn_subspace(model, fit_pairs.base.torch().x, fit_pairs.donors["different"].torch().x,
                             targets(fit_pairs),
                             loss, sites, rank, steps=args.steps, batch_size=64, learning_rate=0.02, seed=rank)
        for kind, basis in (("learned", fit.basis), ("random", random_basis(n_heads, rank, seed=rank))):
            for split_name, pairs in (("held-out training-multiset pairs", held_out),
                                      ("OOD evaluation pairs", evaluation)):
                n = len(pairs)
                follow = score(pairs, basis, "different")
                third = score(pairs, basis, "third")
                rows.append({"rank": rank, "subspace": kind, "pairs": split_name, "n": n,
                             "follow r' (different donor)": follow,
                             "follow r' (third donor)": third, "transfer": follow - third,
                             "se": binomial_se(follow, n) + binomial_se(third, n),
                             "final training loss": fit.losses[-1] if kind == "learned" else float("nan")})
    for split_name, pairs in (("held-out training-multiset pairs", held_out), ("OOD evaluation pairs", evaluation)):
        follow, third = score(pairs, None, "different"), score(pairs, None, "third")
        rows.append({"rank": n_heads, "subspace": "full interchange", "pairs": split_name, "n": len(pairs),
                     "follow r' (different donor)": follow, "follow r' (third donor)": third,
                     "transfer": follow - third,
                     "se": binomial_se(follow, len(pairs)) + binomial_se(third, len(pairs)),
                     "final training loss": float("nan")})
    return rows


def per_target_rule(table, pairs, group: int) -> list[dict]:
    """Rows of one group of a `transfer_sweep` table (relations different, third, same), for all pairs
    and per target rule r' (the different donor's part): follow r', the third donor's follow, their
    paired difference (transfer) with its s.e., and the same-rule donor's keep."""
    from latentcode.intervention import per_example

    target = pairs.donor_parts["different"]
    follow_r, follow_third = (per_example(table, relation, "follow")[group] for relation in ("different", "third"))
    keep = per_example(table, "same", "keep")[group]
    rows = []
    for part in [None, *np.unique(target)]:
        mask = np.ones(len(target), bool) if part is None else target == part
        n = int(mask.sum())
        paired = follow_r[mask] - follow_third[mask]
        rows.append({"target r'": "all" if part is None else pairs.part_names[int(part)], "n": n,
                     "follow r' (different donor)": float(follow_r[mask].mean()),
                     "follow r' (third donor)": float(follow_third[mask].mean()), "transfer": float(paired.mean()),
                     "transfer se (paired)": float(paired.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
                     "keep (same-rule donor)": float(keep[mask].mean())})
    return rows


# -- confirmation on many pairs -----------------------------------------------------------------------
def confirm(name: str, run_dir: Path, args) -> None:
    """The selected group of a measured model (its summary.json) on `args.confirm` fresh OOD pairs (seed
    4), per target rule: enough pairs for the rules that are rarely well-posed. Writes confirm.csv."""
    import pandas as pd

    import latentcode
    from latentcode.intervention import transfer_sweep
    from latentcode.intervention.patching import SiteGroup
    from latentcode.sources import parse_selector

    out = Path(args.out) / name
    summary = json.loads((out / "summary.json").read_text())
    run = latentcode.Run(run_dir)
    model, task = run.load_model().eval(), run.task()
    pairs = task.counterfactual_pairs(args.confirm, "ood", seed=4, variant=summary["variant"],
                                      prediction=task.n_predictions - 1)
    group = SiteGroup(parse_selector(summary["selected_group"], task))
    table = transfer_sweep(model, task, pairs, [group], relations=("different", "third", "same"))
    frame = pd.DataFrame(per_target_rule(table, pairs, 0))
    summary["confirm_command"] = (f"python analyses/rule_localisation.py --runs-from {args.runs_from} --model {name} "
                                  f"--confirm {args.confirm}")
    with output_set(args) as outputs:
        outputs.write_text(out / "confirm.csv", frame.to_csv(index=False))
        outputs.write_text(out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    print(frame.to_string(index=False))


# -- figures ---------------------------------------------------------------------------------------
TRANSFER_LIMIT = 0.6  # one signed colour scale for every map of every model


def draw_model(outputs, out: Path, name: str, summary: dict, map_table, attribution_table) -> None:
    """`out/map.png` and `out/attribution.png` of one model, into the set `outputs`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    layers = sorted(map_table.loc[map_table["kind"] == "map", "layer"].unique())
    cells = map_table[map_table["kind"] == "map"]
    n_blocks = int(cells["query_unit"].max()) + 1
    what = summary["map_unit"]
    figure = Figure(figsize=(2.9 * len(layers) + 1.6, 3.4), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(layers), squeeze=False)[0]
    image = None
    for axis, layer in zip(axes, layers, strict=True):
        grid = np.full((n_blocks, n_blocks), np.nan)
        for _, row in cells[cells["layer"] == layer].iterrows():
            grid[int(row["query_unit"]), int(row["key_unit"])] = row["transfer"]
        image = axis.imshow(grid, cmap="RdBu_r", vmin=-TRANSFER_LIMIT, vmax=TRANSFER_LIMIT)
        axis.set_title(f"layer {layer}", fontsize=9)
        axis.set_xlabel(f"key {what}", fontsize=8)
        axis.set_ylabel(f"query {what}", fontsize=8)
        axis.set_xticks(range(n_blocks))
        axis.set_yticks(range(n_blocks))
        axis.tick_params(labelsize=7)
        for (query, key), value in np.ndenumerate(grid):
            if not np.isnan(value):  # in hundredths
                axis.text(key, query, f"{100 * value:+.0f}", ha="center", va="center", fontsize=7,
                          color="white" if abs(value) > 0.35 else "black")
    figure.colorbar(image, ax=list(axes), shrink=0.8,
                    label="follow r' (r' donor) - follow r' (third-rule donor)\n(numbers: x100)")
    figure.suptitle(f"{name} ({summary['variant']}): where patching a code transfers the donor's sub-task; OOD pairs, "
                    f"n = {summary['n_pairs']} per cell, last query position", fontsize=9)
    outputs.write_figure(out / "map", figure)

    figure = Figure(figsize=(4.4, 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    axis.axhline(0, color="0.8", linewidth=0.8)
    axis.axvline(0, color="0.8", linewidth=0.8)
    axis.scatter(attribution_table["exact"], attribution_table["attribution"], s=8, alpha=0.6, color="tab:blue")
    low = float(min(attribution_table["exact"].min(), attribution_table["attribution"].min()))
    high = float(max(attribution_table["exact"].max(), attribution_table["attribution"].max()))
    axis.plot([low, high], [low, high], "--", color="0.5", linewidth=0.8, label="estimate = exact")
    axis.legend(fontsize=7, loc="upper left")
    correlation = summary["attribution_vs_exact"]
    what = "logit difference" if summary["task"] == "sraven" else "squared-error difference"
    axis.set_xlabel(f"exact patch: change of the {what}", fontsize=8)
    axis.set_ylabel("attribution patching estimate", fontsize=8)
    axis.set_title(f"{name}: attribution vs exact patching\n{correlation['groups']} groups (layer x "
                   f"{summary['map_unit']} pairs), OOD pairs, n = {summary['n_pairs']}\n"
                   f"Pearson {correlation['pearson']:.2f}, Spearman {correlation['spearman']:.2f}", fontsize=8)
    axis.tick_params(labelsize=7)
    outputs.write_figure(out / "attribution", figure)


# -- the page --------------------------------------------------------------------------------------
def gather(args) -> None:
    import pandas as pd

    out = Path(args.out)
    lines = ["# Where the rule lives: causal maps of the latent codes (issue 22)", "",
             "Generated by `python analyses/rule_localisation.py --gather` from the per-model folders; each folder's",
             "`summary.json` holds the command that measured it. Read every \"follow r'\" number against the "
             "third-rule",
             "donor beside it (the strongest trivial baseline: a damaged code that lands on r''s answer by itself).",
             "Map groups were chosen on the selection pairs (seed 0); every number below the map is on fresh",
             "evaluation pairs (seed 1). s.e. is the sum of the two binomial standard errors.", ""]
    with output_set(args) as outputs:  # the page and every model's figures, redrawn
        for name in [*SRAVEN_MODELS, *FUZZY_MODELS]:
            summary_path = out / name / "summary.json"
            if not summary_path.is_file():
                continue
            summary = json.loads(summary_path.read_text())
            draw_model(outputs, out / name, name, summary, pd.read_csv(out / name / "map.csv"),
                       pd.read_csv(out / name / "attribution.csv"))
            table = pd.read_csv(out / name / "table.csv")
            subspace = pd.read_csv(out / name / "subspace.csv")
            selection = summary["selected_on_selection_set"]
            lines += [f"## {name} ({summary['variant']})", "",
                      f"`{summary['command']}` ({summary['minutes']:.1f} min). Unpatched: follow r' "
                      f"{summary['unpatched']['follow']:.3f}, keep {summary['unpatched']['keep']:.3f}.", "",
                      f"![map]({name}/map.png)", "",
                      "Selected group (largest transfer on the selection set): "
                      f"{summary['selected_group'].replace('|', chr(92) + '|')}: follow r' "
                      f"{selection['follow (different)']:.3f} vs third-rule donor {selection['follow (third)']:.3f} "
                      f"(transfer {selection['transfer']:.3f} ± {selection['transfer se']:.3f}).", "",
                      "Evaluation pairs:", "", markdown(table[table["target r'"] == "all"]), "",
                      "Per target rule r' at the selected group:", "",
                      markdown(table[(table["group"].str.startswith("selected")) & (table["target r'"] != "all")]), "",
                      *([f"The selected group again on {int(pd.read_csv(out / name / 'confirm.csv')['n'].iloc[0])} "
                         f"fresh pairs (seed 4; `{summary.get('confirm_command', '')}`), per target rule:", "",
                         markdown(pd.read_csv(out / name / "confirm.csv")), ""]
                        if (out / name / "confirm.csv").is_file() else []),
                      *search_section(out, name, markdown),
                      f"Attribution patching vs exact patching over the map's groups: Pearson "
                      f"{summary['attribution_vs_exact']['pearson']:.2f}, Spearman "
                      f"{summary['attribution_vs_exact']['spearman']:.2f} ({summary['attribution_vs_exact']['groups']} "
                      f"groups). ![attribution]({name}/attribution.png)", "",
                      "Learned subspace at the selected group (fitted on training-multiset pairs):", "",
                      markdown(subspace), ""]
        outputs.write_text(out / "README.md", "\n".join(lines) + "\n")
    print(f"wrote {out / 'README.md'}")


def search_section(out: Path, name: str, markdown) -> list[str]:
    """The page's lines for `analyses/localisation_search.py`'s result, where it was run."""
    import pandas as pd

    if not (out / name / "search.csv").is_file():
        return []
    found = json.loads((out / name / "search.json").read_text())
    table = pd.read_csv(out / name / "search.csv").drop(columns=["group"])
    return [f"Found without being told (`{found['command']}`, {found['minutes']:.1f} min): "
            f"{found['found'].replace('|', chr(92) + '|')}. The search's route (chosen on {found['selection_pairs']} "
            f"selection pairs) and the hand-made groups, on the same {found['confirmation_pairs']} fresh pairs (seed "
            "4); transfer se paired, damage = keep (unpatched) - keep (same-rule donor):", "", markdown(table), "",
            *per_rule_lines(out, name, markdown)]


def per_rule_lines(out: Path, name: str, markdown, min_pairs: int = 20) -> list[str]:
    """Per target rule r' (>= `min_pairs` pairs): the found and hand-made groups' transfer and keep."""
    import pandas as pd

    rows = pd.read_csv(out / name / "search-per-rule.csv") if (out / name / "search-per-rule.csv").is_file() else None
    found = None if rows is None else rows[rows["group kind"] == "search route"]["step"].iloc[-1]
    chosen = rows if rows is None else rows[((rows["step"] == found) | ((rows["group kind"] == "hand-made") & (
        rows["step"] != "whole layer"))) & (rows["n"] >= min_pairs) & (rows["target r'"] != "all")]
    if chosen is None or chosen.empty:
        return []
    labels = {step: "found" if step == found else step for step in chosen["step"].unique()}
    cells = chosen.assign(cell=[f"{t:.3f} ± {se:.3f} (keep {k:.2f})" for t, se, k in zip(
        chosen["transfer"], chosen["transfer se (paired)"], chosen["keep (same-rule donor)"], strict=True)])
    table = cells.pivot_table(index=["target r'", "n"], columns="step", values="cell", aggfunc="first", sort=False)
    table = table[list(labels)].rename(columns=labels).reset_index()
    return [f"Per target rule r' with at least {min_pairs} of the confirmation pairs (transfer ± s.e., and the "
            "same-rule donor's keep), `search-per-rule.csv`:", "", markdown(table), ""]


def markdown(frame) -> str:
    columns = list(frame.columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in frame.iterrows():
        cells = [f"{value:.3f}" if isinstance(value, float) else str(value).replace("|", "\\|") for value in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-from", default="models",
                        help="directory of finished runs named like the shipped models")
    parser.add_argument("--model", nargs="+", default=["sraven-hyla"],
                        help="run names, or 'all' for every shipped model")
    parser.add_argument("--n", type=int, default=256, help="pairs in the selection and in the evaluation set")
    parser.add_argument("--n-fit", type=int, default=1024, help="pairs the subspaces are fitted on")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="subspace ranks")
    parser.add_argument("--steps", type=int, default=150, help="training steps per subspace")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--gather", action="store_true", help="only write the page from the per-model folders")
    parser.add_argument("--confirm", type=int, metavar="N", help="only re-score each model's selected group on N "
                        "fresh pairs (seed 4), per target rule (confirm.csv)")
    args = parser.parse_args()
    if args.confirm:
        import torch

        torch.set_num_threads(1)
        for name in [*SRAVEN_MODELS, *FUZZY_MODELS] if args.model == ["all"] else args.model:
            confirm(name, Path(args.runs_from) / name, args)
    elif not args.gather:
        import torch

        torch.set_num_threads(1)
        names = [*SRAVEN_MODELS, *FUZZY_MODELS] if args.model == ["all"] else args.model
        for name in names:
            summary = measure_model(name, Path(args.runs_from) / name, args)
            print(f"{name}: selected {summary['selected_group']}, {summary['minutes']:.1f} min", flush=True)
    gather(args)


if __name__ == "__main__":
    main()
