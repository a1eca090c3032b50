"""`TorchAttentionSource`: latent codes from any PyTorch model whose attention goes through
`torch.nn.functional.scaled_dot_product_attention` (SDPA) or `torch.nn.MultiheadAttention`,
without editing the model's code.

    source = TorchAttentionSource(model)
    with Recorder(model, "last-self", source=source) as recorder:
        model(inputs)
    source.layer_names()      # e.g. ['encoder.layer.0.attention.self', 'encoder.layer.1.attention.self']

A `TorchFunctionMode` sees each call; the model gets the original result, and the source recomputes
the call's attention from its inputs for the requested query rows only (memory O(batch x heads x
requested queries x keys)). What is recorded, how layers are numbered and named, the MultiheadAttention
fast path and how edits reach the output: docs/concepts/sources.md ("How each source reads and edits").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from latentcode.sources.attention_calls import (
    call_scores,
    call_shape,
    check_no_dropout,
    edited_mha_output,
    edited_sdpa_output,
    pattern_or_scores,
)
from latentcode.sources.attention_rows import check_pairs, codes_of_rows
from latentcode.sources.eager_attention import check_eager_call, eager_calls, edited_eager_output
from latentcode.sources.source import (
    CallOrderSource,
    Editor,
    FunctionCalls,
    PairsFor,
    PassLayers,
    Sink,
    check_score,
    removed_on_exit,
)

_SDPA = F.scaled_dot_product_attention
_MHA = F.multi_head_attention_forward
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_MHA_ARGS = (
    "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias",
    "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias",
)  # fmt: skip
ROOT_NAME = "(root)"


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


class TorchAttentionSource(CallOrderSource):
    """Latent codes of any model whose attention goes through `F.scaled_dot_product_attention` or
    `nn.MultiheadAttention`; see docs/concepts/sources.md for what is recorded and how layers are
    numbered and named (`layers()`: a MultiheadAttention called with a key that is not its query is
    cross-attention)."""

    name = "torch"

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
        self.model = model

    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        check_score(score)
        with self._intercepted(partial(self._on_call, pairs_for, score, sink)):
            yield

    def _on_call(self, pairs_for: PairsFor, score: str, sink: Sink, layer: int, where: str, kind: str,
                 call: dict[str, Any], result: Any) -> Any:
        """Hand `sink` the codes of one intercepted call at the pairs `pairs_for` asks; the model gets `result`."""
        n_queries, n_keys = call_shape(kind, call)
        pairs = pairs_for(layer, n_keys, n_queries)
        if pairs is not None:
            check_pairs(pairs, n_queries, n_keys, where)
            rows, inverse = torch.unique(pairs[0], return_inverse=True)
            with torch.no_grad():
                attention = pattern_or_scores(call_scores(kind, call, rows), score, call.get("sinks"))
                sink(layer, *pairs, codes_of_rows(attention, inverse, pairs[1]))
        return result

    @contextmanager
    def edit(self, pairs_for: PairsFor, editor: Editor) -> Iterator[None]:
        """`edited_probabilities @ value` in the rows the edit changed, the fused call's own result elsewhere
        (docs/concepts/sources.md); calls with dropout are refused (`CannotIntervene`)."""

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
            if kind == "eager":
                return edited_eager_output(call, result, rows, inverse, pairs[1], edit)
            return edited_mha_output(call, result, rows, inverse, pairs[1], edit)

        with self._intercepted(on_call):
            yield

    @contextmanager
    def _intercepted(self, on_call: Callable[[int, str, str, dict[str, Any], Any], Any]) -> Iterator[None]:
        """While active, `on_call(layer, where, kind, call, result)` sees every attention call the model
        makes and returns what the model gets; layers are numbered and named as docs/concepts/sources.md says."""
        running: list[str] = []  # names of the model's modules whose forward is running, outermost first
        this_pass = PassLayers()
        # The module whose forward just returned (its forward hooks are running). A pass that raised
        # reaches `leave` (always_call) without it: its layers, counted only up to the error, must not
        # become the source's layers, or a later Recorder would refuse valid sites of later layers.
        returned: list[str | None] = [None]

        def enter(module, args, name):
            if name == ROOT_NAME:
                running.clear()  # stale entries of a pass that raised
            if not running:  # the outermost module starts: a new forward pass
                this_pass.clear()
            running.append(name)

        def mark_returned(module, args, output, name):
            returned[0] = name

        def leave(module, args, output, name):
            completed, returned[0] = returned[0] == name, None
            if name in running:
                del running[len(running) - 1 - running[::-1].index(name)]
            if not running and this_pass.layers and completed:
                self._layers = list(this_pass.layers)

        def intercept(kind: str, call: dict[str, Any], result: Any) -> Any:
            if not running:
                return result  # not made by the model
            cross = kind == "mha" and call["query"] is not call["key"]
            layer = this_pass.add(running[-1], *call_shape(kind, call), cross)
            return on_call(layer, f"attention call {layer} ({this_pass.layers[-1]['name']})", kind, call, result)

        def intercept_bound(kind: str, names: tuple[str, ...], args: tuple, kwargs: dict, result: Any) -> Any:
            return intercept(kind, {**dict(zip(names, args, strict=False)), **kwargs}, result)  # arguments by name

        def intercept_eager(module: nn.Module, call: dict[str, Any], result: Any, made: tuple) -> Any:
            if running:  # made by the model: exact, or one line saying why not
                check_eager_call(module, *made, call, f"attention call {len(this_pass.layers)} ({running[-1]})")
            return intercept("eager", call, result)

        with removed_on_exit() as handles:
            for module_name, module in self.model.named_modules():
                name = module_name or ROOT_NAME
                handles.append(module.register_forward_pre_hook(lambda m, a, name=name: enter(m, a, name)))
                # Hooks run in the order they were added: mark_returned (skipped when forward raises), then leave.
                handles.append(module.register_forward_hook(lambda m, a, o, name=name: mark_returned(m, a, o, name)))
                handles.append(
                    module.register_forward_hook(lambda m, a, o, name=name: leave(m, a, o, name), always_call=True)
                )
            calls = FunctionCalls({_SDPA: partial(intercept_bound, "sdpa", _SDPA_ARGS),
                                   _MHA: partial(intercept_bound, "mha", _MHA_ARGS)})
            with mha_fastpath_disabled(), calls, eager_calls(intercept_eager):
                yield
