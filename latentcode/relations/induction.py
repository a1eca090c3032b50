"""Does the model use its induction codes? The loss on the second copy of repeated random tokens,
attributed to every (layer, head)'s codes at the induction pairs, and the exact ablation of chosen
heads' codes there beside the same edit at as many random pairs.

Sequences are `repeated_random_tokens` ``[batch, 1 + 2 * half]``: ``bos``, ``half`` tokens, the
same ``half`` again. The *loss* is the mean next-token cross-entropy (nats) of the predictions
made at the queries ``q = half + 1 .. 2 * half - 1`` of the second copy (each predicts a token it
saw ``half`` positions earlier), per sequence. The *induction pairs* are those queries with their
induction key ``k = q - half + 1`` (the token after the earlier copy of ``tokens[q]``): ``half - 1``
pairs in every layer.

The edit is `ZeroAblate` of one head's code at a set of pairs (``a[h, q, k] = 0``, the row not
renormalised: the value that key contributed is removed). Its first-order estimate for every
(layer, head) at once is attribution patching with the donor codes all zero
(``-d loss / d a[h, q, k] * a[h, q, k]`` summed over the pairs), from one forward and one backward
pass (`latentcode.intervention.patching.attribution_patching`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.errors import UsageError
from latentcode.intervention import Intervention, ZeroAblate
from latentcode.intervention.patching import attribution_patching

__all__ = ["HeadEffects", "ablation_effect", "induction_attribution", "induction_pairs", "random_pairs",
           "second_copy_loss"]


def induction_pairs(half: int) -> list[tuple[int, int]]:
    """(query, induction key) of the second copy's queries whose prediction the loss counts."""
    return [(query, query - half + 1) for query in range(half + 1, 2 * half)]


def random_pairs(half: int, seed: int) -> list[tuple[int, int]]:
    """One pair per query of `induction_pairs`, its key drawn uniformly among the keys 0..q other
    than the induction key (``np.random.default_rng(seed)``): the control of the same size."""
    rng = np.random.default_rng(seed)
    pairs = []
    for query, induction_key in induction_pairs(half):
        keys = np.setdiff1d(np.arange(query + 1), [induction_key])
        pairs.append((query, int(rng.choice(keys))))
    return pairs


def _inputs(tokens: np.ndarray | Tensor, half: int) -> dict:
    # Logits of the last `half` positions only (half + 1 .. 2 * half): the loss needs no others.
    return {"input_ids": torch.as_tensor(tokens), "logits_to_keep": half}


def second_copy_loss(tokens: Tensor, half: int):
    """The metric: model output -> loss per sequence ``[batch]`` (see the module docstring), the
    output's logits being those of the last `half` positions."""
    targets = torch.as_tensor(tokens)[:, half + 2:]  # the tokens predicted at queries half+1 .. 2*half-1

    def metric(output) -> Tensor:
        logits = output.logits[:, -half:-1]
        return nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(dim=1)

    return metric


@torch.no_grad()
def _loss(model: nn.Module, tokens: np.ndarray, half: int) -> np.ndarray:
    return second_copy_loss(tokens, half)(model(**_inputs(tokens, half))).float().cpu().numpy()


def _sites(pairs: Sequence[tuple[int, int]], layer: int | None) -> list[tuple]:
    return [(layer, query, key) for query, key in pairs]


@dataclass
class HeadEffects:
    """Attribution: per sequence the estimated loss change of zeroing each head's codes at the
    induction pairs ``[batch, layer, head]``, and the unedited loss ``[batch]``."""

    effects: np.ndarray
    base_loss: np.ndarray

    def mean(self) -> np.ndarray:
        """``[layer, head]``: the mean over sequences."""
        return self.effects.mean(axis=0)

    def top(self, n: int) -> list[tuple[int, int]]:
        """The (layer, head) of the `n` largest mean estimated increases of the loss."""
        order = np.argsort(-self.mean(), axis=None, kind="stable")[:n]
        return [tuple(int(i) for i in np.unravel_index(index, self.mean().shape)) for index in order]


def induction_attribution(model: nn.Module, tokens: np.ndarray, half: int, n_layers: int, n_heads: int
                          ) -> HeadEffects:
    """Attribution patching of the second-copy loss to zeroing each (layer, head)'s codes at the
    induction pairs: ``[batch, layer, head]`` (one forward and one backward pass)."""
    pairs = induction_pairs(half)
    zeros = {layer: torch.zeros(len(tokens), n_heads, len(pairs)) for layer in range(n_layers)}
    attribution = attribution_patching(model, _inputs(tokens, half), None, second_copy_loss(tokens, half),
                                       sites=_sites(pairs, None), donor_codes=zeros)
    effects = np.stack([attribution.effects[layer].sum(dim=2).float().cpu().numpy()
                        for layer in range(n_layers)], axis=1)
    return HeadEffects(effects, _loss(model, tokens, half))


def ablation_effect(model: nn.Module, tokens: np.ndarray, half: int, heads: Sequence[tuple[int, int]],
                    pairs: Sequence[tuple[int, int]], base_loss: np.ndarray | None = None) -> dict[str, float]:
    """The exact loss change of zeroing the codes of `heads` (layer, head) at `pairs` (query, key):
    ``{"effect": mean over sequences, "effect_se", "n", "base_loss", "ablated_loss"}``."""
    if not heads or not pairs:
        raise UsageError(f"ablation_effect needs at least one head and one pair; got heads={list(heads)}, "
                         f"pairs={list(pairs)}")
    base = _loss(model, tokens, half) if base_loss is None else base_loss
    edits = [ZeroAblate(heads=[head], sites=_sites(pairs, layer)) for layer, head in heads]
    union = sorted({site for edit in edits for site in edit.sites})
    with Intervention(model, edits, sites=union), torch.no_grad():
        ablated = _loss(model, tokens, half)
    change = ablated - base
    n = len(change)
    return {"effect": float(change.mean()), "effect_se": float(change.std(ddof=1) / math.sqrt(n)) if n > 1 else np.nan,
            "n": n, "base_loss": float(base.mean()), "ablated_loss": float(ablated.mean())}
