// cpu/moe.h: the fp32 CPU mixture-of-experts MLP (issue 27), forward and backward: the layer a
// mixture-of-experts block has in place of GPT-2's MLP.
//
// The idea: a linear router scores every token against E experts; softmax turns the scores into
// probabilities and each token goes to its K most probable experts. Each expert is a GPT-2 MLP of
// its own (fc to F, GELU, fcproj back to C), and the token's output is the sum of its experts'
// outputs weighted by their probabilities (not renormalized over the K, as in Switch Transformer
// and GShard: with K = 1 the router still learns from the loss). Dropless by default; with a
// capacity factor cf each expert takes at most ceil(cf x rows x K / E) tokens, first choices first
// and then in token order, and the rest of its assignments are dropped (they add nothing).
//
// Two auxiliary losses keep the router healthy, returned for the model to weigh and log:
//   balance  Switch Transformer's load-balancing loss, E sum_e f_e P_e: f_e the share of the
//            rows x K choices that picked expert e (before capacity), P_e the mean probability of
//            e; 1 when the load is even, E when every token picks the same expert. Its gradient
//            flows through P only.
//   z        ST-MoE's router z-loss, the mean over tokens of logsumexp(scores)^2: keeps the scores
//            small.
//
// Each expert's tokens are gathered into one contiguous batch (expert-major, in token order), so
// every expert's products are two plain matmuls of cpu/ops.h. Ties in the top-K go to the lower
// expert index, so the routing is deterministic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "llmc/cpu/ops.h"

namespace llmc {
namespace cpu {

struct MoeShape {
    int rows = 0, C = 0, F = 0;  // tokens, model width, an expert's hidden width (its units on this rank)
    int E = 0, K = 0;            // experts, experts per token
    float capacity_factor = 0;   // 0: dropless
    int capacity() const {
        return capacity_factor > 0 ? (int)std::ceil(capacity_factor * (double)rows * K / E) : rows * K;
    }
};

// One layer's expert weights: E of each GPT-2 MLP tensor back to back, and the router (E x C).
struct MoeWeights {
    const float *router, *fcw, *fcb, *fcprojw, *fcprojb;
};
struct MoeGrads {
    float *router, *fcw, *fcb, *fcprojw, *fcprojb;
};

// What the forward decides and keeps for the backward. Choice (n, k) is token n's k-th best expert;
// the assignments that were not dropped are numbered expert-major: expert e's are
// [begin[e], begin[e + 1]), in token order, and assignment a is choice choice_of[a].
struct MoeRouting {
    std::vector<float> probs, lse;    // rows x E, rows
    std::vector<int> expert, slot;    // rows x K: the chosen expert, its assignment (-1: dropped)
    std::vector<int> begin, choice_of;
    std::vector<float> chosen_share;  // f_e
    int dropped = 0;
    double balance_loss = 0, z_loss = 0;
};

// The activations of the experts' batches, assignment by assignment, and the scratch both passes use.
struct MoeActivations {
    std::vector<float> x, pre, h, y;  // gathered inputs (A x C), fc (A x F), GELU (A x F), outputs (A x C)
};
struct MoeScratch {
    std::vector<float> scores;        // rows x E: the router's output, then its gradient
    std::vector<float> dy, dh, dx;    // A x C, A x F, A x C
};

namespace moe_detail {

// Softmax, logsumexp and the top K of one token's scores.
inline void route_row(const float* scores, int E, int K, float* probs, float* lse, int* expert) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int e = 0; e < E; e++) mx = std::max(mx, scores[e]);
    double sum = 0;
    for (int e = 0; e < E; e++) sum += std::exp((double)scores[e] - mx);
    *lse = mx + (float)std::log(sum);
    for (int e = 0; e < E; e++) probs[e] = (float)(std::exp((double)scores[e] - mx) / sum);
    // K passes over the E probabilities, each taking the largest not yet taken (the first of equals):
    // no allocation per token
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (std::find(expert, expert + k, e) != expert + k) continue;
            if (best < 0 || probs[e] > probs[best]) best = e;
        }
        expert[k] = best;
    }
}

// Capacity (first choices first, then token order), the expert-major numbering, and the losses.
inline void assign(MoeRouting& r, const MoeShape& s) {
    std::vector<int> taken(s.E, 0), chosen(s.E, 0);
    r.slot.assign((size_t)s.rows * s.K, -1);
    r.dropped = 0;
    for (int k = 0; k < s.K; k++)
        for (int n = 0; n < s.rows; n++) {
            const int e = r.expert[(size_t)n * s.K + k];
            chosen[e]++;
            if (taken[e] < s.capacity()) r.slot[(size_t)n * s.K + k] = taken[e]++;
            else r.dropped++;
        }
    r.begin.assign(s.E + 1, 0);
    for (int e = 0; e < s.E; e++) r.begin[e + 1] = r.begin[e] + taken[e];
    r.choice_of.assign(r.begin[s.E], 0);
    // slot within the expert -> expert-major assignment; token order within an expert
    std::vector<int> next(r.begin.begin(), r.begin.end() - 1);
    for (int n = 0; n < s.rows; n++)
        for (int k = 0; k < s.K; k++) {
            const size_t c = (size_t)n * s.K + k;
            if (r.slot[c] < 0) continue;
            r.slot[c] = next[r.expert[c]]++;
            r.choice_of[r.slot[c]] = (int)c;
        }
    r.chosen_share.assign(s.E, 0);
    r.balance_loss = 0;
    for (int e = 0; e < s.E; e++) {
        double mean_prob = 0;
        for (int n = 0; n < s.rows; n++) mean_prob += r.probs[(size_t)n * s.E + e];
        r.chosen_share[e] = (float)chosen[e] / ((float)s.rows * s.K);
        r.balance_loss += (double)s.E * r.chosen_share[e] * (mean_prob / s.rows);
    }
    r.z_loss = 0;
    for (int n = 0; n < s.rows; n++) r.z_loss += (double)r.lse[n] * r.lse[n] / s.rows;
}

}  // namespace moe_detail

// ---- the layer in pieces ----
// moe_forward and moe_backward are these pieces in order. Expert parallelism (dist/expert_parallel.h)
// runs the same pieces with the experts' batches on other ranks: it sends the gathered rows to the
// ranks of their experts between moe_gather and moe_experts_forward and brings the outputs back
// before moe_combine, and in reverse in the backward.

// The router's scores, softmax and top K of every token, then capacity, the expert-major numbering
// and both losses (MoeRouting).
inline void moe_route(MoeRouting& r, MoeScratch& scratch, const float* x, const float* router, const MoeShape& s) {
    scratch.scores.resize((size_t)s.rows * s.E);
    const float* scores = scratch.scores.data();
    matmul_forward(scratch.scores.data(), x, router, nullptr, nullptr, s.rows, s.C, s.E);
    r.probs.resize((size_t)s.rows * s.E);
    r.lse.resize(s.rows);
    r.expert.resize((size_t)s.rows * s.K);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < s.rows; n++)
        moe_detail::route_row(scores + (size_t)n * s.E, s.E, s.K, &r.probs[(size_t)n * s.E], &r.lse[n],
                              &r.expert[(size_t)n * s.K]);
    moe_detail::assign(r, s);
}

// Every assignment's input row, expert-major (A x C, A = r.begin[E]).
inline void moe_gather(float* rows, const MoeRouting& r, const float* x, const MoeShape& s) {
    const size_t C = s.C, A = r.begin[s.E];
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < A; i++) std::memcpy(rows + i * C, x + r.choice_of[i] / s.K * C, C * sizeof(float));
}

// `experts` experts on their batches of a.x: expert e's are rows [begin[e], begin[e + 1]), and w's
// expert tensors start at the first of them. Fills a.pre, a.h and a.y (sized here; a.x is the caller's).
// w.fcprojb null: the outputs without their bias (a tensor-parallel rank's partial sums but one).
inline void moe_experts_forward(MoeActivations& a, const int* begin, int experts, const MoeWeights& w,
                                const MoeShape& s) {
    const size_t C = s.C, F = s.F, A = begin[experts];
    a.pre.resize(A * F), a.h.resize(A * F), a.y.resize(A * C);
    for (int e = 0; e < experts; e++) {
        const size_t at = begin[e];
        const int m = begin[e + 1] - begin[e];
        if (m == 0) continue;
        matmul_forward(&a.pre[at * F], &a.x[at * C], w.fcw + e * F * C, w.fcb + e * F, nullptr, m, s.C, s.F);
        gelu_forward(&a.h[at * F], &a.pre[at * F], (size_t)m * F);
        matmul_forward(&a.y[at * C], &a.h[at * F], w.fcprojw + e * C * F, w.fcprojb ? w.fcprojb + e * C : nullptr,
                       nullptr, m, s.F, s.C);
    }
}

// out (rows x C) = each token's experts' outputs (y, expert-major) weighted by their probabilities.
inline void moe_combine(float* out, const MoeRouting& r, const float* y, const MoeShape& s) {
    const size_t C = s.C;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < s.rows; n++) {
        float* o = out + n * C;
        std::fill(o, o + C, 0.0f);
        for (int k = 0; k < s.K; k++) {
            const size_t c = (size_t)n * s.K + k;
            if (r.slot[c] < 0) continue;
            const float gate = r.probs[(size_t)n * s.E + r.expert[c]];
            const float* yc = y + (size_t)r.slot[c] * C;
            for (size_t j = 0; j < C; j++) o[j] += gate * yc[j];
        }
    }
}

// Backward of moe_combine: dy (A x C, expert-major) = gate x dout, and the router's d scores (in
// scratch.scores) from the gates, the balance loss (weight dbalance) and the z-loss (weight dz).
inline void moe_gates_backward(float* dy, MoeScratch& scratch, const float* dout, const MoeRouting& r, const float* y,
                               const MoeShape& s, float dbalance, float dz) {
    const size_t C = s.C;
    float* dscores = scratch.scores.data();  // d probs first, then d scores
    // the gates' gradients go to the probabilities they are, beside the balance loss's
#pragma omp parallel for schedule(static)
    for (int n = 0; n < s.rows; n++) {
        float* dp = dscores + (size_t)n * s.E;
        for (int e = 0; e < s.E; e++) dp[e] = dbalance * s.E * r.chosen_share[e] / s.rows;
        const float* d = dout + n * C;
        for (int k = 0; k < s.K; k++) {
            const size_t c = (size_t)n * s.K + k;
            if (r.slot[c] < 0) continue;
            const float gate = r.probs[(size_t)n * s.E + r.expert[c]];
            const float* yc = y + (size_t)r.slot[c] * C;
            float* dyc = dy + (size_t)r.slot[c] * C;
            double dgate = 0;
            for (size_t j = 0; j < C; j++) {
                dgate += (double)d[j] * yc[j];
                dyc[j] = gate * d[j];
            }
            dp[r.expert[c]] += (float)dgate;
        }
    }
    // softmax backward, plus the z-loss's d/dscores = 2 lse / rows x probs
#pragma omp parallel for schedule(static)
    for (int n = 0; n < s.rows; n++) {
        float* dp = dscores + (size_t)n * s.E;
        const float* p = &r.probs[(size_t)n * s.E];
        double dot = 0;
        for (int e = 0; e < s.E; e++) dot += (double)p[e] * dp[e];
        const float zterm = dz * 2.0f * r.lse[n] / s.rows;
        for (int e = 0; e < s.E; e++) dp[e] = p[e] * (dp[e] - (float)dot) + zterm * p[e];
    }
}

// Backward of the router: dx (rows x C, overwritten; null: the router's gradient only) and the
// router's gradient (accumulated) from the d scores moe_gates_backward left in scratch.scores.
inline void moe_router_backward(float* dx, float* grouter, MoeScratch& scratch, const float* x, const float* router,
                                const MoeShape& s) {
    matmul_backward(dx, grouter, nullptr, scratch.scores.data(), x, router, s.rows, s.C, s.E);
}

// Backward of moe_experts_forward: dx (rows of a.x, overwritten) from dy, the experts' weight
// gradients accumulated (g's expert tensors start at the first of the experts, as w's).
inline void moe_experts_backward(float* dx, MoeGrads& g, MoeScratch& scratch, const float* dy,
                                 const MoeActivations& a, const int* begin, int experts, const MoeWeights& w,
                                 const MoeShape& s) {
    const size_t C = s.C, F = s.F;
    scratch.dh.resize((size_t)begin[experts] * F);
    for (int e = 0; e < experts; e++) {
        const size_t at = begin[e];
        const int m = begin[e + 1] - begin[e];
        if (m == 0) continue;
        float* dh = &scratch.dh[at * F];
        matmul_backward(dh, g.fcprojw + e * C * F, g.fcprojb + e * C, dy + at * C, &a.h[at * F],
                        w.fcprojw + e * C * F, m, s.F, s.C);
        gelu_backward(dh, &a.pre[at * F], (size_t)m * F);
        matmul_backward(dx + at * C, g.fcw + e * F * C, g.fcb + e * F, dh, &a.x[at * C], w.fcw + e * F * C, m, s.C,
                        s.F);
    }
}

// dx (rows x C) += the assignments' input gradients (dx_rows, expert-major), each token's choices in order.
inline void moe_scatter_backward(float* dx, const MoeRouting& r, const float* dx_rows, const MoeShape& s) {
    const size_t C = s.C;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < s.rows; n++)
        for (int k = 0; k < s.K; k++) {
            const int slot = r.slot[(size_t)n * s.K + k];
            if (slot < 0) continue;
            const float* d = dx_rows + (size_t)slot * C;
            for (size_t j = 0; j < C; j++) dx[n * C + j] += d[j];
        }
}

// out (rows x C) = each token's experts' outputs weighted by their probabilities.
inline void moe_forward(float* out, MoeRouting& r, MoeActivations& a, MoeScratch& scratch, const float* x,
                        const MoeWeights& w, const MoeShape& s) {
    moe_route(r, scratch, x, w.router, s);
    a.x.resize((size_t)r.begin[s.E] * s.C);
    moe_gather(a.x.data(), r, x, s);
    moe_experts_forward(a, r.begin.data(), s.E, w, s);
    moe_combine(out, r, a.y.data(), s);
}

// dx (rows x C, overwritten) and the weights' gradients (accumulated) from dout, and from the
// losses' weights in the model's loss: d loss / d balance_loss and d loss / d z_loss.
inline void moe_backward(float* dx, MoeGrads& g, MoeScratch& scratch, const float* dout, const float* x,
                         const MoeRouting& r, const MoeActivations& a, const MoeWeights& w, const MoeShape& s,
                         float dbalance, float dz) {
    const size_t A = r.begin[s.E];
    scratch.dy.resize(A * s.C), scratch.dx.resize(A * s.C);
    moe_gates_backward(scratch.dy.data(), scratch, dout, r, a.y.data(), s, dbalance, dz);
    moe_router_backward(dx, g.router, scratch, x, w.router, s);
    moe_experts_backward(scratch.dx.data(), g, scratch, scratch.dy.data(), a, r.begin.data(), s.E, w, s);
    moe_scatter_backward(dx, r, scratch.dx.data(), s);
}

}  // namespace cpu
}  // namespace llmc
