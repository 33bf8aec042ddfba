// fp8.cuh: FP8 quantization on the GPU: a tensor's amax, the power-of-two scale that follows from
// it (current scaling) or from the amax history (delayed scaling), and the cast of a bf16 tensor to
// E4M3 or E5M2, with its transpose, counting what it clipped.
//
// The one idea: every scale lives on the device and is read only by kernels, so amax, scale, cast
// and the FP8 product run on the stream in order, with no copy back to the host. A scale and its
// inverse are exact powers of two computed as llmc/fp8.h computes them, and the cast encodes with
// CUDA's __nv_cvt_float_to_fp8 (saturating), which fp8.h matches bit for bit: the GPU quantizes
// every element exactly as the CPU model's simulation (cpu/fp8_linear.h) does. The transpose is
// written from a shared-memory tile, so both copies are stored with coalesced accesses: Hopper's
// FP8 products take only the "TN" form, both operands read along k, and the backward products read
// the activations and gradients transposed (matmul.cuh, matmul_backward_fp8).
#pragma once

#include <cuda_fp8.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llmc/fp8.h"
#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

// One quantized tensor's scale, on the device. `scale` multiplies before encoding, `scale_inv`
// (1 / scale, exact) is what cuBLASLt's A/B scale pointers take. The amaxes collect the largest |x|
// (atomicMax on its bits: non-negative floats order as their bits): `amax_now` of the tensor about
// to be cast (current scaling), `step_amax` of the casts since the step began (delayed scaling).
// scale_inv comes first and the struct is 16-byte aligned: cuBLASLt's FP8 products refuse a scale
// pointer that is not (NOT_SUPPORTED at cublasLtMatmul on an H200, found in the first GPU session).
struct alignas(16) Fp8Scale {
    float scale_inv = 1.0f, scale = 1.0f;
    float amax_now = 0.0f, step_amax = 0.0f;
    uint32_t primed = 0;            // delayed scaling: has a scale from its history
    uint32_t history_count = 0;     // delayed scaling: amaxes in the history (at most its length)
    uint32_t history_next = 0;      // delayed scaling: the ring slot the next amax goes to
};

static_assert(offsetof(Fp8Scale, scale_inv) == 0 && sizeof(Fp8Scale) % 16 == 0,
              "every Fp8Scale of an array must hold its scale_inv 16-byte aligned");

// Where a scale's inverse lies on the device, for cuBLASLt's scale pointers (no load from device memory).
inline const float* fp8_scale_inv(const Fp8Scale* s) {
    return reinterpret_cast<const float*>(reinterpret_cast<const char*>(s) + offsetof(Fp8Scale, scale_inv));
}

// What casts clipped: elements beyond the format's range (saturated) and nonzero ones that became 0.
struct Fp8Clip {
    unsigned long long elements = 0, overflows = 0, underflows = 0;
};

inline __nv_fp8_interpretation_t fp8_interpretation(fp8::Format f) {
    return f == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

// fp8.h's scale_for_amax on the device: the same operations, so the same value.
__device__ inline void fp8_set_scale_from_amax(Fp8Scale& s, float amax, float largest) {
    if (!(amax > 0.0f) || !isfinite(amax)) return;
    int e;
    frexpf(largest / amax, &e);
    s.scale = ldexpf(1.0f, e - 1);
    s.scale_inv = ldexpf(1.0f, 1 - e);
}

// ---------------------------------------------------------------------------------------------
// amax of a bf16 tensor into s->amax_now (max with what it holds).

constexpr int FP8_AMAX_THREADS = 512;

__global__ void __launch_bounds__(FP8_AMAX_THREADS) fp8_amax_kernel(Fp8Scale* s, const floatX* x, size_t n) {
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(__bfloat162float(x[i])));
    m = block_reduce_max(m, shared);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(&s->amax_now), __float_as_uint(m));
}

// Current scaling: the scale from the amax just measured, which is then reset for the next cast.
__global__ void fp8_current_scale_kernel(Fp8Scale* s, float largest) {
    fp8_set_scale_from_amax(*s, s->amax_now, largest);
    s->amax_now = 0.0f;
}

// s's scale from x's own amax: two small launches, no host synchronisation.
inline void fp8_current_scale(Fp8Scale* s, const floatX* x, size_t n, fp8::Format f, cudaStream_t stream) {
    if (!s || !x || n == 0) fail("fp8_current_scale: a null scale or tensor, or an empty tensor");
    const size_t blocks = std::min<size_t>(ceil_div(n, (size_t)FP8_AMAX_THREADS * 8), 1024);
    LLMC_LAUNCH(fp8_amax_kernel, (unsigned)blocks, FP8_AMAX_THREADS, 0, stream)(s, x, n);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(fp8_current_scale_kernel, 1, 1, 0, stream)(s, fp8::info(f).largest);
    CUDA_CHECK_LAUNCH();
}

// Delayed scaling at the end of a step, one thread per tensor (cpu::Fp8Linears::end_step): a
// tensor's step amax (already the maximum over the data-parallel ranks), if it was quantized at all,
// joins its history (a ring of `history` floats per tensor), and its next scale follows from the
// history's largest value. `largest[i]`: the format's largest value for tensor i.
__global__ void fp8_delayed_update_kernel(Fp8Scale* scales, float* histories, const float* largest, int tensors,
                                          int history) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tensors) return;
    Fp8Scale& s = scales[i];
    const float amax = s.step_amax;
    s.step_amax = 0.0f;
    if (!(amax > 0.0f)) return;
    float* ring = histories + (size_t)i * history;
    ring[s.history_next] = amax;
    s.history_next = (s.history_next + 1) % history;
    s.history_count = min(s.history_count + 1, (uint32_t)history);
    float m = 0.0f;
    for (uint32_t h = 0; h < s.history_count; h++) m = fmaxf(m, ring[h]);
    fp8_set_scale_from_amax(s, m, largest[i]);
    s.primed = 1;
}

inline void fp8_delayed_update(Fp8Scale* scales, float* histories, const float* largest, int tensors, int history,
                               cudaStream_t stream) {
    if (tensors < 1 || history < 1) fail(strformat("fp8_delayed_update: %d tensors, history %d", tensors, history));
    constexpr int threads = 128;
    LLMC_LAUNCH(fp8_delayed_update_kernel, ceil_div(tensors, threads), threads, 0, stream)(scales, histories, largest,
                                                                                          tensors, history);
    CUDA_CHECK_LAUNCH();
}

// Delayed scaling over data-parallel ranks: each tensor's step amax copied out to a contiguous
// array (to all-gather), and back in as the maximum over the ranks' arrays.
__global__ void fp8_step_amax_out_kernel(float* out, const Fp8Scale* scales, int tensors) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < tensors) out[i] = scales[i].step_amax;
}
__global__ void fp8_step_amax_max_kernel(Fp8Scale* scales, const float* all, int tensors, int ranks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tensors) return;
    float m = 0.0f;
    for (int r = 0; r < ranks; r++) m = fmaxf(m, all[(size_t)r * tensors + i]);
    scales[i].step_amax = m;
}
inline void fp8_step_amax_out(float* out, const Fp8Scale* scales, int tensors, cudaStream_t stream) {
    LLMC_LAUNCH(fp8_step_amax_out_kernel, ceil_div(tensors, 128), 128, 0, stream)(out, scales, tensors);
    CUDA_CHECK_LAUNCH();
}
inline void fp8_step_amax_max(Fp8Scale* scales, const float* all, int tensors, int ranks, cudaStream_t stream) {
    LLMC_LAUNCH(fp8_step_amax_max_kernel, ceil_div(tensors, 128), 128, 0, stream)(scales, all, tensors, ranks);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// The cast: q (rows x cols) = encode(x * scale), and qt (cols x rows) its transpose when given. A
// block owns a 32 x 32 tile: its 32 x 8 threads read the tile row by row (coalesced), encode, keep
// the codes in shared memory, and write the transpose row by row too (a 1-D block of 256 threads:
// thread t is column t % 32 of rows t / 32, t / 32 + 8, ...). With record_amax the tile's
// amax joins s->step_amax (delayed scaling measures as it casts); clip (optional) counts.

constexpr int FP8_TILE = 32;
constexpr int FP8_TILE_ROWS_PER_PASS = 8;

constexpr int FP8_CAST_THREADS = FP8_TILE * FP8_TILE_ROWS_PER_PASS;

__global__ void __launch_bounds__(FP8_CAST_THREADS)
    fp8_cast_kernel(uint8_t* q, uint8_t* qt, Fp8Scale* s, Fp8Clip* clip, const floatX* x, int rows, int cols,
                    __nv_fp8_interpretation_t format, float largest, bool record_amax) {
    __shared__ uint8_t tile[FP8_TILE][FP8_TILE + 4];  // +4: the transposed reads fall in other banks
    __shared__ float shared[WARP_SIZE];
    const int tx = threadIdx.x % FP8_TILE, ty = threadIdx.x / FP8_TILE;  // a 1-D block: block_reduce's shape
    const int row0 = blockIdx.y * FP8_TILE, col0 = blockIdx.x * FP8_TILE;
    const float scale = s->scale;
    float amax = 0.0f;
    unsigned overflows = 0, underflows = 0, elements = 0;
    for (int r = ty; r < FP8_TILE; r += FP8_TILE_ROWS_PER_PASS) {
        const int row = row0 + r, col = col0 + tx;
        if (row >= rows || col >= cols) continue;
        const float v = __bfloat162float(x[(size_t)row * cols + col]);
        const float scaled = v * scale;
        const uint8_t code = (uint8_t)__nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, format);
        amax = fmaxf(amax, fabsf(v));
        elements++;
        overflows += fabsf(scaled) > largest;
        underflows += scaled != 0.0f && (code & 0x7f) == 0;
        q[(size_t)row * cols + col] = code;
        tile[r][tx] = code;
    }
    if (qt) {
        __syncthreads();
        for (int c = ty; c < FP8_TILE; c += FP8_TILE_ROWS_PER_PASS) {
            const int col = col0 + c, row = row0 + tx;
            if (row < rows && col < cols) qt[(size_t)col * rows + row] = tile[tx][c];
        }
    }
    // One atomic per block and counter.
    if (record_amax) {
        amax = block_reduce_max(amax, shared);
        if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(&s->step_amax), __float_as_uint(amax));
    }
    if (clip) {
        const float counts[3] = {(float)elements, (float)overflows, (float)underflows};
        unsigned long long* targets[3] = {&clip->elements, &clip->overflows, &clip->underflows};
        for (int i = 0; i < 3; i++) {
            const float total = block_reduce_sum(counts[i], shared);  // at most 1024: exact in fp32
            if (threadIdx.x == 0 && total > 0.0f) atomicAdd(targets[i], (unsigned long long)total);
        }
    }
}

// into += from, one thread: a cast made once and used several times counted at every use.
__global__ void fp8_clip_add_kernel(Fp8Clip* into, const Fp8Clip* from) {
    into->elements += from->elements, into->overflows += from->overflows, into->underflows += from->underflows;
}
inline void fp8_clip_add(Fp8Clip* into, const Fp8Clip* from, cudaStream_t stream) {
    LLMC_LAUNCH(fp8_clip_add_kernel, 1, 1, 0, stream)(into, from);
    CUDA_CHECK_LAUNCH();
}

// Casts x (rows x cols, bf16) to q, and its transpose to qt if qt is given, with s's scale; see
// fp8_cast_kernel. clip may be null.
inline void fp8_cast(uint8_t* q, uint8_t* qt, Fp8Scale* s, Fp8Clip* clip, const floatX* x, int rows, int cols,
                     fp8::Format f, bool record_amax, cudaStream_t stream) {
    if (!q || !s || !x) fail("fp8_cast: q, the scale and x must be given");
    if (rows < 1 || cols < 1) fail(strformat("fp8_cast: %d x %d is empty", rows, cols));
    const dim3 grid(ceil_div(cols, FP8_TILE), ceil_div(rows, FP8_TILE));
    if (grid.y > 65535) fail(strformat("fp8_cast: %d rows is too many (at most %d)", rows, 65535 * FP8_TILE));
    LLMC_LAUNCH(fp8_cast_kernel, grid, FP8_CAST_THREADS, 0, stream)(q, qt, s, clip, x, rows, cols,
                                                                   fp8_interpretation(f), fp8::info(f).largest,
                                                                   record_amax);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
