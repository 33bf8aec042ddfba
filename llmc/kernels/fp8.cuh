// fp8.cuh: FP8 quantization on the GPU: a tensor's amax, the power-of-two scale that follows from
// it (current scaling) or from the amax history (delayed scaling), and the cast of a bf16 tensor to
// E4M3 or E5M2, with its transpose, counting what it clipped.
//
// The one idea: every scale lives on the device and is read only by kernels, so amax, scale, cast
// and the FP8 product run on the stream in order, with no copy back to the host. A scale and its
// inverse are exact powers of two computed as llmc/numerics/fp8.h computes them, and the cast encodes with
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

#include "llmc/numerics/fp8.h"
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
// Tensor i's largest amax over `ranks` ranks' arrays (all: ranks x tensors).
__device__ inline float fp8_max_over_ranks(const float* all, int tensors, int ranks, int i) {
    float m = 0.0f;
    for (int r = 0; r < ranks; r++) m = fmaxf(m, all[(size_t)r * tensors + i]);
    return m;
}
__global__ void fp8_step_amax_max_kernel(Fp8Scale* scales, const float* all, int tensors, int ranks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < tensors) scales[i].step_amax = fp8_max_over_ranks(all, tensors, ranks, i);
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

using Fp8Tile = uint8_t[FP8_TILE][FP8_TILE + 8];  // +8: a row's start moves by 2 banks

// The block's tile (rows row0.., columns col0.. of a rows x cols matrix, in shared memory) written
// transposed into qt (cols x rows): thread t takes tile column t / 8 (+ 32 in the second pass), rows
// (t % 8) * 8 .. + 7, and stores them in one 8-byte store (`vec`: rows a multiple of 8, qt aligned),
// 8 threads covering a 64-byte piece of a row of qt.
template <bool vec>
__device__ inline void fp8_store_tile_transposed(const Fp8Tile& tile, uint8_t* qt, int row0, int col0, int rows,
                                                 int cols) {
    const int rchunk = threadIdx.x % (FP8_TILE / FP8_VEC);
    for (int c = threadIdx.x / (FP8_TILE / FP8_VEC); c < FP8_TILE; c += FP8_ROWS_PER_PASS) {
        const int col = col0 + c, row = row0 + rchunk * FP8_VEC;
        if (col >= cols || row >= rows) continue;
        uint8_t codes[FP8_VEC];
#pragma unroll
        for (int i = 0; i < FP8_VEC; i++) codes[i] = tile[rchunk * FP8_VEC + i][c];
        const size_t at = (size_t)col * rows + row;
        if (vec && row + FP8_VEC <= rows) {
            *reinterpret_cast<uint2*>(qt + at) = *reinterpret_cast<const uint2*>(codes);
        } else {
            for (int i = 0; i < FP8_VEC && row + i < rows; i++) qt[at + i] = codes[i];
        }
    }
}

// The grid of 64 x 64 tiles over a rows x cols matrix (`what`: the caller, for the error).
inline dim3 fp8_tile_grid(const char* what, int rows, int cols) {
    const dim3 grid(ceil_div(rows, FP8_TILE), ceil_div(cols, FP8_TILE));
    if (grid.y > 65535) fail(strformat("%s: %d columns is too many (at most %d)", what, cols, 65535 * FP8_TILE));
    return grid;
}

template <bool vec>
__global__ void __launch_bounds__(FP8_CAST_THREADS) fp8_cast_kernel(Fp8CastArgs a) {
    __shared__ Fp8Tile tile;
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
        fp8_store_tile_transposed<vec>(tile, a.qt, row0, col0, a.rows, a.cols);
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
    const dim3 grid = fp8_tile_grid("fp8_cast", rows, cols);
    const auto aligned = [](const void* p, size_t to) { return p == nullptr || (uintptr_t)p % to == 0; };
    const bool vec = cols % FP8_VEC == 0 && rows % FP8_VEC == 0 && aligned(x, 16) && aligned(q, 8) && aligned(qt, 8);
    const Fp8CastArgs a{q, qt, s, clip, x, rows, cols, fp8_interpretation(f), fp8::info(f).largest, record_amax};
    if (vec)
        LLMC_LAUNCH(fp8_cast_kernel<true>, grid, FP8_CAST_THREADS, 0, stream)(a);
    else
        LLMC_LAUNCH(fp8_cast_kernel<false>, grid, FP8_CAST_THREADS, 0, stream)(a);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// The byte transpose: qt (cols x rows) of q (rows x cols), codes already cast (a weight gathered in
// FP8 under ZeRO-3, whose backward product reads it transposed). The cast kernel's tiles, without
// the cast: a block of 256 threads moves a 64 x 64 tile through shared memory, 8 bytes a thread and
// access where the shape is a multiple of 8 and the pointers 8-byte aligned (`vec`), else byte by byte.
template <bool vec>
__global__ void __launch_bounds__(FP8_CAST_THREADS) fp8_transpose_kernel(uint8_t* qt, const uint8_t* q, int rows,
                                                                          int cols) {
    __shared__ Fp8Tile tile;
    const int row0 = blockIdx.x * FP8_TILE, col0 = blockIdx.y * FP8_TILE;
    const int chunk = threadIdx.x % (FP8_TILE / FP8_VEC), first = threadIdx.x / (FP8_TILE / FP8_VEC);
    for (int r = first; r < FP8_TILE; r += FP8_ROWS_PER_PASS) {
        const int row = row0 + r, col = col0 + chunk * FP8_VEC;
        if (row >= rows || col >= cols) continue;
        const size_t at = (size_t)row * cols + col;
        uint8_t codes[FP8_VEC];
        if (vec) *reinterpret_cast<uint2*>(codes) = *reinterpret_cast<const uint2*>(q + at);
        else
            for (int i = 0; i < FP8_VEC && col + i < cols; i++) codes[i] = q[at + i];
        for (int i = 0; i < FP8_VEC && col + i < cols; i++) tile[r][chunk * FP8_VEC + i] = codes[i];
    }
    __syncthreads();
    fp8_store_tile_transposed<vec>(tile, qt, row0, col0, rows, cols);
}

inline void fp8_transpose(uint8_t* qt, const uint8_t* q, int rows, int cols, cudaStream_t stream) {
    if (!qt || !q || rows < 1 || cols < 1) fail(strformat("fp8_transpose: null codes or an empty %d x %d", rows, cols));
    const dim3 grid = fp8_tile_grid("fp8_transpose", rows, cols);
    const bool vec = rows % FP8_VEC == 0 && cols % FP8_VEC == 0 && (uintptr_t)q % 8 == 0 && (uintptr_t)qt % 8 == 0;
    if (vec) LLMC_LAUNCH(fp8_transpose_kernel<true>, grid, FP8_CAST_THREADS, 0, stream)(qt, q, rows, cols);
    else LLMC_LAUNCH(fp8_transpose_kernel<false>, grid, FP8_CAST_THREADS, 0, stream)(qt, q, rows, cols);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// ZeRO-3's weights gathered in FP8 (models/cuda/fp8_gather.cuh; the layout is dist/packed_gather.h's).
// A rank packs its slice of each layer: the weights' elements as E4M3 codes, with the weight's scale,
// and the other parameters as bf16; the ranks' packed chunks are all-gathered and unpacked into the
// weights' codes and the layer's bf16 buffer. Each kernel walks a table of pieces, a block row
// (blockIdx.y) a piece: a run of one weight's elements (`tensor`, the weight's index among the
// scaled weights, layer by layer) or of bf16 ones (tensor -1).
struct Fp8Piece {
    // Packing and measuring: src counts bf16 elements of the shard, dst bytes of the packed chunks.
    // Unpacking: src counts bytes of the gathered chunks; dst bytes of the codes (a weight's piece)
    // or bf16 elements of the layer's buffer.
    uint64_t src = 0, dst = 0, count = 0;
    int32_t tensor = -1, unused = 0;
};

constexpr int FP8_PIECE_THREADS = 256;

// Blocks a row of pieces takes: enough for the largest piece at 8 elements a thread, at most 1024.
inline unsigned fp8_piece_blocks(size_t largest_piece) {
    return (unsigned)std::clamp<size_t>(ceil_div(largest_piece, (size_t)FP8_PIECE_THREADS * FP8_VEC * 4), 1, 1024);
}

// Every weight piece's amax joins amax[tensor] (zeroed by the caller).
__global__ void __launch_bounds__(FP8_PIECE_THREADS) fp8_pieces_amax_kernel(const Fp8Piece* pieces,
                                                                             const floatX* shard, float* amax) {
    __shared__ float shared[WARP_SIZE];
    const Fp8Piece p = pieces[blockIdx.y];
    if (p.tensor < 0) return;  // the whole block: the piece is the block's
    float m = 0.0f;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.count; i += stride)
        m = fmaxf(m, fabsf(__bfloat162float(shard[p.src + i])));
    block_amax_into(&amax[p.tensor], m, shared);
}

// Packs: a weight piece encoded with scales[tensor * stride]'s scale (its amax joining step_amax with
// record_amax, what it clipped counted in clips[tensor]); a bf16 piece copied. 8 elements a thread
// where the piece's ends allow 16-byte loads and 8-byte stores.
struct Fp8PackArgs {
    const Fp8Piece* pieces;
    const floatX* shard;
    uint8_t* packed;
    Fp8Scale* scales;
    int stride;
    Fp8Clip* clips;
    float largest;  // E4M3's largest value
    bool record_amax;
};

__global__ void __launch_bounds__(FP8_PIECE_THREADS) fp8_pack_kernel(Fp8PackArgs a) {
    __shared__ float shared[WARP_SIZE];
    const Fp8Piece p = a.pieces[blockIdx.y];
    const floatX* x = a.shard + p.src;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    if (p.tensor < 0) {
        floatX* out = reinterpret_cast<floatX*>(a.packed + p.dst);  // 2-byte aligned: packed_gather.h
        for (size_t i = first; i < p.count; i += stride) out[i] = x[i];
        return;
    }
    Fp8Scale* s = a.scales + (size_t)p.tensor * a.stride;
    const float scale = s->scale;
    uint8_t* out = a.packed + p.dst;
    float amax = 0.0f;
    unsigned overflows = 0, underflows = 0;
    auto encode = [&](float v) {
        const float scaled = v * scale;
        const uint8_t code = (uint8_t)__nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, __NV_E4M3);
        amax = fmaxf(amax, fabsf(v));
        overflows += fabsf(scaled) > a.largest;
        underflows += scaled != 0.0f && (code & 0x7f) == 0;
        return code;
    };
    const bool vec = p.src % FP8_VEC == 0 && p.dst % FP8_VEC == 0;
    const size_t groups = vec ? p.count / FP8_VEC : 0;
    for (size_t g = first; g < groups; g += stride) {
        const x128 in = load128cs(x + g * FP8_VEC);
        uint8_t codes[FP8_VEC];
#pragma unroll
        for (int i = 0; i < FP8_VEC; i++) codes[i] = encode(__bfloat162float(in[i]));
        *reinterpret_cast<uint2*>(out + g * FP8_VEC) = *reinterpret_cast<const uint2*>(codes);
    }
    for (size_t i = groups * FP8_VEC + first; i < p.count; i += stride) out[i] = encode(__bfloat162float(x[i]));
    if (a.record_amax) block_amax_into(&s->step_amax, amax, shared);
    Fp8Clip* clip = a.clips + p.tensor;
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&clip->elements, (unsigned long long)p.count);
    if (__syncthreads_or(overflows | underflows)) {
        const float counts[2] = {(float)overflows, (float)underflows};  // a few thousand a thread at most: exact
        unsigned long long* targets[2] = {&clip->overflows, &clip->underflows};
        for (int i = 0; i < 2; i++) {
            const float total = block_reduce_sum(counts[i], shared);
            if (threadIdx.x == 0 && total > 0.0f) atomicAdd(targets[i], (unsigned long long)total);
        }
    }
}

// Unpacks every rank's pieces from the gathered chunks: a weight's codes into `codes`, 16 bytes at a
// time where both ends are 16-byte aligned, bf16 elements into the layer's buffer `whole`.
__global__ void __launch_bounds__(FP8_PIECE_THREADS) fp8_unpack_kernel(const Fp8Piece* pieces,
                                                                       const uint8_t* gathered, uint8_t* codes,
                                                                       floatX* whole) {
    const Fp8Piece p = pieces[blockIdx.y];
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    if (p.tensor < 0) {
        const floatX* in = reinterpret_cast<const floatX*>(gathered + p.src);
        for (size_t i = first; i < p.count; i += stride) whole[p.dst + i] = in[i];
        return;
    }
    const uint8_t* in = gathered + p.src;
    uint8_t* out = codes + p.dst;
    const size_t wide = (p.src | p.dst) % 16 == 0 ? p.count / 16 : 0;
    for (size_t i = first; i < wide; i += stride)
        reinterpret_cast<uint4*>(out)[i] = reinterpret_cast<const uint4*>(in)[i];
    for (size_t i = wide * 16 + first; i < p.count; i += stride) out[i] = in[i];
}

// The weights' scales from their amaxes over `ranks` ranks' slices (all: ranks x tensors):
// scales[i * stride] from the largest, as current scaling sets a scale.
__global__ void fp8_scales_from_ranks_kernel(Fp8Scale* scales, int stride, const float* all, int tensors, int ranks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tensors) return;
    fp8_set_scale_from_amax(scales[(size_t)i * stride], fp8_max_over_ranks(all, tensors, ranks, i),
                            fp8::info(fp8::Format::E4M3).largest);
}
// What the ranks' slices of each weight clipped, summed: out[i] from all (ranks x tensors).
__global__ void fp8_clip_sum_kernel(Fp8Clip* out, const Fp8Clip* all, int tensors, int ranks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tensors) return;
    Fp8Clip sum;
    for (int r = 0; r < ranks; r++) {
        const Fp8Clip& c = all[(size_t)r * tensors + i];
        sum.elements += c.elements, sum.overflows += c.overflows, sum.underflows += c.underflows;
    }
    out[i] = sum;
}

// A launch's grid: a row of blocks per piece (at most 65535 rows).
inline dim3 fp8_pieces_grid(int count, size_t largest) {
    if (count > 65535) fail(strformat("FP8 gather: %d pieces in one launch, at most 65535", count));
    return dim3(fp8_piece_blocks(largest), count);
}
inline void fp8_pieces_amax(const Fp8Piece* pieces, int count, size_t largest, const floatX* shard, float* amax,
                            cudaStream_t stream) {
    if (count == 0) return;
    LLMC_LAUNCH(fp8_pieces_amax_kernel, fp8_pieces_grid(count, largest), FP8_PIECE_THREADS, 0, stream)(
        pieces, shard, amax);
    CUDA_CHECK_LAUNCH();
}
inline void fp8_pack(const Fp8PackArgs& a, int count, size_t largest, cudaStream_t stream) {
    if (count == 0) return;
    LLMC_LAUNCH(fp8_pack_kernel, fp8_pieces_grid(count, largest), FP8_PIECE_THREADS, 0, stream)(a);
    CUDA_CHECK_LAUNCH();
}
inline void fp8_unpack(const Fp8Piece* pieces, int count, size_t largest, const uint8_t* gathered, uint8_t* codes,
                       floatX* whole, cudaStream_t stream) {
    if (count == 0) return;
    LLMC_LAUNCH(fp8_unpack_kernel, fp8_pieces_grid(count, largest), FP8_PIECE_THREADS, 0, stream)(
        pieces, gathered, codes, whole);
    CUDA_CHECK_LAUNCH();
}
inline void fp8_scales_from_ranks(Fp8Scale* scales, int stride, const float* all, int tensors, int ranks,
                                  cudaStream_t stream) {
    LLMC_LAUNCH(fp8_scales_from_ranks_kernel, ceil_div(tensors, 128), 128, 0, stream)(scales, stride, all, tensors,
                                                                                      ranks);
    CUDA_CHECK_LAUNCH();
}
inline void fp8_clip_sum(Fp8Clip* out, const Fp8Clip* all, int tensors, int ranks, cudaStream_t stream) {
    LLMC_LAUNCH(fp8_clip_sum_kernel, ceil_div(tensors, 128), 128, 0, stream)(out, all, tensors, ranks);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
