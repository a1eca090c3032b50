"""Our `HookPoint` and `HookedRootModule` (latentcode/models/hooks.py) behave as TransformerLens's:
each scenario below runs on a small model built once on TransformerLens's classes and once on ours,
and everything it observes (names, cached activations and gradients, edited outputs, which hooks
remain, the order hooks run in, the errors raised) must be equal. Building one of our models must not
import TransformerLens (nor through it Hugging Face datasets)."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from latentcode.models import hooks as ours
from latentcode.models.hook_state import attached_hooks

transformer_lens = pytest.importorskip("transformer_lens")
from transformer_lens.hook_points import HookPoint as LensHookPoint  # noqa: E402

try:
    from transformer_lens import HookedRootModule as LensRoot
except ImportError:  # transformer-lens < 4
    from transformer_lens.hook_points import HookedRootModule as LensRoot

IMPLEMENTATIONS = {"transformer_lens": (LensHookPoint, LensRoot), "latentcode": (ours.HookPoint, ours.HookedRootModule)}


def toy_model(hook_point_class, root_class) -> nn.Module:
    """Two blocks `blocks.{i}` with a nested hook point each, and a hook point at the top."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 3)
            self.hook_pre = hook_point_class()
            self.inner = nn.Module()
            self.inner.hook_post = hook_point_class()

        def forward(self, x):
            return self.inner.hook_post(torch.tanh(self.hook_pre(self.linear(x))))

    class Toy(root_class):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])
            self.hook_out = hook_point_class()
            self.setup()

        def forward(self, x, scalar=False):
            for block in self.blocks:
                x = block(x)
            out = self.hook_out(x * 2)
            return out.square().sum() if scalar else out

    torch.manual_seed(0)
    return Toy()


def torch_hooks_left(model: nn.Module) -> int:
    return sum(len(attached_hooks(module).forward) + len(attached_hooks(module).backward) for module in model.modules())


def observe(implementation: str) -> dict:
    """Run every scenario on the toy model of `implementation`; what each one saw."""
    model = toy_model(*IMPLEMENTATIONS[implementation])
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(1))
    seen: dict = {}
    seen["hook_dict"] = sorted(model.hook_dict)
    seen["mod_dict"] = sorted(model.mod_dict)
    seen["names"] = [hook_point.name for hook_point in model.hook_points()]
    seen["layers"] = [model.hook_dict[f"blocks.{i}.hook_pre"].layer() for i in (0, 1)]

    for label, names_filter in [("all", None), ("one", "blocks.1.hook_pre"), ("list", ["hook_out", "blocks.0.inner.hook_post"]),
                                ("function", lambda name: name.endswith("hook_pre"))]:
        output, cache = model.run_with_cache(x, names_filter=names_filter, device="cpu")
        seen[f"cache {label}"] = (output, dict(cache))
    _, seen["cache without batch dim"] = model.run_with_cache(x[:1], remove_batch_dim=True)
    with pytest.raises(AssertionError):
        model.run_with_cache(x, remove_batch_dim=True)
    with pytest.raises(ValueError):
        model.run_with_cache(x, names_filter=3)
    parameters_x = x.clone().requires_grad_()
    output, cache = model.run_with_cache(parameters_x, scalar=True, incl_bwd=True)
    seen["cache with gradients"] = (output.detach(), {name: value for name, value in cache.items()})
    model.zero_grad()
    seen["hooks left after caching"] = torch_hooks_left(model)

    calls = []

    def halve(activation, hook):
        calls.append(hook.name)
        return activation / 2

    seen["run_with_hooks"] = model.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_pre", halve),
                                                                (lambda name: "inner" in name, halve)])
    seen["hook calls"] = list(calls)
    seen["hooks left after run_with_hooks"] = torch_hooks_left(model)

    order = []
    model.add_hook("hook_out", lambda a, hook: order.append("first"))
    model.add_hook("hook_out", lambda a, hook: order.append("prepended"), prepend=True)
    model(x)
    seen["order"] = list(order)
    model.reset_hooks()

    model.add_perma_hook("hook_out", lambda a, hook: a + 1)
    model.add_hook("blocks.1.hook_pre", lambda a, hook: a * 0)
    seen["with a permanent and a temporary hook"] = model(x)
    model.reset_hooks()
    seen["after reset_hooks (the permanent hook stays)"] = model(x)
    seen["has_hooks after reset"] = [hook_point.has_hooks() for hook_point in model.hook_points()]
    seen["has_hooks without permanent"] = [hook_point.has_hooks(including_permanent=False) for hook_point in model.hook_points()]
    model.reset_hooks(including_permanent=True)
    seen["after removing the permanent hook"] = model(x)
    seen["hooks left after reset including permanent"] = torch_hooks_left(model)

    with model.hooks(fwd_hooks=[("hook_out", lambda a, hook: a + 10)]):
        with model.hooks(fwd_hooks=[("hook_out", lambda a, hook: a * 3)]):
            seen["nested contexts"] = model(x)
            seen["levels inside"] = [model.hook_dict["hook_out"].has_hooks(level=level) for level in (1, 2, 3)]
        seen["outer context only"] = model(x)
    seen["after the contexts"] = model(x)

    inputs = x.clone().requires_grad_()
    model.run_with_hooks(inputs, scalar=True, bwd_hooks=[("blocks.0.inner.hook_post", lambda g, hook: g * 5)],
                         reset_hooks_end=False).backward()
    seen["input gradient with a backward hook"] = inputs.grad
    seen["bwd hooks kept"] = model.hook_dict["blocks.0.inner.hook_post"].has_hooks(dir="bwd")
    model.reset_hooks()
    seen["bwd hooks after reset"] = model.hook_dict["blocks.0.inner.hook_post"].has_hooks(dir="bwd")

    hook_point = model.hook_dict["hook_out"]
    hook_point.add_hook(lambda a, hook: None)
    hook_point.add_hook(lambda a, hook: None, dir="bwd")
    hook_point.remove_hooks()  # forward hooks only by default
    seen["remove_hooks default direction"] = (hook_point.has_hooks(dir="fwd"), hook_point.has_hooks(dir="bwd"))
    hook_point.remove_hooks("both")
    with pytest.raises(ValueError):
        hook_point.add_hook(lambda a, hook: None, dir="sideways")
    hook_point.ctx["kept"] = 1
    model.reset_hooks(clear_contexts=False)
    seen["ctx kept"] = dict(hook_point.ctx)
    model.reset_hooks()
    seen["ctx cleared"] = dict(hook_point.ctx)
    return seen


def assert_equal(got, expected, where):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got, expected), where
    elif isinstance(expected, dict):
        assert sorted(got) == sorted(expected), where
        for key in expected:
            assert_equal(got[key], expected[key], f"{where}[{key}]")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), where
        for index, (got_item, expected_item) in enumerate(zip(got, expected, strict=True)):
            assert_equal(got_item, expected_item, f"{where}[{index}]")
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


def test_our_hook_points_behave_as_transformer_lens_hook_points():
    expected, got = observe("transformer_lens"), observe("latentcode")
    assert sorted(got) == sorted(expected)
    for scenario in expected:
        assert_equal(got[scenario], expected[scenario], scenario)
    # The scenarios saw something (the comparison above is not between two empty results).
    assert expected["hook calls"] == ["blocks.0.hook_pre", "blocks.0.inner.hook_post", "blocks.1.inner.hook_post"]
    assert expected["order"] == ["prepended", "first"]
    assert len(expected["cache with gradients"][1]) == 10 and expected["levels inside"] == [True, True, False]


def test_building_a_model_imports_no_transformer_lens():
    code = ("import sys\n"
            "from latentcode import ModelConfig, build_model\n"
            "model = build_model(ModelConfig(attention='hyla', n_layers=1, d_model=16, n_heads=2, kqv_dim=8, d_mlp=16,"
            " n_ctx=4, d_in=2, d_out=2))\n"
            "model.run_with_cache(__import__('torch').zeros(1, 4, 2))\n"
            "print(sorted(m for m in ('transformer_lens', 'transformers', 'datasets', 'pandas') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
