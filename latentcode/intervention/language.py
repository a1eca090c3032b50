"""What an edit of latent codes does to a pretrained causal LM's next-token predictions.

    table = intervention_effects("smollm2", ZeroAblate(heads=[3]), sites="10:*:*", task={"seq_len": 64}, n=32)

`intervention_effects` hands a pretrained model's plan (`language_plan.plan_language_intervention`)
to `language_model_effects`. The model reads `n` windows of `seq_len` tokens of the language corpus
(`pretrained.corpus_token_windows`, one token more for the last position's target) with and
without the edit, through the same `Intervention` as every other model (SDPA interception: the
edited rows are `edited_probabilities @ value`, every other entry the fused call's own). Read at
each position p from the first query an edit touches (earlier predictions cannot change: the model
is causal) to the last, per window, then averaged over windows:

    next-token loss          mean over p of -log P(token p+1 | tokens ..p)       (nats)
    next-token probability   mean over p of P(token p+1 | tokens ..p)
    next-token accuracy      mean over p of [argmax P(. | tokens ..p) = token p+1]

Scopes: the edit at every (layer, head) it writes together ("all sites"), and with `per_site` each
(layer, head) alone ("l10.h3"). Beside each scope, with `control`, a control edit of the same size:
the same edit at as many heads of the same layers, drawn at random among the heads the scope does
not edit (seeded; none where the scope edits every head of a layer). The table is
`intervention_effects`'s (before, after, change and their paired bootstrap s.e. over the windows),
with a column `role`: "edit" or "control". "before" is the unedited model on the same windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from latentcode.errors import UsageError
from latentcode.intervention.edits import Edit, MeanAblate
from latentcode.intervention.intervener import Intervention
from latentcode.intervention.language_plan import (
    LanguageInterventionPlan,
    head_units,
    layer_selector,
)
from latentcode.intervention.next_token import METRICS, window_metrics
from latentcode.intervention.patching.inputs import placement
from latentcode.progress import Progress
from latentcode.store import Site

ALL_SITES = "all sites"
BOOTSTRAP_RESAMPLES = 200

Unit = tuple[int, int]  # (layer, head)


def unit_name(units: Sequence[Unit]) -> str:
    return ",".join(f"l{layer}.h{head}" for layer, head in units)


def control_units(units: Sequence[Unit], n_heads: int, rng: np.random.Generator) -> list[tuple[Unit, Unit]] | None:
    """As many (layer, head)s as `units`, each in the layer of the unit it stands for, drawn at random
    among the heads `units` leave alone, as (control unit, the unit it stands for); None where a layer
    has too few of them."""
    edited = set(units)
    chosen: list[tuple[Unit, Unit]] = []
    for layer, head in units:
        taken = {control for control, _ in chosen}
        free = [other for other in range(n_heads) if (layer, other) not in edited and (layer, other) not in taken]
        if not free:
            return None
        chosen.append(((layer, int(rng.choice(free))), (layer, head)))
    return sorted(chosen)


def written_heads(edits: Sequence[Edit], units: Sequence[tuple[Unit, Unit]]) -> list[tuple[int, int, tuple[int, ...]]]:
    """(edit index, layer, heads) of each edit at `units`, given as (unit, the unit it stands for:
    itself, or the edited unit a control unit replaces): per layer, the heads of `units` there whose
    stand-in the edit writes."""
    result = []
    for index, edit in enumerate(edits):
        writes = None if edit.heads is None else {int(head) for head in edit.heads}
        for layer in sorted({layer for (layer, _), _ in units}):
            heads = sorted(head for (unit_layer, head), (_, original) in units
                           if unit_layer == layer and (writes is None or original in writes))
            if heads:
                result.append((index, layer, tuple(heads)))
    return result


def scoped(plan: LanguageInterventionPlan, edits: Sequence[Edit], units: Sequence[tuple[Unit, Unit]]) -> list[Edit]:
    """Each edit at `units` (see `written_heads`), at the plan's pairs of each layer."""
    return [dataclasses.replace(edits[index], heads=list(heads), sites=layer_selector(plan, layer))
            for index, layer, heads in written_heads(edits, units)]


def language_model_effects(plan: LanguageInterventionPlan, edits: Edit | Sequence[Edit], progress: bool = False):
    """The tidy table of the module docstring for `edits` on the plan's windows."""
    import pandas as pd


    edits = (edits,) if isinstance(edits, Edit) else tuple(edits)
    if not edits:
        raise UsageError("give at least one edit")
    units = sorted({unit for edit in edits for unit in head_units(plan, edit.heads)})
    pretrained, inputs, targets = model_and_windows(plan, progress)
    model = pretrained.model
    batches = [slice(start, start + plan.batch_size) for start in range(0, plan.n, plan.batch_size)]

    scopes = [(ALL_SITES, units)]
    if plan.per_site and len(units) > 1:
        scopes += [(unit_name([unit]), [unit]) for unit in units]
    rng = np.random.default_rng(plan.seed)
    measured = []  # (scope, role, [(unit, the unit it stands for)])
    for scope, scope_units in scopes:
        measured.append((scope, "edit", [(unit, unit) for unit in scope_units]))
        control = control_units(scope_units, plan.shape.n_heads, rng) if plan.control else None
        if control is not None:
            measured.append((f"control for {scope}: {unit_name([unit for unit, _ in control])}", "control", control))

    measured_before: dict[tuple, np.ndarray] = {}  # a control may be another scope's heads: one pass for both

    def per_window(scope_units: list[tuple[Unit, Unit]] | None, note: str) -> np.ndarray:
        """`[n, 3]`: METRICS of each window, with the edits at `scope_units` (None: unedited)."""
        key = None if scope_units is None else tuple(written_heads(edits, scope_units))
        if key is not None:
            if key in measured_before:
                tracker.advance(len(batches), note=note)
                return measured_before[key]
        values = []
        for batch in batches:
            with torch.no_grad():
                if scope_units is None:
                    logits = model(input_ids=inputs[batch], use_cache=False).logits
                else:
                    with Intervention(model, scoped(plan, edits, scope_units), sites=plan.selector):
                        logits = model(input_ids=inputs[batch], use_cache=False).logits
            values.append(window_metrics(logits[:, plan.first_query :], targets[batch]).cpu().numpy())
            tracker.advance(note=note)
        values = np.concatenate(values)
        if key is not None:
            measured_before[key] = values
        return values

    description = "; ".join(edit.describe() for edit in edits) + f" at {plan.selector.spec()}"
    tracker = Progress((1 + len(measured)) * len(batches), "intervene", unit="batch", enabled=progress)
    tracker.announce(f"{description} on {plan.n} windows of {plan.seq_len} tokens of the {plan.split} split in "
                     f"{len(batches)} passes of up to {plan.batch_size}: without the edit, then {len(measured)} "
                     f"scopes ({sum(role == 'control' for _, role, _ in measured)} controls)")
    tracker.start()
    try:
        before = per_window(None, "without the edit")
        afters = [(scope, role, per_window(scope_units, scope)) for scope, role, scope_units in measured]
    finally:
        tracker.close()
    resamples = np.random.default_rng(0).integers(0, plan.n, size=(BOOTSTRAP_RESAMPLES, plan.n))
    ran_on = placement(model)  # device and model_dtype: where and in what the model ran
    rows = []
    for scope, role, after in afters:
        for index, metric in enumerate(METRICS):
            was, now = before[:, index], after[:, index]
            rows.append({
                "model": pretrained.name, "task": "language", "split": plan.split, "variant": f"T={plan.seq_len}",
                "n": plan.n, "edit": description, "scope": scope, "role": role, "metric": metric,
                "before": was.mean(), "after": now.mean(), "change": (now - was).mean(),
                "before se": was[resamples].mean(1).std(ddof=1), "after se": now[resamples].mean(1).std(ddof=1),
                "change se": (now - was)[resamples].mean(1).std(ddof=1),
                "positions": f"{plan.first_query}..{plan.seq_len - 1}", **ran_on,
            })  # fmt: skip
    return pd.DataFrame(rows)


def mean_ablate_from_compact(path: str | Path, plan: LanguageInterventionPlan, heads: Sequence[int] | None = None,
                             split: str | None = None) -> MeanAblate:
    """A `MeanAblate` whose means are the codes of the plan's pairs averaged over the windows of a
    codes file of this model with a compact store of the same window length (`latentcode extract
    MODEL --task seq_len=T`; of `split`, all windows if None), rebuilt one window at a time."""
    from latentcode.intervention.checkpoints import check_codes_file_matches
    from latentcode.pretrained import checkpoint_sha256, resolve
    from latentcode.store import CodeFile

    codes_file = path if isinstance(path, CodeFile) else CodeFile(path)  # a file, or codes in memory
    check_codes_file_matches(codes_file, checkpoint_sha256=checkpoint_sha256(resolve(plan.source.path)) or None)
    compact = codes_file.compact
    if compact is None or compact.seq_len != plan.seq_len or codes_file.attrs.get("score", "pattern") != "pattern":
        have = "no compact store" if compact is None else f"windows of {compact.seq_len} tokens"
        raise UsageError(f"{codes_file.path} has {have}; mean-ablating a pretrained model needs a codes file of it "
                         f"with a compact store of windows of {plan.seq_len} tokens (latentcode extract {plan.name} "
                         f"--task seq_len={plan.seq_len} --split train ...)")
    examples = np.flatnonzero(codes_file.split_mask(split))
    if len(examples) == 0:
        raise UsageError(f"{codes_file.path} has no windows of split {split!r}; a mean code needs at least one")
    means: dict[Site, np.ndarray] = {}
    for layer in plan.layers:
        pairs = layer_selector(plan, layer).resolve(plan.shape.n_layers, plan.seq_len)
        queries = sorted({site.query for site in pairs})
        total = sum(compact.rows(layer, queries, np.asarray([example]))[0] for example in examples)  # [H, q, T]
        row_of = {query: row for row, query in enumerate(queries)}
        mean = total / len(examples)
        means.update({site: mean[:, row_of[site.query], site.key] for site in pairs})
    return MeanAblate(means, heads=heads)


def model_and_windows(plan, progress: bool = False):
    """The pretrained model of a language plan (`plan_language_intervention`'s or `plan_language_patch`'s),
    checked against the shape its metadata gave, in eval mode, on the plan's device in its dtype, and its
    `n` corpus windows there: inputs `[n, seq_len]` and the next tokens from the plan's first query on,
    `[n, seq_len - first_query]`."""
    from latentcode.pretrained import corpus_token_windows, load_pretrained

    pretrained = load_pretrained(plan.source.path, device=plan.device, dtype=plan.dtype, progress=progress)
    if (pretrained.n_layers, pretrained.n_heads) != (plan.shape.n_layers, plan.shape.n_heads):
        raise UsageError(f"{plan.name} loaded with {pretrained.n_layers} layers of {pretrained.n_heads} heads, but its "
                         f"metadata says {plan.shape.n_layers} of {plan.shape.n_heads}; the model files disagree")
    pretrained.model.eval()
    ids = torch.from_numpy(corpus_token_windows(pretrained, plan.split, plan.seq_len, plan.n, plan.seed, extra=1))
    ids = ids.to(pretrained.device)  # the windows follow the model (a few int64 per token)
    return pretrained, ids[:, :-1], ids[:, 1 + plan.first_query :]
