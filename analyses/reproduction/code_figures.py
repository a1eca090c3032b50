"""Fig. 3 and Fig. 4 of the paper on the shipped models: the tSNE of the OOD latent codes coloured by
the sub-task (analyses/latent_tsne.py) and the cosine similarity of each SRAVEN rule's mean code
(analyses/sraven_rule_heatmap.py), recorded under analyses/results/code_figures/ by

    python analyses/reproduce.py code-figures [--plan]
"""

from __future__ import annotations

import argparse

from . import ROOT
from .scripted import ScriptedResult, plan_lines, run_and_record

ATTENTIONS = ("softmax", "linear", "hyla")
FOLDER = "code_figures"
FIG3_SRAVEN = ScriptedResult("fig3_sraven", "latent_tsne.py", ("--task", "sraven", "--quiet"),
                             tuple(f"{attention}_tsne.png" for attention in ATTENTIONS), f"{FOLDER}/fig3_sraven")
FIG3_FUZZY = ScriptedResult("fig3_fuzzy_logic", "latent_tsne.py", ("--task", "fuzzy_logic", "--quiet"),
                            tuple(f"{attention}_tsne.png" for attention in ATTENTIONS), f"{FOLDER}/fig3_fuzzy_logic")
FIG4 = ScriptedResult("fig4", "sraven_rule_heatmap.py", ("--quiet",),
                      ("rule_similarity.png", "rule_similarity_centred.png",
                       *(f"{attention}_rule_similarity.json" for attention in ATTENTIONS)), f"{FOLDER}/fig4")
CODE_FIGURES = (FIG3_SRAVEN, FIG3_FUZZY, FIG4)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=str(ROOT.parent / "models"), help="finished runs TASK-ATTENTION")
    parser.add_argument("--out", default="analyses/output/code_figures", help="where the scripts write (not committed)")
    parser.add_argument("--only", nargs="+", choices=[result.name for result in CODE_FIGURES],
                        default=[result.name for result in CODE_FIGURES], help="figures to make (default all)")
    parser.add_argument("--plan", action="store_true", help="print the commands and the files they record; run nothing")


def code_figures(args: argparse.Namespace) -> None:
    chosen = [result for result in CODE_FIGURES if result.name in args.only]
    if args.plan:
        print("\n".join(plan_lines(chosen, args.models, args.out)))
        return
    run_and_record(chosen, args.models, args.out)
