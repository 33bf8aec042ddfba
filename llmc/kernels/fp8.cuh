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
// amax of a bf16 tensor into s->amax_now (max with what it holds): 16-byte loads (8 elements) where
// n is a multiple of 8 and x 16-byte aligned (`vec`), else one element at a time.

constexpr int FP8_AMAX_THREADS = 512;

template <bool vec>
__global__ void __launch_bounds__(FP8_AMAX_THREADS) fp8_amax_kernel(Fp8Scale* s, const floatX* x, size_t n) {
    __shared__ float shared[WARP_SIZE];
    float m = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (vec) {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / x128::size; i += stride) {
            const x128 v = load128cs(x + i * x128::size);
#pragma unroll
            for (int k = 0; k < x128::size; k++) m = fmaxf(m, fabsf(__bfloat162float(v[k])));
        }
    } else {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            m = fmaxf(m, fabsf(__bfloat162float(x[i])));
    }
    block_amax_into(&s->amax_now, m, shared);
}

// Current scaling: the scale from the amax just measured, which is then reset for the next cast.
__global__ void fp8_current_scale_kernel(Fp8Scale* s, float largest) {
    fp8_set_scale_from_amax(*s, s->amax_now, largest);
    s->amax_now = 0.0f;
}

// s's scale from the amax a kernel that wrote the tensor measured into s->amax_now (fused).
inline void fp8_scale_from_amax(Fp8Scale* s, fp8::Format f, cudaStream_t stream) {
    LLMC_LAUNCH(fp8_current_scale_kernel, 1, 1, 0, stream)(s, fp8::info(f).largest);
    CUDA_CHECK_LAUNCH();
}

// s's scale from x's own amax: two small launches, no host synchronisation.
inline void fp8_current_scale(Fp8Scale* s, const floatX* x, size_t n, fp8::Format f, cudaStream_t stream) {
    if (!s || !x || n == 0) fail("fp8_current_scale: a null scale or tensor, or an empty tensor");
    const bool vec = n % x128::size == 0 && (uintptr_t)x % 16 == 0;
    const size_t blocks = std::min<size_t>(ceil_div(n, (size_t)FP8_AMAX_THREADS * 8 * 4), 1024);
    if (vec)
        LLMC_LAUNCH(fp8_amax_kernel<true>, (unsigned)blocks, FP8_AMAX_THREADS, 0, stream)(s, x, n);
    else
        LLMC_LAUNCH(fp8_amax_kernel<false>, (unsigned)blocks, FP8_AMAX_THREADS, 0, stream)(s, x, n);
    CUDA_CHECK_LAUNCH();
    fp8_scale_from_amax(s, f, stream);
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
// block of 256 threads owns a 64 x 64 tile. Reading, thread t takes 8 neighbouring elements of a
// row (one 16-byte load; 8 threads a row, 32 rows a pass, 2 passes), encodes them, stores their 8
// codes in one 8-byte store, and keeps them in shared memory. Writing the transpose, thread t
// gathers 8 neighbouring codes of a tile column (8 rows) and stores them in one 8-byte store, 8
// threads covering a 64-byte piece of a row of qt. Every global access is then at least 8 bytes
// wide and coalesced. Shapes whose columns are not a multiple of 8, or unaligned pointers, take the
// same path element by element (`vec` false). With record_amax the tile's amax joins
// s->step_amax (delayed scaling measures as it casts); clip (optional) counts, with one atomic per
// block and counter.

constexpr int FP8_TILE = 64;
constexpr int FP8_VEC = 8;                                   // elements a thread moves at once
constexpr int FP8_CAST_THREADS = 256;
constexpr int FP8_ROWS_PER_PASS = FP8_CAST_THREADS / (FP8_TILE / FP8_VEC);  // 32

struct Fp8CastArgs {
    uint8_t *q, *qt;
    Fp8Scale* s;
    Fp8Clip* clip;
    const floatX* x;
    int rows, cols;
    __nv_fp8_interpretation_t format;
    float largest;
    bool record_amax;
};

template <bool vec>
__global__ void __launch_bounds__(FP8_CAST_THREADS) fp8_cast_kernel(Fp8CastArgs a) {
    __shared__ uint8_t tile[FP8_TILE][FP8_TILE + 8];  // +8: a row's start moves by 2 banks
    __shared__ float shared[WARP_SIZE];
    const int row0 = blockIdx.x * FP8_TILE, col0 = blockIdx.y * FP8_TILE;
    const int chunk = threadIdx.x % (FP8_TILE / FP8_VEC), first_row = threadIdx.x / (FP8_TILE / FP8_VEC);
    const float scale = a.s->scale;
    float amax = 0.0f;
    unsigned overflows = 0, underflows = 0;
    for (int r = first_row; r < FP8_TILE; r += FP8_ROWS_PER_PASS) {
        const int row = row0 + r, col = col0 + chunk * FP8_VEC;
        if (row >= a.rows || col >= a.cols) continue;
        const size_t at = (size_t)row * a.cols + col;
        float v[FP8_VEC];
        const int n = vec ? FP8_VEC : min(FP8_VEC, a.cols - col);
        if (vec) {
            const x128 in = load128cs(a.x + at);
#pragma unroll
            for (int i = 0; i < FP8_VEC; i++) v[i] = __bfloat162float(in[i]);
        } else {
            for (int i = 0; i < n; i++) v[i] = __bfloat162float(a.x[at + i]);
        }
        uint8_t codes[FP8_VEC];
#pragma unroll
        for (int i = 0; i < FP8_VEC; i++) {
            if (!vec && i >= n) break;
            const float scaled = v[i] * scale;
            codes[i] = (uint8_t)__nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, a.format);
            amax = fmaxf(amax, fabsf(v[i]));
            overflows += fabsf(scaled) > a.largest;
            underflows += scaled != 0.0f && (codes[i] & 0x7f) == 0;
            tile[r][chunk * FP8_VEC + i] = codes[i];
        }
        if (!a.q) continue;
        if (vec) {
            *reinterpret_cast<uint2*>(a.q + at) = *reinterpret_cast<const uint2*>(codes);
        } else {
            for (int i = 0; i < n; i++) a.q[at + i] = codes[i];
        }
    }
    if (a.qt) {
        __syncthreads();
        // thread t: tile column t / 8 (+ 32 in the second pass), rows (t % 8) * 8 .. + 7
        const int rchunk = threadIdx.x % (FP8_TILE / FP8_VEC);
        for (int c = threadIdx.x / (FP8_TILE / FP8_VEC); c < FP8_TILE; c += FP8_ROWS_PER_PASS) {
            const int col = col0 + c, row = row0 + rchunk * FP8_VEC;
            if (col >= a.cols || row >= a.rows) continue;
            uint8_t codes[FP8_VEC];
#pragma unroll
            for (int i = 0; i < FP8_VEC; i++) codes[i] = tile[rchunk * FP8_VEC + i][c];
            const size_t at = (size_t)col * a.rows + row;
            if (vec && row + FP8_VEC <= a.rows) {
                *reinterpret_cast<uint2*>(a.qt + at) = *reinterpret_cast<const uint2*>(codes);
            } else {
                for (int i = 0; i < FP8_VEC && row + i < a.rows; i++) a.qt[at + i] = codes[i];
            }
        }
    }
    if (a.record_amax) block_amax_into(&a.s->step_amax, amax, shared);
    if (a.clip) {
        if (threadIdx.x == 0) {
            const int tile_rows = min(FP8_TILE, a.rows - row0), tile_cols = min(FP8_TILE, a.cols - col0);
            atomicAdd(&a.clip->elements, (unsigned long long)tile_rows * tile_cols);
        }
        if (__syncthreads_or(overflows | underflows)) {  // rare: clipping counted only where it happened
            const float counts[2] = {(float)overflows, (float)underflows};  // at most 4096 a block: exact
            unsigned long long* targets[2] = {&a.clip->overflows, &a.clip->underflows};
            for (int i = 0; i < 2; i++) {
                const float total = block_reduce_sum(counts[i], shared);
                if (threadIdx.x == 0 && total > 0.0f) atomicAdd(targets[i], (unsigned long long)total);
            }
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
// fp8_cast_kernel. q may be null where only the transpose is wanted; clip may be null.
inline void fp8_cast(uint8_t* q, uint8_t* qt, Fp8Scale* s, Fp8Clip* clip, const floatX* x, int rows, int cols,
                     fp8::Format f, bool record_amax, cudaStream_t stream) {
    if ((!q && !qt) || !s || !x) fail("fp8_cast: q or qt, the scale and x must be given");
    if (rows < 1 || cols < 1) fail(strformat("fp8_cast: %d x %d is empty", rows, cols));
    const dim3 grid(ceil_div(rows, FP8_TILE), ceil_div(cols, FP8_TILE));
    if (grid.y > 65535) fail(strformat("fp8_cast: %d columns is too many (at most %d)", cols, 65535 * FP8_TILE));
    const auto aligned = [](const void* p, size_t to) { return p == nullptr || (uintptr_t)p % to == 0; };
    const bool vec = cols % FP8_VEC == 0 && rows % FP8_VEC == 0 && aligned(x, 16) && aligned(q, 8) && aligned(qt, 8);
    const Fp8CastArgs a{q, qt, s, clip, x, rows, cols, fp8_interpretation(f), fp8::info(f).largest, record_amax};
    if (vec)
        LLMC_LAUNCH(fp8_cast_kernel<true>, grid, FP8_CAST_THREADS, 0, stream)(a);
    else
        LLMC_LAUNCH(fp8_cast_kernel<false>, grid, FP8_CAST_THREADS, 0, stream)(a);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
