"""`AdapterSource`: latent codes of attention that no other source can see (explicit matmul/softmax,
fused kernels, ...), through modules the user names and a function from a module's inputs/outputs to
its attention. For modules that return `(output, weights)`, `weights` `[batch, head, query, key]`::

    source = AdapterSource(model, modules=[f"layers.{i}.attention" for i in range(len(model.layers))],
                           scores_fn=lambda module, args, kwargs, output: output[1], score_kind="pattern")
    with Recorder(model, "last-self", source=source) as recorder:
        model(tokens)

`scores_fn(module, args, kwargs, output)` runs in a forward hook after each call of a named module
and returns `[batch, head, query, key]`: probabilities (`score_kind="pattern"`) or raw scores, masked
entries -inf (`score_kind="scores"`). From raw scores both kinds are recorded (the pattern is their
softmax over keys, for the requested queries only); from probabilities only the pattern. It may
recompute the attention from the module's inputs and weights, even by calling the module again (that
inner call is not recorded).

It records only: the module has already used the codes it reads, so editing raises `CannotIntervene`.
Layers are numbered in the order the modules are given (a dict's keys become the layer names); a
module called several times in one pass reports each call under its layer, and the last is kept.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from latentcode.errors import UsageError
from latentcode.sources.attention_rows import (
    check_pairs,
    codes_of_rows,
    slice_pairs,
    softmax_rows,
)
from latentcode.sources.source import (
    SCORE_KINDS,
    AttentionSource,
    CannotIntervene,
    Editor,
    PairsFor,
    Sink,
    check_score,
    removed_on_exit,
)

ScoresFn = Callable[[nn.Module, tuple, dict, Any], Tensor]


def find_module(model: nn.Module, name: str) -> nn.Module:
    """`model.get_submodule(name)`, or a ValueError naming `name` and listing likely module names."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        pass
    names = [module_name for module_name, _ in model.named_modules() if module_name]
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    attention_like = [n for n in names if any(word in n.lower() for word in ("attn", "attention"))]
    examples = list(dict.fromkeys(close + attention_like + names))[:8]
    raise UsageError(
        f"{type(model).__name__} has no module named {name!r}; "
        + (f"did you mean one of {close}? " if close else "")
        + f"its modules include {examples}"
        + (f" (and {len(names) - len(examples)} more; see model.named_modules())" if len(names) > len(examples) else "")
    )


class AdapterSource(AttentionSource):
    """Latent codes from named modules through `scores_fn`; see the module docstring.

    model: the model the Recorder runs.
    modules: module names (`"layers.0.attn"`), or a dict from layer name to module or module name;
        the order gives the layer numbers.
    scores_fn: `(module, args, kwargs, output) -> [batch, head, query, key]` tensor.
    score_kind: what scores_fn returns: "pattern" (probabilities) or "scores" (raw, masked = -inf).
    """

    name = "adapter"

    def __init__(
        self,
        model: nn.Module,
        modules: Mapping[str, nn.Module | str] | Sequence[str | nn.Module],
        scores_fn: ScoresFn,
        score_kind: str = "pattern",
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
        if not callable(scores_fn):
            raise TypeError(f"scores_fn must be callable (module, args, kwargs, output) -> tensor, got {scores_fn!r}")
        if score_kind not in SCORE_KINDS:
            raise UsageError(f"score_kind must be one of {SCORE_KINDS}, got {score_kind!r}")
        if isinstance(modules, str) or not isinstance(modules, (Mapping, Sequence)):
            raise TypeError(f"modules must be a list of module names or a dict name -> module, got {modules!r}")
        if not modules:
            raise UsageError("modules is empty: name at least one attention module")
        names_by_module = {id(module): module_name for module_name, module in model.named_modules()}
        items = modules.items() if isinstance(modules, Mapping) else [(None, entry) for entry in modules]
        self.modules: list[nn.Module] = []
        self._layer_names: list[str] = []
        for given_name, entry in items:
            if isinstance(entry, str):
                module = find_module(model, entry)
                module_name = entry
            elif isinstance(entry, nn.Module):
                module = entry
                module_name = names_by_module.get(id(entry), type(entry).__name__)
            else:
                raise TypeError(f"a module is an nn.Module or a module name, got {entry!r}")
            self.modules.append(module)
            self._layer_names.append(given_name if given_name is not None else module_name)
        self.model = model
        self.scores_fn = scores_fn
        self.score_kind = score_kind

    def n_layers(self) -> int:
        return len(self.modules)

    def layer_names(self) -> list[str]:
        return list(self._layer_names)

    def edit(self, pairs_for: PairsFor, editor: Editor) -> Iterator[None]:
        raise CannotIntervene(
            "AdapterSource cannot edit latent codes: its scores_fn reads the attention after the module has "
            "computed its output with it; edit models whose attention passes through a hook_pattern HookPoint "
            "or calls scaled_dot_product_attention / nn.MultiheadAttention"
        )

    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        check_score(score)
        if score == "scores" and self.score_kind == "pattern":
            raise UsageError(
                "raw scores were asked for, but this AdapterSource's scores_fn returns probabilities "
                "(score_kind='pattern'); record score='pattern', or give a scores_fn that returns raw "
                "scores with score_kind='scores'"
            )
        busy: set[int] = set()  # layers whose scores_fn is running: it may call the module again
        with removed_on_exit() as handles:
            for layer, module in enumerate(self.modules):

                def record(module, args, kwargs, output, layer=layer):
                    if layer in busy:
                        return
                    busy.add(layer)
                    try:
                        attention = self.scores_fn(module, args, kwargs, output)
                    finally:
                        busy.discard(layer)
                    if not isinstance(attention, Tensor) or attention.dim() != 4:
                        shape = tuple(attention.shape) if isinstance(attention, Tensor) else type(attention).__name__
                        raise UsageError(
                            f"scores_fn for layer {layer} ({self._layer_names[layer]}) must return a "
                            f"[batch, head, query, key] tensor, got {shape}"
                        )
                    pairs = pairs_for(layer, attention.shape[-1])
                    if pairs is None:
                        return
                    check_pairs(pairs, attention.shape[-2], attention.shape[-1],
                                f"layer {layer} ({self._layer_names[layer]})")
                    if score == self.score_kind:
                        sink(layer, *pairs, slice_pairs(attention, pairs))
                        return
                    rows, inverse = torch.unique(pairs[0], return_inverse=True)
                    with torch.no_grad():  # probabilities from raw scores, for the requested queries only
                        rows_attention = softmax_rows(attention.index_select(-2, rows.to(attention.device)).float())
                    sink(layer, *pairs, codes_of_rows(rows_attention, inverse, pairs[1]))

                handles.append(module.register_forward_hook(record, with_kwargs=True))
            yield
