"""Reproduce the paper's results at CPU scale: train what is missing, then regenerate analyses/RESULTS.md.

    python analyses/reproduce.py train [--jobs 2] [--only table_a1 fig2c ablations]   # trains missing runs
    python analyses/reproduce.py page                                                 # RESULTS.md from runs

Every run of the plan below is a `latentcode train` command (printed by `plan`), so each is reproducible
from its config; seeds are stated (`--seed s --set task_seed=s`: the training seed and the task's own seed,
which fixes which term combinations are held out, both vary across seeds). Runs train in `--runs`
(default analyses/output/runs, not committed); `train` copies each finished run's JSON files
(config.json, metrics.jsonl, summary.json) and final weights (float16, since issue 36) into
analyses/results/runs/NAME/, which is committed and is what `page` reads, so the page regenerates on
any machine without retraining.

    python analyses/reproduce.py record-sweep SWEEP_DIR ...   # record a sweep's finished runs, with weights
    python analyses/reproduce.py record-weights               # weights of the recorded runs models/ ships
    python analyses/reproduce.py interventions [--plan]       # the intervention pages, from the shipped models
    python analyses/reproduce.py code-figures [--plan]        # Fig. 3 and 4 on the shipped models
With `--jobs 2`, two runs train side by side with one thread each (the fastest use of 2 cores).
"""

# The plan, the page and the commands that record what the page reads live in analyses/reproduction/
# (its docstring maps them); this file is their command line.

from __future__ import annotations

import argparse

from reproduction import PAGE, ROOT
from reproduction.code_figures import add_arguments as add_code_figures_arguments
from reproduction.code_figures import code_figures
from reproduction.decoding import decoding
from reproduction.interventions import __doc__ as interventions_doc
from reproduction.interventions import add_arguments as add_interventions_arguments
from reproduction.interventions import interventions
from reproduction.language import language_codes
from reproduction.page import page
from reproduction.plan import RUNS, commands, park, train
from reproduction.recording import record_shipped_weights, record_sweep
from reproduction.sraven import per_rule
from reproduction.sraven_init import per_rule as sraven_init_per_rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subcommands = parser.add_subparsers(dest="command", required=True)
    train_parser = subcommands.add_parser("train", help="train the runs of the plan that are not recorded yet")
    train_parser.add_argument("--runs", default=str(RUNS), help="where runs train (not committed)")
    train_parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
    train_parser.add_argument("--only", nargs="+",
                              default=["table_a1", "fig2c", "ablations", "sraven", "fig5c", "language"],
                              help="groups of the plan to train (default all)")
    park_parser = subcommands.add_parser("park", help="keep the unfinished runs' latest checkpoints under "
                                         "analyses/results/unfinished/ (commit them), for `train` to resume")
    park_parser.add_argument("--runs", default=str(RUNS), help="where the runs train")
    park_parser.add_argument("--only", nargs="+", default=["sraven_init"], help="groups of the plan to park")
    page_parser = subcommands.add_parser("page", help="regenerate analyses/RESULTS.md from the recorded runs")
    page_parser.add_argument("--page", default=str(PAGE), help="where the page goes (its figures beside it)")
    decoding_parser = subcommands.add_parser("decoding", help="Fig. 2B/5F: decode the sub-task from the shipped "
                                          "models' OOD codes, per layer; record the tables and figures")
    decoding_parser.add_argument("--models", default=str(ROOT.parent / "models"), help="finished runs TASK-ATTENTION")
    decoding_parser.add_argument("--out", default="analyses/output", help="where codes are extracted (not committed)")
    decoding_parser.add_argument("--n-codes", type=int, default=2048, help="instances per split (train, ood)")
    codes_parser = subcommands.add_parser("language-codes", help="Fig. 6's models: their latent codes at T = 512 by "
                                       "token class (analyses/language_codes.py); record the tables and figures")
    codes_parser.add_argument("--models", default=str(ROOT.parent / "models"), help="finished runs language-ATTENTION")
    codes_parser.add_argument("--out", default="analyses/output", help="where codes are extracted (not committed)")
    codes_parser.add_argument("--n-codes", type=int, default=2048, help="windows per split (train, validation)")
    per_rule_parser = subcommands.add_parser("per-rule", help="issue 26: the shipped permuted SRAVEN models' accuracy "
                                          "per query rule and per rule multiset, test vs ood; record the tables")
    per_rule_parser.add_argument("--models", default=str(ROOT.parent / "models"),
                                 help="finished runs sraven-permuted-ATTENTION")
    subcommands.add_parser("sraven-init-per-rule", help="issue 50: the one-init permuted SRAVEN runs' accuracy per "
                           "query rule and per rule multiset, test vs ood; record the table")
    add_code_figures_arguments(subcommands.add_parser(
        "code-figures", help="Fig. 3 and 4: tSNE of the shipped models' OOD codes and the similarity of each SRAVEN "
        "rule's mean code (analyses/latent_tsne.py, sraven_rule_heatmap.py); record the figures"))
    add_interventions_arguments(subcommands.add_parser(
        "interventions", description=interventions_doc, formatter_class=argparse.RawDescriptionHelpFormatter,
        help="the intervention pages (rule swap, term swap, head ablation, topographic similarity, "
        "causal maps): run their scripts on the shipped models and record what results/interventions/ keeps"))
    sweep_parser = subcommands.add_parser("record-sweep", help="record the finished runs of sweep directories, "
                                          "with their weights, under analyses/results/runs/")
    sweep_parser.add_argument("sweeps", nargs="+", help="sweep directories (latentcode sweep --out)")
    subcommands.add_parser("record-weights", help="give the recorded runs that models/ ships their weights")
    subcommands.add_parser("plan", help="print the training command of every run")
    args = parser.parse_args()
    if args.command == "train":
        train(args)
    elif args.command == "park":
        park(args)
    elif args.command == "page":
        page(args)
    elif args.command == "decoding":
        decoding(args)
    elif args.command == "language-codes":
        language_codes(args)
    elif args.command == "per-rule":
        per_rule(args)
    elif args.command == "sraven-init-per-rule":
        sraven_init_per_rule(args)
    elif args.command == "code-figures":
        code_figures(args)
    elif args.command == "interventions":
        interventions(args)
    elif args.command == "record-sweep":
        record_sweep(args.sweeps)
    elif args.command == "record-weights":
        record_shipped_weights()
    else:
        print("\n".join(commands()))


if __name__ == "__main__":
    main()
