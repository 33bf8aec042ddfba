// cpu/gemm.h: the CPU model's one matrix product, a packed, register-tiled fp32 GEMM.
//
// Almost all of the CPU model's time goes into three matmul shapes (y = x W^T + b, dx += dy W,
// dW += dy^T x), so they share this GEMM: operands are copied into contiguous MR-row / NR-column
// panels and an MR x NR block of C lives in SIMD registers for a whole KC-long stretch of k. Each
// element of C is always summed in the same order (k blocks in sequence, k in sequence inside a
// block, whatever the panel or thread that computes it), so results are bitwise identical for any
// thread count or schedule.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace llmc {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// SIMD: the few vector operations the GEMM micro-kernel needs, as intrinsics, so that the register
// tile and its fused multiply-adds are guaranteed rather than left to the auto-vectoriser.
#if defined(__AVX512F__)
using vec = __m512;
constexpr int VEC_FLOATS = 16;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vbroadcast(float x) { return _mm512_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
constexpr int GEMM_MR = 12, GEMM_NV = 2;  // 24 accumulators of the 32 zmm registers
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int VEC_FLOATS = 8;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vbroadcast(float x) { return _mm256_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
constexpr int GEMM_MR = 6, GEMM_NV = 2;  // 12 accumulators of the 16 ymm registers
#else
using vec = float;
constexpr int VEC_FLOATS = 1;
inline vec vzero() { return 0.0f; }
inline vec vload(const float* p) { return *p; }
inline void vstore(float* p, vec v) { *p = v; }
inline vec vbroadcast(float x) { return x; }
inline vec vfma(vec a, vec b, vec c) { return std::fma(a, b, c); }
inline vec vadd(vec a, vec b) { return a + b; }
constexpr int GEMM_MR = 4, GEMM_NV = 4;
#endif

constexpr int GEMM_NR = GEMM_NV * VEC_FLOATS;

// GCC's loop-unroll pragma for the micro-kernel; nvcc (which also compiles this file into the GPU
// tests, as host code) does not know it, so there it is left out.
#if defined(__CUDACC__)
#define LLMC_GCC_UNROLL(n)
#else
#define LLMC_PRAGMA(x) _Pragma(#x)
#define LLMC_GCC_UNROLL(n) LLMC_PRAGMA(GCC unroll n)
#endif
constexpr int GEMM_KC = 256;            // k per packed block: an NR-wide B panel (32 KiB) stays in L1
constexpr int GEMM_MC = GEMM_MR * 16;   // rows per packed A block (about 200 KiB, in L2)
constexpr int GEMM_NC = GEMM_NR * 32;   // columns per packed B block

// A matrix operand as the GEMM sees it: element (r, c) is data[r * ld + c], or data[c * ld + r]
// when `transposed`, so dy^T and W^T are read in place without being materialised.
struct MatRef {
    const float* data;
    size_t ld;
    bool transposed;
};

// Growable, 64-byte aligned scratch for packed panels, one per thread (reused across calls).
class PackBuffer {
public:
    float* get(size_t floats) {
        if (floats + 16 > storage_.size()) storage_.assign(floats + 16, 0.0f);
        uintptr_t p = reinterpret_cast<uintptr_t>(storage_.data());
        return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
    }

private:
    std::vector<float> storage_;
};

// Packing copies a kc-long block of an operand into W-wide panels, k-major inside each panel
// (panel[k * W + i]), zero-padding the last panel so the micro-kernel never branches. The two
// helpers differ in which direction of the source is contiguous; both read memory in long
// sequential runs, which matters when the source (the 50k-wide dlogits) comes from DRAM.

// Source element (i, k) at src[k * ld + i]: rows of k are contiguous across the panels. Walking
// 16 k-rows per group keeps both the reads (whole rows) and the writes (one 16 x W patch per
// panel) sequential.
template <int W>
inline void pack_k_rows(const float* src, size_t ld, int width, int kc, float* out) {
    constexpr int K_GROUP = 16;
    const int full = width / W, rest = width - full * W;
    for (int kg = 0; kg < kc; kg += K_GROUP) {
        const int kend = std::min(kc, kg + K_GROUP);
        for (int s = 0; s < full; s++)
            for (int k = kg; k < kend; k++) {
                float* dst = out + (size_t)s * W * kc + (size_t)k * W;
                const float* row = src + (size_t)k * ld + s * W;
                for (int i = 0; i < W; i++) dst[i] = row[i];  // fixed trip count: one vector move
            }
        if (rest)
            for (int k = kg; k < kend; k++) {
                float* dst = out + (size_t)full * W * kc + (size_t)k * W;
                const float* row = src + (size_t)k * ld + full * W;
                for (int i = 0; i < rest; i++) dst[i] = row[i];
                for (int i = rest; i < W; i++) dst[i] = 0.0f;
            }
    }
}

#if defined(__AVX512F__)
// Transposes the 16 x 16 block held in r[0..15] (row i in r[i]) in place: 2x2 float pairs, then
// 4x4 blocks within 128-bit lanes, then the lanes themselves. (The all-ones masked forms of the
// shuffles avoid GCC 12's false "may be used uninitialized" warnings on the plain intrinsics.)
inline void transpose16x16(__m512 r[16]) {
    const __mmask16 all16 = 0xFFFF;
    const __mmask8 all8 = 0xFF;
    auto unpacklo_ps = [&](__m512 a, __m512 b) { return _mm512_mask_unpacklo_ps(a, all16, a, b); };
    auto unpackhi_ps = [&](__m512 a, __m512 b) { return _mm512_mask_unpackhi_ps(a, all16, a, b); };
    auto unpacklo_pd = [&](__m512 a, __m512 b) {
        const __m512d x = _mm512_castps_pd(a);
        return _mm512_castpd_ps(_mm512_mask_unpacklo_pd(x, all8, x, _mm512_castps_pd(b)));
    };
    auto unpackhi_pd = [&](__m512 a, __m512 b) {
        const __m512d x = _mm512_castps_pd(a);
        return _mm512_castpd_ps(_mm512_mask_unpackhi_pd(x, all8, x, _mm512_castps_pd(b)));
    };
    // lanes (0, 2) of a then (0, 2) of b; and lanes (1, 3) of each
    auto even_lanes = [&](__m512 a, __m512 b) { return _mm512_mask_shuffle_f32x4(a, all16, a, b, 0x88); };
    auto odd_lanes = [&](__m512 a, __m512 b) { return _mm512_mask_shuffle_f32x4(a, all16, a, b, 0xdd); };
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = unpacklo_pd(t[i], t[i + 2]);
        r[i + 1] = unpackhi_pd(t[i], t[i + 2]);
        r[i + 2] = unpacklo_pd(t[i + 1], t[i + 3]);
        r[i + 3] = unpackhi_pd(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = even_lanes(r[i], r[4 + i]);
        t[4 + i] = odd_lanes(r[i], r[4 + i]);
        t[8 + i] = even_lanes(r[8 + i], r[12 + i]);
        t[12 + i] = odd_lanes(r[8 + i], r[12 + i]);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = even_lanes(t[i], t[8 + i]);
        r[8 + i] = odd_lanes(t[i], t[8 + i]);
        r[4 + i] = even_lanes(t[4 + i], t[12 + i]);
        r[12 + i] = odd_lanes(t[4 + i], t[12 + i]);
    }
}
#endif

// Source element (i, k) at src[i * ld + k]: each panel interleaves W contiguous k-runs, a
// transpose, done 16 x 16 in registers where AVX-512 allows.
template <int W>
inline void pack_k_columns(const float* src, size_t ld, int width, int kc, float* out) {
    for (int s = 0; s * W < width; s++) {
        float* dst = out + (size_t)s * W * kc;
        const int n = std::min(W, width - s * W);
        const float* rows[W];
        for (int i = 0; i < W; i++) rows[i] = src + (size_t)(s * W + std::min(i, n - 1)) * ld;
        int k = 0;
#if defined(__AVX512F__)
        for (; k + 16 <= kc; k += 16) {
            for (int i0 = 0; i0 < W; i0 += 16) {
                const int lanes = std::min(16, W - i0);
                __m512 r[16];
                for (int i = 0; i < 16; i++) r[i] = i < lanes ? _mm512_loadu_ps(rows[i0 + i] + k) : _mm512_setzero_ps();
                transpose16x16(r);
                const __mmask16 mask = (__mmask16)((1u << lanes) - 1);
                for (int kk = 0; kk < 16; kk++) _mm512_mask_storeu_ps(dst + (size_t)(k + kk) * W + i0, mask, r[kk]);
            }
        }
#endif
        for (; k < kc; k++)
            for (int i = 0; i < W; i++) dst[k * W + i] = rows[i][k];
        if (n < W)  // the padding lanes above read row n-1 again; zero them
            for (int k2 = 0; k2 < kc; k2++)
                for (int i = n; i < W; i++) dst[k2 * W + i] = 0.0f;
    }
}

// Rows [m0, m0+mc) x k [k0, k0+kc) of A into MR-row panels.
inline void pack_a(const MatRef& a, int m0, int mc, int k0, int kc, float* out) {
    if (a.transposed) pack_k_rows<GEMM_MR>(a.data + (size_t)k0 * a.ld + m0, a.ld, mc, kc, out);
    else pack_k_columns<GEMM_MR>(a.data + (size_t)m0 * a.ld + k0, a.ld, mc, kc, out);
}

// k [k0, k0+kc) x columns [n0, n0+nc) of B into NR-column panels.
inline void pack_b(const MatRef& b, int k0, int kc, int n0, int nc, float* out) {
    if (b.transposed) pack_k_columns<GEMM_NR>(b.data + (size_t)n0 * b.ld + k0, b.ld, nc, kc, out);
    else pack_k_rows<GEMM_NR>(b.data + (size_t)k0 * b.ld + n0, b.ld, nc, kc, out);
}

// C[0:rows, 0:cols] += (or, with `overwrite`, =) Ap-panel x Bp-panel over kc, the MR x NR sum
// held in registers.
inline void micro_kernel(int kc, const float* __restrict ap, const float* __restrict bp, float* c, size_t ldc,
                         int rows, int cols, bool overwrite) {
    constexpr int MR = GEMM_MR, NV = GEMM_NV, NR = GEMM_NR;
    vec acc[MR][NV];
LLMC_GCC_UNROLL(16)
    for (int i = 0; i < MR; i++)
LLMC_GCC_UNROLL(4)
        for (int j = 0; j < NV; j++) acc[i][j] = vzero();
    for (int k = 0; k < kc; k++) {
        vec bk[NV];
LLMC_GCC_UNROLL(4)
        for (int j = 0; j < NV; j++) bk[j] = vload(bp + j * VEC_FLOATS);
LLMC_GCC_UNROLL(16)
        for (int i = 0; i < MR; i++) {
            const vec ai = vbroadcast(ap[i]);
LLMC_GCC_UNROLL(4)
            for (int j = 0; j < NV; j++) acc[i][j] = vfma(ai, bk[j], acc[i][j]);
        }
        ap += MR;
        bp += NR;
    }
    if (rows == MR && cols == NR) {
LLMC_GCC_UNROLL(16)
        for (int i = 0; i < MR; i++)
LLMC_GCC_UNROLL(4)
            for (int j = 0; j < NV; j++) {
                float* ci = c + i * ldc + j * VEC_FLOATS;
                vstore(ci, overwrite ? acc[i][j] : vadd(vload(ci), acc[i][j]));
            }
    } else {
        alignas(64) float tile[MR * NR];
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NV; j++) vstore(tile + i * NR + j * VEC_FLOATS, acc[i][j]);
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) c[i * ldc + j] = overwrite ? tile[i * NR + j] : c[i * ldc + j] + tile[i * NR + j];
    }
}

// B is packed for the whole of K at once when that takes at most this many floats per thread, so
// a C tile is finished while it sits in cache instead of being re-read once per KC block (this
// is what makes dW += dy^T x with a 50k-row dW fast).
constexpr size_t GEMM_B_PACK_MAX_FLOATS = size_t(1) << 20;

// C (M x N, row stride ldc) = A (M x K) * B (K x N), or C += A * B when `accumulate`. Threads own
// disjoint rectangles of C, split along M or N, whichever keeps the per-thread work (compute plus
// packing) smallest.
inline void gemm(int M, int N, int K, const MatRef& a, const MatRef& b, float* c, size_t ldc, bool accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate)
            for (int i = 0; i < M; i++) std::fill(c + (size_t)i * ldc, c + (size_t)i * ldc + N, 0.0f);
        return;
    }
    constexpr int MR = GEMM_MR, NR = GEMM_NR, KC = GEMM_KC;
    const bool worth_threads = (double)M * N * K > 65536.0;
#pragma omp parallel if (worth_threads)
    {
        const int num_threads = omp_get_num_threads(), tid = omp_get_thread_num();
        const int m_strips = (M + MR - 1) / MR, n_strips = (N + NR - 1) / NR;
        // Choose the pm x pn grid of thread rectangles; packing one element costs about as
        // much as 16 multiply-adds.
        int best_pm = 1;
        double best_cost = std::numeric_limits<double>::max();
        for (int pm = 1; pm <= num_threads; pm++) {
            if (num_threads % pm) continue;
            const int pn = num_threads / pm;
            const double mt = (double)((m_strips + pm - 1) / pm) * MR, nt = (double)((n_strips + pn - 1) / pn) * NR;
            const double cost = mt * nt + 16.0 * (mt * std::ceil(nt / GEMM_NC) + nt);
            if (cost < best_cost) best_cost = cost, best_pm = pm;
        }
        const int pm = best_pm, pn = num_threads / pm;
        const int tm = tid / pn, tn = tid % pn;
        const int m_lo = std::min(M, (int)((int64_t)m_strips * tm / pm) * MR);
        const int m_hi = std::min(M, (int)((int64_t)m_strips * (tm + 1) / pm) * MR);
        const int n_lo = std::min(N, (int)((int64_t)n_strips * tn / pn) * NR);
        const int n_hi = std::min(N, (int)((int64_t)n_strips * (tn + 1) / pn) * NR);

        const int nc_max = std::min(GEMM_NC, (n_hi - n_lo + NR - 1) / NR * NR);
        const int k_span = (size_t)K * nc_max <= GEMM_B_PACK_MAX_FLOATS ? K : KC;
        static thread_local PackBuffer a_buffer, b_buffer;
        float* ap = a_buffer.get((size_t)GEMM_MC * KC);
        float* bp = b_buffer.get((size_t)(k_span + KC) * nc_max);
        for (int n0 = n_lo; n0 < n_hi; n0 += GEMM_NC) {
            const int nc = std::min(GEMM_NC, n_hi - n0), nc_padded = (nc + NR - 1) / NR * NR;
            for (int kb = 0; kb < K; kb += k_span) {
                const int kb_end = std::min(K, kb + k_span);
                for (int k0 = kb; k0 < kb_end; k0 += KC)
                    pack_b(b, k0, std::min(KC, K - k0), n0, nc, bp + (size_t)(k0 - kb) * nc_padded);
                for (int m0 = m_lo; m0 < m_hi; m0 += GEMM_MC) {
                    const int mc = std::min(GEMM_MC, m_hi - m0);
                    for (int k0 = kb; k0 < kb_end; k0 += KC) {
                        const int kc = std::min(KC, K - k0);
                        const float* bk = bp + (size_t)(k0 - kb) * nc_padded;
                        pack_a(a, m0, mc, k0, kc, ap);
                        for (int jn = 0; jn < nc; jn += NR)
                            for (int im = 0; im < mc; im += MR)
                                micro_kernel(kc, ap + (size_t)im * kc, bk + (size_t)jn * kc,
                                             c + (size_t)(m0 + im) * ldc + n0 + jn, ldc, std::min(MR, mc - im),
                                             std::min(NR, nc - jn), !accumulate && k0 == 0);
                    }
                }
            }
        }
    }
}

}  // namespace cpu
}  // namespace llmc
