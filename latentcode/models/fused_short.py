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
`[batch, head, query, key]` tensor out and reading it back, and nothing of that size is held between
forward and backward), then applies the chain rule of the same formulas row by row and adds into the
keys', values' and position bias's gradients. The full path writes and reads about fifteen such
tensors per layer and step (scores, bias sum, softmax, dropout, the batched products that run far
below a core's speed with 2 or 4 as their inner dimension, and their gradients), which took about
half of a SRAVEN training step (benchmarks/bench_model_step.py, modes eager and full).

Why training only: the shipped checkpoints were trained through the full path, and evaluation keeps
it, so the shipped results are reproduced bit for bit; this path gives the same numbers to float
tolerance (tests/models/test_fused_short.py) and is chosen by `latentcode.models.path_policy` only
in training mode, below `AUTO_MIN_POSITIONS` positions, with no hook that reads scores, codes or the
value network's activations, float32 on the CPU, a sigma and a value network that declare a kernel
code (`ScoreNormalization.fused_code`, `ValueNetwork.fused_code`), and the library built
(`latentcode.models.c_kernels`; without a compiler the full path runs).

Every loop over keys runs over whole 8-float vectors (GCC/Clang vector extensions: AVX2 with
`-march=native`) of rows padded with masked keys. Passes of a training batch's size use a library
compiled for their shape (`library_for`), whose loops the compiler unrolls.

Threads: the batch is split over `torch.get_num_threads()` threads, torch's own OpenMP threads where
the library is built with OpenMP (`latentcode.models.c_kernels`), else a Python pool (ctypes releases
the GIL); each part has its own position-bias gradient, added in a fixed order: the same numbers for
the same number of threads.
"""

from __future__ import annotations

import ctypes
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from latentcode.models.c_kernels import CompiledLibrary, run_in_threads, uses_openmp

SOFTMAX, RMS = 1, 2
"""Bits of a sigma's kernel code: softmax over keys, then rms over heads (identity: 0)."""
LINEAR, HYPER_LINEAR, HYPER_RELU = 0, 1, 2
"""Value networks' kernel codes."""
MAX_POSITIONS = 256
"""The kernel keeps a query row of every head on the stack-sized scratch; longer sequences take other paths."""

SOURCE = Path(__file__).with_name("fused_short.c").read_text()
"""The kernels' C source (`fused_short.c`, beside this file)."""

COMPILE_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-shared", "-fPIC")
"""No `-ffast-math` or `-fassociative-math`: the exponential's rounding step (adding and subtracting
1.5 * 2^23) must stay as written; the sums over keys are written as vectors already."""


def _declare(library: ctypes.CDLL) -> None:
    pointer, long, integer, single = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
    library.short_forward.argtypes = [*[pointer] * 7, *[long] * 6, integer, integer, single]
    library.short_backward.argtypes = [*[pointer] * 11, *[long] * 6, integer, integer, single]
    library.short_forward.restype = library.short_backward.restype = None
    library.short_forward_parts.argtypes = [*[pointer] * 7, *[long] * 6, integer, integer, single]
    library.short_backward_parts.argtypes = [*[pointer] * 11, *[long] * 6, integer, integer, single]
    library.short_forward_parts.restype = library.short_backward_parts.restype = None


KERNELS = CompiledLibrary("fused_short", SOURCE, COMPILE_FLAGS, _declare, openmp=True)
"""The generic library: any shape, its sizes as arguments."""
SHAPED_MIN_ENTRIES = 2**19
"""Passes with at least this many (batch, head, query, key) entries (a training batch of the paper's models:
SRAVEN 2.7M, fuzzy logic 1.0M) use a library built for their shape (`FIXED_*` in the source: about a second
to build, once per machine and shape, then read from the cache); smaller ones take the generic library."""
_shaped: dict[tuple[int, int, int, int], CompiledLibrary] = {}


def use_fused(enabled: bool):
    """Within the block, training takes this path where it can (True) or the full path (False): for
    before / after measurements (benchmarks/bench_model_step.py --modes)."""
    return KERNELS.switched(enabled)


def why_not(like: Tensor, n_positions: int) -> str | None:
    """Why the kernel cannot compute a layer whose parameters are like `like` over `n_positions`
    positions now, or None if it can."""
    if not KERNELS.enabled:
        return "turned off (fused_short.use_fused(False))"
    if like.dtype != torch.float32 or like.device.type != "cpu":
        return f"its kernel computes float32 on the CPU, this layer is {like.dtype} on {like.device.type}"
    if torch.compiler.is_compiling():
        return "torch.compile is tracing the model (the C kernel is opaque to it)"
    if torch.is_autocast_enabled("cpu"):
        return "CPU autocast is on (its kernel computes float32)"
    if n_positions > MAX_POSITIONS:
        return f"its kernel takes at most {MAX_POSITIONS} positions, this pass has {n_positions}"
    if KERNELS.load() is None:
        return f"its C kernels could not be built: {KERNELS.failure()}"
    return None


def _in_threads(library: ctypes.CDLL, kernel_name: str, batch: int, before: list, after: list) -> None:
    """`kernel(*before, b0, b1, *after)` for the batch elements b0:b1 of each of `torch.get_num_threads()`
    parts, in parallel: on torch's OpenMP threads (`kernel_parts`) where the library has OpenMP, else
    over the Python pool. An entry of `before` may be a function of the part's index (its own buffer:
    part i's is part 0's plus i buffers, as `kernel_parts` takes it)."""
    parts = max(1, min(torch.get_num_threads(), batch))
    if parts > 1 and uses_openmp(library):
        getattr(library, kernel_name + "_parts")(*[entry(0) if callable(entry) else entry for entry in before],
                                                 batch, parts, *after)
        return
    kernel = getattr(library, kernel_name)
    bounds = [batch * i // parts for i in range(parts + 1)]
    run_in_threads([partial(kernel, *[entry(i) if callable(entry) else entry for entry in before], bounds[i],
                            bounds[i + 1], *after) for i in range(parts)])


def library_for(batch: int, n_positions: int, n_heads: int, d_head: int, d_head_v: int) -> ctypes.CDLL:
    """The library for a pass of this shape (`SHAPED_MIN_ENTRIES`); the generic one where a shaped one
    cannot be built. Both compute the same sums in the same order; the compiler may contract them into
    multiply-adds differently, so they agree to float32 rounding."""
    generic = KERNELS.load()
    if batch * n_heads * n_positions**2 < SHAPED_MIN_ENTRIES:
        return generic
    shape = (n_positions, n_heads, d_head, d_head_v)
    if shape not in _shaped:
        defines = "".join(f"#define FIXED_{name} {size}\n" for name, size in zip("THDE", shape, strict=True))
        name = "fused_short-" + "-".join(f"{axis}{size}" for axis, size in zip("THDE", shape, strict=True))
        _shaped[shape] = CompiledLibrary(name, defines + SOURCE, COMPILE_FLAGS, _declare, openmp=True)
    return _shaped[shape].load() or generic


def _pointer(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


class FusedShortAttention(torch.autograd.Function):
    """z `[batch, query, head, d_head_v]` from scaled queries and keys `[batch, pos, head, d_head]`, values
    `[batch, pos, head, d_head_v]`, the position bias `[head, query, key]` (or None), the allowed pairs
    (bool `[query, key]` or None) and the dropout mask (`[query, key]` or None); `sigma` and `network`
    are kernel codes (module docstring). Differentiable once, in the queries, keys, values and bias: a
    backward that would build a graph (`create_graph=True`) is refused, never computed as if the
    gradient did not depend on the inputs (what torch's `once_differentiable` does where the incoming
    gradient needs no graph of its own)."""

    @staticmethod
    def forward(ctx, queries, keys, values, bias, allowed, keep, sigma: int, network: int, eps: float):
        queries, keys, values = queries.contiguous(), keys.contiguous(), values.contiguous()
        batch, n_positions, n_heads, d_head = queries.shape
        d_head_v = values.shape[-1]
        bias = None if bias is None else bias.contiguous()
        allowed = None if allowed is None else allowed.contiguous().view(torch.uint8)
        keep = None if keep is None else keep.reshape(n_positions, n_positions).contiguous()
        z = queries.new_empty(batch, n_positions, n_heads, d_head_v)
        KERNELS.calls += 1
        library = library_for(batch, n_positions, n_heads, d_head, d_head_v)
        _in_threads(library, "short_forward", batch,
                    [queries.data_ptr(), keys.data_ptr(), values.data_ptr(), _pointer(bias), _pointer(allowed),
                     _pointer(keep), z.data_ptr()],
                    [n_positions, n_heads, d_head, d_head_v, sigma, network, eps])
        ctx.save_for_backward(queries, keys, values, bias, allowed, keep)
        ctx.sigma, ctx.network, ctx.eps = sigma, network, eps
        return z

    @staticmethod
    def backward(ctx, grad_z):
        if torch.is_grad_enabled():
            raise RuntimeError("the fused attention of training is differentiable once: for a second derivative "
                               "(create_graph=True) turn it off with fused_short.use_fused(False)")
        queries, keys, values, bias, allowed, keep = ctx.saved_tensors
        batch, n_positions, n_heads, d_head = queries.shape
        grad_z = grad_z.contiguous()
        grad_q, grad_k, grad_v = (torch.empty_like(x) for x in (queries, keys, values))
        parts = max(1, min(torch.get_num_threads(), batch))
        grad_bias = None
        if bias is not None and ctx.needs_input_grad[3]:
            grad_bias = queries.new_zeros(parts, *bias.shape)
        library = library_for(batch, n_positions, n_heads, d_head, values.shape[-1])
        _in_threads(library, "short_backward", batch,
                    [queries.data_ptr(), keys.data_ptr(), values.data_ptr(), _pointer(bias), _pointer(allowed),
                     _pointer(keep), grad_z.data_ptr(), grad_q.data_ptr(), grad_k.data_ptr(), grad_v.data_ptr(),
                     (lambda i: None) if grad_bias is None else (lambda i: grad_bias[i].data_ptr())],
                    [n_positions, n_heads, d_head, values.shape[-1], ctx.sigma, ctx.network, ctx.eps])
        if grad_bias is not None:
            grad_bias = grad_bias.sum(dim=0)
        return grad_q, grad_k, grad_v, grad_bias, None, None, None, None, None
