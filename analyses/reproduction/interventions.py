"""The intervention pages under analyses/results/interventions/ (issues 12 and 22), regenerated from the
shipped models instead of copied by hand:

    python analyses/reproduce.py interventions --plan                  # the commands and what they write
    python analyses/reproduce.py interventions [--only rule_swap ...]  # run them, record the kept files

rule_swap, term_swap, term_swap_fixed_query, head_ablation and topographic_similarity run their script on
the shipped models into analyses/output/interventions/NAME/ (each model's rows are kept there in
per_model/, so a second run only gathers) and record the table (.csv), its summary (.md), the page
(.html) and the figures (palette PNGs) in analyses/results/interventions/NAME/. The causal maps
(analyses/rule_localisation.py) are measured into analyses/results/interventions/localisation/ itself,
one folder per model; `localisation` redraws their page and figures from those folders (`--gather`).
Measuring them again (about 40 minutes on one thread), as --plan prints:

    python analyses/rule_localisation.py --runs-from models --model all --n 256
    python analyses/rule_localisation.py --runs-from models --model sraven-hyla --confirm 2048

The README.md beside them is the reading of these tables, written by hand.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from . import RESULTS, ROOT
from .scripted import ScriptedResult, plan_lines, run_and_record

INTERVENED = RESULTS / "interventions"


def _intervention(name: str, script: str, arguments: tuple[str, ...], stem: str, figures: tuple[str, ...],
                  extra: tuple[str, ...] = ()) -> ScriptedResult:
    kept = (f"{stem}.csv", f"{stem}.md", f"{stem}.html", *extra, *(f"{figure}.png" for figure in figures))
    return ScriptedResult(name, script, (*arguments, "--quiet"), kept, f"interventions/{name}", quantize_figures=True)


# The arguments each recorded table was made with (results/interventions/README.md lists the same).
SCRIPTED = (
    _intervention("rule_swap", "rule_swap.py", ("--n", "2048", "--n-codes", "2048"), "rule_swap",
                  ("rule_swap_sraven-rule", "rule_swap_matrix_sraven-rule", "rule_swap_query-row",
                   "rule_swap_matrix_query-row"), extra=("rule_swap_matrix.csv",)),
    _intervention("term_swap", "term_swap.py", ("--n", "2048"), "term_swap",
                  ("term_swap_last-self", "term_swap_last-row")),
    _intervention("term_swap_fixed_query", "term_swap.py", ("--n", "2048", "--variant", "fixed_query"), "term_swap",
                  ("term_swap_last-self", "term_swap_last-row")),
    _intervention("head_ablation", "head_ablation.py",
                  ("--n", "1024", "--n-single", "512", "--n-order", "256", "--n-means", "512"), "head_ablation",
                  tuple(f"head_ablation_{kind}_{task}" for kind in ("single", "cumulative")
                        for task in ("sraven", "fuzzy_logic"))),
    _intervention("topographic_similarity", "topographic_similarity.py", ("--n-codes", "4096"),
                  "topographic_similarity", ("topographic_similarity_sraven", "topographic_similarity_fuzzy_logic")),
)
LOCALISATION = INTERVENED / "localisation"
LOCALISATION_GATHER = ["python", "analyses/rule_localisation.py", "--gather"]
LOCALISATION_MEASURE = ["python analyses/rule_localisation.py --runs-from models --model all --n 256",
                        "python analyses/rule_localisation.py --runs-from models --model sraven-hyla --confirm 2048"]
CHOICES = (*(result.name for result in SCRIPTED), "localisation")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=str(ROOT.parent / "models"),
                        help="the shipped models (finished runs TASK-ATTENTION)")
    parser.add_argument("--out", default="analyses/output/interventions",
                        help="where the scripts write and keep each model's rows (not committed)")
    parser.add_argument("--only", nargs="+", choices=CHOICES, default=list(CHOICES),
                        help="pages to regenerate (default all)")
    parser.add_argument("--plan", action="store_true", help="print the commands and the files they write; run nothing")


def plan(only, models, out) -> list[str]:
    lines = plan_lines([result for result in SCRIPTED if result.name in only], models, out)
    if "localisation" in only:
        lines.append(" ".join(LOCALISATION_GATHER) + "   # from the per-model folders; measured by: "
                     + "; ".join(LOCALISATION_MEASURE))
        lines.append(f"    writes {(LOCALISATION / 'README.md').relative_to(ROOT.parent)}")
        lines += [f"    writes {(folder / figure).relative_to(ROOT.parent)}"
                  for folder in sorted(path.parent for path in LOCALISATION.glob("*/summary.json"))
                  for figure in ("map.png", "attribution.png")]
    return lines


def interventions(args: argparse.Namespace) -> None:
    if args.plan:
        print("\n".join(plan(args.only, args.models, args.out)))
        return
    run_and_record([result for result in SCRIPTED if result.name in args.only], args.models, args.out)
    if "localisation" in args.only:
        print(" ".join(LOCALISATION_GATHER), flush=True)
        subprocess.run([sys.executable, str(ROOT / "rule_localisation.py"), "--gather"], check=True)


def interventions_section() -> str:
    """The page's links to each intervention page, with what it measured."""
    lines = ["| page | made by | files |", "|---|---|---|"]
    for result in SCRIPTED:
        html = next(kept for kept in result.kept if kept.endswith(".html"))
        command = " ".join(result.command("models", "analyses/output/interventions")[:-2])
        lines.append(f"| [{result.name}](results/{result.folder}/{html}) | `{command}` | "
                     + ", ".join(f"[{kept}](results/{result.folder}/{kept})" for kept in result.kept
                                 if not kept.endswith(".html")) + " |")
    models = sorted(path.parent.name for path in LOCALISATION.glob("*/summary.json"))
    lines.append(f"| [localisation](results/interventions/localisation/README.md) | `{LOCALISATION_MEASURE[0]}`, "
                 f"then `{' '.join(LOCALISATION_GATHER)}` | one folder per model: "
                 + ", ".join(f"[{model}](results/interventions/localisation/{model}/)" for model in models) + " |")
    return "\n".join(lines)
