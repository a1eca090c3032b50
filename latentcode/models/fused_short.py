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

It writes z and the codes a `[batch, head, query, key]` (and for rms the inverse rms `[batch, query,
key]`), which the backward reads instead of recomputing the exponentials; the backward applies the
chain rule of the same formulas row by row and adds into the keys', values' and position bias's
gradients. Nothing `[batch, head, query, key]` but the codes is written: the full path writes and
reads about fifteen such tensors per layer and step (scores, bias sum, softmax, dropout, the batched
products that run far below a core's speed with 2 or 4 as their inner dimension, and their
gradients), which took about half of a SRAVEN training step (benchmarks/bench_model_step.py).

Why training only: the shipped checkpoints were trained through the full path, and evaluation keeps
it, so the shipped results are reproduced bit for bit; this path gives the same numbers to float
tolerance (tests/models/test_fused_short.py) and is chosen by `latentcode.models.path_policy` only
in training mode, below `AUTO_MIN_POSITIONS` positions, with no hook that reads scores, codes or the
value network's activations, float32 on the CPU, a sigma and a value network that declare a kernel
code (`ScoreNormalization.fused_code`, `ValueNetwork.fused_code`), and the library built
(`latentcode.models.c_kernels`; without a compiler the full path runs).

Threads: the batch is split over `torch.get_num_threads()` threads (ctypes releases the GIL), each
with its own position-bias gradient, added in a fixed order: the same numbers for the same number of
threads.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from latentcode.models.c_kernels import CompiledLibrary

SOFTMAX, RMS = 1, 2
"""Bits of a sigma's kernel code: softmax over keys, then rms over heads (identity: 0)."""
LINEAR, HYPER_LINEAR, HYPER_RELU = 0, 1, 2
"""Value networks' kernel codes."""
MAX_POSITIONS = 256
"""The kernel keeps a query row of every head on the stack-sized scratch; longer sequences take other paths."""

SOURCE = r"""
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SOFTMAX 1
#define RMS 2
#define LINEAR 0
#define HYPER_LINEAR 1
#define HYPER_RELU 2

/* exp for x <= 0 (softmax after subtracting the row's maximum): Cephes' expf polynomial, branch-free so
   that the loops calling it vectorize; relative error about 1e-7. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int bits = ((int)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static float *scratch(long n) { return (float *)calloc((size_t)n, sizeof(float)); }

/* x [B, T, H, W] of batch element b -> xT [H][W][Tp] (keys along the last axis, zero padded). */
static void by_head(const float *x, long b, long T, long H, long W, long Tp, float *xT) {
    const float *xb = x + b * T * H * W;
    for (long t = 0; t < T; t++)
        for (long h = 0; h < H; h++)
            for (long w = 0; w < W; w++) xT[(h * W + w) * Tp + t] = xb[(t * H + h) * W + w];
}

static void add_back(const float *xT, long b, long T, long H, long W, long Tp, float *x) {
    float *xb = x + b * T * H * W;
    for (long t = 0; t < T; t++)
        for (long h = 0; h < H; h++)
            for (long w = 0; w < W; w++) xb[(t * H + h) * W + w] = xT[(h * W + w) * Tp + t];
}

/* ok[k] = 1 for a key query t may see, 0 for a masked or padding key. */
static void valid_keys(const unsigned char *allowed, long t, long T, long Tp, float *ok) {
    for (long k = 0; k < Tp; k++) ok[k] = (k < T && (!allowed || allowed[t * T + k])) ? 1.0f : 0.0f;
}

/* s [H][Tp] <- sigma(q . k + bias) of query t; inverse rms [Tp] where sigma has RMS. */
static void codes_of_row(const float *qt, const float *kT, const float *bias, const float *ok, long t,
                         long T, long H, long D, long Tp, int sigma, float eps, float *s, float *inverse_rms) {
    for (long h = 0; h < H; h++) {
        float *sh = s + h * Tp;
        for (long k = 0; k < Tp; k++) sh[k] = 0.0f;
        for (long d = 0; d < D; d++) {
            const float qd = qt[h * D + d], *kd = kT + (h * D + d) * Tp;
            for (long k = 0; k < Tp; k++) sh[k] += qd * kd[k];
        }
        if (bias) {
            const float *bh = bias + (h * T + t) * T;
            for (long k = 0; k < T; k++) sh[k] += bh[k];
        }
        if (sigma & SOFTMAX) {
            float m = -3.0e38f, total = 0.0f;
            for (long k = 0; k < Tp; k++) m = (ok[k] != 0.0f && sh[k] > m) ? sh[k] : m;
            for (long k = 0; k < Tp; k++) {
                float e = exp_nonpositive(sh[k] - m);
                sh[k] = ok[k] != 0.0f ? e : 0.0f;
                total += sh[k];
            }
            const float inverse = 1.0f / total;
            for (long k = 0; k < Tp; k++) sh[k] *= inverse;
        } else {
            for (long k = 0; k < Tp; k++) sh[k] = ok[k] != 0.0f ? sh[k] : 0.0f;
        }
    }
    if (sigma & RMS) {
        for (long k = 0; k < Tp; k++) inverse_rms[k] = 0.0f;
        for (long h = 0; h < H; h++)
            for (long k = 0; k < Tp; k++) inverse_rms[k] += s[h * Tp + k] * s[h * Tp + k];
        for (long k = 0; k < Tp; k++) inverse_rms[k] = 1.0f / sqrtf(inverse_rms[k] / (float)H + eps);
        for (long h = 0; h < H; h++)
            for (long k = 0; k < Tp; k++) s[h * Tp + k] *= inverse_rms[k];
    }
}

/* u [E][Tp] <- sum_h ad[h][k] vT[h][e][k]; r = relu(u) where asked (in place). */
static void hidden_of_row(const float *ad, const float *vT, long H, long E, long Tp, float *u) {
    for (long e = 0; e < E; e++) {
        float *ue = u + e * Tp;
        for (long k = 0; k < Tp; k++) ue[k] = 0.0f;
        for (long h = 0; h < H; h++) {
            const float *a = ad + h * Tp, *ve = vT + (h * E + e) * Tp;
            for (long k = 0; k < Tp; k++) ue[k] += a[k] * ve[k];
        }
    }
}

void short_forward(const float *q, const float *kk, const float *v, const float *bias,
                   const unsigned char *allowed, const float *keep, float *z, float *codes, float *inverse_rms,
                   long b0, long b1, long T, long H, long D, long E, int sigma, int network, float eps) {
    const long Tp = (T + 7) / 8 * 8;
    float *kT = scratch(H * D * Tp), *vT = scratch(H * E * Tp), *s = scratch(H * Tp), *ad = scratch(H * Tp);
    float *u = scratch(E * Tp), *r = scratch(E * Tp), *ok = scratch(Tp), *irms = scratch(Tp);
    for (long b = b0; b < b1; b++) {
        by_head(kk, b, T, H, D, Tp, kT);
        by_head(v, b, T, H, E, Tp, vT);
        for (long t = 0; t < T; t++) {
            const float *qt = q + (b * T + t) * H * D;
            valid_keys(allowed, t, T, Tp, ok);
            codes_of_row(qt, kT, bias, ok, t, T, H, D, Tp, sigma, eps, s, irms);
            if (sigma & RMS)
                for (long k = 0; k < T; k++) inverse_rms[(b * T + t) * T + k] = irms[k];
            for (long h = 0; h < H; h++) {
                float *out = codes + ((b * H + h) * T + t) * T;
                const float *sh = s + h * Tp, *keep_row = keep ? keep + t * T : 0;
                for (long k = 0; k < T; k++) out[k] = sh[k];
                for (long k = 0; k < T; k++) ad[h * Tp + k] = keep_row ? sh[k] * keep_row[k] : sh[k];
            }
            float *zt = z + (b * T + t) * H * E;
            if (network == LINEAR) {
                for (long h = 0; h < H; h++)
                    for (long e = 0; e < E; e++) {
                        const float *a = ad + h * Tp, *ve = vT + (h * E + e) * Tp;
                        float total = 0.0f;
                        for (long k = 0; k < Tp; k++) total += a[k] * ve[k];
                        zt[h * E + e] = total;
                    }
            } else {
                hidden_of_row(ad, vT, H, E, Tp, u);
                for (long i = 0; i < E * Tp; i++) r[i] = (network == HYPER_RELU && u[i] < 0.0f) ? 0.0f : u[i];
                for (long h = 0; h < H; h++)
                    for (long e = 0; e < E; e++) {
                        const float *a = ad + h * Tp, *re = r + e * Tp;
                        float total = 0.0f;
                        for (long k = 0; k < Tp; k++) total += a[k] * re[k];
                        zt[h * E + e] = total;
                    }
            }
        }
    }
    free(kT); free(vT); free(s); free(ad); free(u); free(r); free(ok); free(irms);
}

void short_backward(const float *q, const float *kk, const float *v, const unsigned char *allowed,
                    const float *keep, const float *codes, const float *inverse_rms, const float *grad_z,
                    float *grad_q, float *grad_k, float *grad_v, float *grad_bias,
                    long b0, long b1, long T, long H, long D, long E, int sigma, int network) {
    const long Tp = (T + 7) / 8 * 8;
    float *kT = scratch(H * D * Tp), *vT = scratch(H * E * Tp), *dkT = scratch(H * D * Tp);
    float *dvT = scratch(H * E * Tp), *a = scratch(H * Tp), *ad = scratch(H * Tp), *g = scratch(H * Tp);
    float *u = scratch(E * Tp), *r = scratch(E * Tp), *gr = scratch(E * Tp), *ok = scratch(Tp);
    float *along = scratch(Tp), *irms = scratch(Tp);
    for (long b = b0; b < b1; b++) {
        by_head(kk, b, T, H, D, Tp, kT);
        by_head(v, b, T, H, E, Tp, vT);
        memset(dkT, 0, sizeof(float) * H * D * Tp);
        memset(dvT, 0, sizeof(float) * H * E * Tp);
        for (long t = 0; t < T; t++) {
            const float *qt = q + (b * T + t) * H * D, *dzt = grad_z + (b * T + t) * H * E;
            const float *keep_row = keep ? keep + t * T : 0;
            valid_keys(allowed, t, T, Tp, ok);
            for (long h = 0; h < H; h++) {
                const float *row = codes + ((b * H + h) * T + t) * T;
                for (long k = 0; k < T; k++) a[h * Tp + k] = row[k];
                for (long k = 0; k < T; k++) ad[h * Tp + k] = keep_row ? row[k] * keep_row[k] : row[k];
            }
            /* g = d loss / d ad */
            if (network == LINEAR) {
                for (long h = 0; h < H; h++) {
                    float *gh = g + h * Tp;
                    const float *ah = ad + h * Tp;
                    for (long k = 0; k < Tp; k++) gh[k] = 0.0f;
                    for (long e = 0; e < E; e++) {
                        const float dz = dzt[h * E + e], *ve = vT + (h * E + e) * Tp;
                        float *dve = dvT + (h * E + e) * Tp;
                        for (long k = 0; k < Tp; k++) { gh[k] += dz * ve[k]; dve[k] += ah[k] * dz; }
                    }
                }
            } else {
                hidden_of_row(ad, vT, H, E, Tp, u);
                for (long i = 0; i < E * Tp; i++) r[i] = (network == HYPER_RELU && u[i] < 0.0f) ? 0.0f : u[i];
                for (long i = 0; i < E * Tp; i++) gr[i] = 0.0f;
                for (long h = 0; h < H; h++)
                    for (long e = 0; e < E; e++) {
                        const float dz = dzt[h * E + e], *ah = ad + h * Tp;
                        float *gre = gr + e * Tp;
                        for (long k = 0; k < Tp; k++) gre[k] += ah[k] * dz;
                    }
                if (network == HYPER_RELU)
                    for (long i = 0; i < E * Tp; i++) gr[i] = u[i] > 0.0f ? gr[i] : 0.0f;
                for (long h = 0; h < H; h++) {
                    float *gh = g + h * Tp;
                    const float *ah = ad + h * Tp;
                    for (long k = 0; k < Tp; k++) gh[k] = 0.0f;
                    for (long e = 0; e < E; e++) {
                        const float dz = dzt[h * E + e], *re = r + e * Tp, *gre = gr + e * Tp;
                        const float *ve = vT + (h * E + e) * Tp;
                        float *dve = dvT + (h * E + e) * Tp;
                        for (long k = 0; k < Tp; k++) { gh[k] += dz * re[k] + gre[k] * ve[k]; dve[k] += ah[k] * gre[k]; }
                    }
                }
            }
            /* through the dropout mask: g = d loss / d a */
            if (keep_row)
                for (long h = 0; h < H; h++)
                    for (long k = 0; k < T; k++) g[h * Tp + k] *= keep_row[k];
            if (sigma & RMS) {
                for (long k = 0; k < T; k++) irms[k] = inverse_rms[(b * T + t) * T + k];
                for (long k = 0; k < Tp; k++) along[k] = 0.0f;
                for (long h = 0; h < H; h++)
                    for (long k = 0; k < Tp; k++) along[k] += g[h * Tp + k] * a[h * Tp + k];
                for (long k = 0; k < Tp; k++) along[k] /= (float)H;
                for (long h = 0; h < H; h++)
                    for (long k = 0; k < Tp; k++) g[h * Tp + k] = irms[k] * (g[h * Tp + k] - a[h * Tp + k] * along[k]);
                if (sigma & SOFTMAX) /* the softmax's output p = a / inverse rms */
                    for (long h = 0; h < H; h++)
                        for (long k = 0; k < T; k++) a[h * Tp + k] /= irms[k];
            }
            if (sigma & SOFTMAX) {
                for (long h = 0; h < H; h++) {
                    float *gh = g + h * Tp;
                    const float *ph = a + h * Tp;
                    float total = 0.0f;
                    for (long k = 0; k < Tp; k++) total += ph[k] * gh[k];
                    for (long k = 0; k < Tp; k++) gh[k] = ph[k] * (gh[k] - total);
                }
            } else {
                for (long h = 0; h < H; h++)
                    for (long k = 0; k < Tp; k++) g[h * Tp + k] = ok[k] != 0.0f ? g[h * Tp + k] : 0.0f;
            }
            /* g = d loss / d s: into the position bias, the queries and the keys */
            float *dqt = grad_q + (b * T + t) * H * D;
            for (long h = 0; h < H; h++) {
                const float *gh = g + h * Tp;
                if (grad_bias) {
                    float *dbh = grad_bias + (h * T + t) * T;
                    for (long k = 0; k < T; k++) dbh[k] += gh[k];
                }
                for (long d = 0; d < D; d++) {
                    const float qd = qt[h * D + d], *kd = kT + (h * D + d) * Tp;
                    float *dkd = dkT + (h * D + d) * Tp, total = 0.0f;
                    for (long k = 0; k < Tp; k++) { total += gh[k] * kd[k]; dkd[k] += gh[k] * qd; }
                    dqt[h * D + d] = total;
                }
            }
        }
        add_back(dkT, b, T, H, D, Tp, grad_k);
        add_back(dvT, b, T, H, E, Tp, grad_v);
    }
    free(kT); free(vT); free(dkT); free(dvT); free(a); free(ad); free(g); free(u); free(r); free(gr);
    free(ok); free(along); free(irms);
}
"""

COMPILE_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math",
                 "-fassociative-math", "-fno-signed-zeros", "-shared", "-fPIC")
"""`-fassociative-math` lets the compiler vectorize the sums over keys (in an order of its choosing,
fixed at compile time: the same numbers on every run)."""


def _declare(library: ctypes.CDLL) -> None:
    pointer, long, integer, single = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
    library.short_forward.argtypes = [*[pointer] * 9, *[long] * 6, integer, integer, single]
    library.short_backward.argtypes = [*[pointer] * 12, *[long] * 6, integer, integer]
    library.short_forward.restype = library.short_backward.restype = None


KERNELS = CompiledLibrary("fused_short", SOURCE, COMPILE_FLAGS, _declare)
_enabled = True
_pool: ThreadPoolExecutor | None = None


@contextmanager
def use_fused(enabled: bool):
    """Within the block, training takes this path where it can (True) or the full path (False): for
    before / after measurements (benchmarks/bench_model_step.py --modes)."""
    global _enabled
    previous, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = previous


def why_not(like: Tensor, n_positions: int) -> str | None:
    """Why the kernel cannot compute a layer whose parameters are like `like` over `n_positions`
    positions now, or None if it can."""
    if not _enabled:
        return "turned off (fused_short.use_fused(False))"
    if like.dtype != torch.float32 or like.device.type != "cpu":
        return f"its kernel computes float32 on the CPU, this layer is {like.dtype} on {like.device.type}"
    if torch.is_autocast_enabled("cpu"):
        return "CPU autocast is on (its kernel computes float32)"
    if n_positions > MAX_POSITIONS:
        return f"its kernel takes at most {MAX_POSITIONS} positions, this pass has {n_positions}"
    if KERNELS.load() is None:
        return f"its C kernels could not be built: {KERNELS.failure()}"
    return None


def _in_threads(kernel, batch: int, before: list, after: list) -> None:
    """`kernel(*before, b0, b1, *after)` for the batch elements b0:b1 of each of `torch.get_num_threads()`
    parts, in parallel; an entry of `before` may be a function of the part's index (its own buffer)."""
    global _pool
    parts = max(1, min(torch.get_num_threads(), batch))
    bounds = [batch * i // parts for i in range(parts + 1)]
    calls = [([entry(i) if callable(entry) else entry for entry in before], bounds[i], bounds[i + 1])
             for i in range(parts)]
    if parts == 1:
        kernel(*calls[0][0], 0, batch, *after)
        return
    if _pool is None or _pool._max_workers < parts:
        _pool = ThreadPoolExecutor(max_workers=parts, thread_name_prefix="latentcode-fused-short")
    futures = [_pool.submit(kernel, *entries, start, end, *after) for entries, start, end in calls]
    for future in futures:
        future.result()


def _pointer(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


class FusedShortAttention(torch.autograd.Function):
    """z `[batch, query, head, d_head_v]` from scaled queries and keys `[batch, pos, head, d_head]`, values
    `[batch, pos, head, d_head_v]`, the position bias `[head, query, key]` (or None), the allowed pairs
    (bool `[query, key]` or None) and the dropout mask (`[query, key]` or None); `sigma` and `network`
    are kernel codes (module docstring). Differentiable once, in the queries, keys, values and bias."""

    @staticmethod
    def forward(ctx, queries, keys, values, bias, allowed, keep, sigma: int, network: int, eps: float):
        queries, keys, values = queries.contiguous(), keys.contiguous(), values.contiguous()
        batch, n_positions, n_heads, d_head = queries.shape
        d_head_v = values.shape[-1]
        bias = None if bias is None else bias.contiguous()
        allowed = None if allowed is None else allowed.contiguous().view(torch.uint8)
        keep = None if keep is None else keep.reshape(n_positions, n_positions).contiguous()
        z = queries.new_empty(batch, n_positions, n_heads, d_head_v)
        codes = queries.new_empty(batch, n_heads, n_positions, n_positions)
        inverse_rms = queries.new_empty(batch, n_positions, n_positions) if sigma & RMS else None
        _in_threads(KERNELS.load().short_forward, batch,
                    [queries.data_ptr(), keys.data_ptr(), values.data_ptr(), _pointer(bias), _pointer(allowed),
                     _pointer(keep), z.data_ptr(), codes.data_ptr(), _pointer(inverse_rms)],
                    [n_positions, n_heads, d_head, d_head_v, sigma, network, eps])
        ctx.save_for_backward(queries, keys, values, allowed, keep, codes, inverse_rms)
        ctx.sigma, ctx.network, ctx.bias_shape = sigma, network, None if bias is None else bias.shape
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_z):
        queries, keys, values, allowed, keep, codes, inverse_rms = ctx.saved_tensors
        batch, n_positions, n_heads, d_head = queries.shape
        grad_z = grad_z.contiguous()
        grad_q, grad_k, grad_v = (torch.empty_like(x) for x in (queries, keys, values))
        parts = max(1, min(torch.get_num_threads(), batch))
        grad_bias = None
        if ctx.bias_shape is not None and ctx.needs_input_grad[3]:
            grad_bias = queries.new_zeros(parts, *ctx.bias_shape)
        _in_threads(KERNELS.load().short_backward, batch,
                    [queries.data_ptr(), keys.data_ptr(), values.data_ptr(), _pointer(allowed), _pointer(keep),
                     codes.data_ptr(), _pointer(inverse_rms), grad_z.data_ptr(), grad_q.data_ptr(),
                     grad_k.data_ptr(), grad_v.data_ptr(),
                     (lambda i: None) if grad_bias is None else (lambda i: grad_bias[i].data_ptr())],
                    [n_positions, n_heads, d_head, values.shape[-1], ctx.sigma, ctx.network])
        if grad_bias is not None:
            grad_bias = grad_bias.sum(dim=0)
        return grad_q, grad_k, grad_v, grad_bias, None, None, None, None, None
