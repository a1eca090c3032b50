"""Interventions on latent codes: the Recorder's twin. Edit the codes a[:, q, k] at selected sites
during forward passes and see what the model computes with them.

    from latentcode.intervention import Intervention, ZeroAblate
    with Intervention(model, ZeroAblate(heads=[0, 3]), sites="last-self"):
        edited_output = model(inputs)

`intervention_effects` measures a task metric with and without an edit (what `latentcode intervene`
prints and writes).
"""

from latentcode.intervention import edits
from latentcode.intervention.checkpoints import CodesOfAnotherModel, checkpoint_sha256_of
from latentcode.intervention.edits import *  # noqa: F403 (every edit kind, as edits.__all__ lists them)
from latentcode.intervention.effects import intervention_effects, write_effects
from latentcode.intervention.intervener import Intervention
from latentcode.intervention.subspace import learn_subspace, patched_outputs, random_basis
from latentcode.intervention.transfer import (
    METRICS,
    counterfactual_metrics,
    output_position,
    per_example,
    transfer_sweep,
)
from latentcode.sources.source import CannotIntervene

__all__ = [
    *edits.__all__,
    "CannotIntervene",
    "CodesOfAnotherModel",
    "Intervention",
    "METRICS",
    "checkpoint_sha256_of",
    "counterfactual_metrics",
    "intervention_effects",
    "learn_subspace",
    "output_position",
    "patched_outputs",
    "per_example",
    "random_basis",
    "transfer_sweep",
    "write_effects",
]
