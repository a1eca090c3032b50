"""The attention of short sequences in training, from queries to z, in one C kernel per batch element.

For one batch element, with queries already scaled by 1 / sqrt(d_head), the kernel computes what the
full path of `latentcode.models.attention` computes, one query row at a time:

    s[h, k]   = q[q, h] . k[k, h] + position_bias[h, q, k]          (masked pairs: see sigma)
    a[h, k]   = sigma(s)                                              softmax over k, identity, rms over h,
                                                                      or softmax then rms
    ad[h, k]  = a[h, k] keep[q, k]                                    the dropout mask of the pass
    z[q, h]   = sum_k ad[h, k] v[k, h]                                linear value network
    z[q, h]   = sum_k ad[h, k] r[k],  r[k] = relu(sum_h ad[h, k] v[k, h])   hyper_relu (HYLA;
                                                                      hyper_linear without the relu)

It writes z and nothing else: the backward computes each row's codes again (cheaper than writing a
`[batch, head, query, key]` tensor out and reading it back) and applies the chain rule of the same
formulas row by row, adding into the keys', values' and position bias's gradients. The full path
writes and reads about fifteen such tensors per layer and step (benchmarks/bench_model_step.py,
modes eager and full).

Training only: evaluation keeps the full path that trained the shipped checkpoints, so their results
are reproduced bit for bit; this path gives the same numbers to float tolerance
(tests/models/test_fused_short.py). `latentcode.models.path_policy` says when it is chosen.

The kernels (`kernels_short.h`) are the operators `latentcode::short_attention` and
`latentcode::short_attention_backward` of `latentcode.models.kernel_ops`; this module registers their
fake implementations and autograd formula. Every loop over keys runs over whole 8-float vectors of
rows padded with masked keys. The shapes of the paper's training batches (SRAVEN's T=36 with 16
heads of 4, fuzzy logic's T=32 with 8 heads of 2) run a copy compiled for them (`shaped=False` takes
the generic one). The batch is split over `torch.get_num_threads()` OpenMP threads, each part with
its own position-bias gradient, added in a fixed order: the same numbers for the same threads.
"""

from __future__ import annotations

import torch
from torch import Tensor

from latentcode.models.kernel_ops import EXTENSION, Kernel, loaded, ops

SOFTMAX, RMS = 1, 2
"""Bits of a sigma's kernel code: softmax over keys, then rms over heads (identity: 0)."""
LINEAR, HYPER_LINEAR, HYPER_RELU = 0, 1, 2
"""Value networks' kernel codes."""
MAX_POSITIONS = 256
"""The kernel keeps a query row of every head on the stack-sized scratch; longer sequences take other paths."""

KERNELS = Kernel("fused_short")
use_fused = KERNELS.switched  # use_fused(False): within the block, training takes the full path


def why_not(like: Tensor, n_positions: int) -> str | None:
    """Why the kernel cannot compute a layer whose parameters are like `like` over `n_positions`
    positions now, or None if it can."""
    if not KERNELS.enabled:
        return "turned off (fused_short.use_fused(False))"
    if like.dtype != torch.float32 or like.device.type != "cpu":
        return f"its kernel computes float32 on the CPU, this layer is {like.dtype} on {like.device.type}"
    if torch.is_autocast_enabled("cpu"):
        return "CPU autocast is on (its kernel computes float32)"
    if n_positions > MAX_POSITIONS:
        return f"its kernel takes at most {MAX_POSITIONS} positions, this pass has {n_positions}"
    if not loaded():
        return f"its kernels are not loaded: {KERNELS.failure()}"
    return None


def short_attention(queries: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, allowed: Tensor | None,
                    keep: Tensor | None, sigma: int, network: int, eps: float, shaped: bool = True) -> Tensor:
    """z `[batch, query, head, d_head_v]` from scaled queries and keys `[batch, pos, head, d_head]`, values
    `[batch, pos, head, d_head_v]`, the position bias `[head, query, key]` (or None), the allowed pairs
    (bool `[query, key]` or None) and the dropout mask (`[..., query, key]` or None); `sigma` and `network`
    are kernel codes (module docstring). Differentiable once, in the queries, keys, values and bias (a
    second derivative, `create_graph=True`, is refused)."""
    n_positions = queries.shape[1]
    KERNELS.count()
    return ops().short_attention(
        queries.contiguous(), keys.contiguous(), values.contiguous(), None if bias is None else bias.contiguous(),
        None if allowed is None else allowed.contiguous(),
        None if keep is None else keep.reshape(n_positions, n_positions).contiguous(), sigma, network, eps, shaped)


def _fake(queries, keys, values, bias, allowed, keep, sigma, network, eps, shaped=True):
    return queries.new_empty(*queries.shape[:3], values.shape[3])


def _fake_backward(queries, keys, values, bias, allowed, keep, grad_z, sigma, network, eps, bias_gradient,
                   shaped=True):
    grad_bias = bias.new_empty(bias.shape) if bias is not None and bias_gradient else queries.new_empty(0)
    return queries.new_empty(queries.shape), keys.new_empty(keys.shape), values.new_empty(values.shape), grad_bias


def _save_inputs(ctx, inputs, output) -> None:
    queries, keys, values, bias, allowed, keep, sigma, network, eps, shaped = inputs
    ctx.save_for_backward(queries, keys, values, bias, allowed, keep)
    ctx.codes = sigma, network, eps, shaped


def _gradient(ctx, grad_z: Tensor):
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError("the fused attention of training is differentiable once: for a second derivative "
                           "(create_graph=True) turn it off with fused_short.use_fused(False)")
    queries, keys, values, bias, allowed, keep = ctx.saved_tensors
    sigma, network, eps, shaped = ctx.codes
    bias_gradient = bias is not None and ctx.needs_input_grad[3]
    grad_q, grad_k, grad_v, grad_bias = torch.ops.latentcode.short_attention_backward(
        queries, keys, values, bias, allowed, keep, grad_z.contiguous(), sigma, network, eps, bias_gradient, shaped)
    return grad_q, grad_k, grad_v, grad_bias if bias_gradient else None, None, None, None, None, None, None


def _register() -> None:
    torch.library.register_fake("latentcode::short_attention", _fake)
    torch.library.register_fake("latentcode::short_attention_backward", _fake_backward)
    torch.library.register_autograd("latentcode::short_attention", _gradient, setup_context=_save_inputs)


EXTENSION.on_load(_register)
