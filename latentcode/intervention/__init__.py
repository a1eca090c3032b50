"""Interventions on latent codes: the Recorder's twin. Edit the codes a[:, q, k] at selected sites
during forward passes and see what the model computes with them.

    from latentcode.intervention import Intervention, ZeroAblate
    with Intervention(model, ZeroAblate(heads=[0, 3]), sites="last-self"):
        edited_output = model(inputs)

`intervention_effects` measures a task metric with and without an edit (what `latentcode intervene`
prints and writes); `plan_intervention` checks its arguments first (no torch: names load their module
on first use, so the command line's check imports the plan without torch).
"""

from latentcode.lazy import lazy_exports

_WHERE = {
    "AddVector": "latentcode.intervention.edits",
    "Edit": "latentcode.intervention.edits",
    "EditError": "latentcode.intervention.edits",
    "Interchange": "latentcode.intervention.edits",
    "MeanAblate": "latentcode.intervention.edits",
    "ScaleHeads": "latentcode.intervention.edits",
    "SetCode": "latentcode.intervention.edits",
    "ZeroAblate": "latentcode.intervention.edits",
    "CannotIntervene": "latentcode.sources.source",
    "CodesOfAnotherModel": "latentcode.intervention.edits",
    "checkpoint_sha256_of": "latentcode.intervention.edits",
    "intervention_effects": "latentcode.intervention.effects",
    "write_effects": "latentcode.intervention.effects",
    "Intervention": "latentcode.intervention.intervener",
    "InterventionPlan": "latentcode.intervention.plan",
    "plan_intervention": "latentcode.intervention.plan",
    "learn_subspace": "latentcode.intervention.subspace",
    "patched_outputs": "latentcode.intervention.subspace",
    "random_basis": "latentcode.intervention.subspace",
    "METRICS": "latentcode.intervention.transfer",
    "counterfactual_metrics": "latentcode.intervention.transfer",
    "output_position": "latentcode.intervention.transfer",
    "per_example": "latentcode.intervention.transfer",
    "transfer_sweep": "latentcode.intervention.transfer",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
__all__ = sorted(_WHERE)
