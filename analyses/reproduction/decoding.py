"""What the latent codes hold and what the models use: Fig. 2B / 5F (decoding the sub-task from OOD
codes, per layer) and the causal maps of issue 22, as recorded under analyses/results/."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from . import RESULTS, ROOT

# task -> (the analysis script, its table's file stem, the metric shown). The scripts run on the shipped
# checkpoints (models/TASK-ATTENTION, seed 0); their CSV and figure are copied to results/decoding/.
DECODING = {
    "fuzzy_logic": ("fuzzy_term_decoding.py", "term_decoding", "mean_balanced_accuracy", "fuzzy_logic-{attention}"),
    "sraven": ("sraven_rule_decoding.py", "rule_decoding", "accuracy", "sraven-{attention}"),
    "sraven_permuted": ("sraven_rule_decoding.py", "rule_decoding", "accuracy", "sraven-permuted-{attention}"),
}
DECODED = RESULTS / "decoding"


def decoding(args: argparse.Namespace) -> None:
    """Run the decoding scripts on the shipped checkpoints and record their tables and figures."""
    from latentcode.files import AtomicOutputs
    from latentcode.rundir import RunDirectory

    for key, (script, stem, _, run_name) in DECODING.items():
        if not RunDirectory(Path(args.models) / run_name.format(attention="hyla")).is_finished:
            print(f"skipped {key}: no {run_name} in {args.models}")
            continue
        out = Path(args.out) / f"decoding-{key}"
        command = ["python", str(ROOT / script), "--runs-from", args.models, "--run-name", run_name, "--out", str(out),
                   "--quiet", "--n-codes", str(args.n_codes)]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
        with AtomicOutputs(lock=DECODED / f"{key}_{stem}", purpose="recording a decoding table") as outputs:
            for suffix in (".csv", ".png"):
                outputs.write_bytes(DECODED / f"{key}_{stem}{suffix}", (out / f"{stem}{suffix}").read_bytes())


def decoding_table(task: str) -> str:  # task: a key of DECODING
    """Per model and layer: the probe's test score (fitted on train, scored on ood), its
    cross-validated score on train (which picks the layer, marked *) and the strongest baseline."""
    import pandas as pd

    _, stem, metric, _ = DECODING[task]
    path = DECODED / f"{task}_{stem}.csv"
    if not path.is_file():
        return f"not computed yet: `python analyses/reproduce.py decoding` writes {path.relative_to(ROOT.parent)}"
    table = pd.read_csv(path)
    rows = table[table["metric"] == metric]
    layers = sorted(rows["layer"].unique())
    lines = ["| model | " + " | ".join(f"layer {layer}: ood (train cv) / strongest baseline"
                                       for layer in layers) + " |",
             "|---" * (len(layers) + 1) + "|"]
    for model, of_model in rows.groupby("model", sort=False):
        cells = []
        for layer in layers:
            row = of_model[of_model["layer"] == layer].iloc[0]
            mark = "**" if row["selected"] else ""
            cells.append(f"{mark}{row['value']:.3f}{mark} ({row['validation']:.3f}) / "
                         f"{row['strongest_baseline_value']:.3f} {row['strongest_baseline']}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


LOCALISATION = RESULTS / "interventions" / "localisation"


def localisation_section() -> str:
    """Issue 22's causal maps of the shipped models (analyses/rule_localisation.py), one row each: the
    group chosen on the selection pairs and its transfer on the evaluation pairs, beside the
    third-rule donor baseline."""
    import pandas as pd

    lines = ["| model | group (chosen on the selection pairs) | follow r' (r' donor) | follow r' (third-rule donor) | "
             "transfer ± s.e. (evaluation pairs) | n |", "|---|---|---|---|---|---|"]
    for folder in sorted(LOCALISATION.glob("*/summary.json")):
        summary = json.loads(folder.read_text())
        table = pd.read_csv(folder.parent / "table.csv")
        row = table[(table["target r'"] == "all") & table["group"].str.startswith("selected")].iloc[0]
        group = summary["selected_group"].replace("|", "\\|")
        follow, third = row["follow r' (different donor)"], row["follow r' (third donor)"]
        lines.append(f"| {summary['model']} | `{group}` | {follow:.3f} | {third:.3f} | {row['transfer']:.3f} ± "
                     f"{row['se']:.3f} | {int(row['n'])} |")
    if len(lines) == 2:
        return "Not measured yet: `python analyses/rule_localisation.py --runs-from models --model all`."
    return "\n".join(lines)


def search_section() -> str:
    """Issue 31's search (analyses/localisation_search.py) on each shipped model, one row each: the group
    found without being told and the whole layer it lies in, beside the best hand-made group where there
    is one (unpermuted SRAVEN: the queried feature's 8 context cells among themselves), every figure on
    the same fresh confirmation pairs, transfer and damage ± paired s.e."""
    import pandas as pd

    def cell(row, what: str) -> str:
        return f"{row[what]:.3f} ± {row[what + ' se']:.3f}"

    lines = ["| model | layer | found (queries x keys) | transfer | damage | 8 x 8 context cells: transfer | damage | "
             "whole layer: transfer | damage | n | minutes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    # a found group whose transfer is not 2 s.e. above zero is shown in brackets: the route ended in noise
    for folder in sorted(LOCALISATION.glob("*/search.json")):
        found = json.loads(folder.read_text())
        table = pd.read_csv(folder.parent / "search.csv")
        route, hand_made = table[table["group kind"] == "search route"], table[table["group kind"] == "hand-made"]
        last = route.iloc[-1]
        block = hand_made[hand_made["step"].str.contains("8 x 8")]
        whole = hand_made[hand_made["step"] == "whole layer"].iloc[0]
        eight = (cell(block.iloc[0], "transfer"), cell(block.iloc[0], "damage")) if len(block) else ("-", "-")
        shape = f"{int(last['n_queries'])} x {int(last['n_keys'])}"
        shape = shape if last["transfer"] > 2 * last["transfer se"] else f"({shape}: nothing transfers)"
        lines.append(f"| {found['model']} | {int(last['layer'])} | {shape} | "
                     f"{cell(last, 'transfer')} | {cell(last, 'damage')} | {eight[0]} | {eight[1]} | "
                     f"{cell(whole, 'transfer')} | {cell(whole, 'damage')} | "
                     f"{int(last['n'])} | {found['minutes']:.1f} |")
    if len(lines) == 2:
        return "Not measured yet: `python analyses/localisation_search.py --model all`."
    return "\n".join(lines)
