"""TransformerLens's hook infrastructure, written out: `HookPoint` and `HookedRootModule`.

A `HookPoint` is an identity module whose `name` is its path in the model; every interesting
activation passes through one, so caching, patching and ablation need no special code. A
`HookedRootModule` names its hook points (`setup()`) and runs the model with temporary hooks.
This is TransformerLens's interface (`transformer_lens.hook_points`, `transformer_lens.HookedRootModule`),
so that a TransformerLens user is at home, without importing TransformerLens (seconds of imports).
`tests/models/test_hooks_match_transformer_lens.py` runs the same calls on both and compares them.

Both have TransformerLens's signatures and semantics (`add_hook`, `hooks()`, `run_with_hooks`,
`run_with_cache`, `reset_hooks`, ...). A hook is `hook(tensor, hook=hook_point)`; what it returns
(if not None) replaces the tensor. Not here: `pos_slice` of `run_with_cache`, hook aliases and
tensor conversions of TransformerLens 4.x's TransformerBridge (our models need neither).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

Direction = Literal["fwd", "bwd"]
HookFunction = Callable[..., Any]  # hook(tensor, hook=HookPoint) -> replacement tensor or None
NamesFilter = Callable[[str], bool] | Sequence[str] | str | None
HookSpec = tuple[str | Callable[[str], bool], HookFunction]  # (hook point name or filter on names, hook)


@dataclass
class LensHandle:
    """A hook added by `HookPoint.add_hook`: its PyTorch handle, whether `reset_hooks` keeps it
    (`is_permanent`), and the `hooks()` context level that added it."""

    hook: RemovableHandle
    is_permanent: bool = False
    context_level: int | None = None


def _matches(handle: LensHandle, including_permanent: bool, level: int | None) -> bool:
    return (including_permanent or not handle.is_permanent) and (level is None or handle.context_level == level)


def _directions(dir: str) -> tuple[str, ...]:
    if dir not in ("fwd", "bwd", "both"):
        raise ValueError(f"Invalid direction {dir}")  # TransformerLens's message
    return ("fwd", "bwd") if dir == "both" else (dir,)


class HookPoint(nn.Module):
    """An identity module to hook an activation at (`[batch, ...]`, whatever passes through)."""

    def __init__(self):
        super().__init__()
        self.fwd_hooks: list[LensHandle] = []
        self.bwd_hooks: list[LensHandle] = []
        self.ctx: dict = {}
        self.name: str | None = None  # its path from the root module, set by HookedRootModule.setup()

    def forward(self, x: Tensor) -> Tensor:
        return x

    def add_perma_hook(self, hook: HookFunction, dir: Direction = "fwd") -> None:
        """A hook that `reset_hooks` keeps (only `including_permanent=True` removes it)."""
        self.add_hook(hook, dir=dir, is_permanent=True)

    def add_hook(self, hook: HookFunction, dir: Direction = "fwd", is_permanent: bool = False,
                 level: int | None = None, prepend: bool = False) -> LensHandle:
        """Call `hook(activation, hook=self)` on every forward pass (`dir="fwd"`) or on the gradient
        of the activation (`"bwd"`); a returned tensor replaces the activation (or gradient)."""
        if dir == "fwd":
            def forward_hook(module: nn.Module, inputs: Any, output: Tensor) -> Any:
                return hook(output, hook=self)

            handle = self.register_forward_hook(forward_hook, prepend=prepend)
        elif dir == "bwd":
            def backward_hook(module: nn.Module, grad_input: Any, grad_output: tuple[Tensor, ...]) -> Any:
                result = hook(grad_output[0], hook=self)
                return None if result is None else result if isinstance(result, tuple) else (result,)

            handle = self.register_full_backward_hook(backward_hook, prepend=prepend)
        else:
            raise ValueError(f"Invalid direction {dir}")
        lens_handle = LensHandle(handle, is_permanent, level)
        handles = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
        handles.insert(0, lens_handle) if prepend else handles.append(lens_handle)
        return lens_handle

    def has_hooks(self, dir: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = True,
                  level: int | None = None) -> bool:
        """Whether hooks added by `add_hook` (permanent ones if `including_permanent`; of one context
        level if `level` is given) are attached in direction `dir`."""
        return any(_matches(handle, including_permanent, level)
                   for direction in _directions(dir) for handle in getattr(self, f"{direction}_hooks"))

    def remove_hooks(self, dir: Literal["fwd", "bwd", "both"] = "fwd", including_permanent: bool = False,
                     level: int | None = None) -> None:
        for direction in _directions(dir):
            kept = []
            for handle in getattr(self, f"{direction}_hooks"):
                if _matches(handle, including_permanent, level):
                    handle.hook.remove()
                else:
                    kept.append(handle)
            setattr(self, f"{direction}_hooks", kept)

    def clear_context(self) -> None:
        self.ctx = {}

    def layer(self) -> int:
        """The layer index of a hook point named `blocks.{layer}.…`."""
        if self.name is None:
            raise ValueError("Name cannot be None")
        return int(self.name.split(".")[1])


class HookedRootModule(nn.Module):
    """A model whose `HookPoint`s are named after their paths; call `setup()` at the end of
    `__init__`, once every submodule exists."""

    name: str | None
    mod_dict: dict[str, nn.Module]
    hook_dict: dict[str, HookPoint]

    def __init__(self, *args: Any):
        super().__init__()
        self.is_caching = False
        self.context_level = 0

    def setup(self) -> None:
        """Set every submodule's `name` to its path and collect `mod_dict` and `hook_dict`."""
        self.mod_dict, self.hook_dict = {}, {}
        for name, module in self.named_modules():
            if name == "":
                continue
            module.name = name
            self.mod_dict[name] = module
            if isinstance(module, HookPoint):
                self.hook_dict[name] = module

    def hook_points(self):
        return self.hook_dict.values()

    def remove_all_hook_fns(self, direction: Literal["fwd", "bwd", "both"] = "both",
                            including_permanent: bool = False, level: int | None = None) -> None:
        for hook_point in self.hook_points():
            hook_point.remove_hooks(direction, including_permanent=including_permanent, level=level)

    def clear_contexts(self) -> None:
        for hook_point in self.hook_points():
            hook_point.clear_context()

    def reset_hooks(self, clear_contexts: bool = True, direction: Literal["fwd", "bwd", "both"] = "both",
                    including_permanent: bool = False, level: int | None = None) -> None:
        if clear_contexts:
            self.clear_contexts()
        self.remove_all_hook_fns(direction, including_permanent, level=level)
        self.is_caching = False

    def add_hook(self, name: str | Callable[[str], bool], hook: HookFunction, dir: Direction = "fwd",
                 is_permanent: bool = False, level: int | None = None, prepend: bool = False) -> None:
        """Add `hook` at the hook point `name`, or at every hook point whose name `name(...)` accepts."""
        for hook_point in self._hook_points_named(name):
            hook_point.add_hook(hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def add_perma_hook(self, name: str | Callable[[str], bool], hook: HookFunction, dir: Direction = "fwd") -> None:
        self.add_hook(name, hook, dir=dir, is_permanent=True)

    def _hook_points_named(self, name: str | Callable[[str], bool]) -> list[HookPoint]:
        if isinstance(name, str):
            hook_point = self.mod_dict[name]
            if not isinstance(hook_point, HookPoint):
                raise TypeError(f"{name} is a {type(hook_point).__name__}, not a HookPoint; hooks go on HookPoints")
            return [hook_point]
        return [hook_point for hook_name, hook_point in self.hook_dict.items() if name(hook_name)]

    @contextmanager
    def hooks(self, fwd_hooks: Sequence[HookSpec] = (), bwd_hooks: Sequence[HookSpec] = (),
              reset_hooks_end: bool = True, clear_contexts: bool = False) -> Iterator[HookedRootModule]:
        """Add `fwd_hooks` and `bwd_hooks` (`[(name or filter, hook)]`) for the duration of the block
        (all of them removed at its end if `reset_hooks_end`)."""
        try:
            self.context_level += 1
            for hooks, direction in ((fwd_hooks, "fwd"), (bwd_hooks, "bwd")):
                for name, hook in hooks:
                    self.add_hook(name, hook, dir=direction, level=self.context_level)
            yield self
        finally:
            if reset_hooks_end:
                self.reset_hooks(clear_contexts, including_permanent=False, level=self.context_level)
            self.context_level -= 1

    def run_with_hooks(self, *model_args: Any, fwd_hooks: Sequence[HookSpec] = (), bwd_hooks: Sequence[HookSpec] = (),
                       reset_hooks_end: bool = True, clear_contexts: bool = False, **model_kwargs: Any) -> Any:
        """The model's output with `fwd_hooks` / `bwd_hooks` added for this forward pass."""
        if len(bwd_hooks) > 0 and reset_hooks_end:
            logging.warning("WARNING: Hooks will be reset at the end of run_with_hooks. This removes the backward "
                            "hooks before a backward pass can occur.")
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts) as hooked_model:
            return hooked_model.forward(*model_args, **model_kwargs)

    def get_caching_hooks(self, names_filter: NamesFilter = None, incl_bwd: bool = False,
                          device: torch.device | str | None = None, remove_batch_dim: bool = False,
                          cache: dict | None = None) -> tuple[dict, list[HookSpec], list[HookSpec]]:
        """`(cache, fwd_hooks, bwd_hooks)`: hooks that store each activation the filter accepts (detached,
        on `device`) in `cache` under its hook point's name, and its gradient under `name + "_grad"`."""
        cache = {} if cache is None else cache
        accepts = _names_filter(names_filter)
        self.is_caching = True

        def save(tensor: Tensor, hook: HookPoint, is_backward: bool = False) -> None:
            if hook.name is None:
                raise RuntimeError("Hook should have been provided a name")
            stored = tensor.detach().to(device)
            if remove_batch_dim and stored.ndim > 0 and stored.shape[0] == 1:
                stored = stored.squeeze(0)
            cache[hook.name + ("_grad" if is_backward else "")] = stored

        names = [name for name in self.hook_dict if accepts(name)]
        fwd_hooks = [(name, partial(save, is_backward=False)) for name in names]
        bwd_hooks = [(name, partial(save, is_backward=True)) for name in names] if incl_bwd else []
        return cache, fwd_hooks, bwd_hooks

    def run_with_cache(self, *model_args: Any, names_filter: NamesFilter = None,
                       device: torch.device | str | None = None, remove_batch_dim: bool = False,
                       incl_bwd: bool = False, reset_hooks_end: bool = True, clear_contexts: bool = False,
                       **model_kwargs: Any) -> tuple[Any, dict[str, Tensor]]:
        """`(output, cache)`: the model's output and `{hook point name: activation}` of every hook point
        `names_filter` accepts (None: all; a name, a list of names or a function of the name); with
        `incl_bwd`, also `output.backward()` and the gradients as `{name + "_grad": gradient}`."""
        if remove_batch_dim and model_args and isinstance(model_args[0], Tensor):
            batch_size = model_args[0].shape[0] if model_args[0].ndim > 0 else 1
            assert batch_size == 1, f"Cannot remove batch dimension from cache with batch size {batch_size}"
        cache, fwd_hooks, bwd_hooks = self.get_caching_hooks(names_filter, incl_bwd, device, remove_batch_dim)
        with self.hooks(fwd_hooks=fwd_hooks, bwd_hooks=bwd_hooks, reset_hooks_end=reset_hooks_end,
                        clear_contexts=clear_contexts):
            model_out = self(*model_args, **model_kwargs)
            if incl_bwd:
                model_out.backward()
        return model_out, cache


def _names_filter(names_filter: NamesFilter) -> Callable[[str], bool]:
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if isinstance(names_filter, list):
        return lambda name: name in names_filter
    if callable(names_filter):
        return names_filter
    raise ValueError("names_filter must be a string, list of strings, or function")
