"""The arithmetic of one intercepted attention call, from its bound arguments:
`F.scaled_dot_product_attention` ("sdpa"), `F.multi_head_attention_forward` ("mha", what
`nn.MultiheadAttention` calls) or a transformers model's eager attention ("eager": an SDPA call with
soft-capping and sinks, `latentcode.sources.eager_attention`). The raw scores and probabilities of
selected query rows, and the call's output with the rows an edit changed recomputed, in float32, for
the requested rows only (memory O(batch x heads x requested queries x keys)). `TorchAttentionSource`
intercepts the calls; docs/concepts/sources.md says what is recorded and edited.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from latentcode.sources.attention_rows import as_minus_infinity, changed, softmax_rows
from latentcode.sources.source import CannotIntervene


# -- the attention of selected query rows -------------------------------------------------------------
def additive_mask(mask: Tensor, true_means: str) -> Tensor:
    """A float32 mask to add to scores: 0 where attending, -inf where masked.

    A boolean mask marks what `true_means` ("attend": SDPA's convention; "masked": the convention
    of nn.MultiheadAttention); a float mask is additive already, and its entries at or below half
    its dtype's lowest value (the large negative numbers used as minus infinity) become -inf."""
    if mask.dtype == torch.bool:
        masked = ~mask if true_means == "attend" else mask
        return torch.zeros(masked.shape, device=mask.device).masked_fill(masked, float("-inf"))
    return as_minus_infinity(mask)


def rows_of(mask: Tensor, rows: Tensor) -> Tensor:
    """`mask[..., rows, :]` unless the mask broadcasts over queries."""
    if mask.dim() >= 2 and mask.shape[-2] != 1:
        return mask.index_select(-2, rows.to(mask.device))
    return mask


def as_batch_head(tensor: Tensor) -> Tensor:
    """`[..., query, key]` -> `[batch, head, query, key]`: 2-D one batch element and head, 3-D one head,
    more than 4-D leading dimensions flattened into the head axis."""
    if tensor.dim() == 2:
        return tensor[None, None]
    if tensor.dim() == 3:
        return tensor[:, None]
    if tensor.dim() > 4:
        return tensor.flatten(1, -3)
    return tensor


def sdpa_scores(call: dict[str, Any], rows: Tensor) -> Tensor:
    """The raw scores of an SDPA (or eager) call for the query positions `rows`: `[..., len(rows), key]`,
    float32, with -inf where masked (by `attn_mask` or `is_causal`); an eager call's `softcap`:
    `softcap * tanh(s / softcap)` of the scaled scores, before the mask, as Gemma 2 computes it."""
    query, key, softcap = call["query"], call["key"].float(), call.get("softcap")
    rows = rows.to(query.device)
    scale = 1.0 / math.sqrt(query.shape[-1]) if call.get("scale") is None else call["scale"]
    if call.get("enable_gqa") and key.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    scores = torch.matmul(query.index_select(-2, rows).float(), key.transpose(-2, -1)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if call.get("is_causal"):
        scores = scores.masked_fill(torch.arange(key.shape[-2], device=scores.device) > rows[:, None], float("-inf"))
    if call.get("attn_mask") is not None:
        scores = scores + additive_mask(rows_of(call["attn_mask"], rows), true_means="attend")
    return scores


def mha_scores(call: dict[str, Any], rows: Tensor) -> Tensor:
    """The raw scores of an `F.multi_head_attention_forward` call for the query positions `rows`:
    `[batch, head, len(rows), key]`, float32, -inf where masked. Follows PyTorch's implementation:
    in-projection, bias_k, static_k, add_zero_attn, attn_mask (2-D or 3-D) and key_padding_mask."""
    query, n_heads = call["query"], call["num_heads"]
    padding_mask = call.get("key_padding_mask")
    if query.dim() == 2:  # unbatched [sequence, embed]
        query = query.unsqueeze(1)
        padding_mask = None if padding_mask is None else padding_mask.unsqueeze(0)
    n_queries, batch, embed = query.shape
    head_dim = embed // n_heads
    rows = rows.to(query.device)
    w_q = call["q_proj_weight"] if call.get("use_separate_proj_weight") else call["in_proj_weight"].chunk(3)[0]
    b_q = None if call.get("in_proj_bias") is None else call["in_proj_bias"].chunk(3)[0]
    # [query, batch, embed] -> [batch, head, rows, head_dim]
    q = F.linear(query.index_select(0, rows), w_q, b_q).float()
    q = q.reshape(len(rows), batch, n_heads, head_dim).permute(1, 2, 0, 3)
    k = mha_projected(call, "k")
    # Keys past the call's own (bias_k, the zero key) are attended wherever the masks say nothing.
    extra_keys = (0, int(call.get("bias_k") is not None and call.get("static_k") is None)
                  + int(bool(call.get("add_zero_attn"))))
    attn_mask = call.get("attn_mask")
    scores = torch.matmul(q * math.sqrt(1.0 / head_dim), k.transpose(-2, -1))
    if attn_mask is not None:  # [query, key] or [batch * head, query, key]; only the requested rows
        if attn_mask.dim() == 3:
            attn_mask = attn_mask.reshape(-1, n_heads, n_queries, attn_mask.shape[-1])
        scores = scores + F.pad(additive_mask(rows_of(attn_mask, rows), true_means="masked"), extra_keys)
    if padding_mask is not None:
        scores = scores + F.pad(additive_mask(padding_mask, true_means="masked"), extra_keys)[:, None, None, :]
    return scores


def pattern_or_scores(scores: Tensor, score: str, sinks: Tensor | None = None) -> Tensor:
    """Probabilities (with an eager call's `sinks` in the denominator) or the scores themselves."""
    return softmax_rows(scores, sinks) if score == "pattern" else scores


def call_shape(kind: str, call: dict[str, Any]) -> tuple[int, int]:
    """(queries, keys) of an intercepted call; MultiheadAttention's keys include bias_k and the zero key."""
    if kind in ("sdpa", "eager"):
        return call["query"].shape[-2], call["key"].shape[-2]
    n_keys = call["static_k"].shape[1] if call.get("static_k") is not None else call["key"].shape[0]
    n_keys += int(call.get("bias_k") is not None) + int(bool(call.get("add_zero_attn")))
    return call["query"].shape[0], n_keys


def call_scores(kind: str, call: dict[str, Any], rows: Tensor) -> Tensor:
    """Raw scores `[batch, head, len(rows), key]` of an intercepted call, float32, -inf where masked."""
    return mha_scores(call, rows) if kind == "mha" else as_batch_head(sdpa_scores(call, rows))


# -- the arithmetic of an edit: outputs of the edited query rows ---------------------------------------
def mha_projected(call: dict[str, Any], which: str) -> Tensor:
    """The keys (`which="k"`) or values (`"v"`) of an `F.multi_head_attention_forward` call,
    `[batch, head, key, head_dim]` float32, following PyTorch: in-projection, bias_k / bias_v,
    static_k / static_v, add_zero_attn."""
    query, given = call["query"], call["key" if which == "k" else "value"]
    if query.dim() == 2:  # unbatched [sequence, embed]
        query, given = query.unsqueeze(1), given.unsqueeze(1)
    batch, n_heads = query.shape[1], call["num_heads"]
    head_dim = query.shape[2] // n_heads
    part = 1 if which == "k" else 2  # of the packed in-projection [q; k; v]
    if call.get(f"static_{which}") is not None:
        projected = call[f"static_{which}"].float().reshape(batch, n_heads, -1, head_dim)
    else:
        weight = call[f"{which}_proj_weight"] if call.get("use_separate_proj_weight") else \
            call["in_proj_weight"].chunk(3)[part]
        bias = None if call.get("in_proj_bias") is None else call["in_proj_bias"].chunk(3)[part]
        projected = F.linear(given, weight, bias).float()
        if call.get(f"bias_{which}") is not None:
            projected = torch.cat([projected, call[f"bias_{which}"].float().repeat(1, batch, 1)])
        projected = projected.reshape(projected.shape[0], batch, n_heads, head_dim).permute(1, 2, 0, 3)
    if call.get("add_zero_attn"):
        projected = torch.cat([projected, projected.new_zeros(batch, n_heads, 1, head_dim)], dim=2)
    return projected


def edit_rows(scores: Tensor, inverse: Tensor, keys: Tensor, edit: Callable[[Tensor], Tensor],
              sinks: Tensor | None = None):
    """Probabilities of the requested rows `[batch, head, rows, key]` (with `sinks`, an eager call's,
    in the denominator), edited at the pairs.

    Returns `(edited_probabilities, changed_rows)`, `changed_rows` `[batch, head, rows]` marking the
    rows where the edit changed some code; `(None, None)` when it changed nothing."""
    probabilities = softmax_rows(scores, sinks)
    inverse, keys = inverse.to(scores.device), keys.to(scores.device)
    codes = probabilities[:, :, inverse, keys]
    edited = edit(codes)
    if edited.shape != codes.shape:
        raise ValueError(f"the edit returned codes of shape {tuple(edited.shape)}; expected {tuple(codes.shape)}")
    changed_pairs = changed(edited, codes)
    if getattr(edit, "differentiable", False) and torch.is_grad_enabled():
        changed_pairs = torch.ones_like(changed_pairs)  # the output must come from the codes for their gradient
    if not bool(changed_pairs.any()):
        return None, None
    probabilities = probabilities.clone()
    probabilities[:, :, inverse, keys] = edited.float()
    changed_rows = torch.zeros(probabilities.shape[:3], device=scores.device)
    changed_rows = changed_rows.index_add(2, inverse, changed_pairs.float()) > 0
    return probabilities, changed_rows


def edited_sdpa_output(call: dict[str, Any], output: Tensor, rows: Tensor, inverse: Tensor, keys: Tensor,
                       edit: Callable[[Tensor], Tensor]) -> Tensor:
    """An SDPA call's output with `edited_probabilities @ value` in every (batch, head, query row)
    whose codes the edit changed, and the fused call's own output everywhere else."""
    return edited_rows_and_output("sdpa", call, output, rows, inverse, keys, edit)[0]


def edited_rows_and_output(kind: str, call: dict[str, Any], output: Tensor, rows: Tensor, inverse: Tensor,
                           keys: Tensor, edit: Callable[[Tensor], Tensor]):
    """`(output, edited_probabilities, changed_rows)` of an SDPA or eager call (`output` `[..., query, d]`),
    as `edited_sdpa_output`; `(output, None, None)` where the edit changed nothing."""
    rows = rows.to(output.device)
    probabilities, changed_rows = edit_rows(call_scores(kind, call, rows), inverse, keys, edit, call.get("sinks"))
    if probabilities is None:
        return output, None, None
    value = call["value"]
    if call.get("enable_gqa") and value.dim() >= 3 and value.shape[-3] != call["query"].shape[-3]:
        value = value.repeat_interleave(call["query"].shape[-3] // value.shape[-3], dim=-3)
    fused_rows = output.index_select(-2, rows)  # [..., rows, dim_v]
    leading = fused_rows.shape[:-2]
    edited_rows = torch.matmul(probabilities.reshape(*leading, *probabilities.shape[-2:]), value.float())
    new_rows = torch.where(
        changed_rows.reshape(*leading, len(rows), 1), edited_rows.to(output.dtype), fused_rows
    )
    return output.index_copy(output.dim() - 2, rows, new_rows), probabilities, changed_rows


def edited_mha_output(call: dict[str, Any], result: tuple, rows: Tensor, inverse: Tensor, keys: Tensor,
                      edit: Callable[[Tensor], Tensor]) -> tuple:
    """`(attn_output, attn_weights)` of an `F.multi_head_attention_forward` call with the output rows
    recomputed from the edited probabilities where the edit changed a code of some head (the heads
    mix in the out-projection), the fused output elsewhere; returned weights follow the edit."""
    rows = rows.to(result[0].device)
    probabilities, changed_rows = edit_rows(call_scores("mha", call, rows), inverse, keys, edit)
    if probabilities is None:
        return result
    output, weights = result
    unbatched = call["query"].dim() == 2
    if unbatched:
        output = output.unsqueeze(1)
        weights = None if weights is None else weights.unsqueeze(0)
    n_rows, (_, batch, embed) = len(rows), output.shape
    changed_query = changed_rows.any(dim=1)  # [batch, rows]
    heads = torch.matmul(probabilities, mha_projected(call, "v"))  # [batch, head, rows, head_dim]
    edited_rows = F.linear(heads.permute(2, 0, 1, 3).reshape(n_rows, batch, embed),
                           call["out_proj_weight"].float(), None if call.get("out_proj_bias") is None
                           else call["out_proj_bias"].float())  # fmt: skip
    new_rows = torch.where(changed_query.T[..., None], edited_rows.to(output.dtype), output.index_select(0, rows))
    output = output.index_copy(0, rows, new_rows)
    if weights is not None:
        per_head = weights.dim() == 4
        edited_weights = probabilities if per_head else probabilities.mean(dim=1)
        mask = changed_query[:, None, :, None] if per_head else changed_query[..., None]
        new_weights = torch.where(mask, edited_weights.to(weights.dtype), weights.index_select(-2, rows))
        weights = weights.index_copy(weights.dim() - 2, rows, new_weights)
    if unbatched:
        output = output.squeeze(1)
        weights = None if weights is None else weights.squeeze(0)
    return output, weights


def check_no_dropout(kind: str, call: dict[str, Any], where: str) -> None:
    """An edit replaces probabilities by values computed without dropout: refuse calls that drop out."""
    rate = float(call.get("dropout_p") or 0.0)
    active = rate > 0 and (kind == "sdpa" or bool(call.get("training", True)))
    if active:
        raise CannotIntervene(
            f"{where}: the attention call applies dropout (dropout_p={rate:g}); an intervention computes the "
            "edited rows without dropout, so it needs the model in eval mode (model.eval())"
        )
