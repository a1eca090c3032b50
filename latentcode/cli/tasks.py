"""`latentcode tasks`: inspect the tasks (the registered tasks, SRAVEN ambiguity, counts)."""

from __future__ import annotations

import argparse
import math

from latentcode.cli.arguments import POSITIVE_INTEGER, SEED, integer
from latentcode.cli.command import Command, nothing_to_check

# `tasks count --features` at most: (M!)^3 has about 100,000 digits at M = 10,000 (a second to compute).
MAX_COUNTED_FEATURES = 10_000


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("tasks", help="inspect the tasks (the registered tasks, SRAVEN ambiguity, counts)")
    commands = parser.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")
    commands.add_parser("list", help="every registered task: splits, variants, objective, preset, capabilities",
                        description="One line per task the registry finds in latentcode/tasks/ (a task is one module "
                        "there): its splits, variants (the first is the default), objective, whether "
                        "`latentcode train --preset NAME` trains it, and the optional capabilities it provides "
                        "(Task.provides).")
    ambiguity = commands.add_parser(
        "ambiguity", help="Monte Carlo estimate of the fraction of ambiguous SRAVEN instances",
        description="Estimate the fraction of SRAVEN instances whose 8 context panels admit "
        "another rule assignment with a different answer (see latentcode.tasks.ambiguity).")
    ambiguity.add_argument("--features", type=integer(1), default=4, help="M, features per panel (default 4)")
    ambiguity.add_argument("--values", type=integer(3), default=8, help="K, values per feature (default 8)")
    ambiguity.add_argument("--n", type=POSITIVE_INTEGER, default=4096, help="instances to check (default 4096)")
    ambiguity.add_argument("--seed", type=SEED, default=0)
    ambiguity.add_argument("--criterion", choices=("all_features", "any_feature"), default="all_features",
                           help="all_features: the authors' criterion (default); any_feature: the paper's wording")
    ambiguity.add_argument("--rules", choices=("strict", "authors"), default="strict",
                           help="when distribute_three fits: strict, only as the generator makes it (default); "
                           "authors, the authors' looser checker (with all_features: the paper's Table A2)")
    counts = commands.add_parser("count", help="number of possible SRAVEN tasks and instances")
    counts.add_argument("--features", type=integer(2, MAX_COUNTED_FEATURES), default=4,
                        help=f"M, features per panel (default 4; at most {MAX_COUNTED_FEATURES:,}: the counts "
                             "then have tens of thousands of digits)")
    counts.add_argument("--values", type=integer(3), default=8)
    return parser


def run(args: argparse.Namespace) -> None:
    {"list": _run_list, "ambiguity": _run_ambiguity, "count": _run_counts}[args.tasks_command](args)


def _run_list(args: argparse.Namespace) -> None:
    from latentcode.tasks import CAPABILITIES, task_class, task_names

    for name in task_names():
        task = task_class(name)
        capabilities = [capability for capability in CAPABILITIES if task.provides(capability)]
        print(f"{name}: splits {', '.join(task.splits)}; variants {', '.join(task.variants)}; {task.objective}; "
              f"preset {'yes' if task.training_setup is not None else 'no'}; "
              f"capabilities {', '.join(capabilities) or 'none'}")


def _run_ambiguity(args: argparse.Namespace) -> None:
    import time

    from latentcode.tasks.sraven_counts import estimate_ambiguity

    start = time.perf_counter()
    fraction, standard_error = estimate_ambiguity(args.features, args.values, args.n, args.seed, args.criterion,
                                                  args.rules)
    seconds = time.perf_counter() - start
    print(f"M={args.features} K={args.values} n={args.n} criterion={args.criterion} rules={args.rules}: "
          f"ambiguous fraction {fraction:.4f} ± {standard_error:.4f} (standard error), {seconds:.2f} s")


def _run_counts(args: argparse.Namespace) -> None:
    from latentcode.tasks.sraven_counts import count_instances, count_tasks

    print(f"SRAVEN M={args.features} K={args.values}: {readable_count(count_tasks(args.features))} tasks, "
          f"{readable_count(count_instances(args.features, args.values), exact_below=0)} labelled instances")


def readable_count(count: int, exact_below: int = 10**15) -> str:
    """`count` with thousands separators below `exact_below`, else as 1.234e+N: rounded through a float
    below 1e300, its first four digits above (a float overflows above 1e308, and Python refuses to print
    an integer of more than 4,300 digits)."""
    if count < exact_below:
        return f"{count:,}"
    if count < 10**300:
        return f"{count:.3e}"
    digits = int(math.log10(count)) + 1 if count > 0 else 1  # log10 may be one off near a power of ten:
    while count >= 10**digits:
        digits += 1
    while digits > 1 and count < 10 ** (digits - 1):
        digits -= 1
    first_four = count // 10 ** max(digits - 4, 0)
    return f"{first_four / 10 ** (min(digits, 4) - 1):.3f}e+{digits - 1:02d}"


COMMAND = Command(register, nothing_to_check("every flag is an integer in its range or a choice, which "
                                             "argparse checks, and reads no file"), run, order=10)
