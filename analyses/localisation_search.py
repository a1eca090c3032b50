"""Where does the rule live, found without being told (issue 31): `site_search` on a shipped model,
beside the hand-made groups, every number on the same fresh confirmation pairs with n, s.e. and the
damage (how often a donor of the base's own rule breaks the model's answer).

For each model: the search chooses on `--n` selection pairs (OOD, seed 0) and its route (best whole
layer, best block, each accepted cut) is measured on `--confirm-n` confirmation pairs (OOD, seed 4),
together with the hand-made groups of `analyses/rule_localisation.py` at the search's layer: for
unpermuted SRAVEN the queried feature's 8 context cells among themselves, the same 9 x 9 with the
query cell (the group the page published first), and the query cell's row; for every model the
whole layer.

    python analyses/localisation_search.py --model sraven-hyla                  # minutes on one thread
    python analyses/localisation_search.py --model all
    python analyses/rule_localisation.py --gather                               # the page shows search.csv

Writes under --out (default analyses/results/interventions/localisation): `MODEL/search.csv` (the
route and the hand-made groups on the confirmation pairs), `MODEL/search-per-rule.csv` (the same
groups per target rule r'), `MODEL/search-candidates.csv` (every candidate the search weighed, on the
selection pairs) and `MODEL/search.json`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rule_localisation import FUZZY_MODELS, OUT, SRAVEN_MODELS, output_set, per_target_rule

COLUMNS = ["group kind", "step", "layer", "n_queries", "n_keys", "n", "follow (different)", "follow (third)",
           "transfer", "transfer se", "keep (unpatched)", "keep (same)", "damage", "damage se", "group"]


def hand_made_groups(task, layer: int, variant: str):
    """The queried feature's cells (unpermuted SRAVEN) and the whole layer, at `layer`."""
    from latentcode.intervention.patching import part_group

    groups = {}
    if task.name == "sraven" and variant == "unpermuted":
        feature = task.n_features - 1  # the measured (last) query position's feature
        cells = list(range(feature, task.seq_len, task.n_features))
        query = cells[-1]
        groups["queried feature's context cells x themselves (8 x 8)"] = part_group(layer, cells[:-1], cells[:-1])
        groups["queried feature's cells x themselves, query included (9 x 9)"] = part_group(layer, cells, cells)
        groups["query cell x every key"] = part_group(layer, [query], range(task.seq_len))
    groups["whole layer"] = part_group(layer, range(task.seq_len), range(task.seq_len))
    return groups


def search_model(name: str, run_dir: Path, args) -> dict:
    import pandas as pd

    import latentcode
    from latentcode.intervention import transfer_sweep
    from latentcode.intervention.patching import site_search

    started = time.time()
    run = latentcode.Run(run_dir)
    model, task = run.load_model().eval(), run.task()
    variant = run.config.variant or task.variants[0]
    options = {"variant": variant, "prediction": task.n_predictions - 1}
    selection = task.counterfactual_pairs(args.n, "ood", seed=0, **options)
    confirmation = task.counterfactual_pairs(args.confirm_n, "ood", seed=4, **options)
    result = site_search(model, task, selection, confirmation,
                         say=lambda text: print(f"{name}: {text} ({time.time() - started:.0f} s)", flush=True))
    layer = result.route[-1].layer
    hand_made = hand_made_groups(task, layer, variant)
    print(f"{name}: {len(hand_made)} hand-made groups on the confirmation pairs", flush=True)
    table = transfer_sweep(model, task, confirmation, list(hand_made.values()),
                           relations=("different", "third", "same"))
    table["step"] = list(hand_made)
    table["group kind"] = "hand-made"
    route = result.confirmed.copy()
    route["group kind"] = "search route"
    per_rule = pd.DataFrame([{"group kind": kind, "step": step, **row}
                             for frame, kind in ((route, "search route"), (table, "hand-made"))
                             for index, step in enumerate(frame["step"])
                             for row in per_target_rule(frame, confirmation, index)])
    route.attrs, table.attrs = {}, {}  # per-example arrays of different lengths: pandas compares attrs on concat
    both = pd.concat([route, table], ignore_index=True)
    both["keep (unpatched)"] = both["keep (unpatched)"].astype(float)
    frame = both[[column for column in COLUMNS if column in both.columns]]
    summary = {"model": name, "variant": variant, "selection_pairs": len(selection),
               "confirmation_pairs": len(confirmation), "found": result.found.name,
               "search": result.settings, "exact_examples": result.examples, "minutes": (time.time() - started) / 60,
               "command": f"python analyses/localisation_search.py --model {name} --n {args.n} "
                          f"--confirm-n {args.confirm_n}"}
    out = Path(args.out) / name
    with output_set(args) as outputs:
        outputs.write_text(out / "search.csv", frame.to_csv(index=False))
        outputs.write_text(out / "search-candidates.csv", result.candidates.to_csv(index=False))
        outputs.write_text(out / "search-per-rule.csv", per_rule.to_csv(index=False))
        outputs.write_text(out / "search.json", json.dumps(summary, indent=2, default=str) + "\n")
    print(frame.drop(columns=["group"]).to_string(index=False), flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-from", default="models",
                        help="directory of finished runs named like the shipped models")
    parser.add_argument("--model", nargs="+", default=["sraven-hyla"], help="run names, or 'all'")
    parser.add_argument("--n", type=int, default=256, help="selection pairs (seed 0)")
    parser.add_argument("--confirm-n", type=int, default=2048, help="confirmation pairs (seed 4)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    for name in [*SRAVEN_MODELS, *FUZZY_MODELS] if args.model == ["all"] else args.model:
        summary = search_model(name, Path(args.runs_from) / name, args)
        print(f"{name}: found {summary['found']} in {summary['minutes']:.1f} min", flush=True)


if __name__ == "__main__":
    main()
