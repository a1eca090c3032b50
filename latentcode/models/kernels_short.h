/* The fused short-sequence attention of training, from scaled queries to z and back (latentcode/models/fused_short.py
   documents it; latentcode/models/kernel_ops.cpp makes it operators). C with GCC / Clang vector extensions. */
#pragma once
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace latentcode_short {

constexpr int SOFTMAX = 1, RMS = 2;
constexpr int LINEAR = 0, HYPER_LINEAR = 1, HYPER_RELU = 2;

/* Instantiated for the shapes of the paper's training batches (T, H, D, E as template arguments: the compiler
   then unrolls the loops over head widths and keys, about a third faster) and generically (all 0: the sizes
   are the arguments); kernel_ops.cpp dispatches. noinline: each copy is compiled on its own, as the C library's
   functions were, not inlined into the OpenMP region that calls it (the generic copy ran up to a third slower
   inlined there). */
#define SHAPE const long T = FT ? FT : T_, H = FH ? FH : H_, D = FD ? FD : D_, E = FE ? FE : E_;

/* GCC / Clang vector extensions: one AVX2 register (two SSE or NEON ones elsewhere). Every row of keys
   is padded to Tp, a multiple of 8, and 32-byte aligned, so that each loop over keys is whole vectors. */
typedef float v8 __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
#define V(p) (*(v8 *)(p))

static inline v8 splat(float x) { v8 r = {x, x, x, x, x, x, x, x}; return r; }
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
    if (p) memset(p, 0, bytes);
    return p;
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
template <long FT, long FH, long FD, long FE>
__attribute__((noinline)) static void short_forward(const float *q, const float *kk, const float *v, const float *bias, const unsigned char *allowed,
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
template <long FT, long FH, long FD, long FE>
__attribute__((noinline)) static void short_backward(const float *q, const float *kk, const float *v, const float *bias, const unsigned char *allowed,
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

#undef SHAPE
#undef V
}  // namespace latentcode_short
