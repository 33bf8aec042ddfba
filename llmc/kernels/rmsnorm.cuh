// rmsnorm.cuh: RMSNorm (Llama's pre-norm) forward, recompute and backward over N rows of C bf16
// channels, fp32 math. The definition is cpu::rmsnorm_forward / _backward (cpu/llama_ops.h):
//
//   out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps), kept per row for the backward
//   dinp += (dout * weight - norm * mean(dout * weight * norm)) * rstd, norm = x * rstd
//   dweight += sum over rows of dout * norm
//
// The kernels are layernorm.cuh's with the mean and the bias taken out, and keep its rules. One warp
// owns one row; where the row fits (forward: C <= 4096, Llama 3 8B's width; backward: C <= 2048,
// as it holds three vectors per chunk: dout, x and dinp) it stays in registers between the passes,
// so every element crosses DRAM once; wider rows are streamed again and hit L1/L2. A lane's vector
// count is rounded up to a power of two (1, 2, 4, 8, 16), so five instantiations, not sixteen,
// cover every width (less for nvcc and the emulator's g++ to compile); the vectors past the row's
// end are skipped. dweight, a sum over rows, is deterministic without atomics as LayerNorm's
// is: each warp adds its rows into its own slice of shared memory (a lane always owns the same
// columns), the block adds its warps' slices in warp order into a partial row, and a second kernel
// adds the blocks' partial rows in block order. The grid depends only on (N, C), never on the
// device, so dweight is the same bits on every GPU.
//
// No fused residual-add + RMSNorm: as in GPT-2's CUDA model, the residual is added in the epilogue of
// the projection that writes it (matmul_forward's `residual`, or bias_residual_add under tensor
// parallelism), and the norm reads the sum. What GPT-2 has beside its forward, a recompute from the
// saved statistics (recomputation -r), is here too.
#pragma once

#include <algorithm>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

// cpu::RMSNORM_EPS (cpu/llama_ops.h: Llama 3's), added to the mean square. The CPU header is not
// included here (it brings the CPU model's OpenMP code into every CUDA file); the workbench
// (dev/cuda/llama_layers.cu), which includes both, asserts that they are equal.
constexpr float RMSNORM_EPS = 1e-5f;

constexpr int RMSNORM_FORWARD_MAX_CHUNKS_PER_LANE = 16;   // 32 lanes x 16 vectors x 8 = 4096 channels
constexpr int RMSNORM_BACKWARD_MAX_CHUNKS_PER_LANE = 8;   // 2048 channels: 3 x 8 vectors = 96 registers
constexpr int RMSNORM_FORWARD_WARPS = 8;                  // rows per forward block
constexpr int RMSNORM_BACKWARD_MAX_WARPS = 8;             // rows in flight per backward block
constexpr int RMSNORM_BACKWARD_MAX_BLOCKS = 512;          // a few per SM on any GPU; bounds the scratch
constexpr int RMSNORM_PARTIAL_SUM_SLICES = 8;             // threads adding one column's partials

inline void rmsnorm_check_shape(int N, int C, const char* what) {
    if (N < 1) fail(strformat("%s: N = %d rows, expected at least 1", what, N));
    if (C < 8 || C % 8 != 0) fail(strformat("%s: C = %d channels, expected a positive multiple of 8", what, C));
}

// The vectors a lane holds for a row of C channels, rounded up to the instantiated counts; 0 where
// the row is wider than `max_chunks` vectors a lane: the streaming kernel.
inline int rmsnorm_chunks_per_lane(int C, int max_chunks) {
    const int needed = ceil_div(C / x128::size, WARP_SIZE);
    int chunks = 1;
    while (chunks < needed) chunks *= 2;
    return chunks <= max_chunks ? chunks : 0;
}

// The output with both roundings spelled out, (x * rstd) * weight as the CPU multiplies, so that the
// forward and the recompute kernels, compiled separately, produce the same bits.
__device__ inline float rmsnorm_scale(float x, float rstd, float weight) {
    return __fmul_rn(__fmul_rn(x, rstd), weight);
}

// ---------------------------------------------------------------------------------------------
// Forward: out = x * rstd * weight, with rstd saved per row. Where `amax` is given (FP8's current
// scaling measures the output for the product that reads it), the block's largest |output| joins
// *amax, one atomic per block of 8 rows.

// The row's vectors held by one lane are chunks lane, lane + 32, ..., so a warp's loads are
// contiguous. CHUNKS_PER_LANE 0: the streaming row, read again for the output.
template <int CHUNKS_PER_LANE>
__device__ inline float rmsnorm_forward_row(floatX* out, float* rstd, const floatX* inp, const floatX* weight,
                                            int row, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int chunks = C / x128::size;
    const floatX* x = inp + (size_t)row * C;
    constexpr int HELD = CHUNKS_PER_LANE > 0 ? CHUNKS_PER_LANE : 1;  // (an array of size 0 is not C++)
    [[maybe_unused]] x128 xs[HELD];

    float squares = 0.0f;
    if constexpr (CHUNKS_PER_LANE > 0) {
#pragma unroll
        for (int k = 0; k < CHUNKS_PER_LANE; k++) {
            const int chunk = lane + k * WARP_SIZE;
            if (chunk < chunks) {
                xs[k] = load128(x + chunk * x128::size);
#pragma unroll
                for (int i = 0; i < x128::size; i++) squares += __bfloat162float(xs[k][i]) * __bfloat162float(xs[k][i]);
            }
        }
    } else {
        for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) {
            const x128 xv = load128(x + chunk * x128::size);
#pragma unroll
            for (int i = 0; i < x128::size; i++) squares += __bfloat162float(xv[i]) * __bfloat162float(xv[i]);
        }
    }
    const float s = 1.0f / sqrtf(warp_reduce_sum(squares) / C + RMSNORM_EPS);

    floatX* o = out + (size_t)row * C;
    float largest = 0.0f;
    // one pass over the lane's vectors, from registers or from memory again
    auto write = [&](int chunk, const x128& xv) {
        const x128 w = load128(weight + chunk * x128::size);
        x128 result;
#pragma unroll
        for (int i = 0; i < x128::size; i++) {
            result[i] = __float2bfloat16_rn(rmsnorm_scale(__bfloat162float(xv[i]), s, __bfloat162float(w[i])));
            largest = fmaxf(largest, fabsf(__bfloat162float(result[i])));
        }
        store128(o + chunk * x128::size, result);
    };
    if constexpr (CHUNKS_PER_LANE > 0) {
#pragma unroll
        for (int k = 0; k < CHUNKS_PER_LANE; k++) {
            const int chunk = lane + k * WARP_SIZE;
            if (chunk < chunks) write(chunk, xs[k]);
        }
    } else {
        for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) write(chunk, load128(x + chunk * x128::size));
    }
    if (lane == 0) rstd[row] = s;
    return largest;
}

// One warp per row; rows past N take part only in the block's amax.
template <int CHUNKS_PER_LANE>
__global__ void __launch_bounds__(RMSNORM_FORWARD_WARPS * WARP_SIZE)
    rmsnorm_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C,
                           float* amax) {
    __shared__ float shared[WARP_SIZE];
    const int row = blockIdx.x * RMSNORM_FORWARD_WARPS + threadIdx.x / WARP_SIZE;
    float largest = 0.0f;
    if (row < N) largest = rmsnorm_forward_row<CHUNKS_PER_LANE>(out, rstd, inp, weight, row, C);
    if (amax) block_amax_into(amax, largest, shared);
}

// out (N x C) = RMSNorm(inp) * weight, rstd (N) saved. With `amax`, the output's largest |value|
// joins *amax (FP8's current scaling).
inline void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C,
                            cudaStream_t stream, float* amax = nullptr) {
    rmsnorm_check_shape(N, C, "rmsnorm_forward");
    const int blocks = ceil_div(N, RMSNORM_FORWARD_WARPS);
    auto launch = [&](auto kernel) {
        LLMC_LAUNCH(kernel, blocks, RMSNORM_FORWARD_WARPS * WARP_SIZE, 0, stream)(out, rstd, inp, weight, N, C, amax);
        CUDA_CHECK_LAUNCH();
    };
    switch (rmsnorm_chunks_per_lane(C, RMSNORM_FORWARD_MAX_CHUNKS_PER_LANE)) {
        case 1: launch(rmsnorm_forward_kernel<1>); break;
        case 2: launch(rmsnorm_forward_kernel<2>); break;
        case 4: launch(rmsnorm_forward_kernel<4>); break;
        case 8: launch(rmsnorm_forward_kernel<8>); break;
        case 16: launch(rmsnorm_forward_kernel<16>); break;
        default: launch(rmsnorm_forward_kernel<0>); break;
    }
    static_assert(RMSNORM_FORWARD_MAX_CHUNKS_PER_LANE == 16, "the switch above instantiates 1, 2, 4, 8, 16");
}

// ---------------------------------------------------------------------------------------------
// Recompute: the forward's output from its saved rstd, one thread per 8 channels (recomputation
// keeps the block's input and rstd, not the normalised activation).

__global__ void rmsnorm_recompute_kernel(floatX* out, const floatX* inp, const float* rstd, const floatX* weight,
                                         int N, int C) {
    const int chunks = C / x128::size;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * chunks) return;
    const int row = (int)(index / chunks);
    const int channel = (int)(index % chunks) * x128::size;
    const size_t offset = (size_t)row * C + channel;
    const float s = rstd[row];
    const x128 xv = load128(inp + offset);
    const x128 w = load128(weight + channel);
    x128 result;
#pragma unroll
    for (int i = 0; i < x128::size; i++)
        result[i] = __float2bfloat16_rn(rmsnorm_scale(__bfloat162float(xv[i]), s, __bfloat162float(w[i])));
    store128(out + offset, result);
}

inline void rmsnorm_recompute(floatX* out, const floatX* inp, const float* rstd, const floatX* weight, int N, int C,
                              cudaStream_t stream) {
    rmsnorm_check_shape(N, C, "rmsnorm_recompute");
    const int threads = 256;
    const size_t blocks = ceil_div((size_t)N * (C / x128::size), (size_t)threads);
    if (blocks > 0x7fffffffULL) fail(strformat("rmsnorm_recompute: N = %d x C = %d is too large", N, C));
    LLMC_LAUNCH(rmsnorm_recompute_kernel, (unsigned)blocks, threads, 0, stream)(out, inp, rstd, weight, N, C);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Backward.

// The launch shape, a function of (N, C) only. A block runs `warps_per_block` rows at a time over a
// contiguous range of rows; each warp keeps C fp32 partial sums of dweight in shared memory, so wide
// rows get fewer warps.
struct RMSNormBackwardPlan {
    int warps_per_block = 0;
    int blocks = 0;  // = the number of partial rows in the scratch
    int rows_per_block = 0;
    size_t shared_bytes = 0;
};

inline RMSNormBackwardPlan rmsnorm_backward_plan(int N, int C) {
    rmsnorm_check_shape(N, C, "rmsnorm_backward");
    constexpr size_t SHARED_BYTES_TARGET = 52 * 1024;  // leaves room for several blocks per SM
    const size_t bytes_per_warp = (size_t)C * sizeof(float);
    RMSNormBackwardPlan plan;
    plan.warps_per_block = (int)std::clamp<size_t>(SHARED_BYTES_TARGET / bytes_per_warp, 1,
                                                   (size_t)RMSNORM_BACKWARD_MAX_WARPS);
    plan.blocks = std::min(ceil_div(N, plan.warps_per_block), RMSNORM_BACKWARD_MAX_BLOCKS);
    plan.rows_per_block = ceil_div(N, plan.blocks);
    plan.blocks = ceil_div(N, plan.rows_per_block);  // no block without rows
    plan.shared_bytes = plan.warps_per_block * bytes_per_warp;
    return plan;
}

// Enough for any call with at most N rows (a buffer sized once for the largest batch). The final
// block count is not monotone in N (whole rows per block), so the bound is the count before that
// rounding, which is.
inline size_t rmsnorm_backward_scratch_floats(int N, int C) {
    const RMSNormBackwardPlan plan = rmsnorm_backward_plan(N, C);
    const int max_blocks = std::min(ceil_div(N, plan.warps_per_block), RMSNORM_BACKWARD_MAX_BLOCKS);
    return (size_t)max_blocks * (size_t)C;
}

// A warp's shared-memory slice holds C dweight sums. Channel c of chunk c / 8 sits at
// (half * chunks + chunk) * 4 + c % 4, half = (c / 4) % 2: a lane's 8 channels are two float4, each
// beside its neighbours' float4, so a warp's float4 accesses have no bank conflicts (layernorm.cuh's
// layout, one region instead of two).
__device__ inline int rmsnorm_slice_offset(int channel, int chunks) {
    const int chunk = channel / x128::size, half = (channel / 4) % 2;
    return (half * chunks + chunk) * 4 + channel % 4;
}

// Pass 1 for one vector of a row: the lane's share of sum(dout * weight * norm).
__device__ inline float rmsnorm_backward_row_sum(const x128& d, const x128& x, const x128& w, float s) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < x128::size; i++)
        sum += __bfloat162float(d[i]) * __bfloat162float(w[i]) * (__bfloat162float(x[i]) * s);
    return sum;
}

// Pass 2 for one vector of a row: dinp += ..., and dout * norm into the warp's slice. Returns the
// largest |dinp| it wrote (FP8's amax of the residual gradient).
__device__ inline float rmsnorm_backward_vector(floatX* dinp_row, float* warp_slice, int chunk, int chunks,
                                               const x128& d, const x128& x, const x128& w, const x128& dx, float s,
                                               float dnorm_norm_mean) {
    float* lo = warp_slice + chunk * 4;
    float* hi = warp_slice + (chunks + chunk) * 4;
    f128 dweight_sums[2] = {load128(lo), load128(hi)};
    x128 dx_new;
    float largest = 0.0f;
#pragma unroll
    for (int i = 0; i < x128::size; i++) {
        const float dout_i = __bfloat162float(d[i]);
        const float norm = __bfloat162float(x[i]) * s;
        const float dnorm = dout_i * __bfloat162float(w[i]);
        dx_new[i] = __float2bfloat16_rn(__bfloat162float(dx[i]) + (dnorm - norm * dnorm_norm_mean) * s);
        largest = fmaxf(largest, fabsf(__bfloat162float(dx_new[i])));
        dweight_sums[i / 4][i % 4] += dout_i * norm;
    }
    store128(dinp_row + chunk * x128::size, dx_new);
    store128(lo, dweight_sums[0]);
    store128(hi, dweight_sums[1]);
    return largest;
}

__device__ inline void rmsnorm_backward_zero_slices(float* warp_slices, int C) {
    const int floats = (blockDim.x / WARP_SIZE) * C;
    for (int i = threadIdx.x; i < floats; i += blockDim.x) warp_slices[i] = 0.0f;
    __syncthreads();
}

// After the row loop: the block's partial row, its warps' slices added in warp order.
__device__ inline void rmsnorm_backward_write_partial(float* partials, const float* warp_slices, int C) {
    __syncthreads();
    const int warps = blockDim.x / WARP_SIZE, chunks = C / x128::size;
    float* block_partial = partials + (size_t)blockIdx.x * C;
    for (int column = threadIdx.x; column < C; column += blockDim.x) {
        const int offset = rmsnorm_slice_offset(column, chunks);
        float sum = 0.0f;
        for (int w = 0; w < warps; w++) sum += warp_slices[(size_t)w * C + offset];
        block_partial[column] = sum;
    }
}

// CHUNKS_PER_LANE > 0: the row's dout, x and dinp held in registers between the passes; 0: both
// passes read the row from memory (rows wider than the registers hold).
template <int CHUNKS_PER_LANE>
__global__ void __launch_bounds__(RMSNORM_BACKWARD_MAX_WARPS * WARP_SIZE)
    rmsnorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                            const floatX* weight, const float* rstd, int N, int C, int rows_per_block, float* amax) {
    float* warp_slices = dynamic_shared_memory<float>();  // [warps][C]
    rmsnorm_backward_zero_slices(warp_slices, C);
    const int warps = blockDim.x / WARP_SIZE, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int chunks = C / x128::size;
    float* warp_slice = warp_slices + (size_t)warp * C;
    const int row_begin = blockIdx.x * rows_per_block, row_end = min(row_begin + rows_per_block, N);
    float largest = 0.0f;

    for (int row = row_begin + warp; row < row_end; row += warps) {
        const floatX* d_row = dout + (size_t)row * C;
        const floatX* x_row = inp + (size_t)row * C;
        floatX* dx_row = dinp + (size_t)row * C;
        const float s = rstd[row];
        float dnorm_norm_sum = 0.0f;
        if constexpr (CHUNKS_PER_LANE > 0) {
            x128 ds[CHUNKS_PER_LANE], xs[CHUNKS_PER_LANE], dxs[CHUNKS_PER_LANE];
#pragma unroll
            for (int k = 0; k < CHUNKS_PER_LANE; k++) {
                const int chunk = lane + k * WARP_SIZE;
                if (chunk < chunks) {
                    ds[k] = load128cs(d_row + chunk * x128::size);
                    xs[k] = load128cs(x_row + chunk * x128::size);
                    dxs[k] = load128(dx_row + chunk * x128::size);  // early, so pass 2 does not wait for it
                    dnorm_norm_sum += rmsnorm_backward_row_sum(ds[k], xs[k], load128(weight + chunk * x128::size), s);
                }
            }
            const float dnorm_norm_mean = warp_reduce_sum(dnorm_norm_sum) / C;
#pragma unroll
            for (int k = 0; k < CHUNKS_PER_LANE; k++) {
                const int chunk = lane + k * WARP_SIZE;
                if (chunk < chunks) {
                    largest = fmaxf(largest, rmsnorm_backward_vector(dx_row, warp_slice, chunk, chunks, ds[k], xs[k],
                                                                     load128(weight + chunk * x128::size), dxs[k], s,
                                                                     dnorm_norm_mean));
                }
            }
        } else {
            for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) {
                dnorm_norm_sum += rmsnorm_backward_row_sum(load128(d_row + chunk * x128::size),
                                                           load128(x_row + chunk * x128::size),
                                                           load128(weight + chunk * x128::size), s);
            }
            const float dnorm_norm_mean = warp_reduce_sum(dnorm_norm_sum) / C;
            for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) {
                largest = fmaxf(largest, rmsnorm_backward_vector(
                                             dx_row, warp_slice, chunk, chunks, load128(d_row + chunk * x128::size),
                                             load128(x_row + chunk * x128::size), load128(weight + chunk * x128::size),
                                             load128(dx_row + chunk * x128::size), s, dnorm_norm_mean));
            }
        }
    }
    rmsnorm_backward_write_partial(partials, warp_slices, C);
    // the slices are read: their first floats serve the reduction (it synchronises before writing),
    // so the block asks for no static shared memory beside the plan's dynamic bytes
    if (amax) block_amax_into(amax, largest, warp_slices);
}

// dweight[c] += the sum of partials[g][c] over blocks g. Thread row y of a block adds blocks y, y + 8,
// ... in order, then thread row 0 adds the 8 sums in order.
__global__ void __launch_bounds__(WARP_SIZE * RMSNORM_PARTIAL_SUM_SLICES)
    rmsnorm_sum_partials_kernel(float* dweight, const float* partials, int blocks, int C) {
    __shared__ float slice_sums[RMSNORM_PARTIAL_SUM_SLICES][WARP_SIZE];
    const int column = blockIdx.x * WARP_SIZE + threadIdx.x;
    float sum = 0.0f;
    if (column < C) {
#pragma unroll 4
        for (int g = threadIdx.y; g < blocks; g += RMSNORM_PARTIAL_SUM_SLICES) sum += partials[(size_t)g * C + column];
    }
    slice_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && column < C) {
        float total = 0.0f;
#pragma unroll
        for (int y = 0; y < RMSNORM_PARTIAL_SUM_SLICES; y++) total += slice_sums[y][threadIdx.x];
        dweight[column] += total;
    }
}

// dinp (N x C) += ..., dweight (C) += ... (both accumulate: a pre-norm's input is the residual stream,
// whose gradient already holds the skip connection's share). scratch: rmsnorm_backward_scratch_floats(M, C)
// floats for some M >= N. With `amax`, the new dinp's largest |value| joins *amax (FP8's current
// scaling of the residual gradient the projection's backward reads next).
inline void rmsnorm_backward(floatX* dinp, float* dweight, float* scratch, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* rstd, int N, int C, cudaStream_t stream,
                             float* amax = nullptr) {
    const RMSNormBackwardPlan plan = rmsnorm_backward_plan(N, C);
    auto launch = [&](auto kernel) {
        if (plan.shared_bytes > 48 * 1024) {
            int device = 0, max_shared = 0;
            CUDA_CHECK(cudaGetDevice(&device));
            CUDA_CHECK(cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
            if (plan.shared_bytes > (size_t)max_shared) {
                fail(strformat("rmsnorm_backward: C = %d needs %zu bytes of shared memory per block, the device "
                               "allows %d",
                               C, plan.shared_bytes, max_shared));
            }
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)plan.shared_bytes));
        }
        LLMC_LAUNCH(kernel, plan.blocks, plan.warps_per_block * WARP_SIZE, plan.shared_bytes, stream)(
            dinp, scratch, dout, inp, weight, rstd, N, C, plan.rows_per_block, amax);
        CUDA_CHECK_LAUNCH();
    };
    switch (rmsnorm_chunks_per_lane(C, RMSNORM_BACKWARD_MAX_CHUNKS_PER_LANE)) {
        case 1: launch(rmsnorm_backward_kernel<1>); break;
        case 2: launch(rmsnorm_backward_kernel<2>); break;
        case 4: launch(rmsnorm_backward_kernel<4>); break;
        case 8: launch(rmsnorm_backward_kernel<8>); break;
        default: launch(rmsnorm_backward_kernel<0>); break;
    }
    static_assert(RMSNORM_BACKWARD_MAX_CHUNKS_PER_LANE == 8, "the switch above instantiates 1, 2, 4, 8");

    const dim3 sum_threads(WARP_SIZE, RMSNORM_PARTIAL_SUM_SLICES);
    LLMC_LAUNCH(rmsnorm_sum_partials_kernel, ceil_div(C, WARP_SIZE), sum_threads, 0, stream)(dweight, scratch,
                                                                                          plan.blocks, C);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
