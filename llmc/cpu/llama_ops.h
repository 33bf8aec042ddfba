// cpu/llama_ops.h: the fp32 CPU layers Llama 3 adds to GPT-2's (cpu/ops.h): RMSNorm, rotary position
// embeddings (RoPE), grouped-query attention and SwiGLU's elementwise part, forward and backward.
//
// Like ops.h they are the reference the CUDA kernels are checked against, so they keep its rules:
// every output is summed in one fixed order, whatever the thread count (sums over rows are split by
// columns; grouped attention's dK and dV are summed over the group's query heads in head order, by
// the one task that owns the kv head), and parameter gradients ACCUMULATE. Matrix products (the qkv,
// output, gate/up and down projections, all without biases) are ops.h's matmul_forward/backward.
// Shapes: N = B * T rows; NH query heads and KVH key/value heads of HS channels; H the MLP width.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "llmc/cpu/ops.h"

namespace llmc {
namespace cpu {

constexpr float RMSNORM_EPS = 1e-5f;            // Llama 3's, added to the mean square
constexpr float LLAMA3_ROPE_THETA = 500000.0f;  // Llama 3's RoPE base (Llama 2's was 10000)

// ---------------------------------------------------------------------------------------------
// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight, no mean subtracted and no bias. rstd keeps
// each row's 1 / sqrt(mean(x^2) + eps) for the backward.

inline void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                            float eps = RMSNORM_EPS) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        const float* x = inp + (size_t)r * C;
        float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
        for (int c = 0; c < C; c++) sq += x[c] * x[c];
        const float s = 1.0f / std::sqrt(sq / C + eps);
        float* o = out + (size_t)r * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
        rstd[r] = s;
    }
}

// dinp += d/dinp and dweight += d/dweight. dinp accumulates because a pre-norm's input is the
// residual stream, whose gradient already holds the skip connection's share (as layernorm_backward).
// With n = x * s: dx = s * (dout * w - n * mean(dout * w * n)), the second term through s's
// dependence on every x of the row.
inline void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                             const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        const float* x = inp + (size_t)r * C;
        const float* d = dout + (size_t)r * C;
        const float s = rstd[r];
        float dnorm_norm_sum = 0.0f;
#pragma omp simd reduction(+ : dnorm_norm_sum)
        for (int c = 0; c < C; c++) dnorm_norm_sum += d[c] * weight[c] * (x[c] * s);
        const float dnorm_norm_mean = dnorm_norm_sum / C;
        float* dx = dinp + (size_t)r * C;
#pragma omp simd
        for (int c = 0; c < C; c++) dx[c] += (d[c] * weight[c] - x[c] * s * dnorm_norm_mean) * s;
    }
    for_column_ranges(C, [&](int c0, int c1) {
        for (int r = 0; r < N; r++) {
            const float* x = inp + (size_t)r * C;
            const float* d = dout + (size_t)r * C;
            const float s = rstd[r];
            for (int c = c0; c < c1; c++) dweight[c] += d[c] * (x[c] * s);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Rotary position embeddings, in place on the q and k heads of a qkv buffer (rows of
// [q: NH*HS | k: KVH*HS | v: KVH*HS]; v is left alone). Channel pair (i, i + HS/2) of every head,
// i < HS/2, is rotated by the angle pos * theta^(-2i/HS): Hugging Face's "rotate-half" convention
// (LlamaForCausalLM's apply_rotary_pos_emb), not Meta's adjacent pairs (2i, 2i+1), so that weights
// move between llmc and Hugging Face without permuting the q and k projections' rows. Row bt is at
// position_of(bt, T, positions) (ops.h), so a context-parallel rank passes its global positions.
//
// The angles are computed in double and only their cosines and sines rounded to fp32: Hugging Face
// forms pos * inv_freq in fp32, which is off by up to pos * 2^-24 radians (0.008 rad at position
// 131072); these are the exact angles, which a float64 PyTorch reference reproduces to fp32 rounding.

// cos_sin[t * HS + i] = cos(angle(t, i)), cos_sin[t * HS + HS/2 + i] = sin(angle(t, i)), for the T
// positions of a sequence and i < HS/2: the table every row at position t reads.
inline void rope_table(float* cos_sin, int T, int HS, float theta, const int* positions = nullptr) {
    const int half = HS / 2;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const double pos = position_of(t, T, positions);
        for (int i = 0; i < half; i++) {
            const double angle = pos * std::pow((double)theta, -2.0 * i / HS);
            cos_sin[(size_t)t * HS + i] = (float)std::cos(angle);
            cos_sin[(size_t)t * HS + half + i] = (float)std::sin(angle);
        }
    }
}

// Rotates the NH + KVH q and k heads of every row by sign * angle: +1 the forward, -1 the backward
// (a rotation's inverse, and its transpose: the gradient of y = R x is R^T dy = R(-angle) dy).
inline void rope_rotate(float* qkv, int B, int T, int NH, int KVH, int HS, float theta, const int* positions,
                        float sign) {
    const int half = HS / 2;
    const size_t row = (size_t)(NH + 2 * KVH) * HS;
    std::vector<float> cos_sin((size_t)T * HS);
    rope_table(cos_sin.data(), T, HS, theta, positions);
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float* c = cos_sin.data() + (size_t)(bt % T) * HS;
        const float* s = c + half;
        for (int h = 0; h < NH + KVH; h++) {
            float* x = qkv + bt * row + (size_t)h * HS;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float x0 = x[i], x1 = x[i + half], si = sign * s[i];
                x[i] = x0 * c[i] - x1 * si;
                x[i + half] = x1 * c[i] + x0 * si;
            }
        }
    }
}

inline void rope_forward(float* qkv, int B, int T, int NH, int KVH, int HS, float theta = LLAMA3_ROPE_THETA,
                         const int* positions = nullptr) {
    rope_rotate(qkv, B, T, NH, KVH, HS, theta, positions, 1.0f);
}

// In place on dqkv: the gradient of the rotated q and k becomes that of the unrotated ones (v's passes).
inline void rope_backward(float* dqkv, int B, int T, int NH, int KVH, int HS, float theta = LLAMA3_ROPE_THETA,
                          const int* positions = nullptr) {
    rope_rotate(dqkv, B, T, NH, KVH, HS, theta, positions, -1.0f);
}

// ---------------------------------------------------------------------------------------------
// Grouped-query causal attention. qkv rows are [q: NH*HS | k: KVH*HS | v: KVH*HS]; query head h reads
// kv head h / (NH / KVH) (Hugging Face's repeat_kv: each kv head serves NH / KVH consecutive query
// heads). out rows are NH*HS wide; att keeps the softmax probabilities (B, NH, T, T; t2 <= t used).
// Each query position goes through ops.h's attention_query_forward / _backward, as GPT-2's do: with
// KVH == NH the layout is GPT-2's [q | k | v] and the results are bitwise ops.h's attention's.

struct GqaLayout {
    int NH, KVH, HS;
    size_t row() const { return (size_t)(NH + 2 * KVH) * HS; }
    int group() const { return NH / KVH; }
    size_t q(int h) const { return (size_t)h * HS; }
    size_t k(int kvh) const { return (size_t)(NH + kvh) * HS; }
    size_t v(int kvh) const { return (size_t)(NH + KVH + kvh) * HS; }
    // query head h of a sequence whose first row is seq, with the kv head it reads
    AttentionHead head(const float* seq, int h, int T) const {
        const int kvh = h / group();
        return AttentionHead{seq + q(h), seq + k(kvh), seq + v(kvh), row(), T, HS};
    }
};

inline void gqa_attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int KVH, int HS) {
    const GqaLayout g{NH, KVH, HS};
    const float scale = 1.0f / std::sqrt((float)HS);
    const size_t C = (size_t)NH * HS;
#pragma omp parallel
    {
        std::vector<float> kt((size_t)HS * T);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHead head = g.head(qkv + (size_t)b * T * g.row(), h, T);
                transpose_head(kt.data(), head.k, head.row, T, HS);
                for (int t = 0; t < T; t++)
                    attention_query_forward(out + ((size_t)b * T + t) * C + g.q(h),
                                            att + (((size_t)b * NH + h) * T + t) * T, head, kt.data(), t, scale);
            }
        }
    }
}

// dqkv is overwritten. One task per (sequence, kv head): it owns the dk and dv of that kv head and
// the dq of its group's query heads, and adds the group's query heads into dk and dv one after the
// other in head order, so each sum has one order whatever the thread count, and needs no atomics.
inline void gqa_attention_backward(float* dqkv, const float* dout, const float* att, const float* qkv, int B, int T,
                                   int NH, int KVH, int HS) {
    const GqaLayout g{NH, KVH, HS};
    const float scale = 1.0f / std::sqrt((float)HS);
    const size_t row = g.row(), C = (size_t)NH * HS;
#pragma omp parallel
    {
        std::vector<float> datt(T), vt((size_t)HS * T);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int kvh = 0; kvh < KVH; kvh++) {
                const float* seq = qkv + (size_t)b * T * row;
                float* dseq = dqkv + (size_t)b * T * row;
                const int h0 = kvh * g.group(), h1 = h0 + g.group();
                transpose_head(vt.data(), seq + g.v(kvh), row, T, HS);
                for (int t = 0; t < T; t++) {
                    float* dr = dseq + t * row;
                    for (int h = h0; h < h1; h++) std::fill(dr + g.q(h), dr + g.q(h) + HS, 0.0f);
                    std::fill(dr + g.k(kvh), dr + g.k(kvh) + HS, 0.0f);
                    std::fill(dr + g.v(kvh), dr + g.v(kvh) + HS, 0.0f);
                }
                for (int h = h0; h < h1; h++) {
                    const AttentionHead head = g.head(seq, h, T);
                    for (int t = 0; t < T; t++)
                        attention_query_backward(dseq + g.q(h), dseq + g.k(kvh), dseq + g.v(kvh), datt.data(),
                                                 dout + ((size_t)b * T + t) * C + g.q(h),
                                                 att + (((size_t)b * NH + h) * T + t) * T, head, vt.data(), t, scale);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU: the MLP is down(silu(gate(x)) * up(x)). gate and up are one product: x times the (2H, C)
// weight whose first H rows are gate's and last H up's (ops.h's matmul_forward, no bias), so each
// row of gate_up is [gate: H | up: H]; the elementwise part below maps it to out = silu(gate) * up
// (N x H), which the down projection (C, H) takes back to C channels.

// silu(g) = g * sigmoid(g); fast_exp as GELU uses (ops.h), clamped so a large |g| gives 0 or g.
inline float swiglu_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

inline void swiglu_forward(float* out, const float* gate_up, int N, int H) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        const float* gate = gate_up + (size_t)r * 2 * H;
        const float* up = gate + H;
        float* o = out + (size_t)r * H;
#pragma omp simd
        for (int j = 0; j < H; j++) o[j] = gate[j] * swiglu_sigmoid(gate[j]) * up[j];
    }
}

// dgate_up is overwritten (gate_up is an activation, not a residual): d/dup = silu(gate) and
// d/dgate = up * silu'(gate), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
inline void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int N, int H) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        const float* gate = gate_up + (size_t)r * 2 * H;
        const float* up = gate + H;
        const float* d = dout + (size_t)r * H;
        float* dgate = dgate_up + (size_t)r * 2 * H;
        float* dup = dgate + H;
#pragma omp simd
        for (int j = 0; j < H; j++) {
            const float g = gate[j], s = swiglu_sigmoid(g);
            dgate[j] = d[j] * up[j] * s * (1.0f + g * (1.0f - s));
            dup[j] = d[j] * g * s;
        }
    }
}

}  // namespace cpu
}  // namespace llmc
