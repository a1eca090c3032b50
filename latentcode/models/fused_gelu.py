"""The MLP's tanh-approximate GELU in training, one fused C pass forward and one backward.

    gelu(x)  = 0.5 x (1 + tanh(z / 2)) = x sigmoid(z),    z = 2c (x + k x^3),  c = sqrt(2 / pi), k = 0.044715
    gelu'(x) = s + x s (1 - s) z'(x),                      s = sigmoid(z),      z'(x) = 2c (1 + 3 k x^2)

torch's `F.gelu(x, approximate="tanh")` and its backward are slow on this CPU (its tanh is not
vectorized here): 4.5 ms forward and 4.7 ms backward for `[4608, 256]` where a multiply takes 0.2 to
0.4 ms, 36 ms of a 430 ms SRAVEN training step; these kernels take 1.3 ms and 1.6 ms (one thread).
Each float is read once and written once per pass, eight at a time in one AVX2 register, without a
libm call: sigmoid through exp(-|z|) computed as Cephes' expf
(n = rint(t log2 e), r = t - n ln 2 in two parts, a degree-6 polynomial, 2^n through the exponent
bits), so that nothing overflows:

    e = exp(-|z|),  d = 1 / (1 + e),  s = d (z >= 0) or e d (z < 0),  s (1 - s) = e d^2

Large |x| gives the limits (gelu(20) = 20, gelu(-20) = -0, gelu'(20) = 1, gelu'(-20) = 0, also for
+-inf); NaN stays NaN. Where exp(-|z|) falls below float32's smallest normal (|x| > ~10) it is
taken as 0: no denormals, no slow microcode. The sigmoid form has no cancellation: where torch's
`1 + tanh` rounds to 0 (x < ~-5.2) it still gives gelu's tiny negative values.

Big tensors are split over `torch.get_num_threads()` threads: torch's own OpenMP threads where the
library is built with OpenMP (`latentcode.models.c_kernels`), else a Python pool (ctypes releases the
GIL). Every float is computed the same way wherever a split falls, so the numbers do not depend on
the thread count.

Used by `MLP.forward` only in training mode, float32 on the CPU, no autocast (torch.compile included:
`latentcode::gelu_tanh` and its backward are registered operators), and where the library is built (`latentcode.models.c_kernels`); elsewhere, and under
`use_fused(False)` (before / after measurements), `F.gelu(..., approximate="tanh")`. Evaluation thus
stays bit for bit the computation of the shipped results. Values and gradients equal a float64
evaluation of the formulas within float32 tolerance (tests/models/test_fused_gelu.py).
"""

from __future__ import annotations

import ctypes
from functools import partial

import torch
from torch import Tensor

from latentcode.models.c_kernels import CompiledLibrary, run_in_threads, uses_openmp

FLOATS_PER_THREAD = 1 << 16
"""A tensor is split over threads only where each gets at least this many floats (256 KiB): below,
handing work to a thread costs more than it saves."""
SPLIT_ALIGNMENT = 16  # floats: splits fall on 64-byte cache lines, so no two threads write one line

SOURCE = r"""
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
void gelu_forward(const float *restrict x, float *restrict y, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) store(y + i, gelu8(load(x + i)));
    if (i < n) {
        float in[8] = {0}, out[8];
        for (long j = 0; j < n - i; j++) in[j] = x[i + j];
        store(out, gelu8(load(in)));
        for (long j = 0; j < n - i; j++) y[i + j] = out[j];
    }
}

void gelu_backward(const float *restrict x, const float *restrict grad_y, float *restrict grad_x, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) store(grad_x + i, load(grad_y + i) * gelu_derivative8(load(x + i)));
    if (i < n) {
        float in[8] = {0}, grad[8] = {0}, out[8];
        for (long j = 0; j < n - i; j++) { in[j] = x[i + j]; grad[j] = grad_y[i + j]; }
        store(out, load(grad) * gelu_derivative8(load(in)));
        for (long j = 0; j < n - i; j++) grad_x[i + j] = out[j];
    }
}

/* The same over `parts` OpenMP threads (torch's: latentcode.models.c_kernels), each a range of whole
   `alignment` floats; one thread where built without OpenMP. */
#define IN_PARTS(call) \
    const long per = (n + parts * alignment - 1) / (parts * alignment) * alignment; \
    _Pragma("omp parallel for num_threads(parts) schedule(static, 1)") \
    for (long i = 0; i < parts; i++) { \
        const long start = i * per, length = n - start < per ? n - start : per; \
        if (length > 0) call; \
    }

void gelu_forward_parts(const float *x, float *y, long n, long parts, long alignment) {
    IN_PARTS(gelu_forward(x + start, y + start, length))
}

void gelu_backward_parts(const float *x, const float *grad_y, float *grad_x, long n, long parts, long alignment) {
    IN_PARTS(gelu_backward(x + start, grad_y + start, grad_x + start, length))
}
"""

COMPILE_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC")



def _declare(library: ctypes.CDLL) -> None:
    pointer = ctypes.c_void_p
    library.gelu_forward.argtypes = [pointer, pointer, ctypes.c_long]
    library.gelu_backward.argtypes = [pointer, pointer, pointer, ctypes.c_long]
    library.gelu_forward.restype = library.gelu_backward.restype = None
    library.gelu_forward_parts.argtypes = [pointer, pointer, *[ctypes.c_long] * 3]
    library.gelu_backward_parts.argtypes = [pointer, pointer, pointer, *[ctypes.c_long] * 3]
    library.gelu_forward_parts.restype = library.gelu_backward_parts.restype = None


KERNELS = CompiledLibrary("fused_gelu", SOURCE, COMPILE_FLAGS, _declare, openmp=True)


def use_fused(enabled: bool):
    """Within the block, the MLP in training uses the fused kernels (True) or `F.gelu` (False)."""
    return KERNELS.switched(enabled)


def available(x: Tensor) -> bool:
    """Whether the fused kernels compute gelu of `x`: float32 on the CPU, no autocast, and the library built
    (also under torch.compile: the kernels are operators it keeps in its graph)."""
    return (
        KERNELS.enabled and x.dtype == torch.float32 and x.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu") and _library_built()
    )


@torch.compiler.assume_constant_result
def _library_built() -> bool:
    """Whether the library is loaded (built first where needed); torch.compile takes the answer as a constant
    of the graph instead of tracing into the build."""
    return KERNELS.load() is not None


def _run(kernel, tensors: list[Tensor], count: int) -> None:
    """`kernel(*pointers, count)` over float32 `tensors` (contiguous, `count` floats each), split into
    contiguous ranges over up to `torch.get_num_threads()` threads; the calling thread runs the first."""
    threads = max(1, min(torch.get_num_threads(), count // FLOATS_PER_THREAD))
    addresses = [tensor.data_ptr() for tensor in tensors]
    if threads == 1:
        kernel(*addresses, count)
        return
    library = KERNELS.load()
    if uses_openmp(library):  # on torch's OpenMP threads
        getattr(library, kernel.__name__ + "_parts")(*addresses, count, threads, SPLIT_ALIGNMENT)
        return
    per_thread = -(-count // (threads * SPLIT_ALIGNMENT)) * SPLIT_ALIGNMENT
    starts = range(0, count, per_thread)
    run_in_threads([partial(kernel, *[address + 4 * start for address in addresses], min(per_thread, count - start))
                    for start in starts])


def forward(x: Tensor) -> Tensor:
    """gelu(x), tanh approximation, of float32 `x` (any shape); no autograd."""
    x = x.contiguous()
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    KERNELS.calls += 1
    _run(KERNELS.load().gelu_forward, [x, y], x.numel())
    return y


def backward(x: Tensor, grad_y: Tensor) -> Tensor:
    """grad_y * gelu'(x), of float32 `x` and `grad_y` of one shape."""
    x, grad_y = x.contiguous(), grad_y.contiguous()
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
    _run(KERNELS.load().gelu_backward, [x, grad_y, grad_x], x.numel())
    return grad_x


# The kernels as PyTorch operators (`torch.library.custom_op`): a fake implementation gives torch.compile,
# fake tensors and opcheck the output's shape without running C; the gradient is registered, so autograd
# and AOT autograd see one operator each way. The operators check dtype and device themselves: anything but
# float32 on the CPU with the library built computes the torch formula, so they are right for any input.

def _kernel_applies(x: Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu" and KERNELS.load() is not None


@torch.library.custom_op("latentcode::gelu_tanh", mutates_args=())
def gelu_operator(x: Tensor) -> Tensor:
    """gelu(x), tanh approximation: the fused kernel for float32 CPU tensors, F.gelu elsewhere."""
    if not _kernel_applies(x):
        return torch.nn.functional.gelu(x, approximate="tanh")
    return forward(x)


@gelu_operator.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("latentcode::gelu_tanh_backward", mutates_args=())
def gelu_backward_operator(x: Tensor, grad_y: Tensor) -> Tensor:
    """grad_y * gelu'(x): the fused kernel for float32 CPU tensors, the formula's gradient elsewhere."""
    if not _kernel_applies(x) or grad_y.dtype != x.dtype:
        return torch.ops.aten.gelu_backward(grad_y, x, approximate="tanh")
    return backward(x, grad_y)


@gelu_backward_operator.register_fake
def _(x: Tensor, grad_y: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _save_input(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _gelu_gradient(ctx, grad_y: Tensor) -> Tensor:
    """Differentiable once: a backward that would build a graph (`create_graph=True`) is refused, never
    computed as if gelu' did not depend on x."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError("the fused GELU of training is differentiable once: for a second derivative "
                           "(create_graph=True) turn it off with fused_gelu.use_fused(False)")
    (x,) = ctx.saved_tensors
    return gelu_backward_operator(x, grad_y)


gelu_operator.register_autograd(_gelu_gradient, setup_context=_save_input)


def gelu(x: Tensor) -> Tensor:
    """`F.gelu(x, approximate="tanh")` through the fused kernels (`available(x)` should hold, else the
    operator computes the formula)."""
    return gelu_operator(x)
