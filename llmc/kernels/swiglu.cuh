// swiglu.cuh: SwiGLU's elementwise part (Llama's MLP), forward and backward, on bf16 rows.
//
// The MLP is down(silu(gate(x)) * up(x)); gate and up are one product whose output rows are
// [gate: H | up: H] (N rows of 2H), and these kernels map each row to H values and back. The
// definition is cpu::swiglu_forward / _backward (cpu/llama_ops.h):
//
//   out   = silu(g) * u, silu(g) = g * s, s = sigmoid(g)
//   dgate = dout * u * s * (1 + g (1 - s))     (silu'(g) = s (1 + g (1 - s)))
//   dup   = dout * g * s
//
// The CPU's sigmoid takes exp from fast_exp (its vectorisable polynomial); here it is expf, as
// gelu.cuh's: the two agree to a few ulp in fp32, far inside the bf16 tolerance of the outputs. For a
// very negative g, expf(-g) overflows to +inf and s is exactly 0, so silu(g) = -0: the limit, no NaN.
//
// Pure streams, as GELU's kernels: each thread moves 16-byte vectors (8 channels of one row) of
// gate and up in and of out (or dgate and dup) back, all arithmetic in fp32, one rounding to bf16 at
// the store. Each output element is written by one thread: deterministic, no synchronisation.
// The down projection reads `out`; fusing the forward into the gate/up product's epilogue (the
// product writes silu(g) * u directly, halving what it writes) is left for later.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

constexpr int SWIGLU_BLOCK_SIZE = 256;
// Measuring an amax costs one atomic a block, so a kernel that measures runs at most this many
// blocks, each thread then taking several vectors a grid apart (gelu.cuh's GELU_MAX_AMAX_BLOCKS, for
// the same reason); one that does not runs a vector a thread, the grid the data's size.
constexpr size_t SWIGLU_MAX_AMAX_BLOCKS = 16384;

__device__ inline float swiglu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// H a multiple of 8 (rows are whole 16-byte vectors), pointers 16-byte aligned.
inline void swiglu_check_arguments(const char* what, int N, int H, const void* a, const void* b, const void* c) {
    if (N < 1 || H < 8 || H % 8 != 0)
        fail(strformat("%s: N = %d rows, H = %d; expected N >= 1 and H a positive multiple of 8", what, N, H));
    if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(c)) % 16 != 0)
        fail(strformat("%s: pointers must be 16-byte aligned, got %p, %p and %p", what, a, b, c));
}

inline unsigned swiglu_blocks(const char* what, int N, int H, const float* amax) {
    const size_t blocks = ceil_div((size_t)N * H, (size_t)SWIGLU_BLOCK_SIZE * x128::size);
    if (!amax && blocks > 0x7fffffffu) fail(strformat("%s: N = %d x H = %d is too many for one launch", what, N, H));
    return (unsigned)(amax ? std::min(blocks, SWIGLU_MAX_AMAX_BLOCKS) : blocks);
}

// Thread t owns the vector of 8 outputs starting at element 8t of the N x H output, and every
// grid's worth after it. Where `amax` is given, the largest |output| joins *amax.
__global__ void __launch_bounds__(SWIGLU_BLOCK_SIZE)
    swiglu_forward_kernel(floatX* out, const floatX* gate_up, int N, int H, float* amax) {
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f;
    const size_t vectors_per_row = H / x128::size, vectors = (size_t)N * vectors_per_row;
    for (size_t v = (size_t)blockIdx.x * blockDim.x + threadIdx.x; v < vectors; v += (size_t)gridDim.x * blockDim.x) {
        const size_t row = v / vectors_per_row, column = (v % vectors_per_row) * x128::size;
        const floatX* gate = gate_up + row * 2 * H + column;
        const x128 g = load128cs(gate);  // read once; `out` feeds the down projection, so it stays cached
        const x128 u = load128cs(gate + H);
        x128 y;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            const float gk = __bfloat162float(g[k]);
            y[k] = __float2bfloat16_rn(gk * swiglu_sigmoid(gk) * __bfloat162float(u[k]));
            m = fmaxf(m, fabsf(__bfloat162float(y[k])));
        }
        store128(out + row * H + column, y);
    }
    if (amax) block_amax_into(amax, m, shared);
}

// out (N x H) = silu(gate) * up from gate_up (N x 2H, rows [gate | up]); with `amax`, the output's
// largest |value| joins *amax (FP8's current scaling of the down projection's input).
inline void swiglu_forward(floatX* out, const floatX* gate_up, int N, int H, cudaStream_t stream,
                           float* amax = nullptr) {
    swiglu_check_arguments("swiglu_forward", N, H, out, gate_up, gate_up);
    const unsigned blocks = swiglu_blocks("swiglu_forward", N, H, amax);
    LLMC_LAUNCH(swiglu_forward_kernel, blocks, SWIGLU_BLOCK_SIZE, 0, stream)(out, gate_up, N, H, amax);
    CUDA_CHECK_LAUNCH();
}

// Thread t owns output columns [8t, 8t + 8) of one row of dout, and with them the same columns of
// gate and of up (and of dgate and dup), every grid's worth after them.
__global__ void __launch_bounds__(SWIGLU_BLOCK_SIZE)
    swiglu_backward_kernel(floatX* dgate_up, const floatX* dout, const floatX* gate_up, int N, int H, float* amax) {
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f;
    const size_t vectors_per_row = H / x128::size, vectors = (size_t)N * vectors_per_row;
    for (size_t v = (size_t)blockIdx.x * blockDim.x + threadIdx.x; v < vectors; v += (size_t)gridDim.x * blockDim.x) {
        const size_t row = v / vectors_per_row, column = (v % vectors_per_row) * x128::size;
        const size_t at = row * 2 * H + column;
        const x128 g = load128cs(gate_up + at), u = load128cs(gate_up + at + H);
        const x128 d = load128cs(dout + row * H + column);
        x128 dg, du;
#pragma unroll
        for (int k = 0; k < x128::size; k++) {
            const float gk = __bfloat162float(g[k]), dk = __bfloat162float(d[k]), s = swiglu_sigmoid(gk);
            dg[k] = __float2bfloat16_rn(dk * __bfloat162float(u[k]) * s * (1.0f + gk * (1.0f - s)));
            du[k] = __float2bfloat16_rn(dk * gk * s);
            m = fmaxf(m, fmaxf(fabsf(__bfloat162float(dg[k])), fabsf(__bfloat162float(du[k]))));
        }
        // both stores after all three loads: dgate_up may be gate_up itself
        store128(dgate_up + at, dg);
        store128(dgate_up + at + H, du);
    }
    if (amax) block_amax_into(amax, m, shared);
}

// dgate_up (N x 2H) is overwritten (gate_up is an activation, not a residual) with the gradient of
// gate_up, from dout (N x H). dgate_up may be gate_up itself (the gradient replacing the activation,
// which the backward no longer needs) but must not otherwise overlap it or dout. With `amax`, the
// result's largest |value| joins *amax (FP8's current scaling of the gate/up product's backward).
inline void swiglu_backward(floatX* dgate_up, const floatX* dout, const floatX* gate_up, int N, int H,
                            cudaStream_t stream, float* amax = nullptr) {
    swiglu_check_arguments("swiglu_backward", N, H, dgate_up, dout, gate_up);
    const unsigned blocks = swiglu_blocks("swiglu_backward", N, H, amax);
    LLMC_LAUNCH(swiglu_backward_kernel, blocks, SWIGLU_BLOCK_SIZE, 0, stream)(dgate_up, dout, gate_up, N, H, amax);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
