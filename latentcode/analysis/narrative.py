"""The report's words: the findings in brief, what was analysed, and where every number comes from.

All of it is read from the run directories (`latentcode.rundir.RunRecord`), the codes files
(`latentcode.store.CodeFile`: selector, variant, split descriptions) and the probe table (its
selected layers, `latentcode.analysis.probes.headline_rows`), never from a task module, so a
report of any task explains itself.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd

from latentcode.analysis.captions import site_set, split_descriptions, variant_of
from latentcode.analysis.probes import headline_rows
from latentcode.analysis.similarity import mean_code_similarity
from latentcode.rundir import RunRecord
from latentcode.store import CodeFile

__all__ = ["about_html", "context_line", "findings_paragraph", "training_variants"]

CANONICAL_SPLITS = ("train", "test", "ood", "unseen_terms")


def _and(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def training_variants(runs: Sequence[RunRecord]) -> list[str]:
    """The input variant each run was trained and evaluated on (its config's ``train.variant``)."""
    return list(dict.fromkeys(str(run.config["train"].get("variant") or "default") for run in runs))


def _variant_words(variant: str) -> str:
    return "the task's default variant" if variant == "default" else f"the {variant} variant"


def _training_words(runs: Sequence[RunRecord]) -> str:
    """``"the unpermuted variant and the task's default variant"``: what the runs were trained on."""
    return _and([_variant_words(variant) for variant in training_variants(runs)])


def _codes_words(code_files: Sequence[CodeFile]) -> tuple[str, str]:
    """The codes files' sites (``" | "``-joined) and their recorded variants in words ("" where none is)."""
    sites = " | ".join(dict.fromkeys(site_set(code_file) for code_file in code_files))
    variants = list(dict.fromkeys(variant for code_file in code_files if (variant := variant_of(code_file))))
    return sites, _and([_variant_words(variant) for variant in variants]) if variants else ""


def context_line(runs: Sequence[RunRecord], code_files: Sequence[CodeFile]) -> str:
    """One line for a headline: the task, the variant the models were trained and evaluated on, and
    where the codes come from, e.g. ``"sraven: trained and evaluated on the unpermuted variant;
    latent codes at sraven-rule sites (...) on the unpermuted variant"``."""
    task = (runs[0].task if runs else code_files[0].task_config.get("name")) if runs or code_files else "?"
    parts = []
    if runs:
        parts.append("trained and evaluated on " + _training_words(runs))
    if code_files:
        sites, variants = _codes_words(code_files)
        parts.append("latent codes at " + sites + (f" on {variants}" if variants else ""))
    return f"{task}: " + "; ".join(parts)


# -- findings --------------------------------------------------------------------------------------
def _probe_sentence(table: pd.DataFrame, fit_split: str, test_split: str, descriptions: dict[str, str]) -> str:
    """The probes' headline in words: per model, the headline metric at the layer chosen on the fit
    split, beside its strongest baseline."""
    rows = headline_rows(table).dropna(subset=["value"]).sort_values("value", ascending=False)
    if rows.empty:
        return ""
    quoted, below = [], []
    for _, row in rows.iterrows():
        baseline = (f"; strongest baseline {row['strongest_baseline']} {row['strongest_baseline_value']:.2f}"
                    if row["strongest_baseline"] else "")
        quoted.append(f"{row['model']} {row['value']:.2f} (layer {int(row['layer'])}{baseline})")
        if row["strongest_baseline"] and not pd.isna(row["beats_baselines"]) and not row["beats_baselines"]:
            below.append(str(row["model"]))
    test_words = f"{test_split} ({descriptions[test_split]})" if test_split in descriptions else test_split
    sentence = (f"A linear probe decodes {rows['label'].iloc[0]} from the latent codes of each layer, fitted on "
                f"{fit_split} and scored on {test_words}; at the layer chosen on {fit_split} (never on the test "
                f"split), {rows['metric'].iloc[0]} is " + _and(quoted) + ".")
    if below:
        sentence += f" For {_and(below)} that is not above the strongest baseline."
    return sentence


def _task_sentence(runs: Sequence[RunRecord], descriptions: dict[str, str]) -> str:
    metric = runs[0].headline_metric
    finals = {run.name: run.final_metrics() for run in runs}
    splits = [split for split in CANONICAL_SPLITS if split != "train"
              and any(metric in final.get(split, {}) for final in finals.values())]
    splits += sorted({split for final in finals.values() for split in final} - set(CANONICAL_SPLITS))
    clauses = []
    for split in splits:
        values = [(final[split][metric], name) for name, final in finals.items() if metric in final.get(split, {})]
        if not values:
            continue
        words = f"{split} ({descriptions[split]})" if split in descriptions else split
        clauses.append(f"on {words}, " + _and([f"{name} {value:.2f}" for value, name in values]))
    if not clauses:
        return ""
    return f"Task {metric} at the end of training: " + "; ".join(clauses) + "."


def _similarity_panels(code_files: Sequence[CodeFile], label: str, split: str | None) -> dict[str, list]:
    """model -> its `Similarity` per layer, for labels with one value per example ({} otherwise)."""
    panels = {}
    for code_file in code_files:
        try:
            panels[code_file.model_name] = [mean_code_similarity(code_file, label, layer, split)
                                            for layer in code_file.layers]
        except ValueError:  # a continuous or multi-column label: nothing to say about it here
            return {}
    return panels


def findings_paragraph(
    runs: Sequence[RunRecord],
    code_files: Sequence[CodeFile],
    probe_table: pd.DataFrame | None,
    fit_split: str,
    test_split: str,
    picture_label: str | None = None,
    picture_split: str | None = None,
) -> str:
    """The report's plain-language summary: what was trained, how well it does per split, how well
    the sub-task can be read from the codes, how much of the codes' variance the picture label
    explains (on `picture_split`), and which layers carry nothing."""
    descriptions = split_descriptions(code_files)
    models = list(dict.fromkeys([run.name for run in runs] + [code_file.model_name for code_file in code_files]))
    task = runs[0].task if runs else code_files[0].task_config.get("name", "an unnamed task")
    sentences = [f"This report compares {_and(models)} attention on {task}"
                 + (f", trained and evaluated on {_training_words(runs)}." if runs else ".")]
    if runs:
        sentences.append(_task_sentence(runs, descriptions))
    if code_files:
        sites, variants = _codes_words(code_files)
        sentences.append("Their latent codes (the attention scores of all heads at one query-key pair) were recorded "
                         f"at {sites}" + (f", on {variants}" if variants else "") + ".")
    if probe_table is not None and len(probe_table):
        sentences.append(_probe_sentence(probe_table, fit_split, test_split, descriptions))
    similarity = _similarity_panels(code_files, picture_label, picture_split) if picture_label else {}
    if similarity:
        shares, constant = [], []
        label = next((panel.label for panels in similarity.values() for panel in panels), "")
        for model, panels in similarity.items():
            explained = [(panel.explained_variance, panel.layer) for panel in panels
                         if panel.explained_variance is not None]
            if explained:
                share, layer = max(explained)
                shares.append(f"{model} {share:.0%} (layer {layer})")
            constant += [f"{model} layer {panel.layer}" for panel in panels if panel.constant]
        if shares:
            sentences.append(f"The share of the codes' variance that lies between the values of {label} (rather than "
                             "within them) is at most " + _and(shares) + ".")
        if constant:
            sentences.append(f"The codes of {_and(constant)} are the same for every example: they carry nothing "
                             "about the task there.")
    return " ".join(sentence for sentence in sentences if sentence)


# -- what was analysed, and where the numbers come from -----------------------------------------
def _splits_table(
    runs: Sequence[RunRecord], code_files: Sequence[CodeFile], fit_split: str, test_split: str,
    picture_split: str | None,
) -> str:
    descriptions = split_descriptions(code_files)
    evaluated = {split for run in runs for split in run.final_metrics()}
    in_codes = {split: sum(int((code_file.split_of_examples() == split).sum()) for code_file in code_files)
                for split in dict.fromkeys(s for code_file in code_files for s in code_file.splits)}
    splits = [s for s in CANONICAL_SPLITS if s in evaluated or s in in_codes]
    splits += sorted((evaluated | set(in_codes)) - set(splits))
    rows = []
    for split in splits:
        uses = []
        if split in evaluated:
            uses.append("final task metrics")
        if split in in_codes:
            if split == fit_split:
                uses.append("probes fitted")
            if split == test_split:
                uses.append("probes scored")
            if picture_split in (None, split):
                uses.append("figures of codes")
        per_model = in_codes.get(split, 0) // max(1, len(code_files))
        rows.append(f"<tr><td>{html.escape(split)}</td><td>{html.escape(descriptions.get(split, '–'))}</td>"
                    f"<td>{per_model or '–'}</td><td>{html.escape(', '.join(uses) or '–')}</td></tr>")
    return ("<table><tr><th>split</th><th>what it holds</th><th>codes per model</th><th>used here for</th></tr>"
            + "".join(rows) + "</table>")


def about_html(
    runs: Sequence[RunRecord],
    code_files: Sequence[CodeFile],
    fit_split: str,
    test_split: str,
    picture_split: str | None,
    notes: Sequence[str] = (),
) -> str:
    """The 'What was analysed' section: task, variants, sites, splits, and the source of each number."""
    items = []
    task_config = (runs[0].task_config if runs else code_files[0].task_config) if runs or code_files else {}
    if task_config:
        settings = ", ".join(f"{key} {value}" for key, value in task_config.items() if key != "name")
        items.append(f"<b>Task</b>: {html.escape(str(task_config.get('name')))} ({html.escape(settings)}).")
    if runs:
        items.append("<b>Models</b>: " + html.escape(", ".join(run.name for run in runs))
                     + ", trained and evaluated on " + html.escape(_training_words(runs)) + ".")
    for code_file in code_files:
        variant = variant_of(code_file)
        counts = ", ".join(f"{split} {int((code_file.split_of_examples() == split).sum())}"
                           for split in code_file.splits)
        items.append(
            f"<b>Latent codes of {html.escape(code_file.model_name)}</b>: {html.escape(site_set(code_file))}"
            + (f", on the {html.escape(variant)} variant" if variant else "")
            + f"; {html.escape(code_file.attrs.get('score', 'pattern'))} scores of {code_file.n_heads or 'several'} "
            f"heads per site; examples {html.escape(counts)} ({html.escape(str(code_file.path))})."
        )
    sources = []
    if runs:
        sources.append(
            "<b>Training</b> (settings, curves, final metrics per split): read from each run directory's "
            "config.json, metrics.jsonl and summary.json. They describe the training that produced the models, "
            "evaluated on the variant it used, not anything this report ran."
        )
    if code_files:
        sources.append(
            f"<b>Decoding and figures of latent codes</b>: computed by this report from the codes files above "
            f"(probes fitted on {html.escape(fit_split)}, scored on {html.escape(test_split)}; figures on "
            f"{html.escape(picture_split or 'all splits')})."
        )
    sources += [html.escape(note) for note in notes]
    return (
        "<h2>What was analysed</h2><ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"
        + (_splits_table(runs, code_files, fit_split, test_split, picture_split) if code_files or runs else "")
        + "<h3>Where the numbers come from</h3><ul>" + "".join(f"<li>{source}</li>" for source in sources) + "</ul>"
    )
