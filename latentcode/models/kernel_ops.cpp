// latentcode's fused CPU kernels as PyTorch operators, torch.ops.latentcode.* (built and loaded by
// latentcode/models/kernel_ops.py with torch.utils.cpp_extension; fake tensors and autograd are registered in
// Python: fused_gelu.py, fused_short.py, fused_hyper.py). Each operator takes float32 CPU tensors (checked
// here: anything else is the caller's torch formula); GELU and the short attention split their work over
// torch's OpenMP threads, the hyper value networks' tiles run in the calling thread.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>

#include "kernels_gelu.h"
#include "kernels_hyper.h"
#include "kernels_short.h"

namespace {

using at::Tensor;

void check_float32_cpu(const Tensor &x, const char *name, bool contiguous = true) {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "latentcode kernels take float32 tensors, ", name, " is ", x.scalar_type());
    TORCH_CHECK(x.device().is_cpu(), "latentcode kernels take CPU tensors, ", name, " is on ", x.device());
    TORCH_CHECK(!contiguous || x.is_contiguous(), "latentcode kernels take contiguous tensors, ", name, " is not");
}

int parts_for(long work, long minimum_per_part) {
    return (int)std::max(1L, std::min((long)at::get_num_threads(), work / minimum_per_part));
}

// -- GELU: a tensor over up to torch.get_num_threads() parts of at least FLOATS_PER_THREAD floats each, split on
// 64-byte lines (every float is computed the same way wherever a split falls) --------------------------------
constexpr long FLOATS_PER_THREAD = 1 << 16, SPLIT_ALIGNMENT = 16;

template <class Call>
void in_parts(long n, Call call) {
    const long parts = parts_for(n, FLOATS_PER_THREAD);
    const long per = (n + parts * SPLIT_ALIGNMENT - 1) / (parts * SPLIT_ALIGNMENT) * SPLIT_ALIGNMENT;
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
    for (long i = 0; i < parts; i++) {
        const long start = i * per, length = n - start < per ? n - start : per;
        if (length > 0) call(start, length);
    }
}

Tensor gelu_tanh(const Tensor &x) {
    check_float32_cpu(x, "x");
    Tensor y = at::empty(x.sizes(), x.options());
    const float *in = x.const_data_ptr<float>();
    float *out = y.data_ptr<float>();
    in_parts(x.numel(), [&](long start, long length) { latentcode_gelu::gelu_forward(in + start, out + start, length); });
    return y;
}

Tensor gelu_tanh_backward(const Tensor &x, const Tensor &grad_y) {
    check_float32_cpu(x, "x");
    check_float32_cpu(grad_y, "grad_y");
    TORCH_CHECK(x.sizes() == grad_y.sizes(), "gelu_tanh_backward: x and grad_y differ in shape");
    Tensor grad_x = at::empty(x.sizes(), x.options());
    const float *in = x.const_data_ptr<float>(), *grad = grad_y.const_data_ptr<float>();
    float *out = grad_x.data_ptr<float>();
    in_parts(x.numel(), [&](long start, long length) {
        latentcode_gelu::gelu_backward(in + start, grad + start, out + start, length);
    });
    return grad_x;
}

// -- short-sequence attention: the batch over up to torch.get_num_threads() parts; a part's position-bias gradient
// is its own buffer, added in a fixed order (the same numbers for the same number of threads) ----------------
struct ShortInputs {
    const float *q, *k, *v, *bias;
    const unsigned char *allowed;
    const float *keep;
    long B, T, H, D, E;
};

ShortInputs short_inputs(const Tensor &q, const Tensor &k, const Tensor &v, const std::optional<Tensor> &bias,
                         const std::optional<Tensor> &allowed, const std::optional<Tensor> &keep) {
    check_float32_cpu(q, "queries");
    check_float32_cpu(k, "keys");
    check_float32_cpu(v, "values");
    TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.sizes().slice(0, 3) == q.sizes().slice(0, 3),
                "short_attention: queries and keys [batch, position, head, d_head], values [batch, position, head, d]");
    ShortInputs in{q.const_data_ptr<float>(), k.const_data_ptr<float>(), v.const_data_ptr<float>(), nullptr, nullptr,
                   nullptr, q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)};
    TORCH_CHECK(in.T <= 256, "short_attention takes at most 256 positions");
    if (bias) {
        check_float32_cpu(*bias, "bias");
        TORCH_CHECK(bias->sizes() == at::IntArrayRef({in.H, in.T, in.T}), "short_attention: bias is [head, query, key]");
        in.bias = bias->const_data_ptr<float>();
    }
    if (allowed) {
        TORCH_CHECK(allowed->scalar_type() == at::kBool && allowed->is_contiguous() && allowed->device().is_cpu() &&
                    allowed->sizes() == at::IntArrayRef({in.T, in.T}), "short_attention: allowed is bool [query, key]");
        in.allowed = reinterpret_cast<const unsigned char *>(allowed->const_data_ptr<bool>());
    }
    if (keep) {
        check_float32_cpu(*keep, "keep");
        TORCH_CHECK(keep->sizes() == at::IntArrayRef({in.T, in.T}), "short_attention: keep is [query, key]");
        in.keep = keep->const_data_ptr<float>();
    }
    return in;
}

// The paper's training shapes (T, H, D, E) get loops unrolled for them: SRAVEN's and fuzzy logic's.
#define SHORT_DISPATCH(KERNEL, ...)                                                                              \
    if (shaped && in.T == 36 && in.H == 16 && in.D == 4 && in.E == 4)                                            \
        latentcode_short::KERNEL<36, 16, 4, 4>(__VA_ARGS__);                                                     \
    else if (shaped && in.T == 32 && in.H == 8 && in.D == 2 && in.E == 2)                                        \
        latentcode_short::KERNEL<32, 8, 2, 2>(__VA_ARGS__);                                                      \
    else                                                                                                         \
        latentcode_short::KERNEL<0, 0, 0, 0>(__VA_ARGS__);

Tensor short_attention(const Tensor &q, const Tensor &k, const Tensor &v, const std::optional<Tensor> &bias,
                       const std::optional<Tensor> &allowed, const std::optional<Tensor> &keep, int64_t sigma,
                       int64_t network, double eps, bool shaped) {
    const ShortInputs in = short_inputs(q, k, v, bias, allowed, keep);
    Tensor z = at::empty({in.B, in.T, in.H, in.E}, q.options());
    float *out = z.data_ptr<float>();
    const long parts = parts_for(in.B, 1);
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
    for (long i = 0; i < parts; i++) {
        SHORT_DISPATCH(short_forward, in.q, in.k, in.v, in.bias, in.allowed, in.keep, out, in.B * i / parts,
                       in.B * (i + 1) / parts, in.T, in.H, in.D, in.E, (int)sigma, (int)network, (float)eps)
    }
    return z;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> short_attention_backward(
    const Tensor &q, const Tensor &k, const Tensor &v, const std::optional<Tensor> &bias,
    const std::optional<Tensor> &allowed, const std::optional<Tensor> &keep, const Tensor &grad_z, int64_t sigma,
    int64_t network, double eps, bool bias_gradient, bool shaped) {
    const ShortInputs in = short_inputs(q, k, v, bias, allowed, keep);
    check_float32_cpu(grad_z, "grad_z");
    TORCH_CHECK(grad_z.sizes() == v.sizes(), "short_attention_backward: grad_z is shaped like the values");
    Tensor grad_q = at::empty(q.sizes(), q.options()), grad_k = at::empty(k.sizes(), k.options());
    Tensor grad_v = at::empty(v.sizes(), v.options());
    const long parts = parts_for(in.B, 1);
    const bool with_bias = bias && bias_gradient;
    Tensor grad_bias_parts = with_bias ? at::zeros({parts, in.H, in.T, in.T}, q.options()) : Tensor();
    float *gb = with_bias ? grad_bias_parts.data_ptr<float>() : nullptr;
    const float *gz = grad_z.const_data_ptr<float>();
    float *gq = grad_q.data_ptr<float>(), *gk = grad_k.data_ptr<float>(), *gv = grad_v.data_ptr<float>();
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
    for (long i = 0; i < parts; i++) {
        SHORT_DISPATCH(short_backward, in.q, in.k, in.v, in.bias, in.allowed, in.keep, gz, gq, gk, gv,
                       gb ? gb + i * in.H * in.T * in.T : nullptr, in.B * i / parts, in.B * (i + 1) / parts, in.T,
                       in.H, in.D, in.E, (int)sigma, (int)network, (float)eps)
    }
    Tensor grad_bias = with_bias ? grad_bias_parts.sum(0) : at::empty({0}, q.options());
    return {grad_q, grad_k, grad_v, grad_bias};
}

// -- HYLA's blockwise hyper value networks: one call over the batch (the caller's blocks are its parallelism) -
void check_hyper(const Tensor &codes, const Tensor &values) {
    check_float32_cpu(codes, "codes");
    check_float32_cpu(values, "values", false);
    TORCH_CHECK(codes.dim() == 4 && values.dim() == 4 && values.size(0) == codes.size(0) &&
                values.size(1) == codes.size(3) && values.size(2) == codes.size(1),
                "hyper_values: codes [batch, head, query, key], values [batch, key, head, d]");
    TORCH_CHECK(values.size(3) % latentcode_hyper::CHUNK == 0 && values.size(2) <= latentcode_hyper::MAX_HEADS,
                "hyper_values: d a multiple of 8, at most 16 heads");
    TORCH_CHECK(values.stride(3) == 1 && values.stride(2) == values.size(3),
                "hyper_values: each key's [head, d] of the values is contiguous");
}

Tensor hyper_values(const Tensor &codes, const Tensor &values, bool relu, int64_t key_tile) {
    check_hyper(codes, values);
    const long B = codes.size(0), H = codes.size(1), Q = codes.size(2), N = codes.size(3), D = values.size(3);
    Tensor z = at::empty({B, Q, H, D}, codes.options());
    latentcode_hyper::hyper_forward(codes.const_data_ptr<float>(), values.const_data_ptr<float>(), values.stride(0),
                                    values.stride(1), z.data_ptr<float>(), B, H, Q, N, D, key_tile, relu);
    return z;
}

std::tuple<Tensor, Tensor> hyper_values_backward(const Tensor &codes, const Tensor &values, const Tensor &grad_z,
                                                 bool relu, int64_t key_tile) {
    check_hyper(codes, values);
    check_float32_cpu(grad_z, "grad_z");
    const long B = codes.size(0), H = codes.size(1), Q = codes.size(2), N = codes.size(3), D = values.size(3);
    TORCH_CHECK(grad_z.sizes() == at::IntArrayRef({B, Q, H, D}), "hyper_values_backward: grad_z is [batch, query, head, d]");
    Tensor grad_codes = at::empty(codes.sizes(), codes.options());
    Tensor grad_values = at::zeros(values.sizes(), values.options());
    latentcode_hyper::hyper_backward(codes.const_data_ptr<float>(), values.const_data_ptr<float>(), values.stride(0),
                                     values.stride(1), grad_z.const_data_ptr<float>(), grad_codes.data_ptr<float>(),
                                     grad_values.data_ptr<float>(), grad_values.stride(0), grad_values.stride(1), B, H,
                                     Q, N, D, key_tile, relu);
    return {grad_codes, grad_values};
}

}  // namespace

TORCH_LIBRARY(latentcode, m) {
    m.def("gelu_tanh(Tensor x) -> Tensor");
    m.def("gelu_tanh_backward(Tensor x, Tensor grad_y) -> Tensor");
    m.def("short_attention(Tensor queries, Tensor keys, Tensor values, Tensor? bias, Tensor? allowed, Tensor? keep, "
          "int sigma, int network, float eps, bool shaped=True) -> Tensor");
    m.def("short_attention_backward(Tensor queries, Tensor keys, Tensor values, Tensor? bias, Tensor? allowed, "
          "Tensor? keep, Tensor grad_z, int sigma, int network, float eps, bool bias_gradient, bool shaped=True) "
          "-> (Tensor, Tensor, Tensor, Tensor)");
    m.def("hyper_values(Tensor codes, Tensor values, bool relu, int key_tile) -> Tensor");
    m.def("hyper_values_backward(Tensor codes, Tensor values, Tensor grad_z, bool relu, int key_tile) "
          "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(latentcode, CPU, m) {
    m.impl("gelu_tanh", &gelu_tanh);
    m.impl("gelu_tanh_backward", &gelu_tanh_backward);
    m.impl("short_attention", &short_attention);
    m.impl("short_attention_backward", &short_attention_backward);
    m.impl("hyper_values", &hyper_values);
    m.impl("hyper_values_backward", &hyper_values_backward);
}
