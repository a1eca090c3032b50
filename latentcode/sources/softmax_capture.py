"""`SoftmaxSource`: latent codes of attention written by hand, read at the softmax the model computes.

    source = SoftmaxSource(model)                    # modules named like attention (ATTENTION_NAMES)
    source = SoftmaxSource(model, r"h\\.\\d+\\.attn")  # or a regular expression on module names
    source = SoftmaxSource(model, lambda name, module: isinstance(module, MyAttention))
    with Recorder(model, "last-self", source=source) as recorder:
        model(inputs)
    source.layer_names()     # e.g. ['h.0.attn', 'h.1.attn']

The one softmax over the last axis of a 4-D `[batch, head, query, key]` tensor that a chosen module
computes per call is its attention: its result (`score="pattern"`) or its input in float32
(`score="scores"`), edited in place by `edit`. Layers, nesting and what is refused:
docs/concepts/sources.md ("How each source reads and edits").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from latentcode.errors import LatentcodeError
from latentcode.sources.attention_rows import (
    as_minus_infinity,
    check_pairs,
    slice_pairs,
    write_pairs,
)
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

_SOFTMAXES = (torch.softmax, F.softmax, Tensor.softmax, torch.special.softmax)

#: module names that look like attention: the last part of the name (`h.0.attn`, `layers.1.self_attn`,
#: `decoder.layers.0.encoder_attn`, `encoder.layer.0.attention.self`, `h.0.attn.attention`)
ATTENTION_NAMES = re.compile(
    r"(^|.*\.)(attn|self_attn|attention|self_attention|encoder_attn|cross_attn|crossattention|"
    r"cross_attention|selfattention|encdecattention|self)$",
    re.IGNORECASE,
)

ModuleChoice = str | re.Pattern | Callable[[str, nn.Module], bool]


class SoftmaxCaptureError(LatentcodeError, RuntimeError):
    """A chosen module computed no softmax over `[batch, head, query, key]`, or several, in one call."""


def chosen_modules(model: nn.Module, modules: ModuleChoice | None) -> dict[str, nn.Module]:
    """`{name: module}` of the modules `modules` chooses (a regular expression matched against the
    whole name, or a predicate `(name, module) -> bool`); of nested choices only the innermost."""
    if modules is None:
        modules = ATTENTION_NAMES
    if isinstance(modules, str):
        modules = re.compile(modules)
    if isinstance(modules, re.Pattern):
        pattern = modules
        modules = lambda name, module: pattern.fullmatch(name) is not None  # noqa: E731
    chosen = {name: module for name, module in model.named_modules() if name and modules(name, module)}
    # Keep the innermost: drop a chosen module with a chosen descendant.
    return {name: module for name, module in chosen.items()
            if not any(other.startswith(name + ".") for other in chosen)}  # fmt: skip


class SoftmaxSource(CallOrderSource):
    """Latent codes of hand-written attention, at the softmax computed inside chosen modules; see the
    module docstring and docs/concepts/sources.md."""

    name = "softmax"

    def __init__(self, model: nn.Module, modules: ModuleChoice | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.modules = chosen_modules(model, modules)
        if not self.modules:
            what = "the attention-like names (ATTENTION_NAMES)" if modules is None else repr(modules)
            raise SoftmaxCaptureError(
                f"no module of {type(model).__name__} matches {what}; name the attention modules with a "
                "regular expression on their names (list them with model.named_modules()) or a predicate "
                "(name, module) -> bool, as in SoftmaxSource(model, r'layers\\.\\d+\\.attn')"
            )

    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        check_score(score)

        def on_pairs(layer: int, where: str, pairs: tuple[Tensor, Tensor], scores: Tensor, probabilities: Tensor
                     ) -> Tensor:
            attention = probabilities if score == "pattern" else as_minus_infinity(scores.detach())
            sink(layer, *pairs, slice_pairs(attention, pairs))
            return probabilities

        with self._intercepted(pairs_for, on_pairs):
            yield

    @contextmanager
    def edit(self, pairs_for: PairsFor, editor: Editor) -> Iterator[None]:
        """The softmax returns its result with the editor's codes written at the pairs."""

        def on_pairs(layer: int, where: str, pairs: tuple[Tensor, Tensor], scores: Tensor, probabilities: Tensor
                     ) -> Tensor:
            queries, keys = (index.to(probabilities.device) for index in pairs)
            codes = probabilities[:, :, queries, keys]
            edited = editor(layer, *pairs, codes)
            if edited.shape != codes.shape:
                raise ValueError(f"{where}: the edit returned codes of shape {tuple(edited.shape)}; "
                                 f"expected {tuple(codes.shape)}")  # fmt: skip
            return write_pairs(probabilities, pairs, edited)

        with self._intercepted(pairs_for, on_pairs):
            yield

    @contextmanager
    def _intercepted(self, pairs_for: PairsFor, on_pairs: Callable[..., Tensor]) -> Iterator[None]:
        """While active, `on_pairs(layer, where, pairs, scores, probabilities)` sees the attention softmax of every
        chosen module where `pairs_for` asks for pairs, and returns what the module gets."""
        running: list[str] = []  # chosen modules whose forward is running, outermost first
        softmaxes_in_call: list[int] = []  # per running chosen module, softmaxes seen so far
        this_pass = PassLayers()

        def root_enter(module, args):  # a new forward pass (stale entries of one that raised go too)
            this_pass.clear()
            running.clear()
            softmaxes_in_call.clear()

        def root_leave(module, args, output):
            if this_pass.layers:
                self._layers = list(this_pass.layers)

        def enter(module, args, name):
            running.append(name)
            softmaxes_in_call.append(0)

        def leave(module, args, output, name):
            if not running or running[-1] != name:
                return  # a pass that raised left stale entries; the root's pre-hook clears them
            running.pop()
            if softmaxes_in_call.pop() == 0:
                raise SoftmaxCaptureError(
                    f"module {name!r} ({type(module).__name__}) ran but computed no softmax over a "
                    "[batch, head, query, key] tensor; if it calls scaled_dot_product_attention use "
                    "TorchAttentionSource, else choose the modules that compute the softmax"
                )

        def intercept(args: tuple, kwargs: dict, result: Tensor) -> Tensor:
            tensor = args[0] if args else kwargs.get("input", kwargs.get("self"))
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if not running or not isinstance(result, Tensor) or result.dim() != 4 or dim not in (-1, 3):
                return result
            name = running[-1]
            softmaxes_in_call[-1] += 1
            if softmaxes_in_call[-1] > 1:
                raise SoftmaxCaptureError(
                    f"module {name!r} computed several softmaxes over [batch, head, query, key] tensors in "
                    "one call; choose the inner modules that compute one each"
                )
            layer = this_pass.add(name, *result.shape[-2:])
            pairs = pairs_for(layer, result.shape[-1], result.shape[-2])
            if pairs is None:
                return result
            where = f"attention layer {layer} ({this_pass.layers[-1]['name']})"
            check_pairs(pairs, *result.shape[-2:], where)
            return on_pairs(layer, where, pairs, tensor if isinstance(tensor, Tensor) else result, result)

        with removed_on_exit() as handles:
            handles.append(self.model.register_forward_pre_hook(root_enter))
            # Not always_call: a pass that raised names only the layers before the error, and must not
            # become the source's layers (a later Recorder would refuse valid sites of later layers).
            handles.append(self.model.register_forward_hook(root_leave))
            for name, module in self.modules.items():
                handles.append(module.register_forward_pre_hook(lambda m, a, name=name: enter(m, a, name)))
                handles.append(module.register_forward_hook(lambda m, a, o, name=name: leave(m, a, o, name)))
            with FunctionCalls(dict.fromkeys(_SOFTMAXES, intercept)):
                yield
