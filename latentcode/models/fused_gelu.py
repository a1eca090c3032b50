"""The MLP's tanh-approximate GELU in training, one fused C pass forward and one backward.

    gelu(x)  = 0.5 x (1 + tanh(z / 2)) = x sigmoid(z),    z = 2c (x + k x^3),  c = sqrt(2 / pi), k = 0.044715
    gelu'(x) = s + x s (1 - s) z'(x),                      s = sigmoid(z),      z'(x) = 2c (1 + 3 k x^2)

torch's `F.gelu(x, approximate="tanh")` and its backward are slow on CPUs where its tanh is not
vectorized (benchmarks/results/kernels_vs_compile_gelu_busy.txt). These kernels (`kernels_gelu.h`,
the operators `latentcode::gelu_tanh` and `latentcode::gelu_tanh_backward` of
`latentcode.models.kernel_ops`; this module registers their fake implementations and autograd
formula) read and write each float once per pass, eight at a time in one AVX2 register, without a
libm call: sigmoid through exp(-|z|) (Cephes' expf), so that nothing overflows:

    e = exp(-|z|),  d = 1 / (1 + e),  s = d (z >= 0) or e d (z < 0),  s (1 - s) = e d^2

Large |x| gives the limits (also for +-inf); NaN stays NaN; exp(-|z|) below float32's smallest
normal is taken as 0 (no denormals). The sigmoid form has no cancellation where torch's `1 + tanh`
rounds to 0 (x < ~-5.2). Big tensors are split over `torch.get_num_threads()` OpenMP threads; every
float is computed the same way wherever a split falls, so the numbers do not depend on the threads.

Used by `MLP.forward` only in training mode, float32 on the CPU, no autocast (torch.compile keeps
the operators in its graph), and where the extension is loaded; elsewhere, and under
`use_fused(False)`, `F.gelu(..., approximate="tanh")`: evaluation stays bit for bit the computation
of the shipped results. Values and gradients equal a float64 evaluation of the formulas within
float32 tolerance (tests/models/test_fused_gelu.py).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from latentcode.models.kernel_ops import EXTENSION, Kernel, loaded, ops

KERNELS = Kernel("fused_gelu")
use_fused = KERNELS.switched  # use_fused(False): within the block, the MLP in training takes `F.gelu`


def available(x: Tensor) -> bool:
    """Whether the fused kernels compute gelu of `x`: float32 on the CPU, no autocast, and the extension loaded
    (also under torch.compile: the kernels are operators it keeps in its graph)."""
    return KERNELS.enabled and not torch.is_autocast_enabled("cpu") and _applies(x)


def _applies(x: Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu" and loaded()


def forward(x: Tensor) -> Tensor:
    """gelu(x), tanh approximation, of float32 CPU `x` (any shape) through the kernel; no autograd."""
    return ops().gelu_tanh(x.contiguous())


def backward(x: Tensor, grad_y: Tensor) -> Tensor:
    """grad_y * gelu'(x), of float32 CPU `x` and `grad_y` of one shape, through the kernel."""
    return ops().gelu_tanh_backward(x.contiguous(), grad_y.contiguous())


def _fake(x: Tensor, *grad_y: Tensor) -> Tensor:  # of both operators: a tensor like x
    return x.new_empty(x.shape)


def _save_input(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _gelu_gradient(ctx, grad_y: Tensor) -> Tensor:
    """Differentiable once: a backward that would build a graph (`create_graph=True`) is refused, never
    computed as if gelu' did not depend on x."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError("the fused GELU of training is differentiable once: for a second derivative "
                           "(create_graph=True) turn it off with fused_gelu.use_fused(False)")
    (x,) = ctx.saved_tensors
    return torch.ops.latentcode.gelu_tanh_backward(x, grad_y.contiguous())


def _register() -> None:
    torch.library.register_fake("latentcode::gelu_tanh", _fake)
    torch.library.register_fake("latentcode::gelu_tanh_backward", _fake)
    torch.library.register_autograd("latentcode::gelu_tanh", _gelu_gradient, setup_context=_save_input)


EXTENSION.on_load(_register)


def gelu(x: Tensor) -> Tensor:
    """`F.gelu(x, approximate="tanh")`: through the operator where `x` is float32 on the CPU and the extension is
    loaded (`available(x)` should hold), else the formula."""
    if not _applies(x):
        return F.gelu(x, approximate="tanh")
    KERNELS.count()
    return torch.ops.latentcode.gelu_tanh(x.contiguous())
