"""`plan_language_intervention`: what `intervention_effects` runs on a pretrained causal LM, checked
before torch (and before the weights are read).

    plan = plan_intervention("smollm2", sites="10:*:*", task={"seq_len": 64}, n=32)   # this plan
    units = head_units(plan, heads=[3])          # [(10, 3)]: the (layer, head)s an edit writes

A pretrained model (`latentcode.pretrained`: a Hugging Face directory, a .gguf file, "smollm2") is
edited on windows of `seq_len` tokens of the language corpus's `split` (train or validation), and
the effect is read on its next-token predictions (`latentcode.intervention.language`). Checked here,
with the same one-line message from Python and the command line: the model (its metadata only:
`pretrained.attention_shape`), the split, the window length against the model's context, the sites
against its layers and the window, and (`head_units`) the edit's heads against its heads and how
many (layer, head)s would each be measured alone. JSON and numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from latentcode.errors import UsageError, about
from latentcode.pretrained import AttentionShape, attention_shape, check_seq_len
from latentcode.rundir import ModelSource
from latentcode.sources.sites import EVERY, Selector, layers_and_first_query, parse_selector
from latentcode.tasks.corpus import SPLITS
from latentcode.validation import check_integer, check_placement

DEFAULT_SEQ_LEN = 512  # as `latentcode extract` reads a pretrained model
MAX_TOKENS_PER_PASS = 2048  # windows x tokens of one forward pass: its logits stay under 2048 x vocabulary floats


@dataclass(frozen=True)
class LanguageInterventionPlan:
    """`n` windows of `seq_len` tokens of the corpus's `split`, in passes of `batch_size`, edited at
    `selector`'s pairs in `layers`; predictions measured from position `first_query` (the first query
    an edit can change) on. `per_site`: each (layer, head) alone too; `control`: beside each scope, the
    same edit at as many heads of the same layers drawn at random (seed `seed`)."""

    source: ModelSource
    name: str
    shape: AttentionShape
    split: str
    seq_len: int
    selector: Selector
    layers: tuple[int, ...]
    first_query: int
    n: int
    batch_size: int
    seed: int
    per_site: bool
    control: bool
    device: str | None = None  # where and in what the model runs (None: the CPU, float32)
    dtype: str | None = None


def plan_language_intervention(
    source: ModelSource,
    *,
    task: Mapping[str, Any] | None = None,
    sites: str | Sequence = "*:*:*",
    split: str | None = None,
    n: int = 1024,
    variant: str | None = None,
    batch_size: int = 256,
    seed: int | None = None,
    per_site: bool = True,
    control: bool = True,
    device: str | None = None,
    dtype: str | None = None,
) -> LanguageInterventionPlan:
    """The plan of editing the pretrained model at `source` (see the module docstring), or the first
    mistake. `task` may give only the window length (`{"seq_len": 64}`, `--task seq_len=64`)."""

    name = str(source.path)
    with about("run_or_model"):
        shape = attention_shape(source.path)
    with about("n"):
        n = check_integer("n", n, minimum=1)
    with about("batch_size"):
        batch_size = check_integer("batch_size", batch_size, minimum=1)
    with about("variant"):
        if variant is not None:
            raise UsageError(f"a pretrained model reads windows of the language corpus, which have no variant; got "
                             f"variant {variant!r}")
    split, seq_len = corpus_windows(split, task, DEFAULT_SEQ_LEN, shape.n_ctx, name)
    with about("sites"):
        selector = parse_selector(sites)
        layers, first_query = layers_and_first_query(selector, shape.n_layers, seq_len)
    return LanguageInterventionPlan(source, name, shape, split, seq_len, selector, layers, first_query, n,
                                    min(batch_size, max(1, MAX_TOKENS_PER_PASS // seq_len)),
                                    0 if seed is None else seed, per_site, control, *check_placement(device, dtype))




def layer_selector(plan: LanguageInterventionPlan, layer: int) -> Selector:
    """The plan's pairs in `layer` alone, as a selector (what a scope's edit of that layer applies at)."""
    selector = plan.selector
    if selector.all_pairs_layer is not None:
        return Selector("explicit", requests=((layer, EVERY, EVERY),))
    requests = tuple((layer, query, key) for requested, query, key in selector.requests
                     if requested is None or requested % plan.shape.n_layers == layer)
    return Selector("explicit", requests=requests)


def head_units(plan: LanguageInterventionPlan, heads: Sequence[int] | None) -> list[tuple[int, int]]:
    """The (layer, head)s an edit of `heads` (None: every head) writes at the plan's sites, each head
    checked against the model's heads, and their number against what is measured alone."""
    from latentcode.intervention.plan import MAX_PER_SITE_SCOPES

    n_heads = plan.shape.n_heads
    heads = list(range(n_heads)) if heads is None else [int(head) for head in heads]
    bad = [head for head in heads if not 0 <= head < n_heads]
    if bad:
        raise UsageError(f"head {bad[0]} is outside the {n_heads} heads of {plan.name} (valid: 0..{n_heads - 1})")
    units = [(layer, head) for layer in plan.layers for head in sorted(set(heads))]
    if plan.per_site and len(units) > MAX_PER_SITE_SCOPES:
        raise UsageError(f"the edit writes {len(units)} (layer, head)s of {plan.name}, and each would be measured alone "
                         f"(more than {MAX_PER_SITE_SCOPES}); edit them together with per_site=False (--no-per-site), "
                         "or name fewer layers or heads")
    return units


def corpus_windows(split: str | None, task, default_seq_len: int, n_ctx: int, name: str) -> tuple[str, int]:
    """The split (default validation) and window length (`task`'s seq_len, else `default_seq_len`) of a
    pretrained model's corpus windows, or the one-line error naming what was wrong."""
    from latentcode.extraction.plan import pretrained_seq_len

    split = "validation" if split is None else split
    if split not in SPLITS:
        with about("split"):
            raise UsageError(f"unknown split {split!r} for a pretrained model: it reads the language corpus's "
                             f"{' or '.join(SPLITS)} split")
    with about("task"):
        seq_len = pretrained_seq_len(task, default_seq_len)
        check_seq_len(seq_len, n_ctx, name)
    return split, seq_len
