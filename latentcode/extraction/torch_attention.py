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

Hugging Face `transformers` models are covered with their default `attn_implementation="sdpa"`;
with "eager" they compute the softmax themselves (load them with "sdpa", or use the adapter).
Not covered (use `latentcode.extraction.AdapterSource`): attention written with explicit
matmul/softmax, `flex_attention`, fused kernels called directly (e.g. flash-attn), and compiled
graphs (`torch.compile`) where the Python-level call never happens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from latentcode.extraction.source import AttentionSource, PairsFor, Sink, check_score

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
    lowest = torch.finfo(mask.dtype).min if mask.dtype.is_floating_point else -math.inf
    return mask.float().masked_fill(mask <= lowest / 2, float("-inf"))


def rows_of(mask: Tensor, rows: Tensor) -> Tensor:
    """`mask[..., rows, :]` unless the mask broadcasts over queries."""
    if mask.dim() >= 2 and mask.shape[-2] != 1:
        return mask.index_select(-2, rows.to(mask.device))
    return mask


def softmax_rows(scores: Tensor) -> Tensor:
    """softmax over keys; rows whose keys are all masked (-inf) become zeros, not NaN."""
    probabilities = torch.softmax(scores, dim=-1)
    fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return probabilities.masked_fill(fully_masked, 0.0)


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


def codes_of_rows(rows_attention: Tensor, inverse: Tensor, keys: Tensor) -> Tensor:
    """`[batch, head, rows, key]` + pair indices -> `[batch, head, n_pairs]`, detached float32."""
    return rows_attention[:, :, inverse.to(rows_attention.device), keys.to(rows_attention.device)].detach().float()


def check_pairs(pairs: tuple[Tensor, Tensor], n_queries: int, n_keys: int, where: str) -> None:
    queries, keys = pairs
    if len(queries) and (int(queries.max()) >= n_queries or int(keys.max()) >= n_keys):
        raise IndexError(
            f"{where}: the call has {n_queries} queries and {n_keys} keys, but query position "
            f"{int(queries.max())} / key position {int(keys.max())} was requested; with a key/value "
            "cache or cross-attention the query axis is shorter than the key axis, so select positions "
            "explicitly"
        )


# -- the interception ---------------------------------------------------------------------------------
def bind(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


class _AttentionCalls(TorchFunctionMode):
    """Calls `on_call(kind, bound_arguments)` after each SDPA / multi_head_attention_forward call."""

    def __init__(self, on_call):
        super().__init__()
        self.on_call = on_call

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)  # the model's own result, from the original call
        if func is _SDPA:
            self.on_call("sdpa", bind(_SDPA_ARGS, args, kwargs))
        elif func is _MHA:
            self.on_call("mha", bind(_MHA_ARGS, args, kwargs))
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

    def n_layers(self) -> int | None:
        """Attention calls per forward pass, once a pass has run under `capture` (else None)."""
        return None if self._layer_names is None else len(self._layer_names)

    def layer_names(self) -> list[str] | None:
        """The module that made each attention call of the last forward pass, by call order."""
        return None if self._layer_names is None else list(self._layer_names)

    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        check_score(score)
        running: list[str] = []  # names of the model's modules whose forward is running, outermost first
        pass_names: list[str] = []  # the module name of each call in this pass
        calls_per_module: dict[str, int] = {}

        def enter(module, args, name):
            if name == ROOT_NAME:
                running.clear()  # stale entries of a pass that raised
            if not running:  # the outermost module starts: a new forward pass
                pass_names.clear()
                calls_per_module.clear()
            running.append(name)

        def leave(module, args, output, name):
            if name in running:
                del running[len(running) - 1 - running[::-1].index(name)]
            if not running and pass_names:
                self._layer_names = list(pass_names)

        def on_call(kind: str, call: dict[str, Any]) -> None:
            if not running:
                return  # not made by the model
            module_name = running[-1]
            count = calls_per_module.get(module_name, 0)
            calls_per_module[module_name] = count + 1
            layer = len(pass_names)
            pass_names.append(module_name if count == 0 else f"{module_name}#{count}")
            if kind == "sdpa":
                n_queries, n_keys = call["query"].shape[-2], call["key"].shape[-2]
            else:
                query, key = call["query"], call["key"]
                n_queries = query.shape[0]
                n_keys = (call["static_k"].shape[1] if call.get("static_k") is not None else key.shape[0])
                n_keys += int(call.get("bias_k") is not None) + int(bool(call.get("add_zero_attn")))
            pairs = pairs_for(layer, n_keys)
            if pairs is None:
                return
            check_pairs(pairs, n_queries, n_keys, f"attention call {layer} ({pass_names[-1]})")
            rows, inverse = torch.unique(pairs[0], return_inverse=True)
            with torch.no_grad():
                if kind == "sdpa":
                    scores = sdpa_scores(
                        call["query"], call["key"], rows,
                        attn_mask=call.get("attn_mask"), is_causal=bool(call.get("is_causal", False)),
                        scale=call.get("scale"), enable_gqa=bool(call.get("enable_gqa", False)),
                    )  # fmt: skip
                    scores = as_batch_head(scores)
                else:
                    scores = mha_scores(call, rows)
                sink(layer, *pairs, codes_of_rows(pattern_or_scores(scores, score), inverse, pairs[1]))

        handles = []
        try:
            for module_name, module in self.model.named_modules():
                name = module_name or ROOT_NAME
                handles.append(module.register_forward_pre_hook(lambda m, a, name=name: enter(m, a, name)))
                handles.append(
                    module.register_forward_hook(lambda m, a, o, name=name: leave(m, a, o, name), always_call=True)
                )
            with mha_fastpath_disabled(), _AttentionCalls(on_call):
                yield
        finally:
            for handle in handles:
                handle.remove()
