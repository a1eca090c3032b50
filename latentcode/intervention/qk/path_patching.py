"""The causal check of the decomposition: remove one component from the query side only (or the key
side only) of one head only, and see the score, the code and the loss change.

Path patching: the head's queries (or keys) are recomputed from the residual stream without the
component, every other head and the other side as they were, and the model runs on from there
(`read_ours.rerun`, `read_hf.rerun`, `read_bridge.rerun`). With the normalisation's scale frozen at
its value for each position the score changes by exactly the decomposition's prediction,

    query side:  delta s[q, k] = - sum_j T_cj        key side:  delta s[q, k] = - sum_i T_ic

(tests/intervention/test_qk_path_patching.py); the code after sigma and the loss change by what is
measured. With the scale recomputed from the stream without the component (what the model would do)
the score changes by more or less than the prediction: both are reported.

Removing `bias` removes every bias of that side (the normalisation's offset, b_Q or b_K, the summed b_O);
a relative position bias (`position` in our models) acts on the score, not the stream, and is refused.
A control removes a vector field `[pos, d_model]` instead of a named component (`path_patch(...,
removed=...)`, e.g. a random direction with the norm of a component at each position): its frozen-scale
prediction is -scale q . R_k(N(v[k]) W_K) (key side), from the head's maps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from latentcode.intervention.qk.components import CannotDecompose, HeadReading
from latentcode.intervention.qk.decomposition import QKTerms
from latentcode.intervention.qk.reading import rerun_head

SIDES = ("query", "key")


@dataclass
class PathPatch:
    """One removal at the pairs of `terms`: `predicted` `[pair]` (the decomposition's score change),
    then per way of taking the scale ("frozen", "recomputed") the measured score change `[pair]`, code
    change `[pair]` and loss change (a float; NaN without a loss)."""

    component: str
    side: str
    predicted: Tensor
    score_change: dict[str, Tensor]
    code_change: dict[str, Tensor]
    loss_change: dict[str, float]

    def mismatch(self) -> float:
        """max |measured - predicted| over the pairs, scale frozen."""
        return float((self.score_change["frozen"] - self.predicted).abs().max())


def side_without(reading: HeadReading, side: str, component: str | Tensor | None, scale: str) -> Tensor:
    """The head's unrotated queries (side "query") or keys ("key") `[pos, d_head]` computed from the
    residual stream without `component` (a name, a vector field `[pos, d_model]`, or None: nothing
    removed), the normalisation's scale "frozen" or "recomputed" from the stream without it."""
    maps = reading.maps
    norm = maps.norm
    weight, bias = (maps.W_Q, maps.b_Q) if side == "query" else (maps.W_K, maps.b_K)
    if component == "position" and reading.position is None:
        raise CannotDecompose("the relative position bias acts on the score, not the residual stream; it has no "
                              "query or key side to remove")
    if isinstance(component, Tensor):
        removed = component.to(reading.residual.dtype)
    else:
        removed = torch.zeros_like(reading.residual) if component is None else reading.component(component)
    stream = reading.residual - removed
    inverse_scale = norm.inverse_scale if scale == "frozen" else norm.recomputed_inverse_scale(stream)
    centred = stream - stream.mean(-1, keepdim=True) if norm.centred else stream
    normalized = centred * inverse_scale[:, None] * norm.gain
    keeps_biases = not (isinstance(component, str) and component == "bias")
    if norm.offset is not None and keeps_biases:
        normalized = normalized + norm.offset
    projected = normalized @ weight
    if bias is not None and keeps_biases:
        projected = projected + bias
    return projected


def predicted_change(terms: QKTerms, component: str, side: str) -> Tensor:
    """The decomposition's score change `[pair]` when `component` leaves `side`."""
    index = terms.names.index(component)
    return -(terms.terms[:, index, :].sum(1) if side == "query" else terms.terms[:, :, index].sum(1))


def predicted_vector_change(reading: HeadReading, terms: QKTerms, removed: Tensor, side: str) -> Tensor:
    """The frozen-scale score change `[pair]` when the vector field `removed` `[pos, d_model]` leaves `side`."""
    maps = reading.maps
    everywhere = torch.arange(reading.n_positions)
    weight = maps.W_Q if side == "query" else maps.W_K
    change = maps.rotate(maps.norm.linear(removed.to(reading.residual.dtype), everywhere) @ weight, everywhere)
    queries, keys = terms.pairs[:, 0], terms.pairs[:, 1]
    if side == "query":
        return -(change[queries] * reading.keys[keys]).sum(-1) * maps.score_scale
    return -(reading.queries[queries] * change[keys]).sum(-1) * maps.score_scale


def path_patch(model, tokens: Tensor, reading: HeadReading, terms: QKTerms, component: str, side: str,
               loss: Callable[[Tensor], Tensor] | None = None, removed: Tensor | None = None) -> PathPatch:
    """Remove `component` from `side` of the head `reading` describes and measure what changes at the
    pairs of `terms` (`loss`: output -> scalar, or None). With `removed` (`[pos, d_model]`), that vector
    field is removed instead and `component` only labels it (a control: a random direction, say)."""
    if side not in SIDES:
        raise CannotDecompose(f"side must be one of {', '.join(SIDES)}, got {side!r}")
    if removed is not None:
        removed = torch.as_tensor(removed)
        if removed.shape != reading.residual.shape:
            raise CannotDecompose(f"removed must have the residual stream's shape {list(reading.residual.shape)}, "
                                  f"got {list(removed.shape)}")
    elif component not in terms.names:
        raise CannotDecompose(f"no component {component!r} at layer {reading.layer}; expected one of "
                              f"{', '.join(terms.names)}")
    queries, keys = terms.pairs[:, 0], terms.pairs[:, 1]

    def measure(without: str | Tensor | None, scale: str):
        scores, codes, output = rerun_head(model, tokens, reading, side, side_without(reading, side, without, scale))
        value = float("nan") if loss is None else float(loss(output))
        return scores[queries, keys].float().cpu(), codes[queries, keys].float().cpu(), value

    base_scores, base_codes, base_loss = measure(None, "frozen")
    target = component if removed is None else removed
    changes = {scale: measure(target, scale) for scale in ("frozen", "recomputed")}
    predicted = (predicted_change(terms, component, side) if removed is None
                 else predicted_vector_change(reading, terms, removed, side))
    return PathPatch(component, side, predicted,
                     {scale: change[0] - base_scores for scale, change in changes.items()},
                     {scale: change[1] - base_codes for scale, change in changes.items()},
                     {scale: change[2] - base_loss for scale, change in changes.items()})
