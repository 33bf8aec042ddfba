// global_norm.cuh: the sum of squares of a gradient range, for global-norm clipping, bitwise
// reproducible.
//
// The idea: the grid depends on n alone (one block per GLOBAL_NORM_BLOCK_SIZE vectors, at most
// GLOBAL_NORM_BLOCKS; never sized to the device), so which thread adds which elements, and in which
// order, is fixed by n. A small range gets a small grid (ZeRO and tensor parallelism sum many small
// pieces; the emulator pays for every thread launched). Each block
// writes its partial sum to its own slot (no atomics), and one small block adds the slots in a fixed
// order in double. Any GPU, any run: the same bits.
#pragma once

#include <algorithm>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

constexpr int GLOBAL_NORM_BLOCKS = 1024;
constexpr int GLOBAL_NORM_BLOCK_SIZE = 256;
constexpr int GLOBAL_NORM_FINAL_BLOCK_SIZE = 256;

// Elements [head, head + 4 * num_vecs) are read as 16-byte vectors (x + head is aligned); the at most
// 3 + 3 elements before and after them are taken by the first threads of the grid.
__global__ void __launch_bounds__(GLOBAL_NORM_BLOCK_SIZE)
    global_norm_partials_kernel(float* partials, const float* x, size_t n, size_t head, size_t num_vecs) {
    __shared__ float shared[WARP_SIZE];
    const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t num_threads = (size_t)gridDim.x * blockDim.x;
    float sum = 0.0f;
    for (size_t vec = thread; vec < num_vecs; vec += num_threads) {
        const f128 p = load128cs(x + head + vec * f128::size);
#pragma unroll
        for (int k = 0; k < f128::size; k++) sum = __fmaf_rn(p[k], p[k], sum);
    }
    const size_t tail_begin = head + num_vecs * f128::size, num_scalars = n - num_vecs * f128::size;
    if (thread < num_scalars) {
        const size_t i = thread < head ? thread : tail_begin + (thread - head);
        sum = __fmaf_rn(x[i], x[i], sum);
    }
    sum = block_reduce_sum(sum, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One block: thread t adds partials t, t + blockDim.x, ... in double, then a fixed halving tree.
__global__ void __launch_bounds__(GLOBAL_NORM_FINAL_BLOCK_SIZE)
    global_norm_final_kernel(double* out, const float* partials, int num_partials, bool accumulate) {
    __shared__ double sums[GLOBAL_NORM_FINAL_BLOCK_SIZE];
    double sum = 0.0;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) sum += (double)partials[i];
    sums[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = GLOBAL_NORM_FINAL_BLOCK_SIZE / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = accumulate ? *out + sums[0] : sums[0];
}

// How many floats the `partials` scratch of global_norm_squared must hold.
inline size_t global_norm_partials_count() { return GLOBAL_NORM_BLOCKS; }

// *out = (or += with accumulate) the sum of x[i]^2 over [0, n), in double; x may start at any float
// boundary. partials: global_norm_partials_count() floats of scratch. Stream-ordered, so several
// ranges can be accumulated in sequence into one *out.
inline void global_norm_squared(double* out, float* partials, const float* x, size_t n, bool accumulate,
                                cudaStream_t stream) {
    const size_t to_boundary = (16 - (uintptr_t)x % 16) % 16 / sizeof(float);
    const size_t head = to_boundary < n ? to_boundary : n;
    const size_t num_vecs = (n - head) / f128::size;
    // The first threads also take the at most 6 scalars around the vectors.
    const size_t wanted = ceil_div(std::max(num_vecs, (size_t)6), (size_t)GLOBAL_NORM_BLOCK_SIZE);
    const int blocks = (int)std::min(wanted, (size_t)GLOBAL_NORM_BLOCKS);
    LLMC_LAUNCH(global_norm_partials_kernel, blocks, GLOBAL_NORM_BLOCK_SIZE, 0, stream)(partials, x, n, head, num_vecs);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(global_norm_final_kernel, 1, GLOBAL_NORM_FINAL_BLOCK_SIZE, 0, stream)(out, partials, blocks, accumulate);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
