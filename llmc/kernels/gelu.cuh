// gelu.cuh: the tanh-form GELU on bf16 tensors, forward and backward, elementwise.
//
// GELU(x) = 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as x * sigmoid(2u)
// (the same identity and the same derivative as cpu::gelu_forward / cpu::gelu_backward), so one
// exp and no cancellation near 0. The kernels are pure streams: each thread moves 16 bytes in and
// out per tensor, all arithmetic in fp32, one rounding to bf16 at the store.
//
// The matmul epilogues (matmul.cuh) fuse GELU into cuBLASLt where they can; these kernels are the
// unfused path and the definition the fused one is checked against.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

constexpr float GELU_SQRT_2_OVER_PI = 0.7978845608028654f;  // cpu::GELU_K
constexpr float GELU_CUBIC = 0.044715f;                     // cpu::GELU_A

// sigmoid(2u) = 0.5 (1 + tanh(u)). For very negative x, expf overflows to +inf and the result is
// exactly 0, so GELU(x) = x * 0 = -0: the limit, without NaN.
__device__ inline float gelu_sigmoid_2u(float x) {
    const float u = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}
__device__ inline float gelu_value(float x) { return x * gelu_sigmoid_2u(x); }
// d/dx [x s(2u)] = s + 2 x s (1 - s) u'(x), with u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
__device__ inline float gelu_derivative(float x) {
    const float s = gelu_sigmoid_2u(x);
    const float du_dx = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * x * x);
    return s + 2.0f * x * s * (1.0f - s) * du_dx;
}

// Pointers must be 16-byte aligned (x128 accesses); n need not be a multiple of 8.
inline void gelu_check_arguments(const char* what, const void* a, const void* b) {
    if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % 16 != 0)
        fail(strformat("%s: pointers must be 16-byte aligned, got %p and %p", what, a, b));
}

constexpr int GELU_BLOCK_SIZE = 256;
// Measuring an amax costs one atomic a block, so a kernel that measures runs at most this many
// blocks (16 waves of an H100's resident threads), each thread then taking several vectors a grid
// apart; one that does not runs a vector a thread, the grid the data's size (on an H200, with every
// launch capped at 4096 blocks, d48's GELU phase took 10% longer than in the call before, where the
// other kernels' phases took 5% less).
constexpr size_t GELU_MAX_AMAX_BLOCKS = 16384;

// Thread t owns elements [8t, 8t + 8) and every grid's worth after them; the thread holding the
// ragged end (n % 8 != 0) goes element by element. Where `amax` is given (FP8's current scaling
// measures the output for the product that reads it), the largest |output| joins *amax.
__global__ void __launch_bounds__(GELU_BLOCK_SIZE)
    gelu_forward_kernel(floatX* out, const floatX* inp, size_t n, float* amax) {
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x * x128::size;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size; i < n; i += stride) {
        if (i + x128::size <= n) {
            const x128 x = load128cs(inp + i);  // read once; `out` feeds the next matmul, so it stays cached
            x128 y;
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                y[k] = __float2bfloat16_rn(gelu_value(__bfloat162float(x[k])));
                m = fmaxf(m, fabsf(__bfloat162float(y[k])));
            }
            store128(out + i, y);
        } else {
            for (size_t j = i; j < n; j++) {
                out[j] = __float2bfloat16_rn(gelu_value(__bfloat162float(inp[j])));
                m = fmaxf(m, fabsf(__bfloat162float(out[j])));
            }
        }
    }
    if (amax) block_amax_into(amax, m, shared);
}

inline unsigned gelu_blocks(const char* what, size_t n, const float* amax) {
    const size_t blocks = ceil_div(n, (size_t)GELU_BLOCK_SIZE * x128::size);
    if (!amax && blocks > 0x7fffffffu) fail(strformat("%s: n = %zu elements is too many for one launch", what, n));
    return (unsigned)(amax ? std::min(blocks, GELU_MAX_AMAX_BLOCKS) : blocks);
}

// out = GELU(inp), n elements; with `amax`, its largest |value| joins *amax. out may equal inp (each
// element is read before it is written by the same thread) but must not otherwise overlap it.
inline void gelu_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream, float* amax = nullptr) {
    if (n == 0) return;
    gelu_check_arguments("gelu_forward", out, inp);
    const unsigned blocks = gelu_blocks("gelu_forward", n, amax);
    LLMC_LAUNCH(gelu_forward_kernel, blocks, GELU_BLOCK_SIZE, 0, stream)(out, inp, n, amax);
    CUDA_CHECK_LAUNCH();
}

__global__ void __launch_bounds__(GELU_BLOCK_SIZE)
    gelu_backward_inplace_kernel(floatX* d_in_out, const floatX* pre_gelu, size_t n, float* amax) {
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x * x128::size;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size; i < n; i += stride) {
        if (i + x128::size <= n) {
            const x128 x = load128cs(pre_gelu + i);
            x128 d = load128(d_in_out + i);
#pragma unroll
            for (int k = 0; k < x128::size; k++) {
                d[k] = __float2bfloat16_rn(__bfloat162float(d[k]) * gelu_derivative(__bfloat162float(x[k])));
                m = fmaxf(m, fabsf(__bfloat162float(d[k])));
            }
            store128(d_in_out + i, d);
        } else {
            for (size_t j = i; j < n; j++) {
                const float d = __bfloat162float(d_in_out[j]);
                d_in_out[j] = __float2bfloat16_rn(d * gelu_derivative(__bfloat162float(pre_gelu[j])));
                m = fmaxf(m, fabsf(__bfloat162float(d_in_out[j])));
            }
        }
    }
    if (amax) block_amax_into(amax, m, shared);
}

// d_in_out *= GELU'(pre_gelu), n elements: the gradient of GELU's output in, of its input out; with
// `amax`, the result's largest |value| joins *amax.
inline void gelu_backward_inplace(floatX* d_in_out, const floatX* pre_gelu, size_t n, cudaStream_t stream,
                                  float* amax = nullptr) {
    if (n == 0) return;
    gelu_check_arguments("gelu_backward_inplace", d_in_out, pre_gelu);
    const unsigned blocks = gelu_blocks("gelu_backward_inplace", n, amax);
    LLMC_LAUNCH(gelu_backward_inplace_kernel, blocks, GELU_BLOCK_SIZE, 0, stream)(d_in_out, pre_gelu, n, amax);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
