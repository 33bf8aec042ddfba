// adamw.cuh: the AdamW step on the GPU, fp32 master weights with stochastically rounded bf16 copies.
//
// The master weights follow the CPU reference (detail::adamw_span in adamw.h) operation for
// operation: every rounding is spelled out with an _rn intrinsic (__fmul_rn, __fmaf_rn, __fdiv_rn,
// __fsqrt_rn, __fadd_rn), which nvcc never contracts into an FMA nor replaces by an approximation,
// so the GPU computes the same IEEE operations as the CPU and agrees with it bit for bit (as long
// as -ftz stays off, its default, so denormals are kept on both sides). The bf16 parameters the
// model reads are then rounded stochastically from the new master value with bits hashed from
// (seed, element index): unbiased, and independent of how elements are split across calls or threads.
#pragma once

#include <climits>
#include <cmath>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

constexpr int ADAMW_BLOCK_SIZE = 256;

// Everything an element's update needs besides its own data; the derived constants are computed
// on the host exactly as adamw_contiguous does.
struct AdamWStep {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
    float bias_correction1, bias_correction2, grad_multiplier;
    uint32_t seed;
    uint64_t index_offset;
};

// The bf16 output of one f128 of master weights: one 8-byte store.
struct alignas(8) Bf16x4 {
    floatX v[f128::size];
};

// The per-call constants, the bias corrections in double and then cast, as adamw_contiguous does.
inline AdamWStep make_adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                                 float grad_multiplier, uint32_t seed, uint64_t index_offset) {
    if (step < 1) fail(strformat("adamw_update: step must be >= 1 (1-based for bias correction), got %d", step));
    AdamWStep s;
    s.lr = lr;
    s.beta1 = beta1;
    s.beta2 = beta2;
    s.one_minus_beta1 = 1.0f - beta1;
    s.one_minus_beta2 = 1.0f - beta2;
    s.eps = eps;
    s.weight_decay = weight_decay;
    s.bias_correction1 = (float)(1.0 - std::pow((double)beta1, step));
    s.bias_correction2 = (float)(1.0 - std::pow((double)beta2, step));
    s.grad_multiplier = grad_multiplier;
    s.seed = seed;
    s.index_offset = index_offset;
    return s;
}

// The update of one element (same order as adamw_span); m and v updated in place, returns the new
// master weight.
__device__ inline float adamw_element(float master, float grad, float& m, float& v, const AdamWStep& s) {
    const float g = __fmul_rn(grad, s.grad_multiplier);
    const float mi = __fmaf_rn(s.beta1, m, __fmul_rn(s.one_minus_beta1, g));
    const float vi = __fmaf_rn(s.beta2, v, __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    m = mi;
    v = vi;
    const float mhat = __fdiv_rn(mi, s.bias_correction1), vhat = __fdiv_rn(vi, s.bias_correction2);
    const float step = __fmaf_rn(s.weight_decay, master, __fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), s.eps)));
    return __fmaf_rn(-s.lr, step, master);
}

// Elements [head, head + 4 * num_vecs) go four at a time (fp32 arrays 16-byte aligned there, params
// 8-byte aligned); the scalar elements, [0, head) and the tail after the vectors, get the threads
// after the vector threads. One thread per vector or scalar element.
__global__ void __launch_bounds__(ADAMW_BLOCK_SIZE)
    adamw_kernel(floatX* params, float* master, const float* grads, float* m, float* v, size_t n, size_t head,
                 size_t num_vecs, AdamWStep s) {
    const size_t work = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (work < num_vecs) {
        const size_t i = head + work * f128::size;
        const f128 g = load128cs(grads + i);
        f128 p = load128cs(master + i), mi = load128cs(m + i), vi = load128cs(v + i);
        Bf16x4 out;
#pragma unroll
        for (int k = 0; k < f128::size; k++) {
            p[k] = adamw_element(p[k], g[k], mi[k], vi[k], s);
            out.v[k] = stochastic_round_bf16(p[k], random_bits(s.seed, s.index_offset + i + k));
        }
        store128cs(master + i, p);
        store128cs(m + i, mi);
        store128cs(v + i, vi);
        *reinterpret_cast<Bf16x4*>(params + i) = out;
        return;
    }
    const size_t scalar = work - num_vecs, tail_begin = head + num_vecs * f128::size;
    const size_t i = scalar < head ? scalar : tail_begin + (scalar - head);
    if (i >= n) return;
    float mi = m[i], vi = v[i];
    const float p = adamw_element(master[i], grads[i], mi, vi, s);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    params[i] = stochastic_round_bf16(p, random_bits(s.seed, s.index_offset + i));
}

// One AdamW step on n contiguous elements sharing one weight decay (a tensor or a slice of one), then
// params = stochastic rounding of the new master weights with bits from (seed, index_offset + i).
// step is 1-based. Any start offset works: elements before the first 16-byte boundary are scalar,
// and if the pointers do not share one alignment phase the whole range is.
inline void adamw_update(floatX* params, float* master, const float* grads, float* m, float* v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int step, float grad_multiplier,
                         uint32_t seed, uint64_t index_offset, cudaStream_t stream) {
    const AdamWStep s = make_adamw_step(lr, beta1, beta2, eps, weight_decay, step, grad_multiplier, seed, index_offset);
    if (n == 0) return;
    const auto address = [](const void* p) { return (uintptr_t)p; };
    const size_t to_boundary = (16 - address(master) % 16) % 16 / sizeof(float);
    size_t head = to_boundary < n ? to_boundary : n;
    const bool phases_agree = (address(grads + head) | address(m + head) | address(v + head)) % 16 == 0 &&
                              address(params + head) % 8 == 0;
    if (!phases_agree) head = n;
    const size_t num_vecs = (n - head) / f128::size;
    const size_t work = num_vecs + (n - num_vecs * f128::size);
    const size_t blocks = ceil_div(work, (size_t)ADAMW_BLOCK_SIZE);
    if (blocks > (size_t)INT_MAX) fail(strformat("adamw_update: %zu elements need too many blocks", n));
    LLMC_LAUNCH(adamw_kernel, (unsigned)blocks, ADAMW_BLOCK_SIZE, 0, stream)(params, master, grads, m, v, n, head, num_vecs, s);
    CUDA_CHECK_LAUNCH();
}

__global__ void copy_master_to_params_kernel(floatX* params, const float* master, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) params[i] = __float2bfloat16_rn(master[i]);
}

// params = master rounded to nearest even (after init or a checkpoint load, where there is no
// update to be unbiased about).
inline void copy_master_to_params(floatX* params, const float* master, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const size_t blocks = ceil_div(n, (size_t)ADAMW_BLOCK_SIZE);
    if (blocks > (size_t)INT_MAX) fail(strformat("copy_master_to_params: %zu elements need too many blocks", n));
    LLMC_LAUNCH(copy_master_to_params_kernel, (unsigned)blocks, ADAMW_BLOCK_SIZE, 0, stream)(params, master, n);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
