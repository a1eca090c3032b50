/* The MLP's tanh-approximate GELU of training, forward and backward (latentcode/models/fused_gelu.py documents
   the formulas; latentcode/models/kernel_ops.cpp makes them operators). C with GCC / Clang vector extensions. */
#pragma once

namespace latentcode_gelu {

#define TWO_C 1.5957691216057308f          /* 2 sqrt(2 / pi) */
#define TWO_C_K 0.0713548162726008f        /* 2 sqrt(2 / pi) 0.044715 */
#define THREE_TWO_C_K 0.2140644488178024f  /* 3 2 sqrt(2 / pi) 0.044715 */
#define EXP_LOWEST -87.0f  /* exp below is under float32's smallest normal: taken as 0 */

/* GCC / Clang vector extensions: one AVX2 register; aligned(4) makes loads unaligned. */
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32), aligned(4)));
typedef unsigned v8u __attribute__((vector_size(32), aligned(4)));

static inline v8 splat(float a) { v8 r = {a, a, a, a, a, a, a, a}; return r; }
static inline v8 load(const float *p) { return *(const v8 *)p; }
static inline void store(float *p, v8 x) { *(v8 *)p = x; }
/* a where mask, else b. A comparison with NaN is false, so NaN in b passes through. */
static inline v8 pick(v8i mask, v8 a, v8 b) { return (v8)(((v8i)a & mask) | ((v8i)b & ~mask)); }

/* exp(t) for t <= 0 as Cephes' expf; 0 below EXP_LOWEST; NaN stays NaN. */
static inline v8 exp_nonpositive(v8 t) {
    const v8i underflow = t < splat(EXP_LOWEST);
    t = pick(underflow, splat(EXP_LOWEST), t);
    const v8 shifter = splat(12582912.0f);  /* 1.5 2^23: adding it rounds to an integer (rint) */
    const v8 n = (t * splat(1.44269504088896341f) + shifter) - shifter;
    v8 r = t - n * splat(0.693359375f);     /* ln 2 in two parts: r = t - n ln 2 without rounding loss */
    r = r - n * splat(-2.12194440e-4f);
    v8 p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    const v8 y = p * (r * r) + r + splat(1.0f);
    /* 2^n through the exponent bits; n in [-126, 0] (unsigned: a NaN's n wraps without UB) */
    const v8u two_to_n = ((v8u)__builtin_convertvector(n, v8i) + 127u) << 23;
    return pick(underflow, splat(0.0f), y * (v8)two_to_n);
}

/* z = 2c (x + k x^3), e = exp(-|z|), d = 1 / (1 + e), s = sigmoid(z). Where x^3 overflows
   (|x| > 2^42) z is +-inf and e 0: s is exactly 0 or 1. */
struct parts { v8 e, d, s; };

static inline struct parts sigmoid_parts(v8 x) {
    struct parts q;
    const v8 z = x * (splat(TWO_C) + splat(TWO_C_K) * (x * x));
    q.e = exp_nonpositive((v8)((v8u)z | 0x80000000u));  /* -|z| */
    q.d = splat(1.0f) / (splat(1.0f) + q.e);
    q.s = pick(z < splat(0.0f), q.e * q.d, q.d);
    return q;
}

static inline v8 gelu8(v8 x) {
    const struct parts q = sigmoid_parts(x);
    /* s == 0 (gelu -> -0): -inf * 0 would be NaN */
    return pick(q.s == splat(0.0f), splat(-0.0f), x * q.s);
}

/* s + x s (1 - s) z'(x), with s (1 - s) = e d^2: where e is 0 the second term is 0, also where
   x z'(x) overflows (inf * 0 would be NaN). */
static inline v8 gelu_derivative8(v8 x) {
    const struct parts q = sigmoid_parts(x);
    const v8 term = x * (splat(TWO_C) + splat(THREE_TWO_C_K) * (x * x)) * (q.e * q.d * q.d);
    return q.s + pick(q.e == splat(0.0f), splat(0.0f), term);
}

/* The last n % 8 floats go through the same vector code on a padded copy: every float is computed
   the same way wherever it lies, so a split over threads changes no number. */
static void gelu_forward(const float *__restrict__ x, float *__restrict__ y, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) store(y + i, gelu8(load(x + i)));
    if (i < n) {
        float in[8] = {0}, out[8];
        for (long j = 0; j < n - i; j++) in[j] = x[i + j];
        store(out, gelu8(load(in)));
        for (long j = 0; j < n - i; j++) y[i + j] = out[j];
    }
}

static void gelu_backward(const float *__restrict__ x, const float *__restrict__ grad_y, float *__restrict__ grad_x, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) store(grad_x + i, load(grad_y + i) * gelu_derivative8(load(x + i)));
    if (i < n) {
        float in[8] = {0}, grad[8] = {0}, out[8];
        for (long j = 0; j < n - i; j++) { in[j] = x[i + j]; grad[j] = grad_y[i + j]; }
        store(out, load(grad) * gelu_derivative8(load(in)));
        for (long j = 0; j < n - i; j++) grad_x[i + j] = out[j];
    }
}

}  // namespace latentcode_gelu
