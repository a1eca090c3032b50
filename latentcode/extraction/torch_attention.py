"""`TorchAttentionSource`: latent codes from any PyTorch model whose attention goes through
`torch.nn.functional.scaled_dot_product_attention` (SDPA) or `torch.nn.MultiheadAttention`,
without editing the model's code.

    source = TorchAttentionSource(model)
    with Recorder(model, "last-self", source=source) as recorder:
        model(inputs)
    codes = recorder.pop()
    source.layer_names()      # e.g. ['encoder.layer.0.attention.self', 'encoder.layer.1.attention.self']

How: while `capture` is active, a `torch.overrides.TorchFunctionMode` sees every call to
`F.scaled_dot_product_attention` and to `F.multi_head_attention_forward` (which
`nn.MultiheadAttention` calls). The model always gets the result of the original function, called
with the original arguments; beside it the source recomputes the attention of that call from the
call's own inputs (q, k, mask, is_causal, scale, enable_gqa; for MultiheadAttention the in-projection
weights, bias_k, add_zero_attn, attn_mask and key_padding_mask), for the requested query rows only,
so memory stays O(batch x heads x requested queries x keys).

Layers: the intercepted calls made during one forward pass of the model, numbered from 0 in call
order (the count restarts whenever the outermost module of the model starts a forward pass). Calls
made while no module of the model is running are ignored. `layer_names()` names each layer by the
innermost module of the model whose forward made the call (`encoder.layer.0.attention.self`, or
the `nn.MultiheadAttention` module itself; `(root)` for the model's own forward); a module that
makes several calls in one pass gets `#1`, `#2`... on its later calls. The names are known after
the first forward pass under `capture`.

What is recorded:

- `score="pattern"`: the attention probabilities softmax(scores) `[batch, head, query, key]`; a query
  whose keys are all masked gets zeros (as PyTorch's SDPA returns there).
- `score="scores"`: the raw scores q·kᵀ·scale plus the call's additive (float) mask; masked entries
  are -inf: those excluded by a boolean mask, by `is_causal` (key > query) or by a
  `key_padding_mask`, and additive-mask entries at or below half the mask dtype's lowest value
  (the "minus infinity" that Hugging Face `transformers` uses).
- Computed in float32. Dropout is not applied: the codes are the probabilities before dropout
  (call `model.eval()` for the model's own output to match them).
- Heads: a 4-D call `[batch, head, query, dim]` gives its heads; a 3-D call `[batch, query, dim]`
  one head; more leading dimensions are flattened into the head axis. With `enable_gqa` the key
  heads are repeated as SDPA does.
- Query positions are indices into the call's query axis and key positions into its key axis;
  the selector's positions are resolved against the number of keys (self-attention: the sequence).

The MultiheadAttention fast path: in eval mode `nn.MultiheadAttention` and
`nn.TransformerEncoderLayer`/`nn.TransformerEncoder` may run a fused kernel
(`torch._transformer_encoder_layer_fwd`, `torch._native_multi_head_attention`, nested tensors)
that neither calls SDPA nor `F.multi_head_attention_forward`. While capturing, the fast path is
switched off (`torch.backends.mha.set_fastpath_enabled(False)`, restored afterwards) so that every
MultiheadAttention takes the standard path. Its outputs at real tokens are the same up to float
rounding; note that the nested-tensor path of `nn.TransformerEncoder` returns zeros at padded
positions, while the standard path returns ordinary values there.

Interventions (`edit`): the intercepted call recomputes the probabilities of the requested query
rows as above (float32, from the call's own inputs), hands the codes at the pairs to the editor,
and where the edit changed a code returns `edited_probabilities @ value` for that (batch, head,
query row); for MultiheadAttention the whole query row is recomputed through the out-projection
(heads mix there) and `need_weights` weights follow the edit. Every other entry is the fused
call's own result, so an edit that changes nothing changes no bit (with the fast path off, as
above). Edited rows are computed without dropout, so calls with dropout are refused: intervene in
eval mode.

Hugging Face `transformers` models are covered with their default `attn_implementation="sdpa"`;
with "eager" they compute the softmax themselves: `latentcode.extraction.SoftmaxSource` reads
those (and `detect_source` picks it). Cross-attention calls (queries of the decoder, keys of the
encoder, e.g. BART's `decoder.layers.0.encoder_attn`) are layers like any other; their query
positions are resolved against the call's queries and key positions against its keys.
Not covered (use `SoftmaxSource` or `latentcode.extraction.AdapterSource`): attention written with
explicit matmul/softmax, `flex_attention`, fused kernels called directly (e.g. flash-attn), and compiled
graphs (`torch.compile`) where the Python-level call never happens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from latentcode.extraction.attention_rows import (
    as_minus_infinity,
    changed,
    check_pairs,
    codes_of_rows,
    softmax_rows,
)
from latentcode.extraction.source import (
    AttentionSource,
    CannotIntervene,
    Editor,
    PairsFor,
    Sink,
    check_score,
    layer_kind,
)

_SDPA = F.scaled_dot_product_attention
_MHA = F.multi_head_attention_forward
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_MHA_ARGS = (
    "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias",
    "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias",
)  # fmt: skip
ROOT_NAME = "(root)"


# -- the arithmetic: attention of selected query rows ------------------------------------------------
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
    """`[..., query, key]` -> `[batch, head, query, key]` (see the module docstring)."""
    if tensor.dim() == 2:
        return tensor[None, None]
    if tensor.dim() == 3:
        return tensor[:, None]
    if tensor.dim() > 4:
        return tensor.flatten(1, -3)
    return tensor


def sdpa_scores(
    query: Tensor,
    key: Tensor,
    rows: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """The raw scores of an SDPA call for the query positions `rows`: `[..., len(rows), key]`,
    float32, with -inf where masked (see the module docstring)."""
    rows = rows.to(query.device)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    key = key.float()
    if enable_gqa and key.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    scores = torch.matmul(query.index_select(-2, rows).float(), key.transpose(-2, -1)) * scale
    if is_causal:
        n_keys = key.shape[-2]
        scores = scores.masked_fill(torch.arange(n_keys, device=scores.device) > rows[:, None], float("-inf"))
    if attn_mask is not None:
        scores = scores + additive_mask(rows_of(attn_mask, rows), true_means="attend")
    return scores


def mha_scores(call: dict[str, Any], rows: Tensor) -> Tensor:
    """The raw scores of an `F.multi_head_attention_forward` call for the query positions `rows`:
    `[batch, head, len(rows), key]`, float32, -inf where masked. Follows PyTorch's implementation:
    in-projection, bias_k, static_k, add_zero_attn, attn_mask (2-D or 3-D) and key_padding_mask."""
    query, key = call["query"], call["key"]
    n_heads = call["num_heads"]
    if query.dim() == 2:  # unbatched [sequence, embed]
        query, key = query.unsqueeze(1), key.unsqueeze(1)
        if call.get("key_padding_mask") is not None:
            call = {**call, "key_padding_mask": call["key_padding_mask"].unsqueeze(0)}
    n_queries, batch, embed = query.shape
    head_dim = embed // n_heads
    rows = rows.to(query.device)
    if call.get("use_separate_proj_weight"):
        w_q, w_k = call["q_proj_weight"], call["k_proj_weight"]
    else:
        w_q, w_k, _ = call["in_proj_weight"].chunk(3)
    b_q = b_k = None
    if call.get("in_proj_bias") is not None:
        b_q, b_k, _ = call["in_proj_bias"].chunk(3)
    # [query, batch, embed] -> [batch, head, rows, head_dim]
    q = F.linear(query.index_select(0, rows), w_q, b_q).float()
    q = q.reshape(len(rows), batch, n_heads, head_dim).permute(1, 2, 0, 3)
    attn_mask, padding_mask = call.get("attn_mask"), call.get("key_padding_mask")
    if attn_mask is not None:  # [query, key] or [batch * head, query, key]; only the requested rows
        if attn_mask.dim() == 3:
            attn_mask = attn_mask.reshape(-1, n_heads, n_queries, attn_mask.shape[-1])
        attn_mask = additive_mask(rows_of(attn_mask, rows), true_means="masked")
    padding_mask = None if padding_mask is None else additive_mask(padding_mask, true_means="masked")
    if call.get("static_k") is not None:
        k = call["static_k"].float().reshape(batch, n_heads, -1, head_dim)
    else:
        k = F.linear(key, w_k, b_k).float()
        if call.get("bias_k") is not None:
            k = torch.cat([k, call["bias_k"].float().repeat(1, batch, 1)])
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            padding_mask = None if padding_mask is None else F.pad(padding_mask, (0, 1))
        k = k.reshape(k.shape[0], batch, n_heads, head_dim).permute(1, 2, 0, 3)
    if call.get("add_zero_attn"):
        k = torch.cat([k, k.new_zeros(batch, n_heads, 1, head_dim)], dim=2)
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        padding_mask = None if padding_mask is None else F.pad(padding_mask, (0, 1))
    scores = torch.matmul(q * math.sqrt(1.0 / head_dim), k.transpose(-2, -1))
    if attn_mask is not None:
        scores = scores + attn_mask
    if padding_mask is not None:
        scores = scores + padding_mask[:, None, None, :]
    return scores


def pattern_or_scores(scores: Tensor, score: str) -> Tensor:
    return softmax_rows(scores) if score == "pattern" else scores


def call_shape(kind: str, call: dict[str, Any]) -> tuple[int, int]:
    """(queries, keys) of an intercepted call; MultiheadAttention's keys include bias_k and the zero key."""
    if kind == "sdpa":
        return call["query"].shape[-2], call["key"].shape[-2]
    n_keys = call["static_k"].shape[1] if call.get("static_k") is not None else call["key"].shape[0]
    n_keys += int(call.get("bias_k") is not None) + int(bool(call.get("add_zero_attn")))
    return call["query"].shape[0], n_keys


def call_scores(kind: str, call: dict[str, Any], rows: Tensor) -> Tensor:
    """Raw scores `[batch, head, len(rows), key]` of an intercepted call, float32, -inf where masked."""
    if kind == "mha":
        return mha_scores(call, rows)
    return as_batch_head(sdpa_scores(
        call["query"], call["key"], rows,
        attn_mask=call.get("attn_mask"), is_causal=bool(call.get("is_causal", False)),
        scale=call.get("scale"), enable_gqa=bool(call.get("enable_gqa", False)),
    ))  # fmt: skip


# -- the arithmetic of an edit: outputs of the edited query rows ---------------------------------------
def mha_values(call: dict[str, Any]) -> Tensor:
    """The values of an `F.multi_head_attention_forward` call, `[batch, head, key, head_dim]`
    float32, following PyTorch: in-projection, bias_v, static_v, add_zero_attn (as `mha_scores`)."""
    query, value = call["query"], call["value"]
    if query.dim() == 2:  # unbatched [sequence, embed]
        query, value = query.unsqueeze(1), value.unsqueeze(1)
    batch, n_heads = query.shape[1], call["num_heads"]
    head_dim = query.shape[2] // n_heads
    if call.get("static_v") is not None:
        v = call["static_v"].float().reshape(batch, n_heads, -1, head_dim)
    else:
        w_v = call["v_proj_weight"] if call.get("use_separate_proj_weight") else call["in_proj_weight"].chunk(3)[2]
        b_v = None if call.get("in_proj_bias") is None else call["in_proj_bias"].chunk(3)[2]
        v = F.linear(value, w_v, b_v).float()
        if call.get("bias_v") is not None:
            v = torch.cat([v, call["bias_v"].float().repeat(1, batch, 1)])
        v = v.reshape(v.shape[0], batch, n_heads, head_dim).permute(1, 2, 0, 3)
    if call.get("add_zero_attn"):
        v = torch.cat([v, v.new_zeros(batch, n_heads, 1, head_dim)], dim=2)
    return v


def edit_rows(scores: Tensor, inverse: Tensor, keys: Tensor, edit: Callable[[Tensor], Tensor]):
    """Probabilities of the requested rows `[batch, head, rows, key]`, edited at the pairs.

    Returns `(edited_probabilities, changed_rows)`, `changed_rows` `[batch, head, rows]` marking the
    rows where the edit changed some code; `(None, None)` when it changed nothing."""
    probabilities = softmax_rows(scores)
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
    rows = rows.to(output.device)
    probabilities, changed_rows = edit_rows(call_scores("sdpa", call, rows), inverse, keys, edit)
    if probabilities is None:
        return output
    value = call["value"]
    if call.get("enable_gqa") and value.dim() >= 3 and value.shape[-3] != call["query"].shape[-3]:
        value = value.repeat_interleave(call["query"].shape[-3] // value.shape[-3], dim=-3)
    fused_rows = output.index_select(-2, rows)  # [..., rows, dim_v]
    leading = fused_rows.shape[:-2]
    edited_rows = torch.matmul(probabilities.reshape(*leading, *probabilities.shape[-2:]), value.float())
    new_rows = torch.where(
        changed_rows.reshape(*leading, len(rows), 1), edited_rows.to(output.dtype), fused_rows
    )
    return output.index_copy(output.dim() - 2, rows, new_rows)


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
    heads = torch.matmul(probabilities, mha_values(call))  # [batch, head, rows, head_dim]
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


# -- the interception ---------------------------------------------------------------------------------
def bind(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


class _AttentionCalls(TorchFunctionMode):
    """After each SDPA / multi_head_attention_forward call, `on_call(kind, bound_arguments, result)`,
    whose return value the caller gets."""

    def __init__(self, on_call):
        super().__init__()
        self.on_call = on_call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)  # the model's own result, from the original call
        if func is _SDPA:
            return self.on_call("sdpa", bind(_SDPA_ARGS, args, kwargs), result)
        if func is _MHA:
            return self.on_call("mha", bind(_MHA_ARGS, args, kwargs), result)
        return result


@contextmanager
def mha_fastpath_disabled() -> Iterator[None]:
    """Switch off the fused MultiheadAttention / TransformerEncoder fast path; restore it after."""
    backends = getattr(torch.backends, "mha", None)
    if backends is None or not hasattr(backends, "set_fastpath_enabled"):
        yield  # older PyTorch: the TorchFunctionMode alone keeps it off (has_torch_function)
        return
    was_enabled = backends.get_fastpath_enabled()
    backends.set_fastpath_enabled(False)
    try:
        yield
    finally:
        backends.set_fastpath_enabled(was_enabled)


class TorchAttentionSource(AttentionSource):
    """Latent codes of any model whose attention goes through `F.scaled_dot_product_attention` or
    `nn.MultiheadAttention`; see the module docstring for what is recorded and how layers are
    numbered and named."""

    name = "torch"

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self._layer_names: list[str] | None = None
        self._layers: list[dict] | None = None

    def n_layers(self) -> int | None:
        """Attention calls per forward pass, once a pass has run under `capture` (else None)."""
        return None if self._layer_names is None else len(self._layer_names)

    def layer_names(self) -> list[str] | None:
        """The module that made each attention call of the last forward pass, by call order."""
        return None if self._layer_names is None else list(self._layer_names)

    def layers(self) -> list[dict] | None:
        """Name, kind ("self"/"cross": by module name, or a MultiheadAttention called with a key that
        is not its query) and query/key lengths of each attention call of the last forward pass."""
        return None if self._layers is None else [dict(layer) for layer in self._layers]

    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        check_score(score)

        def on_call(layer: int, where: str, kind: str, call: dict[str, Any], result: Any) -> Any:
            n_queries, n_keys = call_shape(kind, call)
            pairs = pairs_for(layer, n_keys, n_queries)
            if pairs is not None:
                check_pairs(pairs, n_queries, n_keys, where)
                rows, inverse = torch.unique(pairs[0], return_inverse=True)
                with torch.no_grad():
                    scores = call_scores(kind, call, rows)
                    sink(layer, *pairs, codes_of_rows(pattern_or_scores(scores, score), inverse, pairs[1]))
            return result

        with self._intercepted(on_call):
            yield

    @contextmanager
    def edit(self, pairs_for: PairsFor, editor: Editor) -> Iterator[None]:
        """Each intercepted call computes the probabilities of the requested query rows, edits them,
        and returns `edited_probabilities @ value` in the rows the edit changed (for
        MultiheadAttention, through the out-projection); every other entry is the fused call's own
        result, so an edit that changes nothing changes no bit. Calls with dropout are refused."""

        def on_call(layer: int, where: str, kind: str, call: dict[str, Any], result: Any) -> Any:
            n_queries, n_keys = call_shape(kind, call)
            pairs = pairs_for(layer, n_keys, n_queries)
            if pairs is None:
                return result
            check_pairs(pairs, n_queries, n_keys, where)
            check_no_dropout(kind, call, where)
            rows, inverse = torch.unique(pairs[0], return_inverse=True)
            edit = lambda codes: editor(layer, *pairs, codes)  # noqa: E731
            edit.differentiable = getattr(editor, "differentiable", False)
            if kind == "sdpa":
                return edited_sdpa_output(call, result, rows, inverse, pairs[1], edit)
            return edited_mha_output(call, result, rows, inverse, pairs[1], edit)

        with self._intercepted(on_call):
            yield

    @contextmanager
    def _intercepted(self, on_call: Callable[[int, str, str, dict[str, Any], Any], Any]) -> Iterator[None]:
        """While active, `on_call(layer, where, kind, call, result)` sees every attention call the model
        makes and returns what the model gets; layers are numbered and named as the module docstring says."""
        running: list[str] = []  # names of the model's modules whose forward is running, outermost first
        pass_names: list[str] = []  # the module name of each call in this pass
        pass_layers: list[dict] = []  # name, kind and lengths of each call in this pass
        calls_per_module: dict[str, int] = {}
        # The module whose forward just returned (its forward hooks are running). A pass that raised
        # reaches `leave` (always_call) without it: its layers, counted only up to the error, must not
        # become the source's layers, or a later Recorder would refuse valid sites of later layers.
        returned: list[str | None] = [None]

        def enter(module, args, name):
            if name == ROOT_NAME:
                running.clear()  # stale entries of a pass that raised
            if not running:  # the outermost module starts: a new forward pass
                pass_names.clear()
                pass_layers.clear()
                calls_per_module.clear()
            running.append(name)

        def mark_returned(module, args, output, name):
            returned[0] = name

        def leave(module, args, output, name):
            completed, returned[0] = returned[0] == name, None
            if name in running:
                del running[len(running) - 1 - running[::-1].index(name)]
            if not running and pass_names and completed:
                self._layer_names = list(pass_names)
                self._layers = list(pass_layers)

        def intercept(kind: str, call: dict[str, Any], result: Any) -> Any:
            if not running:
                return result  # not made by the model
            module_name = running[-1]
            count = calls_per_module.get(module_name, 0)
            calls_per_module[module_name] = count + 1
            layer = len(pass_names)
            pass_names.append(module_name if count == 0 else f"{module_name}#{count}")
            n_queries, n_keys = call_shape(kind, call)
            cross = kind == "mha" and call["query"] is not call["key"]
            pass_layers.append({"name": pass_names[-1], "kind": layer_kind(pass_names[-1], cross),
                                "queries": n_queries, "keys": n_keys})  # fmt: skip
            return on_call(layer, f"attention call {layer} ({pass_names[-1]})", kind, call, result)

        handles = []
        try:
            for module_name, module in self.model.named_modules():
                name = module_name or ROOT_NAME
                handles.append(module.register_forward_pre_hook(lambda m, a, name=name: enter(m, a, name)))
                # Hooks run in the order they were added: mark_returned (skipped when forward raises), then leave.
                handles.append(module.register_forward_hook(lambda m, a, o, name=name: mark_returned(m, a, o, name)))
                handles.append(
                    module.register_forward_hook(lambda m, a, o, name=name: leave(m, a, o, name), always_call=True)
                )
            with mha_fastpath_disabled(), _AttentionCalls(intercept):
                yield
        finally:
            for handle in handles:
                handle.remove()
