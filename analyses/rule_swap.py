"""SRAVEN rule swap: does the latent code of the query position carry the rule the model applies?

On fresh OOD instances (unpermuted, as the shipped models), the codes of the LAST query position
(feature M-1 of the 9th panel) are replaced by the mean code of another rule r' (mean over
training-split instances whose query rule is r'), at two site sets:

- `sraven-rule`: that query attending to the same feature of panels 7 and 8 (the paper's sites);
- `query-row`: that query's whole row of keys (every key position);

in one layer at a time and in all layers at once. Each instance gets one r' drawn uniformly among
the rules whose counterfactual answer (`SRaven.counterfactual_answer`, from the instance's grid) is
defined and differs from the true answer, so every counted instance distinguishes "follows r'"
from "keeps its answer". Reported, over those instances, at the last query position:

    follow  prediction == r''s counterfactual answer
    keep    prediction == the original (true) answer
    other   neither

for the swap and, on the same instances and the same r', for the controls and baseline:

    unpatched             the model as it is
    own-rule mean         the mean code of the instance's own rule (should keep)
    all-rules mean        the mean code over all training instances: the code with the rule averaged
                          out (the strongest trivial baseline for "follow": a broken code that lands
                          on r''s answer by itself)
    random instance       the codes of a random other OOD instance (any rule); also how often the
                          prediction follows that donor's rule

Standard errors are binomial over instances (one r' per instance). Each model's rows are kept in
`per_model/` and reused, so models can be measured one call at a time. Writes `rule_swap.csv/.json/.md`,
`rule_swap_matrix.csv`, `rule_swap_<site set>.png`, `rule_swap_matrix_<site set>.png` and
`rule_swap.html` under --out.

    python analyses/rule_swap.py --runs-from models                     # the shipped checkpoints
    python analyses/rule_swap.py --runs-from models --attention hyla --n 2048
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import common
import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import latentcode
from latentcode.store import Site

SITE_SETS = ("sraven-rule", "query-row")
SWAP = "swap: mean code of r'"
CONDITIONS = ("unpatched", SWAP, "control: own-rule mean", "baseline: all-rules mean", "control: random instance")
COLORS = dict(zip(CONDITIONS, ("tab:gray", "tab:red", "tab:blue", "tab:orange", "tab:green"), strict=True))


def scopes(task, n_layers: int) -> dict[str, dict[str, list[Site]]]:
    """`{site set: {scope: sites}}`, scopes `layer 0`.. and `all layers`."""
    (_, query, first_key), (_, _, second_key) = task.selectors()["sraven-rule"]
    keys = {"sraven-rule": (first_key, second_key), "query-row": tuple(range(task.seq_len))}
    result = {}
    for site_set, set_keys in keys.items():
        per_layer = {f"layer {layer}": [Site(layer, query, key) for key in set_keys] for layer in range(n_layers)}
        result[site_set] = {**per_layer, "all layers": [site for sites in per_layer.values() for site in sites]}
    return result


def counterfactuals(task, batch, feature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every rule's answer on each instance's queried feature: `(answers [n, R], defined [n, R])`."""
    from latentcode.tasks import RULES

    pairs = [task.counterfactual_answer(batch, feature, rule) for rule in range(len(RULES))]
    return np.stack([answers for answers, _ in pairs], 1), np.stack([defined for _, defined in pairs], 1)


def choose_other_rules(rule, truth, answers, defined, rng) -> tuple[np.ndarray, np.ndarray]:
    """One r' per instance, uniform among rules != own whose answer is defined and differs from the
    truth; `(r' [n], eligible [n])` (r' = own rule where no rule qualifies)."""
    valid = defined & (answers != truth[:, None])
    valid[np.arange(len(rule)), rule] = False
    eligible = valid.any(axis=1)
    scores = np.where(valid, rng.random(valid.shape), -1.0)
    return np.where(eligible, scores.argmax(axis=1), rule), eligible


def fractions(prediction, truth, target, counted) -> dict[str, float]:
    """follow / keep / other over the counted instances, with binomial standard errors."""
    n = int(counted.sum())
    follow = float((prediction == target)[counted].mean()) if n else float("nan")
    keep = float((prediction == truth)[counted].mean()) if n else float("nan")
    return {"n": n, "follow": follow, "follow_se": common.binomial_se(follow, n), "keep": keep,
            "keep_se": common.binomial_se(keep, n), "other": 1.0 - follow - keep}


def run_model(name: str, run: Path, args) -> tuple[list[dict], list[dict]]:
    from latentcode.intervention import (  # torch: only when measuring
        Interchange,
        MeanAblate,
    )

    model, task, _ = common.load_run(run)
    variant = args.variant
    all_scopes = scopes(task, model.config.n_layers)
    row_sites = all_scopes["query-row"]["all layers"]
    row_spec = ",".join(f"*:{site.query}:{site.key}" for site in all_scopes["query-row"]["layer 0"])
    codes = common.codes_of(run, row_spec, variant, args.n_codes, args.out, splits=("train",),
                            quiet=args.quiet, name="query-row")
    by_rule = MeanAblate.from_codes(codes, by="rule", split="train", model=run)
    overall = MeanAblate.from_codes(codes, split="train", model=run)

    batch = common.sample(task, args.n, "ood", variant)
    rng = np.random.default_rng([args.seed, 1])
    rule = batch.labels["query_rule"][:, -1]
    feature = batch.labels["column_permutations"][:, -1, -1]  # the feature at the last query position
    truth = batch.y[:, -1]
    answers, defined = counterfactuals(task, batch, feature)
    other_rule, eligible = choose_other_rules(rule, truth, answers, defined, rng)
    follow_target = answers[np.arange(args.n), other_rule]
    donor = (np.arange(args.n) + rng.integers(1, args.n, size=args.n)) % args.n  # never itself
    donor_rule = rule[donor]
    donor_target = answers[np.arange(args.n), donor_rule]
    donor_counted = (donor_rule != rule) & defined[np.arange(args.n), donor_rule] & (donor_target != truth)
    donor_codes = {site: codes[donor] for site, codes in
                   common.record_codes(model, batch.x, row_sites, batch_size=args.batch_size).items()}

    def last_position(edits_for=None, sites=None) -> np.ndarray:
        logits = common.predict(model, batch.x, task.n_predictions, edits_for, sites, task.config(), args.batch_size)
        return logits[:, -1].argmax(-1)

    edits = {
        SWAP: lambda start, stop: by_rule.with_labels(other_rule[start:stop]),
        "control: own-rule mean": lambda start, stop: by_rule.with_labels(rule[start:stop]),
        "baseline: all-rules mean": lambda start, stop: overall,
        "control: random instance": lambda start, stop: Interchange(
            {site: values[start:stop] for site, values in donor_codes.items()}),
    }
    unpatched = last_position()
    rows, matrix = [], []
    base = {"model": name, "split": "ood", "variant": variant, "accuracy_unpatched": float((unpatched == truth).mean())}
    for site_set, set_scopes in all_scopes.items():
        for scope, sites in set_scopes.items():
            for condition in CONDITIONS:
                if condition == "unpatched":
                    prediction = unpatched
                else:
                    prediction = last_position(lambda start, stop, c=condition: [
                        dataclasses.replace(edits[c](start, stop), sites=None)], sites)
                row = {**base, "site_set": site_set, "scope": scope, "n_sites": len(sites), "condition": condition,
                       **fractions(prediction, truth, follow_target, eligible),
                       "accuracy": float((prediction == truth).mean())}
                donor_fractions = fractions(prediction, truth, donor_target, donor_counted)
                row.update({"follow_donor_rule": donor_fractions["follow"], "n_donor": donor_fractions["n"]})
                rows.append(row)
                if scope == "all layers":
                    for own in range(answers.shape[1]):
                        for other in range(answers.shape[1]):
                            cell = eligible & (rule == own) & (other_rule == other)
                            if cell.any():
                                matrix.append({"model": name, "site_set": site_set, "condition": condition,
                                               "rule": own, "other_rule": other, "n": int(cell.sum()),
                                               "follow": float((prediction == follow_target)[cell].mean())})
            if not args.quiet:
                print(f"{name} {site_set} {scope}: done", flush=True)
    return rows, matrix


def plot_bars(table: pd.DataFrame, site_set: str, models: list[str], n: int) -> Figure:
    scopes_order = list(dict.fromkeys(table["scope"]))
    figure = Figure(figsize=(4.2 * len(models), 6.4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, len(models), squeeze=False, sharey=True)
    width = 0.8 / len(CONDITIONS)
    for column, model in enumerate(models):
        rows = table[(table["model"] == model) & (table["site_set"] == site_set)]
        for row_index, (metric, label) in enumerate((("follow", "= r''s answer"), ("keep", "= original answer"))):
            axis = axes[row_index, column]
            for index, condition in enumerate(CONDITIONS):
                values = rows[rows["condition"] == condition].set_index("scope").loc[scopes_order]
                axis.bar(np.arange(len(scopes_order)) + (index - 2) * width, values[metric], width,
                         yerr=values[f"{metric}_se"], color=COLORS[condition], label=condition)
            axis.set_xticks(range(len(scopes_order)), scopes_order, fontsize=8)
            axis.set_ylim(0, 1.02)
            axis.set_title(f"{model}: fraction {label}", fontsize=9)
            if column == 0:
                axis.set_ylabel(f"fraction {label}")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=len(CONDITIONS), fontsize=8)
    figure.suptitle(f"SRAVEN rule swap at the last query position: site set {site_set}, OOD split, "
                    f"{table['variant'].iloc[0]} variant\n(n={n} instances per model, one random r' each; ±1 s.e.)",
                    fontsize=10)
    return figure


def plot_matrix(matrix: pd.DataFrame, site_set: str, models: list[str], variant: str) -> Figure:
    """Per (own rule, r'): the fraction following r' under the swap, and under the all-rules mean
    (the baseline: how often a code without the rule lands on r''s answer anyway)."""
    from latentcode.tasks import RULES

    shown = (SWAP, "baseline: all-rules mean")
    figure = Figure(figsize=(4.0 * len(models) + 0.8, 8.4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(shown), len(models), squeeze=False)
    colormap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgray")
    image = None
    for row_index, condition in enumerate(shown):
        for axis, model in zip(axes[row_index], models, strict=True):
            grid = np.full((len(RULES), len(RULES)), np.nan)
            cells = matrix[(matrix["model"] == model) & (matrix["site_set"] == site_set)
                           & (matrix["condition"] == condition)]
            for row in cells.itertuples():
                grid[row.rule, row.other_rule] = row.follow
            image = axis.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=1, cmap=colormap)
            for own, other in zip(*np.nonzero(np.nan_to_num(grid) >= 0.1), strict=True):
                axis.text(other, own, f"{grid[own, other]:.2f}", ha="center", va="center", fontsize=6, color="white")
            axis.set_xticks(range(len(RULES)), RULES, rotation=60, ha="right", fontsize=7)
            axis.set_yticks(range(len(RULES)), RULES, fontsize=7)
            axis.set_xlabel("r' (whose answer is counted)", fontsize=8)
            axis.set_ylabel("own rule", fontsize=8)
            axis.set_title(f"{model}: {condition}", fontsize=8)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="fraction = r''s answer")
    figure.suptitle(f"SRAVEN rule swap in all layers at once: site set {site_set}, OOD split, {variant} variant\n"
                    "fraction of predictions = r''s answer per (own rule, r'), swap vs all-rules mean; grey: no "
                    "instance", fontsize=10)
    return figure


def main() -> None:
    from latentcode.intervention import checkpoint_sha256_of

    parser = common.add_intervention_arguments(common.parser(__doc__, "rule_swap"))
    parser.add_argument("--variant", default="unpermuted", help="SRAVEN variant of the instances (default unpermuted)")
    args = parser.parse_args()
    runs = common.model_runs(args, "sraven")
    rows, matrix = [], []
    for name, run in runs.items():
        key = f"v2-{name}-{checkpoint_sha256_of(run)[:12]}-n{args.n}-seed{args.seed}-{args.variant}-codes{args.n_codes}"
        model_rows, model_matrix = common.cached(Path(args.out) / "per_model" / f"{key}.json",
                                                 lambda name=name, run=run: run_model(name, run, args))
        task = latentcode.Run(run).task()
        site_scopes = scopes(task, latentcode.Run(run).config.model_config().n_layers)
        row_spec = ",".join(f"*:{site.query}:{site.key}" for site in site_scopes["query-row"]["layer 0"])
        codes = common.codes_of(run, row_spec, args.variant, args.n_codes, args.out, splits=("train",),
                                quiet=args.quiet, name="query-row")
        shares = common.share_of_code_variance(codes, site_scopes, "rule")
        for row in model_rows:
            row["rule_share_of_code_variance"] = shares[row["site_set"], row["scope"]]
            row["rule_share_of_code_variance_chance"] = shares["chance"]
        rows += model_rows
        matrix += model_matrix
    out = Path(args.out)
    table, matrix = pd.DataFrame(rows), pd.DataFrame(matrix)
    summary = table[["model", "site_set", "scope", "condition", "n", "follow", "follow_se", "keep", "keep_se",
                     "other", "follow_donor_rule", "rule_share_of_code_variance"]]
    models = list(runs)
    figures = []
    with common.output_set(out / "rule_swap") as outputs:
        common.write_tables(outputs, table, out / "rule_swap", summary)
        outputs.write_text(out / "rule_swap_matrix.csv", matrix.to_csv(index=False))  # a CSV only: not write_table
        for site_set in SITE_SETS:
            figures += [out / f"rule_swap_{site_set}.png", out / f"rule_swap_matrix_{site_set}.png"]
            outputs.write_figure(figures[-2].with_suffix(""), plot_bars(table, site_set, models, args.n))
            outputs.write_figure(figures[-1].with_suffix(""), plot_matrix(matrix, site_set, models, args.variant))
        common.write_html(outputs, out / "rule_swap.html", "SRAVEN rule swap", [
            __doc__.split("\n\n    python")[0], "## Table", summary, "## Figures", *figures])
    with pd.option_context("display.width", 200):
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {out / 'rule_swap.csv'}, {out / 'rule_swap.html'} and {len(figures)} figures")


if __name__ == "__main__":
    main()
