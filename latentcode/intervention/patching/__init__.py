"""Where does a latent code matter? Activation patching of codes over a grid of site groups, and its
first-order estimate (attribution patching) for every (layer, head, query, key) at once.

Both compare a *base* input with a *donor* input (the same shape, e.g. an instance whose rule
differs) under a `metric` of the model's output, one number per example (e.g. the logit of the
donor's counterfactual answer minus that of the base answer):

    exact     effect(G)  = metric(model(base) with the codes of group G taken from model(donor))
                           - metric(model(base))
    estimate  effect(G) ~= sum over (layer, head, query, key) in G of
                           d metric / d a[h, q, k]  *  (a_donor[h, q, k] - a_base[h, q, k])

(the gradient taken at the base input, one backward pass for every site; Nanda's "attribution
patching"). The estimate is exact where the metric is linear in the codes (a test checks it on a
linear toy model); elsewhere compare it with the exact sweep (`compare_attribution`).

    groups = site_grid(n_layers=4, seq_len=36, queries=range(32, 36), key_blocks=9)
    sweep = patching_sweep(model, base_x, donor_x, groups, metric)         # -> PatchingSweep
    sweep.table                                   # one row per group: effect, its s.e., n, ...
    attribution = attribution_patching(model, base_x, donor_x, metric)     # -> Attribution
    attribution.for_groups(groups)                # the same table, estimated

The codes are edited where `Intervention` edits them, through the same sources, so every model the
`Intervention` edits can be swept; models must be in eval mode. A sweep costs about `groups x` a bare
forward pass (`groups_per_pass` groups share one), attribution one forward pass of the donor and one
forward and backward pass of the base (`benchmarks/bench_patching.py`).

Groups shaped by the task's partitions (`partition_grid`), a search over them (`site_search`), the
sweep of a run directory or a causal LM's windows as `latentcode patch` runs it (`patch`, checked
first by the torch-free `plan_patch`): docs/how-to/patch.md.

The modules: `plan` (plan_patch), `run` (patch, the controls), `measures` (what is
measured on each input), `site_groups` (with the task's partitions), `search`, `sweep` (the forward passes compared, and
the exact sweep), `attribution`.
"""

from latentcode.lazy import lazy_exports

# Names load their module on first use, so the command line's check imports `plan` without torch.
_WHERE = {
    "Attribution": "latentcode.intervention.patching.attribution",
    "attribution_patching": "latentcode.intervention.patching.attribution",
    "compare_attribution": "latentcode.intervention.patching.attribution",
    "record_codes": "latentcode.intervention.patching.sweep",
    "part_group": "latentcode.intervention.patching.site_groups",
    "partition_grid": "latentcode.intervention.patching.site_groups",
    "task_partitions": "latentcode.tasks.partitions",
    "PatchPlan": "latentcode.intervention.patching.plan",
    "plan_patch": "latentcode.intervention.patching.plan",
    "PatchResult": "latentcode.intervention.patching.run",
    "patch": "latentcode.intervention.patching.run",
    "SiteSearch": "latentcode.intervention.patching.search",
    "site_search": "latentcode.intervention.patching.search",
    "SiteGroup": "latentcode.intervention.patching.site_groups",
    "head_grid": "latentcode.intervention.patching.site_groups",
    "site_grid": "latentcode.intervention.patching.site_groups",
    "PatchingSweep": "latentcode.intervention.patching.sweep",
    "patching_sweep": "latentcode.intervention.patching.sweep",
    "Positions": "latentcode.sources.sites",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
__all__ = sorted(_WHERE)
