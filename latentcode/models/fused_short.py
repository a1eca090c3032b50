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

Threads: the batch is split over `torch.get_num_threads()` threads (ctypes releases the GIL), each
with its own position-bias gradient, added in a fixed order: the same numbers for the same number of
threads.
"""

from __future__ import annotations

import ctypes
from functools import partial

import torch
from torch import Tensor

from latentcode.models.c_kernels import CompiledLibrary, run_in_threads

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

/* A library built for one shape defines FIXED_T, FIXED_H, FIXED_D and FIXED_E: the compiler then unrolls the
   loops over head widths and keys (about a third faster); the generic library takes them as arguments. */
#ifdef FIXED_T
#define SHAPE const long T = FIXED_T, H = FIXED_H, D = FIXED_D, E = FIXED_E; (void)T_; (void)H_; (void)D_; (void)E_;
#else
#define SHAPE const long T = T_, H = H_, D = D_, E = E_;
#endif

/* GCC / Clang vector extensions: one AVX2 register (two SSE or NEON ones elsewhere). Every row of keys
   is padded to Tp, a multiple of 8, and 32-byte aligned, so that each loop over keys is whole vectors. */
typedef float v8 __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
#define V(p) (*(v8 *)(p))

static inline v8 splat(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline v8 select8(v8i m, v8 a, v8 b) { return (v8)((m & (v8i)a) | (~m & (v8i)b)); }
static inline float hsum(v8 x) { return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7])); }
static inline float hmax(v8 x) { /* in three steps: halves, quarters, pairs */
    float m[4];
    for (int i = 0; i < 4; i++) m[i] = x[i] > x[i + 4] ? x[i] : x[i + 4];
    const float a = m[0] > m[2] ? m[0] : m[2], b = m[1] > m[3] ? m[1] : m[3];
    return a > b ? a : b;
}

/* exp(x) for x in [-87, 0] (softmax after subtracting the row's maximum; clamped there): Cephes' expf
   polynomial, relative error about 1e-7. n = round(x log2 e) by adding and subtracting 1.5 * 2^23. */
static inline v8 exp8(v8 x) {
    x = select8(x < splat(-87.0f), splat(-87.0f), x);
    x = select8(x > splat(0.0f), splat(0.0f), x);
    v8 n = (x * splat(1.44269504088896341f) + splat(12582912.0f)) - splat(12582912.0f);
    v8 r = (x - n * splat(0.693359375f)) + n * splat(2.12194440e-4f);
    v8 p = ((splat(1.9875691500e-4f) * r + splat(1.3981999507e-3f)) * r + splat(8.3334519073e-3f)) * r;
    p = ((p + splat(4.1665795894e-2f)) * r + splat(1.6666665459e-1f)) * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.0f);
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    return p * (v8)bits;
}

static float *scratch(long n) { /* zeroed, 32-byte aligned */
    size_t bytes = ((size_t)n * sizeof(float) + 31) / 32 * 32;
    float *p = (float *)aligned_alloc(32, bytes ? bytes : 32);
    return p ? memset(p, 0, bytes) : p;
}

/* x [B, T, H, W] of batch element b -> xT [H][W][Tp] (positions along the last axis, zero padded). */
static inline __attribute__((always_inline)) void by_head(const float *x, long b, long T, long H, long W, long Tp, float *xT) {
    const float *xb = x + b * T * H * W;
    for (long t = 0; t < T; t++)
        for (long h = 0; h < H; h++)
            for (long w = 0; w < W; w++) xT[(h * W + w) * Tp + t] = xb[(t * H + h) * W + w];
}

static inline __attribute__((always_inline)) void write_back(const float *xT, long b, long T, long H, long W, long Tp, float *x) {
    float *xb = x + b * T * H * W;
    for (long t = 0; t < T; t++)
        for (long h = 0; h < H; h++)
            for (long w = 0; w < W; w++) xb[(t * H + h) * W + w] = xT[(h * W + w) * Tp + t];
}

/* bias [H, T, T] -> [H][T][Tp] (zero padded), or NULL without one. */
static float *pad_bias(const float *bias, long H, long T, long Tp) {
    if (!bias) return 0;
    float *padded = scratch(H * T * Tp);
    for (long i = 0; i < H * T; i++)
        for (long k = 0; k < T; k++) padded[i * Tp + k] = bias[i * T + k];
    return padded;
}

/* keep_padded [T][Tp]: the dropout mask (1 without one) where query t may see key k, 0 for a masked or
   padding key; ok [T][Tp]: 1 where it may see it, else 0. */
static void masks(const unsigned char *allowed, const float *keep, long T, long Tp, float *keep_padded, float *ok) {
    for (long t = 0; t < T; t++)
        for (long k = 0; k < T; k++) {
            const int seen = !allowed || allowed[t * T + k];
            ok[t * Tp + k] = seen ? 1.0f : 0.0f;
            keep_padded[t * Tp + k] = seen ? (keep ? keep[t * T + k] : 1.0f) : 0.0f;
        }
}

/* codes rows h = 0..H-1 of query t (row h at row0 + h * head_stride) <- sigma(q . k + bias). */
static inline __attribute__((always_inline)) void codes_of_row(const float *qt, const float *kT, const float *bias_padded, const float *ok, long t, long T,
                         long H, long D, long Tp, int sigma, float eps, float *row0, long head_stride,
                         float *inverse_rms) {
    const long nv = Tp / 8;
    for (long h = 0; h < H; h++) {
        float *sh = row0 + h * head_stride;
        for (long j = 0; j < nv; j++) {
            v8 acc = bias_padded ? V(bias_padded + (h * T + t) * Tp + 8 * j) : splat(0.0f);
            for (long d = 0; d < D; d++) acc += splat(qt[h * D + d]) * V(kT + (h * D + d) * Tp + 8 * j);
            V(sh + 8 * j) = (sigma & SOFTMAX) ? acc : acc * V(ok + 8 * j);
        }
    }
    if (sigma & SOFTMAX) {
        /* Each step for every head before the next: the heads' rows are independent, so the CPU overlaps
           their exps and reductions instead of waiting on one row's chain max -> exp -> sum -> divide. */
        float top[H], inverse_total[H];
        for (long h = 0; h < H; h++) {
            const float *sh = row0 + h * head_stride;
            v8 most = splat(-3.0e38f);
            for (long j = 0; j < nv; j++) {
                v8 candidate = select8(V(ok + 8 * j) != splat(0.0f), V(sh + 8 * j), splat(-3.0e38f));
                most = select8(candidate > most, candidate, most);
            }
            top[h] = hmax(most);
        }
        for (long h = 0; h < H; h++) {
            float *sh = row0 + h * head_stride;
            const v8 m = splat(top[h]);
            v8 total = splat(0.0f);
            for (long j = 0; j < nv; j++) {
                v8 e = exp8(V(sh + 8 * j) - m) * V(ok + 8 * j);
                V(sh + 8 * j) = e;
                total += e;
            }
            inverse_total[h] = 1.0f / hsum(total);
        }
        for (long h = 0; h < H; h++) {
            float *sh = row0 + h * head_stride;
            const v8 inverse = splat(inverse_total[h]);
            for (long j = 0; j < nv; j++) V(sh + 8 * j) *= inverse;
        }
    }
    if (sigma & RMS) {
        for (long j = 0; j < nv; j++) {
            v8 squares = splat(0.0f);
            for (long h = 0; h < H; h++) {
                v8 x = V(row0 + h * head_stride + 8 * j);
                squares += x * x;
            }
            V(inverse_rms + 8 * j) = squares / splat((float)H) + splat(eps);
        }
        for (long k = 0; k < Tp; k++) inverse_rms[k] = 1.0f / sqrtf(inverse_rms[k]);
        for (long h = 0; h < H; h++)
            for (long j = 0; j < nv; j++) V(row0 + h * head_stride + 8 * j) *= V(inverse_rms + 8 * j);
    }
}

/* hidden [E][Tp] <- sum_h ad[h][k] vT[h][e][k], through the relu for HYPER_RELU. */
static inline __attribute__((always_inline)) void hidden_of_row(const float *ad, const float *vT, long H, long E, long Tp, int network, float *hidden) {
    for (long e = 0; e < E; e++)
        for (long j = 0; j < Tp / 8; j++) {
            v8 acc = splat(0.0f);
            for (long h = 0; h < H; h++) acc += V(ad + h * Tp + 8 * j) * V(vT + (h * E + e) * Tp + 8 * j);
            if (network == HYPER_RELU) acc = select8(acc > splat(0.0f), acc, splat(0.0f));
            V(hidden + e * Tp + 8 * j) = acc;
        }
}

/* Layouts: q (scaled), k [B, T, H, D], v [B, T, H, E], z [B, T, H, E] contiguous; bias [H, T, T], allowed
   [T, T] (bytes), keep [T, T] or NULL; codes [B, H, T, Tp] and inverse_rms [B, T, Tp] written here (Tp = T
   rounded up to 8, 32-byte aligned rows) for the backward. Batch elements b0 .. b1 - 1. */
void short_forward(const float *q, const float *kk, const float *v, const float *bias, const unsigned char *allowed,
                   const float *keep, float *z,
                   long b0, long b1, long T_, long H_, long D_, long E_, int sigma, int network, float eps) {
    SHAPE
    const long Tp = (T + 7) / 8 * 8, nv = Tp / 8;
    float *kT = scratch(H * D * Tp), *vT = scratch(H * E * Tp), *a = scratch(H * Tp), *ad = scratch(H * Tp);
    float *hidden = scratch(E * Tp), *keep_padded = scratch(T * Tp), *ok = scratch(T * Tp), *irms = scratch(Tp);
    float *bias_padded = pad_bias(bias, H, T, Tp);
    masks(allowed, keep, T, Tp, keep_padded, ok);
    for (long b = b0; b < b1; b++) {
        by_head(kk, b, T, H, D, Tp, kT);
        by_head(v, b, T, H, E, Tp, vT);
        for (long t = 0; t < T; t++) {
            const float *kp = keep_padded + t * Tp;
            codes_of_row(q + (b * T + t) * H * D, kT, bias_padded, ok + t * Tp, t, T, H, D, Tp, sigma, eps, a, Tp, irms);
            for (long h = 0; h < H; h++)
                for (long j = 0; j < nv; j++) V(ad + h * Tp + 8 * j) = V(a + h * Tp + 8 * j) * V(kp + 8 * j);
            float *zt = z + (b * T + t) * H * E;
            const float *by_key = vT;
            if (network != LINEAR) hidden_of_row(ad, vT, H, E, Tp, network, hidden);
            for (long h = 0; h < H; h++)
                for (long e = 0; e < E; e++) {
                    const float *x = network == LINEAR ? by_key + (h * E + e) * Tp : hidden + e * Tp;
                    v8 acc = splat(0.0f);
                    for (long j = 0; j < nv; j++) acc += V(ad + h * Tp + 8 * j) * V(x + 8 * j);
                    zt[h * E + e] = hsum(acc);
                }
        }
    }
    free(kT); free(vT); free(a); free(ad); free(hidden); free(keep_padded); free(ok); free(irms); free(bias_padded);
}

/* The chain rule of short_forward from grad_z [B, T, H, E]: grad_q, grad_k [B, T, H, D], grad_v [B, T, H, E]
   written; grad_bias [H, T, T] (or NULL) added to. */
void short_backward(const float *q, const float *kk, const float *v, const float *bias, const unsigned char *allowed,
                    const float *keep, const float *grad_z, float *grad_q, float *grad_k, float *grad_v,
                    float *grad_bias, long b0, long b1, long T_, long H_, long D_, long E_, int sigma, int network,
                    float eps) {
    SHAPE
    const long Tp = (T + 7) / 8 * 8, nv = Tp / 8;
    float *kT = scratch(H * D * Tp), *vT = scratch(H * E * Tp), *dkT = scratch(H * D * Tp), *dvT = scratch(H * E * Tp);
    float *ad = scratch(H * Tp), *g = scratch(H * Tp), *p = scratch(H * Tp), *hidden = scratch(E * Tp);
    float *grad_hidden = scratch(E * Tp), *keep_padded = scratch(T * Tp), *ok = scratch(T * Tp);
    float *a = scratch(H * Tp), *irms = scratch(Tp), *bias_padded = pad_bias(bias, H, T, Tp);
    float *grad_bias_padded = grad_bias ? scratch(H * T * Tp) : 0;
    masks(allowed, keep, T, Tp, keep_padded, ok);
    for (long b = b0; b < b1; b++) {
        by_head(kk, b, T, H, D, Tp, kT);
        by_head(v, b, T, H, E, Tp, vT);
        memset(dkT, 0, sizeof(float) * H * D * Tp);
        memset(dvT, 0, sizeof(float) * H * E * Tp);
        for (long t = 0; t < T; t++) {
            const float *qt = q + (b * T + t) * H * D, *dzt = grad_z + (b * T + t) * H * E;
            const float *kp = keep_padded + t * Tp;
            codes_of_row(qt, kT, bias_padded, ok + t * Tp, t, T, H, D, Tp, sigma, eps, a, Tp, irms); /* again */
            for (long h = 0; h < H; h++)
                for (long j = 0; j < nv; j++) V(ad + h * Tp + 8 * j) = V(a + h * Tp + 8 * j) * V(kp + 8 * j);
            /* g = d loss / d ad, and the values' gradient */
            if (network == LINEAR) {
                for (long h = 0; h < H; h++) {
                    for (long j = 0; j < nv; j++) V(g + h * Tp + 8 * j) = splat(0.0f);
                    for (long e = 0; e < E; e++) {
                        const v8 dz = splat(dzt[h * E + e]);
                        const float *ve = vT + (h * E + e) * Tp;
                        float *dve = dvT + (h * E + e) * Tp;
                        for (long j = 0; j < nv; j++) {
                            V(g + h * Tp + 8 * j) += dz * V(ve + 8 * j);
                            V(dve + 8 * j) += V(ad + h * Tp + 8 * j) * dz;
                        }
                    }
                }
            } else {
                for (long e = 0; e < E; e++)
                    for (long j = 0; j < nv; j++) {
                        v8 u = splat(0.0f), gu = splat(0.0f);
                        for (long h = 0; h < H; h++) {
                            const v8 a = V(ad + h * Tp + 8 * j);
                            u += a * V(vT + (h * E + e) * Tp + 8 * j);
                            gu += a * splat(dzt[h * E + e]);
                        }
                        if (network == HYPER_RELU) {
                            const v8i positive = u > splat(0.0f);
                            u = select8(positive, u, splat(0.0f));
                            gu = select8(positive, gu, splat(0.0f));
                        }
                        V(hidden + e * Tp + 8 * j) = u;
                        V(grad_hidden + e * Tp + 8 * j) = gu;
                    }
                for (long h = 0; h < H; h++) {
                    for (long j = 0; j < nv; j++) V(g + h * Tp + 8 * j) = splat(0.0f);
                    for (long e = 0; e < E; e++) {
                        const v8 dz = splat(dzt[h * E + e]);
                        const float *ve = vT + (h * E + e) * Tp, *re = hidden + e * Tp, *ge = grad_hidden + e * Tp;
                        float *dve = dvT + (h * E + e) * Tp;
                        for (long j = 0; j < nv; j++) {
                            V(g + h * Tp + 8 * j) += dz * V(re + 8 * j) + V(ge + 8 * j) * V(ve + 8 * j);
                            V(dve + 8 * j) += V(ad + h * Tp + 8 * j) * V(ge + 8 * j);
                        }
                    }
                }
            }
            /* through the dropout mask (0 at masked keys): g = d loss / d a */
            for (long h = 0; h < H; h++)
                for (long j = 0; j < nv; j++) V(g + h * Tp + 8 * j) *= V(kp + 8 * j);
            const float *probabilities = a;
            if (sigma & RMS) {
                const float *ir = irms;
                for (long j = 0; j < nv; j++) {
                    v8 along = splat(0.0f);
                    for (long h = 0; h < H; h++) along += V(g + h * Tp + 8 * j) * V(a + h * Tp + 8 * j);
                    along = along / splat((float)H);
                    for (long h = 0; h < H; h++) {
                        const v8 code = V(a + h * Tp + 8 * j);
                        V(g + h * Tp + 8 * j) = V(ir + 8 * j) * (V(g + h * Tp + 8 * j) - code * along);
                        if (sigma & SOFTMAX) V(p + h * Tp + 8 * j) = code / V(ir + 8 * j); /* softmax's output */
                    }
                }
                probabilities = p;
            }
            if (sigma & SOFTMAX)
                for (long h = 0; h < H; h++) {
                    const float *ph = probabilities + h * Tp;
                    v8 total = splat(0.0f);
                    for (long j = 0; j < nv; j++) total += V(ph + 8 * j) * V(g + h * Tp + 8 * j);
                    const v8 dot = splat(hsum(total));
                    for (long j = 0; j < nv; j++) V(g + h * Tp + 8 * j) = V(ph + 8 * j) * (V(g + h * Tp + 8 * j) - dot);
                }
            /* g = d loss / d scores: into the position bias, the queries and the keys */
            float *dqt = grad_q + (b * T + t) * H * D;
            for (long h = 0; h < H; h++) {
                const float *gh = g + h * Tp;
                if (grad_bias_padded)
                    for (long j = 0; j < nv; j++) V(grad_bias_padded + (h * T + t) * Tp + 8 * j) += V(gh + 8 * j);
                for (long d = 0; d < D; d++) {
                    const v8 qd = splat(qt[h * D + d]);
                    const float *kd = kT + (h * D + d) * Tp;
                    float *dkd = dkT + (h * D + d) * Tp;
                    v8 total = splat(0.0f);
                    for (long j = 0; j < nv; j++) {
                        total += V(gh + 8 * j) * V(kd + 8 * j);
                        V(dkd + 8 * j) += V(gh + 8 * j) * qd;
                    }
                    dqt[h * D + d] = hsum(total);
                }
            }
        }
        write_back(dkT, b, T, H, D, Tp, grad_k);
        write_back(dvT, b, T, H, E, Tp, grad_v);
    }
    if (grad_bias_padded)
        for (long i = 0; i < H * T; i++)
            for (long k = 0; k < T; k++) grad_bias[i * T + k] += grad_bias_padded[i * Tp + k];
    free(kT); free(vT); free(dkT); free(dvT); free(ad); free(g); free(p); free(hidden); free(grad_hidden);
    free(keep_padded); free(ok); free(a); free(irms); free(bias_padded); free(grad_bias_padded);
}
"""

COMPILE_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-shared", "-fPIC")
"""No `-ffast-math` or `-fassociative-math`: the exponential's rounding step (adding and subtracting
1.5 * 2^23) must stay as written; the sums over keys are written as vectors already."""


def _declare(library: ctypes.CDLL) -> None:
    pointer, long, integer, single = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
    library.short_forward.argtypes = [*[pointer] * 7, *[long] * 6, integer, integer, single]
    library.short_backward.argtypes = [*[pointer] * 11, *[long] * 6, integer, integer, single]
    library.short_forward.restype = library.short_backward.restype = None


KERNELS = CompiledLibrary("fused_short", SOURCE, COMPILE_FLAGS, _declare)
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


def _in_threads(kernel, batch: int, before: list, after: list) -> None:
    """`kernel(*before, b0, b1, *after)` for the batch elements b0:b1 of each of `torch.get_num_threads()`
    parts, in parallel; an entry of `before` may be a function of the part's index (its own buffer)."""
    parts = max(1, min(torch.get_num_threads(), batch))
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
        _shaped[shape] = CompiledLibrary(name, defines + SOURCE, COMPILE_FLAGS, _declare)
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
        library = library_for(batch, n_positions, n_heads, d_head, d_head_v)
        _in_threads(library.short_forward, batch,
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
        _in_threads(library.short_backward, batch,
                    [queries.data_ptr(), keys.data_ptr(), values.data_ptr(), _pointer(bias), _pointer(allowed),
                     _pointer(keep), grad_z.data_ptr(), grad_q.data_ptr(), grad_k.data_ptr(), grad_v.data_ptr(),
                     (lambda i: None) if grad_bias is None else (lambda i: grad_bias[i].data_ptr())],
                    [n_positions, n_heads, d_head, values.shape[-1], ctx.sigma, ctx.network, ctx.eps])
        if grad_bias is not None:
            grad_bias = grad_bias.sum(dim=0)
        return grad_q, grad_k, grad_v, grad_bias, None, None, None, None, None
