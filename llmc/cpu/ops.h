// cpu/ops.h: the fp32 CPU layers of GPT-2 (encoder, LayerNorm, matmul, GELU, causal attention,
// cross-entropy), forward and backward, parallel with OpenMP.
//
// These are the reference the CUDA kernels are checked against (dev/cuda), so they are written for
// exactness first: every reduction over rows is split by columns rather than rows, so each output is
// summed in one fixed order and results are bitwise identical for any thread count. The matrix
// products go through cpu/gemm.h.
#pragma once

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "llmc/cpu/gemm.h"
#include "llmc/dist/context_parallel.h"
#include "llmc/numerics/layernorm_eps.h"

namespace llmc {
namespace cpu {

// ---------------------------------------------------------------------------------------------
// Elementwise helpers, written so `#pragma omp simd` loops vectorise them.

// exp(x) to about 2 ulp: x = n ln2 + r with |r| <= ln2/2, exp(r) by its degree-7 Taylor
// polynomial, 2^n built in the exponent bits. Clamped to the normal float range; libm's expf
// would be called one element at a time and dominate the softmax over 50k-wide rows. A NaN stays
// NaN (the guards must see it), through r and p; only n's conversion to int, undefined for NaN,
// takes 0 instead. (Computing n from a NaN-free copy of x instead changed how the compiler fused
// x * log2(e) + magic, and with it 88 results on non-NaN inputs; this form is bitwise the same.)
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
    const float n_or_zero = n == n ? n : 0.0f;
    return p * std::bit_cast<float>(((int32_t)n_or_zero + 127) << 23);
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

// Row bt of a B x T batch is at position bt % T, or at positions[bt % T] where given (a context-
// parallel rank holds positions scattered over the sequence; dist/context_parallel.h).
inline int position_of(int bt, int T, const int* positions) { return positions ? positions[bt % T] : bt % T; }

inline void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                            const int* positions = nullptr) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float* te = wte + (size_t)tokens[bt] * C;
        const float* pe = wpe + (size_t)position_of(bt, T, positions) * C;
        float* o = out + (size_t)bt * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
    }
}

// Tokens outside [v_begin, v_end) leave dwte alone: with a vocabulary-parallel embedding, dwte holds
// only rows [v_begin, v_end) of the table (row 0 of dwte is token v_begin), and dwpe is skipped if null.
inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C,
                             int v_begin = 0, int v_end = std::numeric_limits<int>::max(),
                             const int* positions = nullptr) {
    for_column_ranges(C, [&](int c0, int c1) {
        for (int bt = 0; bt < B * T; bt++) {
            const float* d = dout + (size_t)bt * C;
            if (tokens[bt] >= v_begin && tokens[bt] < v_end) {
                float* dte = dwte + (size_t)(tokens[bt] - v_begin) * C;
                for (int c = c0; c < c1; c++) dte[c] += d[c];
            }
            if (dwpe) {
                float* dpe = dwpe + (size_t)position_of(bt, T, positions) * C;
                for (int c = c0; c < c1; c++) dpe[c] += d[c];
            }
        }
    });
}

// The vocabulary-parallel half of the encoder: out row = wte row of the token when it lies in
// [v_begin, v_end) (wte holding those rows only), else zeros. Summed over the ranks that hold the
// other rows, it is the token embedding; add_positions then adds wpe.
inline void embedding_forward_range(float* out, const int* tokens, const float* wte, int v_begin, int v_end, int rows,
                                    int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float* o = out + (size_t)r * C;
        if (tokens[r] >= v_begin && tokens[r] < v_end) std::copy(wte + (size_t)(tokens[r] - v_begin) * C,
                                                                 wte + (size_t)(tokens[r] - v_begin + 1) * C, o);
        else std::fill(o, o + C, 0.0f);
    }
}

// out[r] = inp[r] + wpe[position of token row0 + r] for `rows` rows of a B x T batch (row0: the first
// row's index in it; positions as encoder_forward's).
inline void add_positions(float* out, const float* inp, const float* wpe, int row0, int rows, int T, int C,
                          const int* positions = nullptr) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float* pe = wpe + (size_t)position_of(row0 + r, T, positions) * C;
        const float* x = inp + (size_t)r * C;
        float* o = out + (size_t)r * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = x[c] + pe[c];
    }
}

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

// dbias += column sums of dout (rows x OC).
inline void bias_backward(float* dbias, const float* dout, int rows, int OC) {
    for_column_ranges(OC, [&](int c0, int c1) {
        for (int r = 0; r < rows; r++) {
            const float* d = dout + (size_t)r * OC;
            for (int c = c0; c < c1; c++) dbias[c] += d[c];
        }
    });
}

// dinp = dout W (overwritten; if given), dweight += dout^T inp, dbias += column sums of dout (if given).
inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int rows, int C, int OC) {
    if (dinp) gemm(rows, C, OC, MatRef{dout, (size_t)OC, false}, MatRef{weight, (size_t)C, false}, dinp, C, false);
    gemm(OC, C, rows, MatRef{dout, (size_t)OC, true}, MatRef{inp, (size_t)C, false}, dweight, C, true);
    if (dbias) bias_backward(dbias, dout, rows, OC);
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

// One head of one sequence in a qkv buffer: q, k and v at position 0, the next position `row` floats
// on. GPT-2's heads (below) and grouped-query attention's (cpu/llama_ops.h, where query heads share
// a kv head) differ only in where these point; both run one query position at a time through the
// two functions after it, so their arithmetic is the same, operation for operation.
struct AttentionHead {
    const float *q, *k, *v;
    size_t row;
    int T, hs;
};

// Query position t: a[t2] = the softmax over t2 <= t of scale * q.k[t2], and o = sum_t2 a[t2] v[t2].
// kt is the head's keys transposed by transpose_head.
inline void attention_query_forward(float* o, float* a, const AttentionHead& head, const float* kt, int t,
                                    float scale) {
    const int hs = head.hs;
    dots_with_transposed(a, head.q + t * head.row, kt, head.T, hs, t + 1);
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
    std::fill(o, o + hs, 0.0f);
    for (int t2 = 0; t2 <= t; t2++) {
        const float* v = head.v + t2 * head.row;
        const float w = a[t2];
#pragma omp simd
        for (int d = 0; d < hs; d++) o[d] += w * v[d];
    }
}

// Query position t's share of the gradients, from dO (its rows of dout) and a (its probabilities):
// added to dq at t and to dk and dv at every t2 <= t (dq, dk, dv point at position 0, `row` floats
// apart, as in head). vt is the head's values transposed; datt is scratch of T floats.
inline void attention_query_backward(float* dq, float* dk, float* dv, float* datt, const float* dO, const float* a,
                                     const AttentionHead& head, const float* vt, int t, float scale) {
    const int hs = head.hs;
    const size_t row = head.row;
    const float* q = head.q + t * row;
    float* dqt = dq + t * row;
    // through out = sum_t2 a[t2] v[t2]
    dots_with_transposed(datt, dO, vt, head.T, hs, t + 1);
    float a_datt = 0.0f;
#pragma omp simd reduction(+ : a_datt)
    for (int t2 = 0; t2 <= t; t2++) a_datt += a[t2] * datt[t2];
    // through the softmax, then the scaled dot products
    for (int t2 = 0; t2 <= t; t2++) {
        const float w = a[t2];
        const float dpre = w * (datt[t2] - a_datt) * scale;
        const float* k = head.k + t2 * row;
        float* dkt = dk + t2 * row;
        float* dvt = dv + t2 * row;
#pragma omp simd
        for (int d = 0; d < hs; d++) {
            dvt[d] += w * dO[d];
            dqt[d] += dpre * k[d];
            dkt[d] += dpre * q[d];
        }
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
                const AttentionHead head{base, base + C, base + 2 * C, row, T, hs};
                transpose_head(kt.data(), head.k, row, T, hs);
                for (int t = 0; t < T; t++)
                    attention_query_forward(out + ((size_t)b * T + t) * C + h * hs,
                                            att + (((size_t)b * NH + h) * T + t) * T, head, kt.data(), t, scale);
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
                const AttentionHead head{base, base + C, base + 2 * C, row, T, hs};
                transpose_head(vt.data(), head.v, row, T, hs);
                for (int t = 0; t < T; t++) {
                    float* dr = dbase + t * row;
                    std::fill(dr, dr + hs, 0.0f);
                    std::fill(dr + C, dr + C + hs, 0.0f);
                    std::fill(dr + 2 * C, dr + 2 * C + hs, 0.0f);
                }
                for (int t = 0; t < T; t++)
                    attention_query_backward(dbase, dbase + C, dbase + 2 * C, datt.data(),
                                             dout + ((size_t)b * T + t) * C + h * hs,
                                             att + (((size_t)b * NH + h) * T + t) * T, head, vt.data(), t, scale);
            }
        }
    }
}

// Blockwise causal attention, for context parallelism (dist/context_parallel.h): the queries of one
// chunk of `rows` positions against the keys and values of one chunk of as many, in each of B
// sequences, all keys (Full) or those at or before the query (Diagonal: both chunks the same). In
// place of the softmax matrix each query row keeps lse, the log-sum-exp of its scaled scores over
// the keys seen so far: the forward folds a block into the running output and lse (merge_lse), and
// the backward recomputes the probabilities exp(score - lse) from the final lse, as FlashAttention
// does, so nothing of size T x T is stored. A block's rows are reached through views; lse (and the
// backward's rowsum) of query t of head h in sequence b is at [(b * NH + h) * lse_stride + t].
template <typename F>
struct BlockRows {
    F* at;              // row 0 of sequence 0, head 0 (head h is h * hs floats on)
    size_t row, batch;  // floats between consecutive rows, and between sequences
    F* of(int b, int t, int h, int hs) const { return at + b * batch + t * row + (size_t)h * hs; }
};
using Rows = BlockRows<float>;
using ConstRows = BlockRows<const float>;

// Grouped-query attention (a Llama's kv heads): query head h reads key/value head h / group, and k, v
// hold NH / group heads (group 1: one each, GPT-2's attention).
struct AttentionBlock {
    ConstRows q, k, v;
    int B, NH, hs, rows;
    bool diagonal;  // causal within the block (query and key chunk the same), else every key
    int group = 1;  // query heads per key/value head
    int keys_for(int t) const { return diagonal ? t + 1 : rows; }
};

inline void attention_block_forward(Rows out, float* lse, size_t lse_stride, const AttentionBlock& blk) {
    const int hs = blk.hs, rows = blk.rows;
    const float scale = 1.0f / std::sqrt((float)hs);
#pragma omp parallel
    {
        std::vector<float> kt((size_t)hs * rows), p(rows), o(hs);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < blk.B; b++) {
            for (int h = 0; h < blk.NH; h++) {
                const int kvh = h / blk.group;
                transpose_head(kt.data(), blk.k.of(b, 0, kvh, hs), blk.k.row, rows, hs);
                float* l = lse + ((size_t)b * blk.NH + h) * lse_stride;
                for (int t = 0; t < rows; t++) {
                    const int n = blk.keys_for(t);
                    dots_with_transposed(p.data(), blk.q.of(b, t, h, hs), kt.data(), rows, hs, n);
                    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
                    for (int t2 = 0; t2 < n; t2++) mx = std::max(mx, p[t2]);
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int t2 = 0; t2 < n; t2++) {
                        p[t2] = fast_exp((p[t2] - mx) * scale);
                        sum += p[t2];
                    }
                    std::fill(o.begin(), o.end(), 0.0f);
                    for (int t2 = 0; t2 < n; t2++) {
                        const float w = p[t2];
                        const float* v = blk.v.of(b, t2, kvh, hs);
#pragma omp simd
                        for (int d = 0; d < hs; d++) o[d] += w * v[d];
                    }
                    const LseMerge m = merge_lse(l[t], mx * scale + std::log(sum));
                    const float w_new = m.w_new / sum;
                    float* out_row = out.of(b, t, h, hs);
#pragma omp simd
                    for (int d = 0; d < hs; d++) out_row[d] = m.w_old * out_row[d] + w_new * o[d];
                    l[t] = m.lse;
                }
            }
        }
    }
}

// rowsum[b, h, t] = dout . out over the head's hs channels, for T rows of C channels (lse's layout
// with lse_stride T): the term every key's score gradient subtracts in attention_block_backward.
inline void attention_rowsum(float* rowsum, const float* dout, const float* out, int B, int T, int C, int NH) {
    const int hs = C / NH;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t at = ((size_t)b * T + t) * C + (size_t)h * hs;
                float sum = 0.0f;
                for (int d = 0; d < hs; d++) sum += dout[at + d] * out[at + d];
                rowsum[((size_t)b * NH + h) * T + t] = sum;
            }
}

// Adds the block's share to dq (the queries' rows), dk and dv (the keys' rows), from dout (the
// queries' rows of the attention output's gradient), the final lse and rowsum of the queries. A
// key/value head's gradient sums its group's query heads in head order (one thread per kv head).
inline void attention_block_backward(Rows dq, Rows dk, Rows dv, ConstRows dout, const float* lse,
                                     const float* rowsum, size_t lse_stride, const AttentionBlock& blk) {
    const int hs = blk.hs, rows = blk.rows;
    const float scale = 1.0f / std::sqrt((float)hs);
#pragma omp parallel
    {
        std::vector<float> kt((size_t)hs * rows), vt((size_t)hs * rows), s(rows), dp(rows);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < blk.B; b++) {
            for (int kvh = 0; kvh < blk.NH / blk.group; kvh++) {
                transpose_head(kt.data(), blk.k.of(b, 0, kvh, hs), blk.k.row, rows, hs);
                transpose_head(vt.data(), blk.v.of(b, 0, kvh, hs), blk.v.row, rows, hs);
                for (int h = kvh * blk.group; h < (kvh + 1) * blk.group; h++) {
                    const size_t at = ((size_t)b * blk.NH + h) * lse_stride;
                    for (int t = 0; t < rows; t++) {
                        const int n = blk.keys_for(t);
                        const float* q = blk.q.of(b, t, h, hs);
                        const float* dO = dout.of(b, t, h, hs);
                        float* dqt = dq.of(b, t, h, hs);
                        dots_with_transposed(s.data(), q, kt.data(), rows, hs, n);
                        dots_with_transposed(dp.data(), dO, vt.data(), rows, hs, n);
                        const float l = lse[at + t], r = rowsum[at + t];
                        // s becomes the probabilities, dp the scores' gradients
#pragma omp simd
                        for (int t2 = 0; t2 < n; t2++) {
                            s[t2] = fast_exp(s[t2] * scale - l);
                            dp[t2] = s[t2] * (dp[t2] - r) * scale;
                        }
                        for (int t2 = 0; t2 < n; t2++) {
                            const float p = s[t2], ds = dp[t2];
                            const float* k = blk.k.of(b, t2, kvh, hs);
                            float* dkt = dk.of(b, t2, kvh, hs);
                            float* dvt = dv.of(b, t2, kvh, hs);
#pragma omp simd
                            for (int d = 0; d < hs; d++) {
                                dqt[d] += ds * k[d];
                                dkt[d] += ds * q[d];
                                dvt[d] += p * dO[d];
                            }
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

// Vocabulary-parallel cross-entropy (Megatron-LM): each of n ranks holds columns [v_begin, v_begin +
// cols) of every row's logits, the first `real` of them real tokens (the rest padding), and no rank
// ever sees a whole row. Step 1, per row on this rank: the max over its real columns, the sum of
// exp(x - max) over them, and the target's logit if this rank holds the target (else 0), as
// stats[3 r + 0, 1, 2]. A rank without real columns reports max -inf and sum 0.
inline void crossentropy_local_stats(float* stats, const float* logits, const int* targets, int rows, int v_begin,
                                     int real, int cols) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float* l = logits + (size_t)r * cols;
        float mx = -std::numeric_limits<float>::infinity(), sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int v = 0; v < real; v++) mx = std::max(mx, l[v]);
        if (real > 0) {
#pragma omp simd reduction(+ : sum)
            for (int v = 0; v < real; v++) sum += fast_exp(l[v] - mx);
        }
        const int t = targets[r] - v_begin;
        stats[3 * (size_t)r + 0] = mx;
        stats[3 * (size_t)r + 1] = sum;
        stats[3 * (size_t)r + 2] = t >= 0 && t < real ? l[t] : 0.0f;
    }
}

// Step 2, with every rank's stats gathered (n blocks of 3 * rows floats, in rank order, the same on
// every rank): the global max M, the sum S = sum_k s_k exp(m_k - M) and the target logit give each
// row's loss M + log S - target, identically on every rank. With write_dlogits this rank's columns
// become their gradient (softmax - onehot) * dloss in place, zero on padded columns.
inline void crossentropy_from_stats(float* row_loss, float* logits, const int* targets, const float* all_stats, int n,
                                    bool write_dlogits, float dloss, int rows, int v_begin, int real, int cols) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float mx = -std::numeric_limits<float>::infinity(), target_logit = 0.0f;
        for (int k = 0; k < n; k++) mx = std::max(mx, all_stats[((size_t)k * rows + r) * 3]);
        float sum = 0.0f;
        for (int k = 0; k < n; k++) {
            const float* st = all_stats + ((size_t)k * rows + r) * 3;
            if (st[1] > 0.0f) sum += st[1] * std::exp(st[0] - mx);
            target_logit += st[2];
        }
        row_loss[r] = mx + std::log(sum) - target_logit;
        if (!write_dlogits) continue;
        float* l = logits + (size_t)r * cols;
        const float scale = dloss / sum;
#pragma omp simd
        for (int v = 0; v < real; v++) l[v] = fast_exp(l[v] - mx) * scale;
        std::fill(l + std::max(real, 0), l + cols, 0.0f);
        const int t = targets[r] - v_begin;
        if (t >= 0 && t < real) l[t] -= dloss;
    }
}
}  // namespace cpu
}  // namespace llmc
