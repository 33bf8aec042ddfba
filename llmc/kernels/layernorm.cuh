// layernorm.cuh: LayerNorm forward, recompute and backward over N rows of C bf16 channels, fp32 math.
//
// One warp owns one row. Where C <= 2048 the row stays in registers between the passes (statistics,
// then output), so every element crosses DRAM once; wider rows are streamed again on each pass and
// hit L1/L2. Backward also needs sums over rows (dweight, dbias). To keep them deterministic without
// atomics, each warp adds its rows into its own slice of shared memory (a lane always owns the same
// columns, so no two threads ever touch one address), the block adds its warps' slices in warp order
// into one partial row, and a second kernel adds the blocks' partial rows in block order. The grid
// depends only on (N, C), never on the device, so the sums are the same bits on every GPU.
#pragma once

#include <algorithm>

#include "llmc/kernels/cuda_common.cuh"
#include "llmc/numerics/layernorm_eps.h"

namespace llmc {

// Rows up to 32 lanes x 8 vectors x 8 channels = 2048 channels are held in registers.
constexpr int LAYERNORM_MAX_CHUNKS_PER_LANE = 8;
constexpr int LAYERNORM_FORWARD_WARPS = 8;        // rows per forward block
constexpr int LAYERNORM_BACKWARD_MAX_WARPS = 8;   // rows in flight per backward block
constexpr int LAYERNORM_BACKWARD_MAX_BLOCKS = 512;  // a few per SM on any GPU; bounds the scratch
constexpr int LAYERNORM_PARTIAL_SUM_SLICES = 8;   // threads adding one column's partials in the second kernel

inline void layernorm_check_shape(int N, int C, const char* what) {
    if (N < 1) fail(strformat("%s: N = %d rows, expected at least 1", what, N));
    if (C < 8 || C % 8 != 0) fail(strformat("%s: C = %d channels, expected a positive multiple of 8", what, C));
}

// The affine output with every rounding spelled out, so that the forward and the recompute kernels,
// compiled separately, produce the same bits (no FMA contraction left to the compiler's choice).
__device__ inline float layernorm_affine(float x, float mean, float rstd, float weight, float bias) {
    return __fmaf_rn(__fmul_rn(__fsub_rn(x, mean), rstd), weight, bias);
}

// ---------------------------------------------------------------------------------------------
// Forward: out = (x - mean) * rstd * weight + bias, with mean and rstd saved per row. Where `amax`
// is given (FP8's current scaling measures the output for the product that reads it), the block's
// largest |output| joins *amax, one atomic per block of 8 rows.

// The row's vectors held by one lane are chunks lane, lane + 32, ..., so a warp's loads are contiguous.
template <int CHUNKS_PER_LANE>
__device__ inline float layernorm_forward_row(floatX* out, float* mean, float* rstd, const floatX* inp,
                                              const floatX* weight, const floatX* bias, int row, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int chunks = C / x128::size;
    const floatX* x = inp + (size_t)row * C;

    x128 xs[CHUNKS_PER_LANE];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS_PER_LANE; k++) {
        const int chunk = lane + k * WARP_SIZE;
        if (chunk < chunks) {
            xs[k] = load128(x + chunk * x128::size);
#pragma unroll
            for (int i = 0; i < x128::size; i++) sum += __bfloat162float(xs[k][i]);
        }
    }
    const float m = warp_reduce_sum(sum) / C;

    float squares = 0.0f;  // two passes, as the CPU reference: no cancellation in E[x^2] - E[x]^2
#pragma unroll
    for (int k = 0; k < CHUNKS_PER_LANE; k++) {
        const int chunk = lane + k * WARP_SIZE;
        if (chunk < chunks) {
#pragma unroll
            for (int i = 0; i < x128::size; i++) {
                const float centered = __bfloat162float(xs[k][i]) - m;
                squares += centered * centered;
            }
        }
    }
    const float s = 1.0f / sqrtf(warp_reduce_sum(squares) / C + LAYERNORM_EPS);

    floatX* o = out + (size_t)row * C;
    float largest = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS_PER_LANE; k++) {
        const int chunk = lane + k * WARP_SIZE;
        if (chunk < chunks) {
            const x128 w = load128(weight + chunk * x128::size);
            const x128 b = load128(bias + chunk * x128::size);
            x128 result;
#pragma unroll
            for (int i = 0; i < x128::size; i++) {
                result[i] = __float2bfloat16_rn(
                    layernorm_affine(__bfloat162float(xs[k][i]), m, s, __bfloat162float(w[i]), __bfloat162float(b[i])));
                largest = fmaxf(largest, fabsf(__bfloat162float(result[i])));
            }
            store128(o + chunk * x128::size, result);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
    return largest;
}

// Rows wider than the registers hold: the same three passes, each reading the row again.
__device__ inline float layernorm_forward_streaming_row(floatX* out, float* mean, float* rstd, const floatX* inp,
                                                        const floatX* weight, const floatX* bias, int row, int C) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int chunks = C / x128::size;
    const floatX* x = inp + (size_t)row * C;

    float sum = 0.0f;
    for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) {
        const x128 xv = load128(x + chunk * x128::size);
#pragma unroll
        for (int i = 0; i < x128::size; i++) sum += __bfloat162float(xv[i]);
    }
    const float m = warp_reduce_sum(sum) / C;

    float squares = 0.0f;
    for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) {
        const x128 xv = load128(x + chunk * x128::size);
#pragma unroll
        for (int i = 0; i < x128::size; i++) {
            const float centered = __bfloat162float(xv[i]) - m;
            squares += centered * centered;
        }
    }
    const float s = 1.0f / sqrtf(warp_reduce_sum(squares) / C + LAYERNORM_EPS);

    floatX* o = out + (size_t)row * C;
    float largest = 0.0f;
    for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) {
        const x128 xv = load128(x + chunk * x128::size);
        const x128 w = load128(weight + chunk * x128::size);
        const x128 b = load128(bias + chunk * x128::size);
        x128 result;
#pragma unroll
        for (int i = 0; i < x128::size; i++) {
            result[i] = __float2bfloat16_rn(
                layernorm_affine(__bfloat162float(xv[i]), m, s, __bfloat162float(w[i]), __bfloat162float(b[i])));
            largest = fmaxf(largest, fabsf(__bfloat162float(result[i])));
        }
        store128(o + chunk * x128::size, result);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
    return largest;
}

// One warp per row (CHUNKS_PER_LANE 0: the streaming rows); rows past N take part only in the
// block's amax.
template <int CHUNKS_PER_LANE>
__global__ void __launch_bounds__(LAYERNORM_FORWARD_WARPS * WARP_SIZE)
    layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                             const floatX* bias, int N, int C, float* amax) {
    __shared__ float shared[WARP_SIZE];
    const int row = blockIdx.x * LAYERNORM_FORWARD_WARPS + threadIdx.x / WARP_SIZE;
    float largest = 0.0f;
    if (row < N) {
        if constexpr (CHUNKS_PER_LANE > 0)
            largest = layernorm_forward_row<CHUNKS_PER_LANE>(out, mean, rstd, inp, weight, bias, row, C);
        else
            largest = layernorm_forward_streaming_row(out, mean, rstd, inp, weight, bias, row, C);
    }
    if (amax) block_amax_into(amax, largest, shared);
}

// With `amax`, the output's largest |value| joins *amax (FP8's current scaling).
inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, cudaStream_t stream, float* amax = nullptr) {
    layernorm_check_shape(N, C, "layernorm_forward");
    const int blocks = ceil_div(N, LAYERNORM_FORWARD_WARPS);
    const int threads = LAYERNORM_FORWARD_WARPS * WARP_SIZE;
    auto launch = [&](auto kernel) {
        LLMC_LAUNCH(kernel, blocks, threads, 0, stream)(out, mean, rstd, inp, weight, bias, N, C, amax);
        CUDA_CHECK_LAUNCH();
    };
    switch (ceil_div(C / x128::size, WARP_SIZE)) {  // 0: the streaming rows
        case 1: launch(layernorm_forward_kernel<1>); break;
        case 2: launch(layernorm_forward_kernel<2>); break;
        case 3: launch(layernorm_forward_kernel<3>); break;
        case 4: launch(layernorm_forward_kernel<4>); break;
        case 5: launch(layernorm_forward_kernel<5>); break;
        case 6: launch(layernorm_forward_kernel<6>); break;
        case 7: launch(layernorm_forward_kernel<7>); break;
        case 8: launch(layernorm_forward_kernel<8>); break;
        default: launch(layernorm_forward_kernel<0>); break;
    }
    static_assert(LAYERNORM_MAX_CHUNKS_PER_LANE == 8, "the switch above instantiates 1..8");
}

// ---------------------------------------------------------------------------------------------
// Recompute: the forward's output from its saved statistics, one thread per 8 channels.

__global__ void layernorm_recompute_kernel(floatX* out, const floatX* inp, const float* mean, const float* rstd,
                                           const floatX* weight, const floatX* bias, int N, int C) {
    const int chunks = C / x128::size;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * chunks) return;
    const int row = (int)(index / chunks);
    const int channel = (int)(index % chunks) * x128::size;
    const size_t offset = (size_t)row * C + channel;
    const float m = mean[row], s = rstd[row];
    const x128 xv = load128(inp + offset);
    const x128 w = load128(weight + channel);
    const x128 b = load128(bias + channel);
    x128 result;
#pragma unroll
    for (int i = 0; i < x128::size; i++) {
        result[i] = __float2bfloat16_rn(
            layernorm_affine(__bfloat162float(xv[i]), m, s, __bfloat162float(w[i]), __bfloat162float(b[i])));
    }
    store128(out + offset, result);
}

inline void layernorm_recompute(floatX* out, const floatX* inp, const float* mean, const float* rstd,
                                const floatX* weight, const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_shape(N, C, "layernorm_recompute");
    const int threads = 256;
    const size_t vectors = (size_t)N * (C / x128::size);
    const size_t blocks = ceil_div(vectors, (size_t)threads);
    if (blocks > 0x7fffffffULL) fail(strformat("layernorm_recompute: N = %d x C = %d is too large", N, C));
    LLMC_LAUNCH(layernorm_recompute_kernel, (unsigned)blocks, threads, 0, stream)(out, inp, mean, rstd, weight, bias, N, C);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Backward.
//
// dnorm = dout * weight, norm = (x - mean) * rstd
// dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
// dweight += sum over rows of dout * norm, dbias += sum over rows of dout

// The launch shape, a function of (N, C) only. A block runs `warps` rows at a time over a contiguous
// range of rows; each warp keeps 2C fp32 partial sums in shared memory, so wide rows get fewer warps.
struct LayerNormBackwardPlan {
    int warps_per_block = 0;
    int blocks = 0;          // = the number of partial rows in the scratch
    int rows_per_block = 0;
    size_t shared_bytes = 0;
};

inline LayerNormBackwardPlan layernorm_backward_plan(int N, int C) {
    layernorm_check_shape(N, C, "layernorm_backward");
    constexpr size_t SHARED_BYTES_TARGET = 52 * 1024;  // leaves room for several blocks per SM
    const size_t bytes_per_warp = 2 * (size_t)C * sizeof(float);
    LayerNormBackwardPlan plan;
    plan.warps_per_block = (int)std::clamp<size_t>(SHARED_BYTES_TARGET / bytes_per_warp, 1,
                                                   (size_t)LAYERNORM_BACKWARD_MAX_WARPS);
    plan.blocks = std::min(ceil_div(N, plan.warps_per_block), LAYERNORM_BACKWARD_MAX_BLOCKS);
    plan.rows_per_block = ceil_div(N, plan.blocks);
    plan.blocks = ceil_div(N, plan.rows_per_block);  // no block without rows
    plan.shared_bytes = plan.warps_per_block * bytes_per_warp;
    return plan;
}

// Enough for any call with at most N rows, as a buffer sized once for the largest batch needs. The
// plan's final block count is not monotone in N (C = 768: 4096 rows give 512 blocks, 4097 rows 456),
// so the bound is the count before rounding to whole rows per block, which is.
inline size_t layernorm_backward_scratch_floats(int N, int C) {
    const LayerNormBackwardPlan plan = layernorm_backward_plan(N, C);
    const int max_blocks = std::min(ceil_div(N, plan.warps_per_block), LAYERNORM_BACKWARD_MAX_BLOCKS);
    return (size_t)max_blocks * 2 * (size_t)C;
}

// A warp's shared-memory slice holds dweight then dbias, C floats each. Inside each, channel c of
// chunk c / 8 sits at (half * chunks + chunk) * 4 + c % 4, half = (c / 4) % 2: a lane's 8 channels are
// two float4 that sit next to its neighbours' float4, so a warp's float4 accesses have no bank conflicts.
__device__ inline int layernorm_slice_offset(int channel, int chunks) {
    const int chunk = channel / x128::size, half = (channel / 4) % 2;
    return (half * chunks + chunk) * 4 + channel % 4;
}

// Pass 1 for one vector of a row: the lane's shares of sum(dnorm) and sum(dnorm * norm).
__device__ inline void layernorm_backward_row_sums(const x128& d, const x128& x, const x128& w, float m, float s,
                                                   float& dnorm_sum, float& dnorm_norm_sum) {
#pragma unroll
    for (int i = 0; i < x128::size; i++) {
        const float dnorm = __bfloat162float(d[i]) * __bfloat162float(w[i]);
        const float norm = (__bfloat162float(x[i]) - m) * s;
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
    }
}

// Pass 2 for one vector of a row: dinp += ..., and dout * norm, dout into the warp's slice. Returns
// the largest |dinp| it wrote (FP8's amax of the residual gradient).
__device__ inline float layernorm_backward_vector(floatX* dinp_row, float* warp_slice, int chunk, int chunks, int C,
                                                 const x128& d, const x128& x, const x128& w, const x128& dx,
                                                 float m, float s, float dnorm_mean, float dnorm_norm_mean) {
    float* dweight_lo = warp_slice + chunk * 4;
    float* dweight_hi = warp_slice + (chunks + chunk) * 4;
    float* dbias_lo = dweight_lo + C;
    float* dbias_hi = dweight_hi + C;
    f128 dweight_sums[2] = {load128(dweight_lo), load128(dweight_hi)};
    f128 dbias_sums[2] = {load128(dbias_lo), load128(dbias_hi)};
    x128 dx_new;
    float largest = 0.0f;
#pragma unroll
    for (int i = 0; i < x128::size; i++) {
        const float dout_i = __bfloat162float(d[i]);
        const float norm = (__bfloat162float(x[i]) - m) * s;
        const float dnorm = dout_i * __bfloat162float(w[i]);
        dx_new[i] = __float2bfloat16_rn(__bfloat162float(dx[i]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
        largest = fmaxf(largest, fabsf(__bfloat162float(dx_new[i])));
        dweight_sums[i / 4][i % 4] += dout_i * norm;
        dbias_sums[i / 4][i % 4] += dout_i;
    }
    store128(dinp_row + chunk * x128::size, dx_new);
    store128(dweight_lo, dweight_sums[0]);
    store128(dweight_hi, dweight_sums[1]);
    store128(dbias_lo, dbias_sums[0]);
    store128(dbias_hi, dbias_sums[1]);
    return largest;
}

// After the row loop: the block's partial row, its warps' slices added in warp order, channel order
// [dweight 0..C) [dbias 0..C).
__device__ inline void layernorm_backward_write_partial(float* partials, const float* warp_slices, int C) {
    __syncthreads();
    const int warps = blockDim.x / WARP_SIZE, chunks = C / x128::size;
    float* block_partial = partials + (size_t)blockIdx.x * 2 * C;
    for (int column = threadIdx.x; column < 2 * C; column += blockDim.x) {
        const int region = column < C ? 0 : C;
        const int offset = region + layernorm_slice_offset(column - region, chunks);
        float sum = 0.0f;
        for (int w = 0; w < warps; w++) sum += warp_slices[(size_t)w * 2 * C + offset];
        block_partial[column] = sum;
    }
}

__device__ inline void layernorm_backward_zero_slices(float* warp_slices, int C) {
    const int floats = (blockDim.x / WARP_SIZE) * 2 * C;
    for (int i = threadIdx.x; i < floats; i += blockDim.x) warp_slices[i] = 0.0f;
    __syncthreads();
}

template <int CHUNKS_PER_LANE>
__global__ void __launch_bounds__(LAYERNORM_BACKWARD_MAX_WARPS * WARP_SIZE)
    layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                              const floatX* weight, const float* mean, const float* rstd, int N, int C,
                              int rows_per_block, float* amax) {
    float* warp_slices = dynamic_shared_memory<float>();  // [warps][2 * C]
    layernorm_backward_zero_slices(warp_slices, C);
    const int warps = blockDim.x / WARP_SIZE, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int chunks = C / x128::size;
    float* warp_slice = warp_slices + (size_t)warp * 2 * C;
    const int row_begin = blockIdx.x * rows_per_block, row_end = min(row_begin + rows_per_block, N);
    float largest = 0.0f;

    for (int row = row_begin + warp; row < row_end; row += warps) {
        const floatX* d_row = dout + (size_t)row * C;
        const floatX* x_row = inp + (size_t)row * C;
        floatX* dx_row = dinp + (size_t)row * C;
        const float m = mean[row], s = rstd[row];
        x128 ds[CHUNKS_PER_LANE], xs[CHUNKS_PER_LANE], dxs[CHUNKS_PER_LANE];
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CHUNKS_PER_LANE; k++) {
            const int chunk = lane + k * WARP_SIZE;
            if (chunk < chunks) {
                ds[k] = load128cs(d_row + chunk * x128::size);
                xs[k] = load128cs(x_row + chunk * x128::size);
                dxs[k] = load128(dx_row + chunk * x128::size);  // early, so pass 2 does not wait for it
                const x128 w = load128(weight + chunk * x128::size);
                layernorm_backward_row_sums(ds[k], xs[k], w, m, s, dnorm_sum, dnorm_norm_sum);
            }
        }
        const float dnorm_mean = warp_reduce_sum(dnorm_sum) / C;
        const float dnorm_norm_mean = warp_reduce_sum(dnorm_norm_sum) / C;
#pragma unroll
        for (int k = 0; k < CHUNKS_PER_LANE; k++) {
            const int chunk = lane + k * WARP_SIZE;
            if (chunk < chunks) {
                const x128 w = load128(weight + chunk * x128::size);
                largest = fmaxf(largest, layernorm_backward_vector(dx_row, warp_slice, chunk, chunks, C, ds[k], xs[k],
                                                                   w, dxs[k], m, s, dnorm_mean, dnorm_norm_mean));
            }
        }
    }
    layernorm_backward_write_partial(partials, warp_slices, C);
    // the slices are read: their first floats serve the reduction (it synchronises before writing),
    // so the block asks for no static shared memory beside the plan's dynamic bytes
    if (amax) block_amax_into(amax, largest, warp_slices);
}

// Rows wider than the registers hold: both passes read the row from memory.
__global__ void __launch_bounds__(LAYERNORM_BACKWARD_MAX_WARPS * WARP_SIZE)
    layernorm_backward_streaming_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                        const floatX* weight, const float* mean, const float* rstd, int N, int C,
                                        int rows_per_block, float* amax) {
    float* warp_slices = dynamic_shared_memory<float>();  // [warps][2 * C]
    layernorm_backward_zero_slices(warp_slices, C);
    const int warps = blockDim.x / WARP_SIZE, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int chunks = C / x128::size;
    float* warp_slice = warp_slices + (size_t)warp * 2 * C;
    const int row_begin = blockIdx.x * rows_per_block, row_end = min(row_begin + rows_per_block, N);
    float largest = 0.0f;

    for (int row = row_begin + warp; row < row_end; row += warps) {
        const floatX* d_row = dout + (size_t)row * C;
        const floatX* x_row = inp + (size_t)row * C;
        floatX* dx_row = dinp + (size_t)row * C;
        const float m = mean[row], s = rstd[row];
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
        for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) {
            layernorm_backward_row_sums(load128(d_row + chunk * x128::size), load128(x_row + chunk * x128::size),
                                        load128(weight + chunk * x128::size), m, s, dnorm_sum, dnorm_norm_sum);
        }
        const float dnorm_mean = warp_reduce_sum(dnorm_sum) / C;
        const float dnorm_norm_mean = warp_reduce_sum(dnorm_norm_sum) / C;
        for (int chunk = lane; chunk < chunks; chunk += WARP_SIZE) {
            largest = fmaxf(largest, layernorm_backward_vector(
                                         dx_row, warp_slice, chunk, chunks, C, load128(d_row + chunk * x128::size),
                                         load128(x_row + chunk * x128::size), load128(weight + chunk * x128::size),
                                         load128(dx_row + chunk * x128::size), m, s, dnorm_mean, dnorm_norm_mean));
        }
    }
    layernorm_backward_write_partial(partials, warp_slices, C);
    if (amax) block_amax_into(amax, largest, warp_slices);  // as above
}

// dweight[c] += sum of partials[g][c] over blocks g, dbias likewise from column C + c. Thread row y of a
// block adds blocks y, y + 8, ... in order, then thread row 0 adds the 8 sums in order.
__global__ void __launch_bounds__(WARP_SIZE * LAYERNORM_PARTIAL_SUM_SLICES)
    layernorm_sum_partials_kernel(float* dweight, float* dbias, const float* partials, int blocks, int C) {
    __shared__ float slice_sums[LAYERNORM_PARTIAL_SUM_SLICES][WARP_SIZE];
    const int width = 2 * C;
    const int column = blockIdx.x * WARP_SIZE + threadIdx.x;
    float sum = 0.0f;
    if (column < width) {
#pragma unroll 4
        for (int g = threadIdx.y; g < blocks; g += LAYERNORM_PARTIAL_SUM_SLICES) {
            sum += partials[(size_t)g * width + column];
        }
    }
    slice_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && column < width) {
        float total = 0.0f;
#pragma unroll
        for (int y = 0; y < LAYERNORM_PARTIAL_SUM_SLICES; y++) total += slice_sums[y][threadIdx.x];
        if (column < C) dweight[column] += total;
        else dbias[column - C] += total;
    }
}

// dinp (N x C) += ..., dweight and dbias (C) += ... scratch: layernorm_backward_scratch_floats(M, C) floats for
// some M >= N. With `amax`, the new dinp's largest |value| joins *amax (FP8's current scaling of the
// residual gradient a projection's backward reads next).
inline void layernorm_backward(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream, float* amax = nullptr) {
    const LayerNormBackwardPlan plan = layernorm_backward_plan(N, C);
    auto launch = [&](auto kernel) {
        if (plan.shared_bytes > 48 * 1024) {
            int device = 0, max_shared = 0;
            CUDA_CHECK(cudaGetDevice(&device));
            CUDA_CHECK(cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
            if (plan.shared_bytes > (size_t)max_shared) {
                fail(strformat("layernorm_backward: C = %d needs %zu bytes of shared memory per block, the device "
                               "allows %d",
                               C, plan.shared_bytes, max_shared));
            }
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)plan.shared_bytes));
        }
        LLMC_LAUNCH(kernel, plan.blocks, plan.warps_per_block * WARP_SIZE, plan.shared_bytes, stream)(
            dinp, scratch, dout, inp, weight, mean, rstd, N, C, plan.rows_per_block, amax);
        CUDA_CHECK_LAUNCH();
    };
    switch (ceil_div(C / x128::size, WARP_SIZE)) {
        case 1: launch(layernorm_backward_kernel<1>); break;
        case 2: launch(layernorm_backward_kernel<2>); break;
        case 3: launch(layernorm_backward_kernel<3>); break;
        case 4: launch(layernorm_backward_kernel<4>); break;
        case 5: launch(layernorm_backward_kernel<5>); break;
        case 6: launch(layernorm_backward_kernel<6>); break;
        case 7: launch(layernorm_backward_kernel<7>); break;
        case 8: launch(layernorm_backward_kernel<8>); break;
        default: launch(layernorm_backward_streaming_kernel); break;
    }
    static_assert(LAYERNORM_MAX_CHUNKS_PER_LANE == 8, "the switch above instantiates 1..8");

    const dim3 sum_threads(WARP_SIZE, LAYERNORM_PARTIAL_SUM_SLICES);
    LLMC_LAUNCH(layernorm_sum_partials_kernel, ceil_div(2 * C, WARP_SIZE), sum_threads, 0, stream)(dweight, dbias, scratch,
                                                                                         plan.blocks, C);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
