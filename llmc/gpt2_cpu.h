// gpt2_cpu.h: GPT2CPU, the fp32 CPU reference implementation of llmc::Model (forward, backward,
// AdamW), fast enough to be the project's default trainer on a small multicore machine.
//
// Almost all of the time goes into the three matmul shapes (y = x W^T + b, dx += dy W,
// dW += dy^T x), so they share one packed, register-tiled GEMM: operands are copied into
// contiguous MR-row / NR-column panels and an MR x NR block of C lives in SIMD registers for a
// whole KC-long stretch of k. Each element of C is always summed in the same order (k blocks in
// sequence, k in sequence inside a block, whatever the panel or thread that computes it), and every
// other reduction over rows is split by columns rather than rows, so results are bitwise identical
// for any thread count or schedule.
//
// Memory: parameters, gradients and the AdamW moments are one flat buffer each in ParamLayout's
// bucket-major order, reached only through param(tensor, layer) and grad(tensor, layer); activations
// are one flat buffer sized for max_B x max_T, cut per call by ActivationLayout. The lm-head logits
// (B x T x Vp floats) stay readable after evaluate(); forward_backward turns them into dlogits in
// place, inside the cross-entropy, while each row is still in cache.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "adamw.h"
#include "model.h"
#include "model_config.h"
#include "model_file.h"
#include "model_init.h"
#include "utils.h"
#include "zero.h"

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

// ---------------------------------------------------------------------------------------------
// Elementwise helpers, written so `#pragma omp simd` loops vectorise them.

// exp(x) to about 2 ulp: x = n ln2 + r with |r| <= ln2/2, exp(r) by its degree-7 Taylor
// polynomial, 2^n built in the exponent bits. Clamped to the normal float range; libm's expf
// would be called one element at a time and dominate the softmax over 50k-wide rows.
inline float fast_exp(float x) {
    x = std::min(std::max(x, -87.0f), 88.0f);
    const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float n = (x * 1.44269504088896341f + round_magic) - round_magic;
    const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;  // ln2 = hi + lo
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * std::bit_cast<float>(((int32_t)n + 127) << 23);
}

// GELU, tanh form: 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3). Since
// 0.5 (1 + tanh(u)) = sigmoid(2u), it is x * sigmoid(2u), one exp and no cancellation.
constexpr float GELU_K = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float GELU_A = 0.044715f;
inline float gelu_sigmoid(float x) {
    const float u = GELU_K * (x + GELU_A * x * x * x);
    return 1.0f / (1.0f + fast_exp(-2.0f * u));
}

// Runs fn(begin, end) on one contiguous range of [0, n) per thread (ranges 16-aligned). Used for
// sums over rows: one thread owns each column and adds rows in order, so no reduction races.
template <typename Fn>
inline void for_column_ranges(int n, Fn fn) {
#pragma omp parallel
    {
        const int num_threads = omp_get_num_threads(), tid = omp_get_thread_num();
        const int per_thread = ((n + num_threads - 1) / num_threads + 15) / 16 * 16;
        const int begin = std::min(n, tid * per_thread), end = std::min(n, begin + per_thread);
        if (begin < end) fn(begin, end);
    }
}

// ---------------------------------------------------------------------------------------------
// Layers. Shapes: BT rows of C channels, row-major. Backward functions ACCUMULATE into parameter
// gradients and into dinp where the input also feeds a residual connection.

inline void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float* te = wte + (size_t)tokens[bt] * C;
        const float* pe = wpe + (size_t)(bt % T) * C;
        float* o = out + (size_t)bt * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
    }
}

inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C) {
    for_column_ranges(C, [&](int c0, int c1) {
        for (int bt = 0; bt < B * T; bt++) {
            float* dte = dwte + (size_t)tokens[bt] * C;
            float* dpe = dwpe + (size_t)(bt % T) * C;
            const float* d = dout + (size_t)bt * C;
            for (int c = c0; c < c1; c++) {
                dte[c] += d[c];
                dpe[c] += d[c];
            }
        }
    });
}

constexpr float LAYERNORM_EPS = 1e-5f;

inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, int rows, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float* x = inp + (size_t)r * C;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < C; c++) sum += x[c];
        const float m = sum / C;
        float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
        for (int c = 0; c < C; c++) sq += (x[c] - m) * (x[c] - m);
        const float s = 1.0f / std::sqrt(sq / C + LAYERNORM_EPS);
        float* o = out + (size_t)r * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[r] = m;
        rstd[r] = s;
    }
}

// dinp += d/dinp: the input of a LayerNorm is always the residual stream, whose gradient already
// holds the skip connection's share, so the LayerNorm's share is added, not assigned.
inline void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, const float* mean, const float* rstd, int rows, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float* x = inp + (size_t)r * C;
        const float* d = dout + (size_t)r * C;
        const float m = mean[r], s = rstd[r];
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma omp simd reduction(+ : dnorm_sum, dnorm_norm_sum)
        for (int c = 0; c < C; c++) {
            const float dnorm = d[c] * weight[c];
            dnorm_sum += dnorm;
            dnorm_norm_sum += dnorm * (x[c] - m) * s;
        }
        const float dnorm_mean = dnorm_sum / C, dnorm_norm_mean = dnorm_norm_sum / C;
        float* dx = dinp + (size_t)r * C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            const float norm = (x[c] - m) * s;
            dx[c] += (d[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    for_column_ranges(C, [&](int c0, int c1) {
        for (int r = 0; r < rows; r++) {
            const float* x = inp + (size_t)r * C;
            const float* d = dout + (size_t)r * C;
            const float m = mean[r], s = rstd[r];
            for (int c = c0; c < c1; c++) {
                dweight[c] += d[c] * ((x[c] - m) * s);
                dbias[c] += d[c];
            }
        }
    });
}

// out = base + inp W^T + bias, W stored (OC, C) row-major; base and bias may be null. `base` (the
// residual stream) lets a projection write straight into the next residual without an add pass.
inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, const float* base,
                           int rows, int C, int OC) {
    const bool has_init = base || bias;
    if (has_init) {
#pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++) {
            float* o = out + (size_t)r * OC;
            if (base) std::copy(base + (size_t)r * OC, base + (size_t)(r + 1) * OC, o);
            else std::fill(o, o + OC, 0.0f);
            if (bias) {
#pragma omp simd
                for (int j = 0; j < OC; j++) o[j] += bias[j];
            }
        }
    }
    gemm(rows, OC, C, MatRef{inp, (size_t)C, false}, MatRef{weight, (size_t)C, true}, out, OC, has_init);
}

// dinp = dout W (overwritten), dweight += dout^T inp, dbias += column sums of dout (if given).
inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int rows, int C, int OC) {
    gemm(rows, C, OC, MatRef{dout, (size_t)OC, false}, MatRef{weight, (size_t)C, false}, dinp, C, false);
    gemm(OC, C, rows, MatRef{dout, (size_t)OC, true}, MatRef{inp, (size_t)C, false}, dweight, C, true);
    if (dbias) {
        for_column_ranges(OC, [&](int c0, int c1) {
            for (int r = 0; r < rows; r++) {
                const float* d = dout + (size_t)r * OC;
                for (int c = c0; c < c1; c++) dbias[c] += d[c];
            }
        });
    }
}

inline void gelu_forward(float* out, const float* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * gelu_sigmoid(inp[i]);
}

// d/dx [x s(2u)] = s + 2 x s (1 - s) u'(x); in place on dinout (dout in, dinp out).
inline void gelu_backward(float* dinout, const float* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i], s = gelu_sigmoid(x);
        const float du_dx = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinout[i] *= s + 2.0f * x * s * (1.0f - s) * du_dx;
    }
}

// Causal self-attention. qkv rows are [q | k | v], each C = NH * hs wide; att keeps the softmax
// probabilities (B, NH, T, T; only t2 <= t is used). One (b, h) pair per task: its dq, dk, dv
// slices are private to it, so the backward needs no atomics. The dot products against every
// earlier position (q.k in the forward, dout.v in the backward) run over a transposed (hs, T)
// copy of k or v, so they vectorise across positions t2 instead of needing a horizontal sum.

// dst[d * T + t2] = src[t2 * row + d] for t2 < T, d < hs.
inline void transpose_head(float* dst, const float* src, size_t row, int T, int hs) {
    for (int t2 = 0; t2 < T; t2++)
        for (int d = 0; d < hs; d++) dst[(size_t)d * T + t2] = src[t2 * row + d];
}

// out[t2] = sum_d x[d] * yt[d * T + t2] for t2 < n.
inline void dots_with_transposed(float* out, const float* x, const float* yt, int T, int hs, int n) {
    std::fill(out, out + n, 0.0f);
    for (int d = 0; d < hs; d++) {
        const float xd = x[d];
        const float* y = yt + (size_t)d * T;
#pragma omp simd
        for (int t2 = 0; t2 < n; t2++) out[t2] += xd * y[t2];
    }
}

inline void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt((float)hs);
    const size_t row = 3 * (size_t)C;
#pragma omp parallel
    {
        std::vector<float> kt((size_t)hs * T);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* base = qkv + (size_t)b * T * row + h * hs;
                transpose_head(kt.data(), base + C, row, T, hs);
                for (int t = 0; t < T; t++) {
                    float* a = att + (((size_t)b * NH + h) * T + t) * T;
                    dots_with_transposed(a, base + t * row, kt.data(), T, hs, t + 1);
                    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
                    for (int t2 = 0; t2 <= t; t2++) mx = std::max(mx, a[t2]);
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int t2 = 0; t2 <= t; t2++) {
                        a[t2] = fast_exp((a[t2] - mx) * scale);
                        sum += a[t2];
                    }
                    const float inv = 1.0f / sum;
#pragma omp simd
                    for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
                    float* o = out + ((size_t)b * T + t) * C + h * hs;
                    std::fill(o, o + hs, 0.0f);
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float* v = base + t2 * row + 2 * C;
                        const float w = a[t2];
#pragma omp simd
                        for (int d = 0; d < hs; d++) o[d] += w * v[d];
                    }
                }
            }
        }
    }
}

// dqkv is overwritten.
inline void attention_backward(float* dqkv, const float* dout, const float* att, const float* qkv, int B, int T,
                               int C, int NH) {
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt((float)hs);
    const size_t row = 3 * (size_t)C;
#pragma omp parallel
    {
        std::vector<float> datt(T), vt((size_t)hs * T);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* base = qkv + (size_t)b * T * row + h * hs;
                float* dbase = dqkv + (size_t)b * T * row + h * hs;
                transpose_head(vt.data(), base + 2 * C, row, T, hs);
                for (int t = 0; t < T; t++) {
                    float* dr = dbase + t * row;
                    std::fill(dr, dr + hs, 0.0f);
                    std::fill(dr + C, dr + C + hs, 0.0f);
                    std::fill(dr + 2 * C, dr + 2 * C + hs, 0.0f);
                }
                for (int t = 0; t < T; t++) {
                    const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                    const float* dO = dout + ((size_t)b * T + t) * C + h * hs;
                    const float* q = base + t * row;
                    float* dq = dbase + t * row;
                    // through out = sum_t2 a[t2] v[t2]
                    dots_with_transposed(datt.data(), dO, vt.data(), T, hs, t + 1);
                    float a_datt = 0.0f;
#pragma omp simd reduction(+ : a_datt)
                    for (int t2 = 0; t2 <= t; t2++) a_datt += a[t2] * datt[t2];
                    // through the softmax, then the scaled dot products
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float w = a[t2];
                        const float dpre = w * (datt[t2] - a_datt) * scale;
                        const float* k = base + t2 * row + C;
                        float* dk = dbase + t2 * row + C;
                        float* dv = dk + C;
#pragma omp simd
                        for (int d = 0; d < hs; d++) {
                            dv[d] += w * dO[d];
                            dq[d] += dpre * k[d];
                            dk[d] += dpre * q[d];
                        }
                    }
                }
            }
        }
    }
}

// Per row: the loss -log softmax(logits)[target] over the real vocabulary (padded columns are
// excluded). With `write_dlogits` the row is then overwritten, in place, by its gradient
// (softmax - onehot) * dloss, zero on the padded columns: doing it while the 200 KB row is still in
// cache, with the exponentials already stored, saves a pass over B x T x Vp floats in memory.
inline void crossentropy(float* row_loss, float* logits, const int* targets, bool write_dlogits, float dloss, int rows,
                         int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float* l = logits + (size_t)r * Vp;
        float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
        for (int v = 0; v < V; v++) mx = std::max(mx, l[v]);
        const float target_logit = l[targets[r]];
        float sum = 0.0f;
        if (!write_dlogits) {
#pragma omp simd reduction(+ : sum)
            for (int v = 0; v < V; v++) sum += fast_exp(l[v] - mx);
        } else {
#pragma omp simd reduction(+ : sum)
            for (int v = 0; v < V; v++) {
                l[v] = fast_exp(l[v] - mx);
                sum += l[v];
            }
            const float scale = dloss / sum;
#pragma omp simd
            for (int v = 0; v < V; v++) l[v] *= scale;
            std::fill(l + V, l + Vp, 0.0f);
            l[targets[r]] -= dloss;
        }
        row_loss[r] = mx + std::log(sum) - target_logit;
    }
}

}  // namespace cpu

// Where each activation lives in the flat activation buffer for a call with B x T tokens. Per-layer
// tensors hold all L layers back to back. Sizes grow with B and T, so the layout for any B <= max_B,
// T <= max_T fits in a buffer of size_for(max_B, max_T).
struct ActivationLayout {
    float *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu, *residual3, *lnf, *lnf_mean, *lnf_rstd, *logits, *row_loss;
    // backward scratch: gradients of the residual stream and of one layer's intermediates
    float *dresidual, *dC, *d3C, *d4C;

    size_t total_floats = 0;  // the buffer size this layout needs

    static size_t size_for(const ModelConfig& c, int B, int T) { return ActivationLayout(c, B, T, nullptr).total_floats; }

    // Assigns consecutive slices of `base`; with base == nullptr only total_floats is computed.
    ActivationLayout(const ModelConfig& c, int B, int T, float* base) {
        const size_t BT = (size_t)B * T, C = c.channels, L = c.num_layers, NH = c.num_heads;
        const size_t Vp = c.padded_vocab_size;
        auto take = [&](float*& p, size_t n) {
            p = base ? base + total_floats : nullptr;
            total_floats += (n + 15) / 16 * 16;  // keep every tensor 64-byte aligned
        };
        take(encoded, BT * C);
        take(ln1, L * BT * C);
        take(ln1_mean, L * BT);
        take(ln1_rstd, L * BT);
        take(qkv, L * BT * 3 * C);
        take(atty, L * BT * C);
        take(att, L * B * NH * T * T);
        take(residual2, L * BT * C);
        take(ln2, L * BT * C);
        take(ln2_mean, L * BT);
        take(ln2_rstd, L * BT);
        take(fch, L * BT * 4 * C);
        take(fch_gelu, L * BT * 4 * C);
        take(residual3, L * BT * C);
        take(lnf, BT * C);
        take(lnf_mean, BT);
        take(lnf_rstd, BT);
        take(logits, BT * Vp);
        take(row_loss, BT);
        take(dresidual, BT * C);
        take(dC, BT * C);
        take(d3C, BT * 3 * C);
        take(d4C, BT * 4 * C);
    }
};

class GPT2CPU : public Model {
public:
    // A model sharded over `comm` by ZeRO stage `zero_stage` (see zero.h).
    GPT2CPU(const ModelConfig& config, int max_B, int max_T, Communicator& comm, int zero_stage)
        : config_(validated(config)), layout_(config), max_B_(max_B), max_T_(max_T),
          engine_(layout_, ZeroPlan(layout_, zero_stage, comm.rank(), comm.world_size()), comm, memory_) {
        if (max_B < 1) fail(strformat("GPT2CPU: max_B must be >= 1, got %d", max_B));
        if (max_T < 1 || max_T > config.max_seq_len)
            fail(strformat("GPT2CPU: max_T must be in [1, %d] (the model's max_seq_len), got %d", config.max_seq_len,
                           max_T));
        acts_.assign(activation_floats(config_, max_B, max_T), 0.0f);
    }
    // A single-rank model (stage 0, nothing to communicate).
    GPT2CPU(const ModelConfig& config, int max_B, int max_T) : GPT2CPU(config, max_B, max_T, local_communicator(), 0) {}

    // The activation buffer's length for a max_B x max_T model (the planner reads the same function).
    static size_t activation_floats(const ModelConfig& c, int max_B, int max_T) {
        return ActivationLayout::size_for(c, max_B, max_T) + 16;  // + slack for 64-byte alignment
    }
    // Everything one rank allocates: the engine's buffers and the activations (what --plan prints).
    static std::vector<BufferSpec> memory_specs(const ZeroPlan& zero, const ModelConfig& c, int max_B, int max_T) {
        std::vector<BufferSpec> specs = buffer_specs(zero);
        specs.push_back({"activations", MemoryKind::Activations, activation_floats(c, max_B, max_T)});
        return specs;
    }

    const ModelConfig& config() const override { return config_; }
    int max_batch() const override { return max_B_; }
    int max_seq_len() const override { return max_T_; }

    // Both start a fresh model: gradients and AdamW moments are reset. Every rank passes the same
    // seed or file and keeps its own shard.
    void init_random(uint64_t seed) override {
        std::vector<float> full(layout_.num_params);
        init_gpt2_params(config_, full.data(), seed);
        reset(full);
    }
    void load(const std::string& path) override {
        std::vector<float> full(layout_.num_params);
        read_model_file(path, config_, full.data());
        reset(full);
    }
    // A collective: every rank calls it, rank 0 writes the file.
    void save(const std::string& path) override {
        std::vector<float> full(layout_.num_params);
        engine_.get_params(full.data());
        if (engine_.plan().rank == 0) write_model_file(path, config_, full.data());
    }
    void get_params(float* full) { engine_.get_params(full); }

    void zero_grad() override { engine_.zero_grad(); }

    float forward_backward(const int* inputs, const int* targets, int B, int T, float grad_scale,
                           bool last_micro_batch) override {
        check_batch(inputs, targets, B, T, "forward_backward");
        const float loss = forward(inputs, targets, B, T, Pass::Train, grad_scale);
        backward(inputs, B, T, last_micro_batch);
        return loss;
    }
    float evaluate(const int* inputs, const int* targets, int B, int T) override {
        check_batch(inputs, targets, B, T, "evaluate");
        return forward(inputs, targets, B, T, Pass::Evaluate, 0.0f);
    }
    void next_token_logits(const int* tokens, int T, float* logits_out) override {
        check_batch(tokens, nullptr, 1, T, "next_token_logits");
        forward(tokens, nullptr, 1, T, Pass::LastLogits, 0.0f);
        const ActivationLayout a(config_, 1, T, activation_base());
        std::copy(a.logits, a.logits + config_.padded_vocab_size, logits_out);
    }

    double grad_norm_squared() override { return engine_.grad_norm_squared(); }
    void adamw_step(const AdamWConfig& opt, int step, float grad_multiplier) override {
        engine_.adamw_step(opt, step, grad_multiplier);
    }
    double take_exposed_comm_ms() override { return engine_.take_exposed_comm_ms(); }
    size_t allocated_bytes(MemoryKind kind) const override {
        if (kind == MemoryKind::Activations) return acts_.size() * sizeof(float);
        return engine_.allocated_bytes(kind);
    }

    // Direct access for tests and tools on an unsharded single-rank model (stage 0, 1 rank), where
    // the engine's buffers are exactly ParamLayout's: parameters and gradients, and the B x T x Vp
    // logits of the most recent evaluate() (after forward_backward the buffer holds dlogits).
    float* params() { return unsharded(engine_.full_params()); }
    const float* grads() { return unsharded(engine_.full_grads()); }
    const float* logits() const { return ActivationLayout(config_, last_B_, last_T_, activation_base()).logits; }

private:
    static const ModelConfig& validated(const ModelConfig& c) {
        c.validate();
        return c;
    }
    // The activation buffer rounded up to a 64-byte boundary (acts_ has 16 floats of slack).
    float* activation_base() const {
        const uintptr_t p = reinterpret_cast<uintptr_t>(acts_.data());
        return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
    }
    template <typename T>
    T* unsharded(T* p) {
        if (engine_.plan().world_size != 1 || engine_.plan().stage != 0)
            fail("GPT2CPU: params()/grads() need an unsharded single-rank model (stage 0, 1 rank)");
        return p;
    }

    // Parameters and gradients are reached only through the bucket view (zero.h), so the model
    // never knows how they are sharded.
    const float* param(int tensor, int layer = 0) const { return buckets_.param(tensor, layer); }
    float* grad(int tensor, int layer = 0) const { return buckets_.grad(tensor, layer); }
    void acquire(int bucket, int next_bucket) { buckets_.acquire(bucket, next_bucket); }
    void release(int bucket) { buckets_.release(bucket); }
    void release_all() { buckets_.release_all(); }

    void reset(const std::vector<float>& full) {
        engine_.set_params(full.data());
        engine_.reset_optimizer();
    }

    void check_batch(const int* inputs, const int* targets, int B, int T, const char* who) const {
        llmc::check_batch(config_, max_B_, max_T_, inputs, targets, B, T, who);
    }

    // What a forward pass leaves behind: the loss and logits (Evaluate), the loss and dlogits
    // scaled by grad_scale, ready for backward() (Train), or only the last position's logits.
    enum class Pass { Evaluate, Train, LastLogits };

    // Runs the forward pass on a checked batch; returns the mean loss (0 for LastLogits).
    float forward(const int* inputs, const int* targets, int B, int T, Pass pass, float grad_scale) {
        last_B_ = B;
        last_T_ = T;
        const int C = config_.channels, L = config_.num_layers, NH = config_.num_heads;
        const int V = config_.vocab_size, Vp = config_.padded_vocab_size, BT = B * T;
        const ActivationLayout a(config_, B, T, activation_base());
        using P = ParamLayout;
        const int embedding = P::EMBEDDING_BUCKET, final_norm = layout_.final_bucket();
        acquire(embedding, final_norm);
        cpu::encoder_forward(a.encoded, inputs, param(P::WTE), param(P::WPE), B, T, C);
        for (int l = 0; l < L; l++) {
            acquire(layout_.layer_bucket(l), l + 1 < L ? layout_.layer_bucket(l + 1) : -1);
            const size_t lc = (size_t)l * BT * C;
            const float* residual = l == 0 ? a.encoded : a.residual3 + lc - (size_t)BT * C;
            cpu::layernorm_forward(a.ln1 + lc, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, residual,
                                   param(P::LN1W, l), param(P::LN1B, l), BT, C);
            cpu::matmul_forward(a.qkv + 3 * lc, a.ln1 + lc, param(P::QKVW, l), param(P::QKVB, l), nullptr, BT, C,
                                3 * C);
            cpu::attention_forward(a.atty + lc, a.att + (size_t)l * B * NH * T * T, a.qkv + 3 * lc, B, T, C, NH);
            cpu::matmul_forward(a.residual2 + lc, a.atty + lc, param(P::ATTPROJW, l), param(P::ATTPROJB, l), residual,
                                BT, C, C);
            cpu::layernorm_forward(a.ln2 + lc, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, a.residual2 + lc,
                                   param(P::LN2W, l), param(P::LN2B, l), BT, C);
            cpu::matmul_forward(a.fch + 4 * lc, a.ln2 + lc, param(P::FCW, l), param(P::FCB, l), nullptr, BT, C,
                                4 * C);
            cpu::gelu_forward(a.fch_gelu + 4 * lc, a.fch + 4 * lc, (size_t)BT * 4 * C);
            cpu::matmul_forward(a.residual3 + lc, a.fch_gelu + 4 * lc, param(P::FCPROJW, l),
                                param(P::FCPROJB, l), a.residual2 + lc, BT, 4 * C, C);
            release(layout_.layer_bucket(l));
        }
        acquire(final_norm, -1);
        cpu::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual3 + (size_t)(L - 1) * BT * C,
                               param(P::LNFW), param(P::LNFB), BT, C);
        if (pass == Pass::LastLogits) {
            cpu::matmul_forward(a.logits, a.lnf + (size_t)(BT - 1) * C, param(P::WTE), nullptr, nullptr, 1, C, Vp);
            release_all();
            return 0.0f;
        }
        cpu::matmul_forward(a.logits, a.lnf, param(P::WTE), nullptr, nullptr, BT, C, Vp);
        // Training keeps the embeddings and final norm for backward; an evaluation is done with them.
        if (pass != Pass::Train) release_all();
        // The whole backward is linear in the loss gradient, so grad_scale enters once, here.
        cpu::crossentropy(a.row_loss, a.logits, targets, pass == Pass::Train, grad_scale / BT, BT, V, Vp);
        double total = 0.0;
        for (int r = 0; r < BT; r++) total += a.row_loss[r];
        return (float)(total / BT);
    }

    // Backward of the Pass::Train forward that just ran on the same batch, starting from the
    // dlogits it left in the logits buffer; parameter gradients accumulate. Each bucket is handed to
    // the engine (grads_ready) as soon as its gradient is complete, so its communication overlaps
    // the rest of backward.
    void backward(const int* inputs, int B, int T, bool last_micro_batch) {
        const int C = config_.channels, L = config_.num_layers, NH = config_.num_heads;
        const int Vp = config_.padded_vocab_size, BT = B * T;
        const ActivationLayout a(config_, B, T, activation_base());
        using P = ParamLayout;
        const int embedding = P::EMBEDDING_BUCKET, final_norm = layout_.final_bucket();
        buckets_.take_grads(embedding);
        buckets_.take_grads(final_norm);
        float* dlogits = a.logits;
        cpu::matmul_backward(a.dC, grad(P::WTE), nullptr, dlogits, a.lnf, param(P::WTE), BT, C, Vp);
        std::fill(a.dresidual, a.dresidual + (size_t)BT * C, 0.0f);
        cpu::layernorm_backward(a.dresidual, grad(P::LNFW), grad(P::LNFB), a.dC,
                                a.residual3 + (size_t)(L - 1) * BT * C, param(P::LNFW), a.lnf_mean, a.lnf_rstd, BT, C);
        engine_.grads_ready(final_norm, last_micro_batch);
        for (int l = L - 1; l >= 0; l--) {
            const int bucket = layout_.layer_bucket(l);
            acquire(bucket, l > 0 ? layout_.layer_bucket(l - 1) : -1);
            buckets_.take_grads(bucket);
            const size_t lc = (size_t)l * BT * C;
            const float* residual = l == 0 ? a.encoded : a.residual3 + lc - (size_t)BT * C;
            // dresidual is now d(residual3[l]); the fc projection reads fch_gelu
            cpu::matmul_backward(a.d4C, grad(P::FCPROJW, l), grad(P::FCPROJB, l), a.dresidual, a.fch_gelu + 4 * lc,
                                 param(P::FCPROJW, l), BT, 4 * C, C);
            cpu::gelu_backward(a.d4C, a.fch + 4 * lc, (size_t)BT * 4 * C);
            cpu::matmul_backward(a.dC, grad(P::FCW, l), grad(P::FCB, l), a.d4C, a.ln2 + lc, param(P::FCW, l), BT, C,
                                 4 * C);
            cpu::layernorm_backward(a.dresidual, grad(P::LN2W, l), grad(P::LN2B, l), a.dC,
                                    a.residual2 + lc, param(P::LN2W, l), a.ln2_mean + l * BT,
                                    a.ln2_rstd + l * BT, BT, C);
            // dresidual is now d(residual2[l]); the attention projection reads atty
            cpu::matmul_backward(a.dC, grad(P::ATTPROJW, l), grad(P::ATTPROJB, l), a.dresidual, a.atty + lc,
                                 param(P::ATTPROJW, l), BT, C, C);
            cpu::attention_backward(a.d3C, a.dC, a.att + (size_t)l * B * NH * T * T, a.qkv + 3 * lc, B, T, C, NH);
            cpu::matmul_backward(a.dC, grad(P::QKVW, l), grad(P::QKVB, l), a.d3C, a.ln1 + lc, param(P::QKVW, l), BT,
                                 C, 3 * C);
            cpu::layernorm_backward(a.dresidual, grad(P::LN1W, l), grad(P::LN1B, l), a.dC, residual,
                                    param(P::LN1W, l), a.ln1_mean + l * BT, a.ln1_rstd + l * BT, BT, C);
            engine_.grads_ready(bucket, last_micro_batch);
            release(bucket);
        }
        cpu::encoder_backward(grad(P::WTE), grad(P::WPE), a.dresidual, inputs, B, T, C);
        engine_.grads_ready(embedding, last_micro_batch);
        engine_.finish_backward();
        release_all();
    }


    ModelConfig config_;
    ParamLayout layout_;
    int max_B_, max_T_;
    int last_B_ = 1, last_T_ = 1;
    HostMemory memory_;  // before engine_, which allocates from it
    ZeroEngine<HostMemory> engine_;
    BucketView<HostMemory> buckets_{layout_, engine_};  // the buckets acquired for the pass under way
    std::vector<float> acts_;
};

}  // namespace llmc
