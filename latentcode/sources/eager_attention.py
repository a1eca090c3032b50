"""Hugging Face `transformers` models that run only with eager attention (Gemma 2: soft-capped scores
and sliding-window layers; gpt-oss: attention sinks), read exactly at the call of their attention.

While `eager_calls` is active, transformers' attention registry answers "eager" with a wrapper that
calls the module's own `eager_attention_forward` unchanged and hands the call, read as an SDPA call
with a soft-cap and sinks, to a callback; every call is checked against the model's own function
(`EagerAttentionError` where it differs). The terms read and the checks: docs/concepts/sources.md
("Models transformers runs only eagerly").
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from latentcode.errors import LatentcodeError
from latentcode.sources.attention_calls import call_scores, edited_rows_and_output
from latentcode.sources.attention_rows import softmax_rows

# The most |rebuilt - the eager function's own probabilities| a call may show. Both are computed in float32
# from the call's own inputs (the eager function is run again on float32 copies of a few query rows),
# so only float32 rounding separates them (0 seen on tiny Gemma 2 and gpt-oss) whatever the model's dtype;
# a term the reading misses (a sink, the cap, a bias) moves codes by far more.
CHECK_TOLERANCE = 1e-4
#: query rows of each call compared with the eager function's own probabilities (evenly spread)
CHECKED_ROWS = 8

#: tensor arguments of an eager attention function that this reading uses, or that only say where the
#: tokens are (transformers passes the positions down to every attention function)
READ = frozenset({"module", "query", "key", "value", "attention_mask", "s_aux", "position_ids", "cache_position"})

# on_call(module, call, result, (its eager function, args, kwargs)) -> what the module gets
OnEagerCall = Callable[[nn.Module, dict[str, Any], Any, tuple], Any]


class EagerAttentionError(LatentcodeError, RuntimeError):
    """A model's eager attention computes something latentcode cannot read exactly; names the model
    type, the layer and the term."""


def model_type(module: nn.Module) -> str:
    config = getattr(module, "config", None)
    return str(getattr(config, "model_type", None) or type(module).__name__)


def own_eager_function(module: nn.Module) -> Callable[..., Any]:
    """The `eager_attention_forward` of the modeling file that defines `module`'s class."""
    function = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if not callable(function):
        raise EagerAttentionError(f"{model_type(module)}: {type(module).__name__} calls eager attention but its "
                                  f"module {type(module).__module__} has no eager_attention_forward to read")
    return function


def eager_call(module: nn.Module, function: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of one eager attention call as an SDPA-like call: query, key, value, attn_mask,
    scale, is_causal (False: the mask says), enable_gqa, dropout_p, and softcap and sinks (None: none)."""
    bound = inspect.signature(function).bind(module, *args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            named.update(named.pop(name, {}) or {})
    query, key = named["query"], named["key"]
    scale = named.get("scaling")
    if scale is None:  # the eager functions that default it (Gemma 2) use the module's head_dim
        scale = float(getattr(module, "head_dim", query.shape[-1])) ** -0.5
    sinks = named.get("s_aux")
    if sinks is None and isinstance(getattr(module, "sinks", None), Tensor):
        sinks = module.sinks  # gpt-oss's eager function reads the module's parameter
    softcap = named.get("softcap")
    mask = named.get("attention_mask")
    if mask is not None and mask.shape[-1] != key.shape[-2]:  # some eager functions cut it to the keys
        mask = mask[..., : key.shape[-2]]
    # Tensors the call passes that this reading does not use (e.g. a position bias): named if it is refused
    unread = sorted(name for name, value in named.items() if isinstance(value, Tensor) and name not in READ)
    return {"unread": unread, "query": query, "key": key, "value": named["value"], "attn_mask": mask,
            "is_causal": False,
            "scale": float(scale), "enable_gqa": True, "dropout_p": float(named.get("dropout") or 0.0),
            "softcap": None if softcap is None else float(softcap),
            "sinks": None if sinks is None else sinks.detach().float().reshape(-1)}


def check_eager_call(module: nn.Module, function: Callable[..., Any], args: tuple, kwargs: dict,
                     call: dict[str, Any], where: str) -> None:
    """Refuse (one line) a call whose eager function computes other probabilities than this reading: the
    function is run again on float32 copies of its inputs for CHECKED_ROWS query rows, its returned
    weights compared with softmax(softcap(scale q.k) + mask), the sinks in the denominator, of the same rows."""
    n_queries = call["query"].shape[-2]
    rows = torch.unique(torch.linspace(0, n_queries - 1, min(CHECKED_ROWS, n_queries)).round().long())
    rows = rows.to(call["query"].device)
    signature = inspect.signature(function)
    bound = signature.bind(module, *args, **kwargs)
    bound.arguments["query"] = call["query"].detach().float().index_select(-2, rows)
    bound.arguments["key"], bound.arguments["value"] = call["key"].detach().float(), call["value"].detach().float()
    mask = bound.arguments.get("attention_mask")
    if isinstance(mask, Tensor):  # [batch, 1 or head, query, key]: the same rows
        bound.arguments["attention_mask"] = mask.float().index_select(-2, rows.to(mask.device)) \
            if mask.dim() >= 2 and mask.shape[-2] == n_queries else mask.float()
    if "dropout" in bound.arguments:  # probabilities before dropout, as recorded (training: dropout_p > 0)
        bound.arguments["dropout"] = 0.0
    worst, shape, without_sinks = float("inf"), None, float("inf")
    with torch.no_grad():
        try:
            own = function(*bound.args, **bound.kwargs)
        except (RuntimeError, ValueError, IndexError, TypeError):  # e.g. a bias sized for every query row
            own = None
        weights = own[1] if isinstance(own, tuple) and len(own) > 1 else None
        if isinstance(weights, Tensor):
            scores = call_scores("eager", call, rows)
            rebuilt = softmax_rows(scores, call["sinks"])
            shape = list(weights.shape)
            if weights.shape == rebuilt.shape and rebuilt.numel():
                worst = float((rebuilt - weights.float()).abs().max())
                if call["sinks"] is not None:
                    unsunk = softmax_rows(scores)
                    without_sinks = float((unsunk - weights.float()).abs().max())
    if worst <= CHECK_TOLERANCE or shape is not None and 0 in shape:
        return
    if without_sinks <= CHECK_TOLERANCE:  # e.g. granite_swa: the sink scales the output, not the weights
        raise EagerAttentionError(
            f"{model_type(module)} {where}: its eager attention returns probabilities without its sinks and "
            "applies the sinks to its output instead, so the weights it reports (output_attentions) are not the "
            "codes its output uses; latentcode records codes only where the two agree, so none are recorded")
    terms = " and ".join(term for term, present in (("soft-capping", call["softcap"] is not None),
                                                     ("sinks", call["sinks"] is not None)) if present)
    unread = f"it passes {', '.join(call['unread'])}, which latentcode does not read" if call["unread"] else \
        "its attention has a term latentcode does not read"
    formula = f"softmax(scale q.k{' with ' + terms if terms else ''} + mask), which latentcode reads exactly"
    found = (f"returns no probabilities to compare with {formula}" if shape is None else
             f"returns weights of shape {shape}, not those of {formula}" if worst == float("inf") else
             f"gives probabilities that differ by {worst:.2g} from {formula} (tolerance {CHECK_TOLERANCE:g})")
    raise EagerAttentionError(f"{model_type(module)} {where}: its eager attention {found}: {unread}, so its codes "
                              "are not recorded")


@contextmanager
def eager_calls(on_call: OnEagerCall) -> Iterator[None]:
    """While active, every eager attention call through transformers' registry runs the module's own
    eager function and returns `on_call(module, call, result, (function, args, kwargs))` (see the module
    docstring)."""
    if "transformers" not in sys.modules:  # no transformers model can be running
        yield
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping  # this registry alone, not transformers' class-wide one
    previous = local.get("eager")

    def eager(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        function = own_eager_function(module)
        # An enclosing context's wrapper (a Recorder inside an Intervention) sees the call first, as nested
        # TorchFunctionModes see an SDPA call; this one gets what it returns.
        result = (previous or function)(module, *args, **kwargs)
        return on_call(module, eager_call(module, function, args, kwargs), result, (function, args, kwargs))

    local["eager"] = eager
    try:
        yield
    finally:
        if previous is None:
            local.pop("eager", None)
        else:
            local["eager"] = previous


def edited_eager_output(call: dict[str, Any], result: tuple, rows: Tensor, inverse: Tensor, keys: Tensor,
                        edit: Callable[[Tensor], Tensor]) -> tuple:
    """`(attn_output [B, T, H, d], attn_weights)` of an eager call with `edited_probabilities @ value` in
    every (batch, head, query row) whose codes the edit changed, the call's own output elsewhere;
    the returned weights (`output_attentions`) follow the edit."""
    output, weights = result[0], result[1]
    output, probabilities, changed_rows = edited_rows_and_output("eager", call, output.transpose(1, 2), rows,
                                                                 inverse, keys, edit)
    if probabilities is None:
        return result
    if isinstance(weights, Tensor):
        rows = rows.to(weights.device)
        new_weights = torch.where(changed_rows[..., None], probabilities.to(weights.dtype),
                                  weights.index_select(-2, rows))
        weights = weights.index_copy(weights.dim() - 2, rows, new_weights)
    return (output.transpose(1, 2), weights, *result[2:])
