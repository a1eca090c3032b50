"""Attention sources: where a forward pass's latent codes are captured from.

A source attaches hooks to a model for the duration of `capture(...)`. During each forward pass it
calls `sink(layer, query_positions, key_positions, codes)` once per captured attention layer,
with `codes[b, h, i] = a[b, h, query_positions[i], key_positions[i]]` `[batch, head, n_pairs]`,
sliced as the forward pass runs so that memory stays O(batch x sites x heads).

Sources that can intervene also implement `edit(...)`: during each forward pass it calls
`editor(layer, query_positions, key_positions, codes)` with the same codes (not detached, so
gradients flow) and makes the rest of the layer compute with the codes the editor returns
(`latentcode.intervention` builds on it); one that cannot raises `CannotIntervene`.

Sources: `HookPointSource` (here), `bridge.BridgeSource`, `torch_attention.TorchAttentionSource`,
`softmax_capture.SoftmaxSource` and `adapter.AdapterSource`, compared in docs/concepts/sources.md;
`latentcode.sources.detect.detect_source(model)` picks the first that applies.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any

from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from latentcode.errors import LatentcodeError, UsageError
from latentcode.models.query_block_hook import QueryBlockHook
from latentcode.sources.attention_rows import gather_pairs, slice_pairs, write_pairs

SCORE_KINDS = ("pattern", "scores")

# sink(layer, query_positions [n], key_positions [n], codes [batch, head, n])
Sink = Callable[[int, Tensor, Tensor, Tensor], None]
# pairs_for(layer, seq_len[, n_queries]) -> (query_positions, key_positions) to record, or None to skip
# the layer; seq_len is the number of keys, n_queries (where given) that of queries: cross-attention
PairsFor = Callable[..., "tuple[Tensor, Tensor] | None"]
# editor(layer, query_positions [n], key_positions [n], codes [batch, head, n]) -> edited codes, same shape
Editor = Callable[[int, Tensor, Tensor, Tensor], Tensor]

PATTERN_HOOK = re.compile(r"^blocks\.(\d+)\.attn\.hook_pattern$")
#: module names of cross-attention (queries of one sequence, keys of another) in common libraries:
#: BART/T5-style `encoder_attn`, `EncDecAttention`, BERT-decoder `crossattention`, `cross_attn`
CROSS_ATTENTION_NAMES = re.compile(r"(^|.*\.)(encoder_attn|encdecattention|crossattention|cross_attn|"
                                   r"cross_attention)(\..*)?$", re.IGNORECASE)


class DifferentiableEditor:
    """An editor whose returned codes carry a gradient someone wants (attribution patching, an edit
    with a tensor that requires grad): sources compute the layer's output from the returned codes
    even where they equal the originals. (An SDPA source otherwise keeps the fused call's output
    there, so that an identity edit changes no bit, and no gradient would reach the codes.)"""

    differentiable = True

    def __init__(self, editor: Editor):
        self.editor = editor

    def __call__(self, layer: int, queries: Tensor, keys: Tensor, codes: Tensor) -> Tensor:
        return self.editor(layer, queries, keys, codes)


class NoAttentionCaptured(LatentcodeError, RuntimeError):
    """A forward pass ran but no latent code could be captured from the model."""


class CannotIntervene(LatentcodeError, ValueError):
    """Latent codes of this model (or of this call) cannot be edited; says why and what would work."""


class AttentionSource(abc.ABC):
    """Where latent codes come from. Subclasses implement `capture`."""

    #: stored in the codes file's `source` attribute
    name: str = "unknown"

    def n_layers(self) -> int | None:
        """Number of attention layers, if known before a forward pass."""
        return None

    def layer_names(self) -> list[str] | None:
        """A module name per attention layer, where known."""
        return None

    def layers(self) -> list[dict] | None:
        """Per attention layer of the last forward pass, where known: `{"name", "kind" ("self" or
        "cross"), "queries", "keys"}` (the lengths of the query and key axes)."""
        return None

    @abc.abstractmethod
    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        """While active, every forward pass reports the requested codes to `sink`."""

    def edit(self, pairs_for: PairsFor, editor: Editor) -> AbstractContextManager[None]:
        """While active, every forward pass computes with the codes `editor` returns."""
        raise CannotIntervene(f"the {self.name} source ({type(self).__name__}) cannot edit latent codes")


class CallOrderSource(AttentionSource):
    """A source whose layers are the attention calls of a forward pass in call order, known after the
    first pass under `capture` (`_layers`: those of the last pass that completed, as `PassLayers` lists them)."""

    _layers: list[dict] | None = None

    def n_layers(self) -> int | None:
        """Attention calls per forward pass, once a pass has run under `capture` (else None)."""
        return None if self._layers is None else len(self._layers)

    def layer_names(self) -> list[str] | None:
        """The module that made each attention call of the last forward pass, by call order."""
        return None if self._layers is None else [layer["name"] for layer in self._layers]

    def layers(self) -> list[dict] | None:
        """Name, kind ("self"/"cross") and query/key lengths of each attention call of the last forward pass."""
        return None if self._layers is None else [dict(layer) for layer in self._layers]


class PassLayers:
    """The attention calls of one forward pass, in order: `{"name", "kind", "queries", "keys"}` each, named
    by the module that made it (`#1`, `#2`... on a module's later calls in the pass)."""

    def __init__(self):
        self.layers: list[dict] = []
        self._calls_per_module: dict[str, int] = {}

    def clear(self) -> None:
        self.layers.clear()
        self._calls_per_module.clear()

    def add(self, module_name: str, n_queries: int, n_keys: int, cross: bool = False) -> int:
        """The layer number of a new call of `module_name` (`cross`: the call shows cross-attention)."""
        count = self._calls_per_module.get(module_name, 0)
        self._calls_per_module[module_name] = count + 1
        name = module_name if count == 0 else f"{module_name}#{count}"
        self.layers.append({"name": name, "kind": layer_kind(name, cross), "queries": n_queries, "keys": n_keys})
        return len(self.layers) - 1


def layer_kind(module_name: str, cross: bool = False) -> str:
    """The kind of an attention layer: "cross" for a cross-attention module (by its name, or `cross`
    where the call shows it), else "self"."""
    return "cross" if cross or CROSS_ATTENTION_NAMES.fullmatch(module_name.split("#")[0]) else "self"


class FunctionCalls(TorchFunctionMode):
    """After each call of a function in `handlers`, `handlers[function](args, kwargs, result)`, whose return
    value the caller gets; every other call as it is."""

    def __init__(self, handlers: dict[Callable, Callable[[tuple, dict, Any], Any]]):
        super().__init__()
        self.handlers = handlers

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)  # the model's own result, from the original call
        handler = self.handlers.get(func)
        return result if handler is None else handler(args, kwargs, result)


@contextmanager
def removed_on_exit() -> Iterator[list]:
    """A list for hook handles, each removed on leaving (whatever happens)."""
    handles: list = []
    try:
        yield handles
    finally:
        for handle in handles:
            handle.remove()


def check_score(score: str) -> str:
    if score not in SCORE_KINDS:
        raise UsageError(f"score must be one of {SCORE_KINDS}, got {score!r}")
    return score


class HookPointSource(AttentionSource):
    """Our models and TransformerLens `HookedTransformer`s: forward hooks on the HookPoints
    `blocks.{l}.attn.hook_pattern` (latent codes) or `blocks.{l}.attn.hook_attn_scores` (raw scores).

    The hooks are plain PyTorch forward hooks on the HookPoint modules, so they neither need nor
    disturb TransformerLens's own hook bookkeeping (a user's `run_with_hooks` still works)."""

    name = "latentcode"

    def __init__(self, model: nn.Module, name: str | None = None):
        hook_dict = getattr(model, "hook_dict", None)
        if not hook_dict:
            raise NoAttentionCaptured(f"{type(model).__name__} has no TransformerLens hook points (hook_dict)")
        self.model, self.hook_dict = model, hook_dict
        layers = {int(match.group(1)) for name in hook_dict if (match := PATTERN_HOOK.match(name))}
        if not layers:
            raise NoAttentionCaptured(f"{type(model).__name__} has no hook point named "
                                      "blocks.<layer>.attn.hook_pattern")
        self._n_layers = max(layers) + 1
        if name is not None:
            self.name = name

    @staticmethod
    def applies_to(model: nn.Module) -> bool:
        hook_dict = getattr(model, "hook_dict", None)
        return bool(hook_dict) and any(PATTERN_HOOK.match(name) for name in hook_dict)

    def n_layers(self) -> int:
        return self._n_layers

    def layer_names(self) -> list[str]:
        return [f"blocks.{layer}.attn" for layer in range(self._n_layers)]

    def hook_name(self, layer: int, score: str) -> str:
        return f"blocks.{layer}.attn.{'hook_pattern' if score == 'pattern' else 'hook_attn_scores'}"

    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        """Records through `QueryBlockHook`s: a layer that computes blocks of queries (our attention
        on long sequences) hands each block over and never assembles the whole pattern for it."""
        check_score(score)

        def record(layer, block, query_start):
            pairs = pairs_for(layer, block.shape[-1])
            if pairs is None:
                return
            queries, keys = pairs
            if query_start or block.shape[-2] < int(queries.max()) + 1:
                in_block = (queries >= query_start) & (queries < query_start + block.shape[-2])
                if not bool(in_block.any()):
                    return
                queries, keys = queries[in_block], keys[in_block]
            sink(layer, queries, keys, slice_pairs(block, (queries - query_start, keys)))

        with self._hooked(score, lambda layer: QueryBlockHook(partial(record, layer))):
            yield

    @contextmanager
    def edit(self, pairs_for: PairsFor, editor: Editor) -> Iterator[None]:
        """The hook on `hook_pattern` returns the edited pattern, which the rest of the layer (dropout,
        the value network) consumes; for our HYLA models `hook_pattern` is after RMSHead."""

        def edit(layer, module, inputs, output):
            pairs = pairs_for(layer, output.shape[-1])
            if pairs is None:
                return None
            return write_pairs(output, pairs, editor(layer, *pairs, gather_pairs(output, pairs)))

        with self._hooked("pattern", lambda layer: partial(edit, layer)):
            yield

    @contextmanager
    def _hooked(self, score: str, hook_of: Callable[[int], Callable]) -> Iterator[None]:
        """`hook_of(layer)` as a forward hook of every layer's hook point; removed on exit."""
        with removed_on_exit() as handles:
            for layer in range(self._n_layers):
                handles.append(self.hook_dict[self.hook_name(layer, score)].register_forward_hook(hook_of(layer)))
            yield
