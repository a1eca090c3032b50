/* HYLA's hyper value networks, blockwise: z and the gradients of a tile of keys without a [query, key, d_head_v]
   tensor (latentcode/models/fused_hyper.py documents the formulas; latentcode/models/kernel_ops.cpp makes them
   operators). C with GCC / Clang vector extensions. */
#pragma once

namespace latentcode_hyper {

constexpr long CHUNK = 8;
constexpr long MAX_HEADS = 16;
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
    const float *__restrict__ codes, const float *__restrict__ values, long vb, long vk, float *__restrict__ z,
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
    const float *__restrict__ codes, const float *__restrict__ values, long vb, long vk, const float *__restrict__ grad_z,
    float *__restrict__ grad_codes, float *__restrict__ grad_values, long gvb, long gvk,
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

static void hyper_forward(const float *codes, const float *values, long vb, long vk, float *z,
                   long B, long H, long Q, long N, long D, long KT, int relu)
{
    if (relu) { DISPATCH(forward_impl, 1, codes, values, vb, vk, z, B) }
    else { DISPATCH(forward_impl, 0, codes, values, vb, vk, z, B) }
}

static void hyper_backward(const float *codes, const float *values, long vb, long vk, const float *grad_z,
                    float *grad_codes, float *grad_values, long gvb, long gvk,
                    long B, long H, long Q, long N, long D, long KT, int relu)
{
    if (relu) { DISPATCH(backward_impl, 1, codes, values, vb, vk, grad_z, grad_codes, grad_values, gvb, gvk, B) }
    else { DISPATCH(backward_impl, 0, codes, values, vb, vk, grad_z, grad_codes, grad_values, gvb, gvk, B) }
}

#undef DISPATCH
}  // namespace latentcode_hyper
