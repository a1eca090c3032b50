"""`plan_intervention`: what `intervention_effects` will run, resolved and checked before torch.

    plan = plan_intervention("runs/sraven-hyla", sites="sraven-rule", split="ood", n=1024)
    plan = plan_intervention("smollm2", sites="10:*:*", task={"seq_len": 64}, n=32)
    plan.subject, plan.task, plan.split, plan.variant, plan.layers    # what will be edited and measured
    plan.units(heads=[3])                  # [(10, 3)]: the (layer, head)s an edit of heads 3 writes

One plan for every model (`latentcode.subject`), built by `latentcode intervene`'s check and by
`intervention_effects` alike: one message for one mistake (`errors.about` names the argument). Checked
here: the model, the task (or window length), the split, the variant, the sites against the model's
layers and the sequence, what is measured alone, and memory. JSON and numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from latentcode.errors import UsageError, about
from latentcode.inputs import CorpusWindows, TaskInstances, inputs_of
from latentcode.sources.sites import (
    EVERY,
    Positions,
    Selector,
    layers_and_first_query,
)
from latentcode.store import Site
from latentcode.subject import Subject, subject_of
from latentcode.token_windows import TokenWindows
from latentcode.validation import (
    check_fits_in_memory,
    check_integer,
    check_placement,
    forward_pass_bytes,
)

MAX_PER_SITE_SCOPES = 64  # scopes measured each alone, one pass over the instances each
ALONE = ("sites", "heads")

Unit = tuple[int, int]  # (layer, head)


@dataclass(frozen=True)
class InterventionPlan:
    """`n` instances of `task`'s `split` (`variant`; a causal LM's windows: "T=seq_len") in passes of
    `batch_size`, edited at `selector`'s pairs in `layers`; the outputs read from position `first_query`
    on. `per_site`: each of the edit's units alone too, a unit being a site or, with `alone="heads"`,
    a (layer, head) at the plan's pairs of its layer. `control`: beside each scope, the same edit at as
    many heads of the same layers drawn at random (seed `seed`; none where a scope edits every head)."""

    subject: Subject
    inputs: TaskInstances | CorpusWindows  # how the task's inputs are drawn and scored
    split: str
    variant: str
    selector: Selector
    layers: tuple[int, ...]
    first_query: int
    n: int
    batch_size: int
    seed: int | None
    per_site: bool
    alone: str
    control: bool
    device: str | None = None  # None: the CPU for a model loaded here, where it is for a model object
    dtype: str | None = None  # None: float32 for a model loaded here, its own for a model object

    task = property(lambda self: self.inputs.task)  # a Task, or TokenWindows

    @property
    def seq_len(self) -> int:
        return int(self.task.seq_len)

    @property
    def sites(self) -> tuple[Site, ...]:
        """The plan's sites, listed (a selection of every pair of a long window is not: see `layers`)."""
        return tuple(self.selector.resolve(self.subject.n_layers, self.seq_len))

    def layer_sites(self, layer: int) -> Selector:
        """The plan's pairs in `layer` alone, as a selector (what a scope's edit of that layer applies at)."""
        if self.selector.all_pairs_layer is not None:
            return Selector("explicit", requests=((layer, EVERY, EVERY),))
        n_layers = self.subject.n_layers
        requests = tuple((layer, query, key) for requested, query, key in self.selector.requests
                         if requested is None or requested % n_layers == layer)
        return Selector("explicit", requests=requests)

    def units(self, heads: Sequence[int] | None) -> list[Unit]:
        """The (layer, head)s an edit of `heads` (None: every head) writes at the plan's sites, each head
        checked against the model's heads, and (with `alone="heads"`) their number against what is
        measured alone."""
        n_heads, name = self.subject.n_heads, self.subject.name
        heads = list(range(n_heads)) if heads is None else [int(head) for head in heads]
        bad = [head for head in heads if not 0 <= head < n_heads]
        if bad:
            raise UsageError(f"head {bad[0]} is outside the {n_heads} heads of {name} (valid: 0..{n_heads - 1})")
        units = [(layer, head) for layer in self.layers for head in sorted(set(heads))]
        if self.per_site and self.alone == "heads" and len(units) > MAX_PER_SITE_SCOPES:
            raise UsageError(f"the edit writes {len(units)} (layer, head)s of {name}, and each would be measured "
                             f"alone (more than {MAX_PER_SITE_SCOPES}); edit them together with per_site=False "
                             "(--no-per-site), or name fewer layers or heads")
        return units


def plan_intervention(
    run_or_model: Any,
    *,
    task: Any = None,
    sites: str | Sequence = "last-self",
    split: str | None = None,
    n: int = 1024,
    variant: str | None = None,
    batch_size: int = 256,
    seed: int | None = None,
    per_site: bool = True,
    alone: str | None = None,
    control: bool = True,
    device: str | None = None,
    dtype: str | None = None,
) -> InterventionPlan:
    """The plan of `intervention_effects` with these arguments (see there), or the first mistake.
    A causal LM's `task` may give only the window length (`{"seq_len": 64}`, `--task seq_len=64`);
    `alone` None: each site alone where the selection lists at most MAX_PER_SITE_SCOPES of them, else
    each (layer, head)."""
    subject = subject_of(run_or_model)
    device, dtype = check_placement(device, dtype)
    with about("n"):
        n = check_integer("n", n, minimum=1)
    with about("batch_size"):
        batch_size = check_integer("batch_size", batch_size, minimum=1)
    inputs = inputs_of(subject.task(task))
    split = inputs.check_split(split)
    selector, variant = inputs.selector(sites, variant)
    variant = inputs.task.variant if variant is None else variant  # a causal LM's windows: "T=seq_len"
    seq_len = int(inputs.seq_len)
    with about("sites"):
        layers, first_query = layers_and_first_query(selector, subject.n_layers, seq_len)
        count = _site_count(selector, subject.n_layers, seq_len)
    alone = _alone(alone, count)
    if per_site and alone == "sites" and count > MAX_PER_SITE_SCOPES:
        with about("sites"):
            raise UsageError(
                f"{selector.spec()!r} selects {count} sites, and each would be measured alone (more than "
                f"{MAX_PER_SITE_SCOPES}); edit them together with per_site=False (--no-per-site), measure each "
                "(layer, head) alone with alone='heads' (--alone heads), or sweep groups of them with latentcode patch")
    batch_size = inputs.pass_size(batch_size, n)
    if subject.model_config:  # a latentcode model: its instances are drawn before the first pass
        drawn = 4 * n * seq_len * int(subject.model_config.get("d_in") or 1)
        with about("n"):
            check_fits_in_memory(drawn + forward_pass_bytes(min(batch_size, n), seq_len, subject.model_config),
                                 f"{n} instances (sequences of {seq_len}) in passes of {min(batch_size, n)}")
    return InterventionPlan(subject, inputs, split, variant, selector, layers, first_query, n, batch_size, seed,
                            per_site, alone, control, device, dtype)


def _alone(alone: str | None, count: int) -> str:
    if alone is None:
        return "sites" if count <= MAX_PER_SITE_SCOPES else "heads"
    if alone not in ALONE:
        with about("alone"):
            raise UsageError(f"alone={alone!r}; expected one of {', '.join(ALONE)} (what per_site measures alone)")
    return alone


def _site_count(selector: Selector, n_layers: int, seq_len: int) -> int:
    """How many sites `selector` selects, counted without listing them (`*:*:*` at T = 8192 is 2e9)."""
    if selector.all_pairs_layer is not None:
        return seq_len * seq_len
    total = 0
    for layer, query, key in selector.requests:
        queries, keys = ((position if isinstance(position, Positions) else Positions(items=(position,)))
                         .resolve(seq_len) for position in (query, key))
        total += (n_layers if layer is None else 1) * len(queries) * len(keys)
    return total


def mean_ablation(plan: InterventionPlan, codes: Any, heads: Sequence[int] | None = None, *, by: str | None = None,
                  split: str | None = None) -> Any:
    """The `MeanAblate` of the plan's model from a codes file (or codes in memory) of it: a task's
    per-site means (`MeanAblate.from_codes`, per value of the label `by` if given), or a causal LM's
    means rebuilt from the file's compact store (`mean_ablate_from_compact`: windows carry no label)."""
    from latentcode.intervention.edits import MeanAblate

    if not isinstance(plan.task, TokenWindows):
        return MeanAblate.from_codes(codes, heads, by=by, split=split, model=plan.subject.model_object
                                     or plan.subject.source.path)
    if by is not None:
        with about("by"):
            raise UsageError(f"by={by!r}: a pretrained model's windows carry no label to take one mean per value of; "
                             "mean-ablate without it")
    return mean_ablate_from_compact(codes, plan, heads, split=split)


def mean_ablate_from_compact(path: Any, plan: InterventionPlan, heads: Sequence[int] | None = None,
                             split: str | None = None) -> Any:
    """A `MeanAblate` whose means are the codes of the plan's pairs averaged over the windows of a
    codes file of this model with a compact store of the same window length (`latentcode extract
    MODEL --task seq_len=T`; of `split`, all windows if None), rebuilt one window at a time."""
    import numpy as np

    from latentcode.intervention.edits import MeanAblate, check_codes_file_matches
    from latentcode.pretrained import checkpoint_sha256, resolve
    from latentcode.store import CodeFile

    codes_file = path if isinstance(path, CodeFile) else CodeFile(path)  # a file, or codes in memory
    check_codes_file_matches(codes_file, checkpoint_sha256=checkpoint_sha256(resolve(plan.subject.source.path)) or None)
    compact = codes_file.compact
    if compact is None or compact.seq_len != plan.seq_len or codes_file.attrs.get("score", "pattern") != "pattern":
        have = "no compact store" if compact is None else f"windows of {compact.seq_len} tokens"
        raise UsageError(f"{codes_file.path} has {have}; mean-ablating a pretrained model needs a codes file of it "
                         f"with a compact store of windows of {plan.seq_len} tokens (latentcode extract "
                         f"{plan.subject.name} --task seq_len={plan.seq_len} --split train ...)")
    examples = np.flatnonzero(codes_file.split_mask(split))
    if len(examples) == 0:
        raise UsageError(f"{codes_file.path} has no windows of split {split!r}; a mean code needs at least one")
    means: dict[Site, Any] = {}
    for layer in plan.layers:
        pairs = plan.layer_sites(layer).resolve(plan.subject.n_layers, plan.seq_len)
        queries = sorted({site.query for site in pairs})
        total = sum(compact.rows(layer, queries, np.asarray([example]))[0] for example in examples)  # [H, q, T]
        row_of = {query: row for row, query in enumerate(queries)}
        mean = total / len(examples)
        means.update({site: mean[:, row_of[site.query], site.key] for site in pairs})
    return MeanAblate(means, heads=heads)

