"""Which PyTorch hooks are attached to a module: the one place that reads torch's hook registries.

PyTorch keeps a module's hooks in private dicts (`_forward_hooks`, ...) and hooks for every module
in private globals of `torch.nn.modules.module`; no public call lists them. Everything in
latentcode that asks "is anything hooked here?" (the attention layer choosing a path, tests that
check no hook was left behind) asks `attached_hooks` or `global_hooks_attached`, so that a change
in torch's internals is handled here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from torch import nn
from torch.nn.modules import module as torch_module

_GLOBAL_REGISTRIES = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                      "_global_backward_pre_hooks")


@dataclass(frozen=True)
class AttachedHooks:
    """The hooks attached to one module, in the order they run, by kind."""

    forward: tuple[Callable, ...]
    forward_pre: tuple[Callable, ...]
    backward: tuple[Callable, ...]
    backward_pre: tuple[Callable, ...]

    def __bool__(self) -> bool:
        """Whether any hook is attached."""
        return bool(self.forward or self.forward_pre or self.backward or self.backward_pre)


def attached_hooks(module: nn.Module) -> AttachedHooks:
    """The forward, forward-pre, backward and backward-pre hooks attached to `module` itself (not to
    its children), as registered with `register_forward_hook` and friends (TransformerLens's
    `add_hook` registers through them too)."""
    return AttachedHooks(tuple(module._forward_hooks.values()), tuple(module._forward_pre_hooks.values()),
                         tuple(module._backward_hooks.values()),
                         tuple(module._backward_pre_hooks.values()))


def any_hooks(modules: Iterable[nn.Module]) -> bool:
    """Whether any of `modules` has a hook attached (`model.modules()`: anywhere in a model)."""
    return any(attached_hooks(module) for module in modules)


def global_hooks_attached() -> bool:
    """Whether hooks registered for every module exist (`register_module_forward_hook` and friends)."""
    return any(getattr(torch_module, name, None) for name in _GLOBAL_REGISTRIES)
