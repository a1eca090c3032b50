"""`plan_intervention`: what `intervention_effects` will run, resolved and checked before torch.

    plan = plan_intervention("runs/sraven-hyla", sites="sraven-rule", split="ood", n=1024)
    plan.task, plan.split, plan.variant, plan.sites      # what will be edited and measured

The command line's check (`latentcode intervene`) builds this plan and its run hands it to
`intervention_effects`, which builds the same plan when called from Python: one message for one
mistake (`errors.about` names the argument; the command line shows its flag). Checked here: the
model (`rundir.locate_model`), its config, the task, the split, the variant, the sites, how many
sites are measured alone, and memory. JSON and numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latentcode.errors import UsageError, about
from latentcode.intervention.language_plan import (
    LanguageInterventionPlan,
    plan_language_intervention,
)
from latentcode.rundir import ModelSource, locate_model
from latentcode.sources.sites import Selector, parse_selector
from latentcode.store import Site
from latentcode.subject import checked_model_config, task_of
from latentcode.tasks import Task
from latentcode.validation import (
    check_fits_in_memory,
    check_integer,
    check_placement,
    check_split,
    check_variant,
    forward_pass_bytes,
)

MAX_PER_SITE_SCOPES = 64  # sites measured each alone, one pass over the instances each


@dataclass(frozen=True)
class InterventionPlan:
    """`n` instances of `task`'s `split` (`variant`) in batches of `batch_size`, edited at `sites`
    (all together, and with `per_site` each alone)."""

    source: ModelSource
    task: Task
    split: str
    variant: str
    selector: Selector
    sites: tuple[Site, ...]
    n: int
    batch_size: int
    seed: int | None
    per_site: bool
    device: str | None = None  # None: the CPU for a model loaded here, where it is for a model object
    dtype: str | None = None  # None: float32 for a model loaded here, its own for a model object


def plan_intervention(
    run_or_model: str | Path | ModelSource,
    *,
    task: Task | Mapping[str, Any] | None = None,
    sites: str | Sequence = "last-self",
    split: str | None = None,
    n: int = 1024,
    variant: str | None = None,
    batch_size: int = 256,
    seed: int | None = None,
    per_site: bool = True,
    control: bool = True,
    device: str | None = None,
    dtype: str | None = None,
) -> InterventionPlan | LanguageInterventionPlan:
    """The plan of `intervention_effects` with these arguments (see there), or the first mistake; for a
    pretrained causal LM, `language_plan.plan_language_intervention`'s (`control` is its alone)."""
    with about("run_or_model"):
        source = run_or_model if isinstance(run_or_model, ModelSource) else locate_model(run_or_model)
    device, dtype = check_placement(device, dtype)
    if source.kind == "pretrained":
        return plan_language_intervention(source, task=task, sites=sites, split=split, n=n, variant=variant,
                                          batch_size=batch_size, seed=seed, per_site=per_site, control=control,
                                          device=device, dtype=dtype)
    with about("n"):
        n = check_integer("n", n, minimum=1)
    with about("batch_size"):
        batch_size = check_integer("batch_size", batch_size, minimum=1)
    model_config = checked_model_config(source)
    with about("task"):
        task = task_of(source, task)
    with about("split"):
        split = check_split(task.analysis.held_out_split if split is None else split, task)
    with about("sites"):
        selector = parse_selector(sites, task.config())
    with about("variant"):
        variant = check_variant(variant or selector.default_variant or task.variants[0], task)
    with about("sites"):
        resolved = selector.resolve(model_config["n_layers"], task.seq_len)
    # Every instance is sampled before the first pass ([n, sequence, d_in]), then passes of a batch each.
    inputs = 4 * n * task.seq_len * int(model_config.get("d_in") or 1)
    with about("n"):
        check_fits_in_memory(inputs + forward_pass_bytes(min(batch_size, n), task.seq_len, model_config),
                             f"{n} instances (sequences of {task.seq_len}) in passes of {min(batch_size, n)}")
    if per_site and len(resolved) > MAX_PER_SITE_SCOPES:
        with about("sites"):
            raise UsageError(
                f"{selector.spec()!r} selects {len(resolved)} sites, and each would be measured alone (more than "
                f"{MAX_PER_SITE_SCOPES}); edit them together with per_site=False (--no-per-site), or sweep groups of "
                "them with latentcode patch")
    return InterventionPlan(source, task, split, variant, selector, tuple(resolved), n, batch_size, seed, per_site,
                            device, dtype)
