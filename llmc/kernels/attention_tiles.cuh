// attention_tiles.cuh: the pieces every attention kernel is built from (attention.cuh's
// FlashAttention-2 kernels on mma.sync, attention_hopper.cuh's forward on wgmma): the rows a launch
// works on, the PTX wrappers (cp.async, ldmatrix, mma.sync m16n8k16, ex2), one warp's products of
// its 16 rows with a shared tile, and the copies of rows into shared tiles. See attention.cuh for
// the algorithm.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmc/kernels/cuda_common.cuh"
#include "llmc/utils.h"

namespace llmc {

// The rows one attention launch works on (see "Ring pairs" in attention.cuh). Every buffer holds its rows
// sequence after sequence; the host offsets each pointer to the launch's first row.
struct AttentionRows {
    int T;        // query rows per sequence, and key rows (a ring pair's two chunks are equal)
    int q_rows;   // rows per sequence in the query side's buffers: q's qkv, out, dout, lse, D, dq
    int kv_rows;  // rows per sequence in the key side's buffers: k's and v's qkv, dk, dv
};

// The heads of one attention launch: NH query heads and KVH key/value heads, KVH dividing NH.
// Grouped-query attention: kv head j serves the G = NH / KVH query heads j G .. j G + G - 1 (Hugging
// Face's repeat_kv order); KVH = NH is multi-head attention (GPT-2). A qkv row is [q: NH HS | k: KVH
// HS | v: KVH HS]; out, dout, lse and D have one head per query head. The kernels read each query
// head's k and v where they are, and the dK/dV kernels sum a kv head's gradient over its group in
// their own loop, so no head is ever copied G times.
struct AttentionHeads {
    int NH, KVH;
    __host__ __device__ int group() const { return NH / KVH; }
    __host__ __device__ int kv_of(int h) const { return h / (NH / KVH); }
    // Elements of a qkv row, and where query head h's k and v start in it (q: at h HS).
    __host__ __device__ size_t qkv_width(int HS) const { return (size_t)(NH + 2 * KVH) * HS; }
    __host__ __device__ int k_col(int h, int HS) const { return (NH + kv_of(h)) * HS; }
    __host__ __device__ int v_col(int h, int HS) const { return (NH + KVH + kv_of(h)) * HS; }
};

namespace attention_detail {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
// Keys per shared-memory tile in the forward and dQ kernels.
constexpr int KEY_TILE = 64;
// Largest T: grid.y holds the tile index (at most 65535) and every kernel's tile is at least 64 rows.
constexpr int MAX_T = 65535 * 64;

// A shared-memory tile row is HS bf16 plus 16 bytes of padding: a row is then an odd number of
// 16-byte units long, so the 8 rows that one ldmatrix phase reads start in 8 different bank groups.
template <int HS>
constexpr int tile_stride() {
    return HS + 8;
}

// ---- PTX wrappers ----

__device__ inline uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16-byte global -> shared copy that bypasses registers; with valid false nothing is read and the
// 16 bytes are zero-filled (src must still be a mapped address).
__device__ inline void cp_async16(uint32_t dst, const void* src, bool valid) {
#ifdef LLMC_EMU
    emu::ptx::cp_async(dst, src, 16, valid ? 16 : 0);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
#endif
}
__device__ inline void cp_async4(uint32_t dst, const void* src, bool valid) {
#ifdef LLMC_EMU
    emu::ptx::cp_async(dst, src, 4, valid ? 4 : 0);
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
#endif
}
__device__ inline void cp_async_commit() {
#ifdef LLMC_EMU
    emu::ptx::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ inline void cp_async_wait() {
#ifdef LLMC_EMU
    emu::ptx::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i of
// lane l receives row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i (of its transpose with .trans).
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#ifdef LLMC_EMU
    emu::ptx::ldmatrix_x4(r, addr, false);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#ifdef LLMC_EMU
    emu::ptx::ldmatrix_x4(r, addr, true);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// d += a b for a 16x16 (row-major) times 16x8 (column-major) bf16 product, fp32 accumulators.
// With g = lane / 4 and c = 2 (lane % 4): d[0], d[1] are row g, columns c, c+1; d[2], d[3] row g+8.
// a[0]: row g, columns c, c+1; a[1]: row g+8, same; a[2], a[3]: the same rows, columns c+8, c+9.
// b0: rows (k) c, c+1 of column (n) g; b1: rows c+8, c+9.
__device__ inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef LLMC_EMU
    emu::ptx::mma_m16n8k16_bf16(d, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 2^x in one instruction (relative error about 2^-22); 2^-inf = 0, which is how masked scores vanish.
__device__ inline float fast_exp2(float x) {
#ifdef LLMC_EMU
    return emu::ptx::ex2_approx_ftz(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

// Two floats as a bf16 pair, the lower column in the low half (the mma operand order).
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return (uint32_t)__bfloat16_as_ushort(v.x) | ((uint32_t)__bfloat16_as_ushort(v.y) << 16);
}

// ---- warp-level tile products ----
// A warp multiplies its 16 rows, held as A operands in registers, by a tile in shared memory. The
// tile is read with ldmatrix, two n8 column blocks per instruction: non-transposed when the tile is
// stored [n][k] (the product is with its transpose, e.g. S = Q K^T with K rows as n), transposed
// when it is stored [k][n] (e.g. O = P V with V rows as k).

// A operands (16 x 16) of rows row0..row0+15, columns col0..col0+15 of a padded tile.
template <int STRIDE>
__device__ inline void load_a_frag(uint32_t (&a)[4], const floatX* tile, int row0, int col0, int lane) {
    ldmatrix_x4(a, smem_addr(tile + (row0 + lane % 16) * STRIDE + col0 + (lane / 16) * 8));
}

// The warp's 16 rows x K columns of a padded tile, as K/16 A operands.
template <int K, int STRIDE>
__device__ inline void load_a_rows(uint32_t (&a)[K / 16][4], const floatX* tile, int row0, int lane) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) load_a_frag<STRIDE>(a[kk], tile, row0, kk * 16, lane);
}

// acc (16 x N) += a (16 x K) * tile^T, tile stored [n][k]: N rows of K = HS columns.
template <int N, int K, int STRIDE>
__device__ inline void mma_a_bt(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4], const floatX* tile,
                                int lane) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(tile + (nn * 16 + (lane / 16) * 8 + lane % 8) * STRIDE + kk * 16 +
                                     ((lane / 8) % 2) * 8));
            mma_bf16_16816(acc[2 * nn], a[kk], b[0], b[1]);
            mma_bf16_16816(acc[2 * nn + 1], a[kk], b[2], b[3]);
        }
    }
}

// acc (16 x N) += a (16 x K) * tile, tile stored [k][n]: K rows of N = HS columns.
template <int N, int K, int STRIDE>
__device__ inline void mma_a_b(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4], const floatX* tile,
                               int lane) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, smem_addr(tile + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * STRIDE + nn * 16 +
                                           (lane / 16) * 8));
            mma_bf16_16816(acc[2 * nn], a[kk], b[0], b[1]);
            mma_bf16_16816(acc[2 * nn + 1], a[kk], b[2], b[3]);
        }
    }
}

// A 16 x N accumulator as bf16 A operands over k = its N columns: the accumulators of column
// blocks 2kk and 2kk+1 hold exactly the elements of A operand kk, in the same threads.
template <int N>
__device__ inline void acc_to_a(uint32_t (&a)[N / 16][4], const float (&acc)[N / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        a[kk][0] = pack_bf16x2(acc[2 * kk][0], acc[2 * kk][1]);
        a[kk][1] = pack_bf16x2(acc[2 * kk][2], acc[2 * kk][3]);
        a[kk][2] = pack_bf16x2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
        a[kk][3] = pack_bf16x2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
    }
}

// Writes the warp's 16 x HS accumulator, times `scale`, to rows: row r of the warp goes to
// dst + (row0 + r) * ld, for the rows below T only. A bf16 dst is overwritten (a whole-sequence
// call, or a ring pair's forward output); an fp32 dst is added to (a ring pair's gradients, summed
// over the pairs in fp32: each element belongs to one thread, so the sum is in launch order).
// With `rope` (RoPE's cos/sin table, kernels/rope.cuh: row t is [cos(angle(t, i)), i < HS/2 |
// sin(angle(t, i)), i < HS/2]) the rows are a gradient with respect to RoPE's rotated q or k, and are
// rotated back by -angle(row, i) before they are stored: RoPE's backward, fused. A thread holds both
// columns of every rotated pair (i, i + HS/2): acc[n] and acc[n + HS/16] (column n*8 + 2(lane%4) +
// e%2), so this needs no other thread; the rotation is in fp32 and the value is rounded once.
template <int HS, typename OutT>
__device__ inline float write_rows(OutT* dst, size_t ld, const float (&acc)[HS / 8][4], float scale, int row0, int T,
                                   int lane, const float* rope = nullptr) {
    float largest = 0.0f;  // of the bf16 values stored (the amax FP8's current scaling measures)
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = row0 + lane / 4 + 8 * half;
        if (row >= T) continue;
        float v[HS / 8][2];
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            v[n][0] = acc[n][2 * half] * scale;
            v[n][1] = acc[n][2 * half + 1] * scale;
        }
        if (rope) {
            const float* cos_row = rope + (size_t)row * HS + 2 * (lane % 4);
            const float* sin_row = cos_row + HS / 2;
#pragma unroll
            for (int n = 0; n < HS / 16; n++) {
                const float2 c = *reinterpret_cast<const float2*>(cos_row + n * 8);
                const float2 s = *reinterpret_cast<const float2*>(sin_row + n * 8);
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    const float x0 = v[n][k], x1 = v[n + HS / 16][k], ck = k ? c.y : c.x, sk = k ? s.y : s.x;
                    v[n][k] = x0 * ck + x1 * sk;
                    v[n + HS / 16][k] = x1 * ck - x0 * sk;
                }
            }
        }
        OutT* p = dst + (size_t)row * ld + 2 * (lane % 4);
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            const float lo = v[n][0], hi = v[n][1];
            if constexpr (std::is_same_v<OutT, float>) {
                float2& sum = *reinterpret_cast<float2*>(p + n * 8);
                sum.x += lo;
                sum.y += hi;
            } else {
                static_assert(std::is_same_v<OutT, floatX>, "bf16 or fp32 rows");
                const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
                *reinterpret_cast<__nv_bfloat162*>(p + n * 8) = v;
                largest = fmaxf(largest, fmaxf(fabsf(__low2float(v)), fabsf(__high2float(v))));
            }
        }
    }
    return largest;
}

// One query head h of sequence b as the dK/dV kernels stream it: its q (in qkv rows), dout (NH HS
// per row), lse and D (q_rows per head).
struct QueryHead {
    const floatX* q;
    const floatX* dout;
    const float* lse;
    const float* D;
    __device__ QueryHead(const floatX* q_qkv, const floatX* dout_, const float* lse_, const float* D_, int b, int h,
                         const AttentionRows& rows, const AttentionHeads& heads, int HS)
        : q(q_qkv + (size_t)b * rows.q_rows * heads.qkv_width(HS) + (size_t)h * HS),
          dout(dout_ + (size_t)b * rows.q_rows * heads.NH * HS + (size_t)h * HS),
          lse(lse_ + ((size_t)b * heads.NH + h) * rows.q_rows),
          D(D_ + ((size_t)b * heads.NH + h) * rows.q_rows) {}
};

// Starts copying rows row0..row0+ROWS-1 of one head's (T, HS) slice (row stride ld elements) into a
// padded shared tile. Rows at or past T are zero-filled, so padded keys and queries are finite and
// contribute nothing: a NaN there would survive multiplication by a zero probability.
template <int ROWS, int HS, int THREADS>
__device__ inline void load_rows_async(floatX* tile, const floatX* head, size_t ld, int row0, int T) {
    constexpr int CHUNKS = HS / 8;
    static_assert((ROWS * CHUNKS) % THREADS == 0, "tile copy must divide evenly among the threads");
#pragma unroll
    for (int k = 0; k < ROWS * CHUNKS / THREADS; k++) {
        const int i = k * THREADS + threadIdx.x;
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool valid = row0 + r < T;
        const floatX* src = valid ? head + (size_t)(row0 + r) * ld + c * 8 : head;
        cp_async16(smem_addr(tile + r * tile_stride<HS>() + c * 8), src, valid);
    }
}

// Starts copying n floats src[row0..row0+n-1] into shared memory, zeros at or past T.
template <int N, int THREADS>
__device__ inline void load_floats_async(float* dst, const float* src, int row0, int T) {
    static_assert(N <= THREADS, "one float per thread");
    const int i = threadIdx.x;
    if (i < N) {
        const bool valid = row0 + i < T;
        cp_async4(smem_addr(dst + i), valid ? src + row0 + i : src, valid);
    }
}

// Raises the kernel's dynamic shared-memory limit to `bytes`, or fails naming what the device allows.
template <typename Kernel>
inline void set_smem_limit(Kernel kernel, size_t bytes, const char* who, int HS) {
    int device = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > (size_t)optin)
        fail(strformat("%s: head size %d needs %zu bytes of shared memory per block; this device allows %d", who, HS,
                       bytes, optin));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

}  // namespace attention_detail

}  // namespace llmc
