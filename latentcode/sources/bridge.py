"""`BridgeSource`: latent codes of transformer-lens 4.x `TransformerBridge`s.

A bridge (`TransformerBridge.boot_transformers(name, hf_model=..., tokenizer=...)` or
`boot_native(TransformerBridgeConfig(...))`) is read through forward hooks on its HookPoints
`blocks.{l}.attn.hook_pattern` (and `hook_q`, `hook_k`, `hook_attn_scores` for raw scores, rebuilt
and checked against the pattern where `hook_attn_scores` holds the pattern); `detect_source` picks this
source for a bridge. Which architectures give raw scores and which can be edited: docs/concepts/sources.md
("`BridgeSource`"). (transformer-lens 3.x `HookedTransformer`s are read by `HookPointSource`.)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from latentcode.sources.attention_rows import (
    as_minus_infinity,
    check_pairs,
    codes_of_rows,
    slice_pairs,
    softmax_rows,
    write_pairs,
)
from latentcode.sources.source import (
    PATTERN_HOOK,
    CannotIntervene,
    Editor,
    HookPointSource,
    NoAttentionCaptured,
    PairsFor,
    Sink,
    check_score,
    removed_on_exit,
)


def is_transformer_bridge(model: Any) -> bool:
    """Whether `model` is a transformer-lens 4.x `TransformerBridge` (decided from the class's name
    and module, so that nothing is imported for other models)."""
    return any(
        cls.__name__ == "TransformerBridge" and cls.__module__.startswith("transformer_lens")
        for cls in type(model).__mro__
    )


def _converted(hook_point: nn.Module, tensor: Any) -> Any:
    """What a TransformerLens hook on `hook_point` sees (4.x HookPoints may reshape, e.g. hook_q)."""
    conversion = getattr(hook_point, "hook_conversion", None)
    return conversion.convert(tensor) if conversion is not None and isinstance(tensor, Tensor) else tensor


def _dropout_active(attention: nn.Module) -> bool:
    """Whether dropout may change this attention's pattern (training mode and a dropout rate > 0)."""
    rates = [float(module.p) if isinstance(module, nn.Dropout) else getattr(module, "attention_dropout", None)
             for module in attention.modules()]
    return attention.training and any(isinstance(rate, float) and rate > 0 for rate in rates)


class BridgeSource(HookPointSource):
    """A transformer-lens 4.x `TransformerBridge`; see docs/concepts/sources.md."""

    name = "transformer_bridge"

    def __init__(self, model: nn.Module):
        if not is_transformer_bridge(model):
            raise TypeError("BridgeSource reads transformer-lens 4.x TransformerBridge models, got "
                            f"{type(model).__name__}")
        self.model = model
        self.hook_dict = model.hook_dict
        layers = {int(match.group(1)) for name in self.hook_dict if (match := PATTERN_HOOK.match(name))}
        if not layers:
            raise NoAttentionCaptured(
                f"this TransformerBridge has no hook named blocks.<layer>.attn.hook_pattern "
                f"(its architecture {getattr(model.cfg, 'architecture', '?')!r} may have no attention)"
            )
        self._n_layers = max(layers) + 1

    def _hook(self, layer: int, name: str) -> nn.Module | None:
        return self.hook_dict.get(f"blocks.{layer}.attn.{name}")

    def _pattern_hooks(self) -> Iterator[tuple[int, nn.Module]]:
        """(layer, its hook_pattern) of the layers that have one, the hook points as they are now
        (compatibility mode may have changed them)."""
        self.hook_dict = self.model.hook_dict
        for layer in range(self._n_layers):
            hook_point = self._hook(layer, "hook_pattern")
            if hook_point is not None:
                yield layer, hook_point

    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        check_score(score)
        with removed_on_exit() as handles:
            if score == "pattern":
                for layer, hook_point in self._pattern_hooks():

                    def record(module, inputs, output, layer=layer):
                        pattern = _converted(module, output)
                        pairs = pairs_for(layer, pattern.shape[-1])
                        if pairs is not None:
                            sink(layer, *pairs, slice_pairs(pattern, pairs))

                    handles.append(hook_point.register_forward_hook(record))
            else:
                self.hook_dict = self.model.hook_dict
                self._capture_scores(pairs_for, sink, handles)
            yield

    @contextmanager
    def edit(self, pairs_for: PairsFor, editor: Editor) -> Iterator[None]:
        """Return the edited pattern from `hook_pattern`, for bridges whose attention computes its
        output from the hooked pattern (docs/concepts/sources.md); otherwise raise CannotIntervene."""
        with removed_on_exit() as handles:
            for layer, hook_point in self._pattern_hooks():
                attention = self.model.get_submodule(f"blocks.{layer}.attn")
                wrapped = getattr(attention, "original_component", None)
                state = {"wrapped_returned": False}  # this call: the wrapped HF module has returned

                def starts(module, args, state=state):
                    state["wrapped_returned"] = False

                def returned(module, args, output, state=state):
                    state["wrapped_returned"] = True

                handles.append(attention.register_forward_pre_hook(starts))
                if isinstance(wrapped, nn.Module):
                    handles.append(wrapped.register_forward_hook(returned))

                def edit(module, inputs, output, layer=layer, attention=attention, state=state):
                    pattern = _converted(module, output)
                    pairs = pairs_for(layer, pattern.shape[-1])
                    if pairs is None:
                        return None
                    if state["wrapped_returned"]:
                        raise CannotIntervene(
                            f"blocks.{layer}.attn: this TransformerBridge's attention "
                            f"({type(getattr(attention, 'original_component', attention)).__name__}) computes its "
                            "output inside the wrapped Hugging Face module and fires hook_pattern afterwards, so an "
                            "edited pattern cannot reach the output; load the Hugging Face model with "
                            "attn_implementation='sdpa' and intervene on it directly (TorchAttentionSource)"
                        )
                    check_pairs(pairs, pattern.shape[-2], pattern.shape[-1], f"blocks.{layer}.attn")
                    queries, keys = (index.to(pattern.device) for index in pairs)
                    edited = write_pairs(pattern, pairs, editor(layer, *pairs, pattern[:, :, queries, keys]))
                    conversion = getattr(module, "hook_conversion", None)
                    return conversion.revert(edited) if conversion is not None else edited

                handles.append(hook_point.register_forward_hook(edit))
            yield

    # -- raw scores -----------------------------------------------------------------------------------
    def _capture_scores(self, pairs_for: PairsFor, sink: Sink, handles: list) -> None:
        """Hooks (into `handles`) that hand `sink` each layer's raw scores, read or rebuilt."""
        seen: dict[int, dict[str, Tensor]] = {}  # per layer, this pass: q, k, hook_attn_scores, hook_pattern
        model_inputs: dict[str, Tensor | None] = {"attention_mask": None}

        def remember_mask(module, args, kwargs):
            mask = kwargs.get("attention_mask")
            model_inputs["attention_mask"] = mask if isinstance(mask, Tensor) and mask.dim() == 2 else None

        wrapped = self.model.__dict__.get("original_model") or getattr(self.model, "original_model", None)
        if isinstance(wrapped, nn.Module):
            handles.append(wrapped.register_forward_pre_hook(remember_mask, with_kwargs=True))

        for layer in range(self._n_layers):
            attention = self.model.get_submodule(f"blocks.{layer}.attn")
            for kind in ("hook_q", "hook_k", "hook_attn_scores", "hook_pattern"):
                hook_point = self._hook(layer, kind)
                if hook_point is None:
                    continue

                def keep(module, inputs, output, layer=layer, kind=kind):
                    seen.setdefault(layer, {})[kind] = _converted(module, output)

                handles.append(hook_point.register_forward_hook(keep))

            def finish(module, inputs, output, layer=layer):
                tensors = seen.pop(layer, {})
                pattern = tensors.get("hook_pattern")
                if pattern is None:
                    return
                pairs = pairs_for(layer, pattern.shape[-1])
                if pairs is None:
                    return
                check_pairs(pairs, pattern.shape[-2], pattern.shape[-1], f"blocks.{layer}.attn")
                rows, inverse = torch.unique(pairs[0], return_inverse=True)
                rows = rows.to(pattern.device)
                with torch.no_grad():
                    scores = self._raw_scores(layer, module, tensors, pattern, rows, model_inputs["attention_mask"])
                sink(layer, *pairs, codes_of_rows(scores, inverse, pairs[1]))

            handles.append(attention.register_forward_hook(finish))

    def _raw_scores(self, layer: int, attention: nn.Module, tensors: dict[str, Tensor], pattern: Tensor, rows: Tensor,
                    attention_mask: Tensor | None) -> Tensor:
        """Raw scores `[batch, head, len(rows), key]` of the query positions `rows`."""
        given = tensors.get("hook_attn_scores")
        if (
            isinstance(given, Tensor)
            and given.shape == pattern.shape
            and given is not pattern
            and not torch.equal(given.index_select(-2, rows), pattern.index_select(-2, rows))
        ):
            return as_minus_infinity(given.index_select(-2, rows))
        q, k = tensors.get("hook_q"), tensors.get("hook_k")
        if q is None or k is None or q.dim() != 4 or k.dim() != 4:
            raise NoAttentionCaptured(
                f"blocks.{layer}.attn: hook_attn_scores holds the post-softmax pattern and hook_q/hook_k "
                f"did not fire with [batch, pos, head, d_head] tensors (got {None if q is None else tuple(q.shape)}, "
                f"{None if k is None else tuple(k.shape)}), so raw scores cannot be rebuilt; record score='pattern'"
            )
        scores = self._scores_from_qk(layer, attention, q, k, rows, attention_mask)
        if not _dropout_active(attention):
            self._check_against_pattern(layer, scores, pattern.index_select(-2, rows))
        return scores

    def _scores_from_qk(
        self, layer: int, attention: nn.Module, q: Tensor, k: Tensor, rows: Tensor, attention_mask: Tensor | None
    ) -> Tensor:
        cfg = self.model.cfg
        n_heads = q.shape[2]
        if k.shape[2] != n_heads:  # grouped-query attention: each key head serves a group of query heads
            k = k.repeat_interleave(n_heads // k.shape[2], dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q.index_select(1, rows).float(), k.float())
        scaling = next(
            (m.scaling for m in attention.modules() if isinstance(getattr(m, "scaling", None), float)), None
        )
        if scaling is not None:
            scores = scores * scaling
        else:
            divisor = 1.0
            if getattr(cfg, "use_attn_scale", True):
                attn_scale = getattr(cfg, "attn_scale", -1.0)
                divisor = attn_scale if attn_scale > 0 else math.sqrt(q.shape[-1])
            if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
                divisor *= layer + 1
            scores = scores / divisor
        n_keys = k.shape[1]
        if getattr(cfg, "attention_dir", "causal") == "causal":
            offset = n_keys - q.shape[1]  # queries are the last positions when a cache holds earlier keys
            later = torch.arange(n_keys, device=scores.device) > (rows[:, None] + offset)
            scores = scores.masked_fill(later, float("-inf"))
        if attention_mask is not None and attention_mask.shape == (scores.shape[0], n_keys):
            padding = (attention_mask == 0).to(scores.device)[:, None, None, :]
            scores = scores.masked_fill(padding, float("-inf"))
        return scores

    @staticmethod
    def _check_against_pattern(layer: int, scores: Tensor, pattern_rows: Tensor) -> None:
        reproduced = softmax_rows(scores)
        attended = ~torch.isneginf(scores).all(dim=-1)  # queries with at least one key
        if not attended.any():
            return
        difference = (reproduced - pattern_rows.float()).abs().amax(dim=-1)[attended].max().item()
        tolerance = 1e-4 if pattern_rows.dtype in (torch.float32, torch.float64) else 2e-2
        if not difference <= tolerance:
            raise RuntimeError(
                f"blocks.{layer}.attn: the raw scores rebuilt from hook_q/hook_k do not reproduce "
                f"hook_pattern (largest difference {difference:.2e} > {tolerance:g}): this architecture's "
                "attention (e.g. ALiBi, soft-capping, local windows or a mask the source cannot see) is "
                "not covered; record score='pattern' instead, or use AdapterSource"
            )
