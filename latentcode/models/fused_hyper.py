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
relu and their gradients out as `[key, query, d_head_v]` tensors, about ten passes over T^2 d_head_v
floats per layer; a product with 4 heads as its inner dimension also runs far below a core's speed.
Here each (q, k) pair's u lives in registers, one chunk of 8 of its d_head_v floats at a time
(one AVX2 register; the compiler vectorizes the fixed-width loops).

Built once per machine with the system C compiler (`latentcode.models.c_kernels`: `cc -O3
-march=native` into the kernel cache, loaded with ctypes). Where there is no compiler, the build fails,
or the tensors are not float32 on the CPU with d_head_v a multiple of 8 and at most `MAX_HEADS` heads,
`available` says no and the value network uses its batched-product kernels (the same numbers to
float tolerance: tests/models/test_fused_hyper.py). `use_fused(False)` turns it off (for before /
after measurements: benchmarks/bench_long_sequences.py --hyla-kernel bmm).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from latentcode.models.c_kernels import CompiledLibrary

MAX_HEADS = 16
CHUNK = 8  # floats of d_head_v per inner step: one AVX2 register
KEY_TILE = 64
"""Keys per tile inside the kernels: a tile's values (and their gradient) stay in a core's L2 cache
while each query of the block passes over them."""

SOURCE = r"""
#define CHUNK 8
#define MAX_HEADS 16
/* GCC / Clang vector extensions: one AVX2 register (or two SSE ones); aligned(4) makes loads unaligned. */
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32), aligned(4)));

static inline v8 load(const float *p) { return *(const v8 *)p; }
static inline void store(float *p, v8 x) { *(v8 *)p = x; }
static inline v8 splat(float x) { v8 r = {x, x, x, x, x, x, x, x}; return r; }
static inline v8i positive(v8 x) { return x > splat(0.0f); }
static inline v8 keep(v8 x, v8i mask) { return (v8)((v8i)x & mask); }
static inline float lanes_sum(v8 x) {
    return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

/* codes [B, H, Q, N] contiguous; values: v[b, k, h, d] at values[b * vb + k * vk + h * D + d];
   z [B, Q, H, D] contiguous, overwritten. Keys in tiles of KT, so that a tile's values stay in
   cache while every query of the block reads them. */
static inline __attribute__((always_inline)) void forward_impl(
    const float *restrict codes, const float *restrict values, long vb, long vk, float *restrict z,
    long B, const long H, long Q, long N, long D, long KT, const int relu)
{
    for (long b = 0; b < B; b++) {
        for (long k0 = 0; k0 < N; k0 += KT) {
            const long k1 = k0 + KT < N ? k0 + KT : N;
            for (long q = 0; q < Q; q++) {
                const float *aq = codes + b * H * Q * N + q * N;
                float *zq = z + (b * Q + q) * H * D;
                for (long c = 0; c < D; c += CHUNK) {
                    v8 acc[MAX_HEADS];
                    for (long h = 0; h < H; h++) acc[h] = k0 == 0 ? splat(0.0f) : load(zq + h * D + c);
                    for (long k = k0; k < k1; k++) {
                        const float *vkc = values + b * vb + k * vk + c;
                        float a[MAX_HEADS];
                        v8 u = splat(0.0f);
                        for (long h = 0; h < H; h++) {
                            a[h] = aq[h * Q * N + k];
                            u += a[h] * load(vkc + h * D);
                        }
                        if (relu) u = keep(u, positive(u));
                        for (long h = 0; h < H; h++) acc[h] += a[h] * u;
                    }
                    for (long h = 0; h < H; h++) store(zq + h * D + c, acc[h]);
                }
            }
        }
    }
}

/* grad_z [B, Q, H, D] contiguous; grad_codes [B, H, Q, N] contiguous, overwritten;
   grad_values like values (strides gvb, gvk), added to. Keys in tiles of KT, as in the forward. */
static inline __attribute__((always_inline)) void backward_impl(
    const float *restrict codes, const float *restrict values, long vb, long vk, const float *restrict grad_z,
    float *restrict grad_codes, float *restrict grad_values, long gvb, long gvk,
    long B, const long H, long Q, long N, long D, long KT, const int relu)
{
    for (long b = 0; b < B; b++) {
        for (long k0 = 0; k0 < N; k0 += KT) {
            const long k1 = k0 + KT < N ? k0 + KT : N;
            for (long q = 0; q < Q; q++) {
                const float *aq = codes + b * H * Q * N + q * N;
                float *daq = grad_codes + b * H * Q * N + q * N;
                const float *dzq = grad_z + (b * Q + q) * H * D;
                for (long k = k0; k < k1; k++) {
                    const float *vk_ = values + b * vb + k * vk;
                    float *dvk = grad_values + b * gvb + k * gvk;
                    float a[MAX_HEADS];
                    v8 dacc[MAX_HEADS];
                    for (long h = 0; h < H; h++) {
                        a[h] = aq[h * Q * N + k];
                        dacc[h] = splat(0.0f);
                    }
                    for (long c = 0; c < D; c += CHUNK) {
                        v8 u = splat(0.0f), g = splat(0.0f);
                        for (long h = 0; h < H; h++) {
                            u += a[h] * load(vk_ + h * D + c);
                            g += a[h] * load(dzq + h * D + c);
                        }
                        if (relu) {
                            v8i mask = positive(u);
                            u = keep(u, mask);
                            g = keep(g, mask);
                        }
                        for (long h = 0; h < H; h++) {
                            dacc[h] += load(dzq + h * D + c) * u + g * load(vk_ + h * D + c);
                            store(dvk + h * D + c, load(dvk + h * D + c) + a[h] * g);
                        }
                    }
                    for (long h = 0; h < H; h++) daq[h * Q * N + k] = lanes_sum(dacc[h]);
                }
            }
        }
    }
}

/* Constant head counts let the compiler unroll the head loops and keep the accumulators in registers. */
#define DISPATCH(IMPL, RELU, ...) \
    switch (H) { \
    case 4: IMPL(__VA_ARGS__, 4, Q, N, D, KT, RELU); break; \
    case 8: IMPL(__VA_ARGS__, 8, Q, N, D, KT, RELU); break; \
    default: IMPL(__VA_ARGS__, H, Q, N, D, KT, RELU); }

void hyper_forward(const float *codes, const float *values, long vb, long vk, float *z,
                   long B, long H, long Q, long N, long D, long KT, int relu)
{
    if (relu) { DISPATCH(forward_impl, 1, codes, values, vb, vk, z, B) }
    else { DISPATCH(forward_impl, 0, codes, values, vb, vk, z, B) }
}

void hyper_backward(const float *codes, const float *values, long vb, long vk, const float *grad_z,
                    float *grad_codes, float *grad_values, long gvb, long gvk,
                    long B, long H, long Q, long N, long D, long KT, int relu)
{
    if (relu) { DISPATCH(backward_impl, 1, codes, values, vb, vk, grad_z, grad_codes, grad_values, gvb, gvk, B) }
    else { DISPATCH(backward_impl, 0, codes, values, vb, vk, grad_z, grad_codes, grad_values, gvb, gvk, B) }
}
"""

COMPILE_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC")



def _declare(library: ctypes.CDLL) -> None:
    long, pointer = ctypes.c_long, ctypes.c_void_p
    library.hyper_forward.argtypes = [pointer, pointer, long, long, pointer, *[long] * 6, ctypes.c_int]
    library.hyper_backward.argtypes = [pointer, pointer, long, long, pointer, pointer, pointer, long, long,
                                       *[long] * 6, ctypes.c_int]
    library.hyper_forward.restype = library.hyper_backward.restype = None


KERNELS = CompiledLibrary("fused_hyper", SOURCE, COMPILE_FLAGS, _declare)


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None where they cannot be built (`build_failure()` says why)."""
    return KERNELS.load()


def build_failure() -> str | None:
    """Why the kernels could not be built, or None."""
    return KERNELS.failure()


def use_fused(enabled: bool):
    """Within the block, the hyper value networks use the fused kernels (True) or the batched-product
    ones (False)."""
    return KERNELS.switched(enabled)


def available(values: Tensor) -> bool:
    """Whether the fused kernels compute these values `[batch, key, head, d_head_v]` (and latent codes
    of their dtype): float32 on the CPU, d_head_v a multiple of `CHUNK`, at most `MAX_HEADS` heads, no
    autocast to another dtype, and the library built."""
    return (
        KERNELS.enabled and values.dtype == torch.float32 and values.device.type == "cpu"
        and values.shape[-1] % CHUNK == 0 and values.shape[-2] <= MAX_HEADS
        and not torch.is_autocast_enabled("cpu") and library() is not None
    )


def _value_strides(values: Tensor) -> tuple[Tensor, int, int]:
    """`values` `[batch, key, head, d]` with each key's `[head, d]` contiguous, and its batch and key strides."""
    if values.stride(3) != 1 or values.stride(2) != values.shape[3]:
        values = values.contiguous()
    return values, values.stride(0), values.stride(1)


def forward(latent_codes: Tensor, values: Tensor, relu: bool) -> Tensor:
    """z `[batch, query, head, d]` of codes `[batch, head, query, key]` and values `[batch, key, head, d]`."""
    batch, heads, queries, keys = latent_codes.shape
    codes = latent_codes.contiguous()
    values, value_batch_stride, value_key_stride = _value_strides(values)
    z = codes.new_empty(batch, queries, heads, values.shape[3])
    KERNELS.calls += 1
    library().hyper_forward(codes.data_ptr(), values.data_ptr(), value_batch_stride, value_key_stride, z.data_ptr(),
                            batch, heads, queries, keys, values.shape[3], KEY_TILE, int(relu))
    return z


def backward(latent_codes: Tensor, values: Tensor, grad_z: Tensor, relu: bool,
             grad_values: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`(d codes, d values)` of `sum(forward(...) * grad_z)`; the values' gradient is added to
    `grad_values` (a view of shape `values.shape` whose `[head, d]` per key is contiguous) where given."""
    batch, heads, queries, keys = latent_codes.shape
    codes = latent_codes.contiguous()
    values, value_batch_stride, value_key_stride = _value_strides(values)
    grad_z = grad_z.contiguous()
    if grad_values is None or grad_values.stride(3) != 1 or grad_values.stride(2) != grad_values.shape[3]:
        target = torch.zeros_like(values)
    else:
        target = grad_values
    grad_codes = codes.new_empty(codes.shape)
    library().hyper_backward(codes.data_ptr(), values.data_ptr(), value_batch_stride, value_key_stride,
                             grad_z.data_ptr(), grad_codes.data_ptr(), target.data_ptr(), target.stride(0),
                             target.stride(1), batch, heads, queries, keys, values.shape[3], KEY_TILE, int(relu))
    if grad_values is not None and target is not grad_values:
        grad_values += target
    return grad_codes, grad_values if grad_values is not None else target
