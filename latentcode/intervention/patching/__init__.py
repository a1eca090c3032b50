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

The codes are edited where `Intervention` edits them (after σ, before the value network; for HYLA
after RMSHead), through the same sources, so every model the `Intervention` edits can be swept:
our models, TransformerLens models, SDPA / `nn.MultiheadAttention` models and hand-written softmaxes
(`SoftmaxSource`). Models must be in eval mode (dropout would make the comparison noisy).

Cost: a sweep runs `ceil(groups / groups_per_pass)` forward passes of `groups_per_pass x batch`
examples (the base batch repeated, each copy patched at one group), plus one pass each for the base
and the donor: about `groups x` a bare forward pass, with the Python overhead of one pass shared by
`groups_per_pass` groups. Attribution costs one forward pass of the donor, and one forward and one
backward pass of the base (`benchmarks/bench_patching.py` measures both).

Groups shaped by the task (`partitions`: a query part x a key part of the task's partitions of its
positions, e.g. the queried feature's cells) and a search over them that needs no answer
(`search`: whole layers, then blocks, then cuts of the best block, chosen on selection pairs and
confirmed on fresh ones):

    groups = partition_grid(task_partitions(task), "slot", "slot", layers=[2])
    result = site_search(model, task, selection_pairs, confirmation_pairs)    # -> SiteSearch

A sweep of a run directory, as `latentcode patch` runs it (the pairs drawn from the run's task, the
outputs checked first by the torch-free `plan_patch`, which the command line's check builds too):

    result = patch("models/sraven-hyla", grid="slot", layers=[2], n=64)     # -> PatchResult
    result.table, result.summary

A causal LM has no counterfactual pairs: `patch("smollm2", task={"seq_len": 128}, layers=[3])` runs
resample ablation instead (each window with another window's codes, read on the next-token loss), through
the same plan and loop: the heads grid with its random-head control, offset bands, --group, attribution
and search alike (`latentcode.inputs`: a task's pairs or a corpus's windows; `measures`: what is measured on each).

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
