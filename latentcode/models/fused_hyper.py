"""The hyper value networks' blockwise kernels fused in C: no `[query, key, d_head_v]` tensor at all.

For one batch element, latent codes `a[h, q, k]`, values `v[k, h, :]` and (backward) `dz[q, h, :]`:

    u[q, k]     = sum_h a[h, q, k] v[k, h]                 (d_head_v floats, in registers)
    r[q, k]     = relu(u[q, k])  (hyper_relu)  or u[q, k]  (hyper_linear)
    z[q, h]     = sum_k a[h, q, k] r[q, k]
backward:
    g[q, k]     = sum_h a[h, q, k] dz[q, h] * [u[q, k] > 0]      (d r, through the relu)
    da[h, q, k] = dz[q, h] . r[q, k] + g[q, k] . v[k, h]
    dv[k, h]   += sum_q a[h, q, k] g[q, k]

The batched-matrix-product kernels (`HyperValueNetwork.forward_tile` / `backward_tile`) write u, its
relu and their gradients out as `[key, query, d_head_v]` tensors; here each (q, k) pair's u lives in
registers, 8 of its d_head_v floats at a time (one AVX2 register).

The kernels (`kernels_hyper.h`) are the operators `latentcode::hyper_values` and
`latentcode::hyper_values_backward` of `latentcode.models.kernel_ops`; this module registers their
fake implementations and autograd formula (the blockwise path calls both directly). Where the
extension is not loaded, or the tensors are not float32 on the CPU with d_head_v a multiple of 8 and
at most `MAX_HEADS` heads, `available` says no and the value network uses its batched-product
kernels (the same numbers to float tolerance: tests/models/test_fused_hyper.py). `use_fused(False)`
turns it off (benchmarks/bench_long_sequences.py --hyla-kernel bmm).
"""

from __future__ import annotations

import torch
from torch import Tensor

from latentcode.models.kernel_ops import EXTENSION, Kernel, loaded, ops

MAX_HEADS = 16
CHUNK = 8  # floats of d_head_v per inner step: one AVX2 register
KEY_TILE = 64
"""Keys per tile inside the kernels: a tile's values (and their gradient) stay in a core's L2 cache
while each query of the block passes over them."""

KERNELS = Kernel("fused_hyper")
library = KERNELS.load  # `torch.ops.latentcode` where the kernels are loaded, else None (`build_failure()` says why)
build_failure = KERNELS.failure  # why the kernels are not loaded, or None
use_fused = KERNELS.switched  # use_fused(False): within the block, the hyper value networks take batched products


def available(values: Tensor) -> bool:
    """Whether the fused kernels compute these values `[batch, key, head, d_head_v]` (and latent codes
    of their dtype): float32 on the CPU, d_head_v a multiple of `CHUNK`, at most `MAX_HEADS` heads, no
    autocast to another dtype, and the extension loaded."""
    return (KERNELS.enabled and values.dtype == torch.float32 and values.device.type == "cpu"
            and values.shape[-1] % CHUNK == 0 and values.shape[-2] <= MAX_HEADS
            and not torch.is_autocast_enabled("cpu") and loaded())


def _value_layout(values: Tensor) -> Tensor:
    """`values` `[batch, key, head, d]` with each key's `[head, d]` contiguous (a tile of keys stays a view)."""
    if values.stride(3) != 1 or values.stride(2) != values.shape[3]:
        values = values.contiguous()
    return values


def forward(latent_codes: Tensor, values: Tensor, relu: bool) -> Tensor:
    """z `[batch, query, head, d]` of codes `[batch, head, query, key]` and values `[batch, key, head, d]`."""
    KERNELS.count()
    return ops().hyper_values(latent_codes.contiguous(), _value_layout(values), relu, KEY_TILE)


def backward(latent_codes: Tensor, values: Tensor, grad_z: Tensor, relu: bool) -> tuple[Tensor, Tensor]:
    """`(d codes, d values)` of `sum(forward(...) * grad_z)`."""
    return ops().hyper_values_backward(latent_codes.contiguous(), _value_layout(values), grad_z.contiguous(), relu,
                                       KEY_TILE)


def _fake(codes: Tensor, values: Tensor, relu: bool, key_tile: int) -> Tensor:
    batch, heads, queries, _ = codes.shape
    return codes.new_empty(batch, queries, heads, values.shape[3])


def _fake_backward(codes: Tensor, values: Tensor, grad_z: Tensor, relu: bool, key_tile: int):
    return codes.new_empty(codes.shape), values.new_empty(values.shape)


def _save_inputs(ctx, inputs, output) -> None:
    codes, values, relu, key_tile = inputs
    ctx.save_for_backward(codes, values)
    ctx.settings = relu, key_tile


def _gradient(ctx, grad_z: Tensor):
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError("the fused hyper value network is differentiable once: for a second derivative "
                           "(create_graph=True) turn it off with fused_hyper.use_fused(False)")
    codes, values = ctx.saved_tensors
    grad_codes, grad_values = torch.ops.latentcode.hyper_values_backward(codes, values, grad_z.contiguous(),
                                                                         *ctx.settings)
    return grad_codes, grad_values, None, None


def _register() -> None:
    torch.library.register_fake("latentcode::hyper_values", _fake)
    torch.library.register_fake("latentcode::hyper_values_backward", _fake_backward)
    torch.library.register_autograd("latentcode::hyper_values", _gradient, setup_context=_save_inputs)


EXTENSION.on_load(_register)
