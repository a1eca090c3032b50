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

_EDITS = ["AddVector", "Edit", "EditError", "Interchange", "MeanAblate", "ScaleHeads", "SetCode", "ZeroAblate"]
_WHERE = {
    **{name: "latentcode.intervention.edits" for name in _EDITS},
    "CannotIntervene": "latentcode.extraction.source",
    "CodesOfAnotherModel": "latentcode.intervention.checkpoints",
    "checkpoint_sha256_of": "latentcode.intervention.checkpoints",
    "intervention_effects": "latentcode.intervention.effects",
    "write_effects": "latentcode.intervention.effects",
    "Intervention": "latentcode.intervention.intervener",
    "InterventionPlan": "latentcode.intervention.plan",
    "plan_intervention": "latentcode.intervention.plan",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
__all__ = sorted(_WHERE)
