// step_model.h: the predicted time of one optimizer step per rank, and where it goes.
//
// One description of the run (the resolved RunConfig: mesh, batch, ZeRO stage, recompute, pipeline
// split) and the cluster (cluster.h) give every operation's FLOPs and bytes per micro-batch on the
// busiest pipeline stage; a kernel takes the longer of its FLOPs at its kind's efficiency and its
// bytes at the memory bandwidth. Collectives cost alpha-beta: a latency per step of the algorithm
// and the bytes each rank sends over the link its group crosses. The mesh puts tp innermost (a
// group of consecutive ranks), then cp, then pp, then dp, so a group of stride s and size g stays
// on NVLink while s x g ranks fit in a node, and crosses the network otherwise.
//
// What is exposed follows what the CUDA model (cuda_model.cuh) and ZeroEngine (zero.h) overlap:
//   tp   forward gathers and reductions are exposed (the next kernel needs them); in backward the
//        LayerNorm rows' gathers and the input gradients' reductions run under the weight-gradient
//        matmuls, the gathers of the residual's gradient are exposed;
//   dp   each bucket's gradient is reduced as soon as the last micro-batch's backward finishes it
//        (ZeRO-2 and 3: every micro-batch's), hidden under the rest of that backward but for the
//        last bucket; ZeRO-1/2 all-gather the updated parameters after the step (exposed); ZeRO-3
//        gathers each layer while the previous one computes;
//   pp   activations and their gradients cross between stages per micro-batch (exposed), and the
//        schedule idles each stage for pipeline_bubble_fraction of the step;
//   cp   each rank holds T/cp of every sequence (context_parallel.h); attention's K and V go around
//        the ring in cp - 1 steps, each under the attention of the block in hand, and in backward
//        with the fp32 dK and dV; what a step's block does not cover is exposed. Gradients are
//        reduced over dp x cp.
// Recomputation (-r) adds the forward work backward redoes: 1 the GELU, 2 also the LayerNorms,
// 3 each layer's whole forward with its tp collectives.
// Experts (--experts, with --ep): a MoE layer's MLP runs each token's top-k experts (and the shared
// one) at the dense products' efficiency (an assumption: an expert's product has top_k / experts of
// the rows), reads the weights of the experts its rank holds, and adds the router's product; with
// ep > 1 the rows go to their experts' ranks and back, forward and backward, by all-to-all over the
// expert group (ep consecutive data-parallel ranks), exposed (llmc overlaps none of it yet). The
// experts' gradients are reduced over dp / ep ranks, their optimizer slice is ep times a dense one's.
// FP8 (--fp8 1, on a GPU with FP8 tensor cores): the blocks' products run at the FP8 peak with the
// bf16 products' efficiency (an assumption until a GPU session measures it), and every product's
// inputs, weights and output gradients pay their casts (kernels/fp8.cuh) as memory traffic; the
// MFU counts those products against the FP8 peak (mfu.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "llmc/planning/cluster.h"
#include "llmc/config.h"
#include "llmc/planning/mfu.h"

namespace llmc {

// ---- collectives (alpha-beta; bytes: the whole buffer, g ranks, link bandwidth GB/s per direction)

struct Link {
    double gbps = 0, latency_s = 0;
    bool network = false;
};

inline double ring_reduce_scatter_s(double bytes, int g, Link l) {
    if (g <= 1) return 0;
    return (g - 1) * l.latency_s + (g - 1.0) / g * bytes / (l.gbps * 1e9);
}
inline double ring_all_gather_s(double bytes, int g, Link l) { return ring_reduce_scatter_s(bytes, g, l); }
inline double ring_all_reduce_s(double bytes, int g, Link l) { return 2 * ring_reduce_scatter_s(bytes, g, l); }
// NCCL's double binary tree: 2 log2(g) latency steps, each rank sends the buffer twice (up, down).
inline double tree_all_reduce_s(double bytes, int g, Link l) {
    if (g <= 1) return 0;
    return 2 * std::ceil(std::log2((double)g)) * l.latency_s + 2 * bytes / (l.gbps * 1e9);
}
// NCCL picks the faster algorithm for the size.
inline double all_reduce_s(double bytes, int g, Link l) {
    return std::min(ring_all_reduce_s(bytes, g, l), tree_all_reduce_s(bytes, g, l));
}
inline double p2p_s(double bytes, Link l) { return l.latency_s + bytes / (l.gbps * 1e9); }
// All-to-all (expert parallelism's token exchange): each rank sends its buffer's (g-1)/g to the
// others, one peer per step, as NCCL's pairwise exchange does.
inline double all_to_all_s(double bytes, int g, Link l) { return ring_reduce_scatter_s(bytes, g, l); }

// The link a mesh axis's group crosses: `stride` ranks between its members, `size` members.
inline Link axis_link(const Topology& t, int stride, int size) {
    if ((long long)stride * size <= t.gpus_per_node) return {t.nvlink_gbps, t.nvlink_latency_s, false};
    return {t.network_gbps, t.network_latency_s, true};
}
inline Link tp_link(const RunConfig& c, const Topology& t) { return axis_link(t, 1, c.dims.tp); }
inline Link cp_link(const RunConfig& c, const Topology& t) { return axis_link(t, c.dims.tp, c.dims.cp); }
// The expert group: ep consecutive data-parallel ranks.
inline Link ep_link(const RunConfig& c, const Topology& t) {
    return axis_link(t, c.dims.tp * c.dims.cp * c.dims.pp, c.dims.ep);
}
inline Link pp_link(const RunConfig& c, const Topology& t) { return axis_link(t, c.dims.tp * c.dims.cp, c.dims.pp); }
inline Link dp_link(const RunConfig& c, const Topology& t) {
    return axis_link(t, c.dims.tp * c.dims.cp * c.dims.pp, c.dims.dp);
}
// The gradient reduction's group, dp x cp: across dp's link where there is dp, else within cp's.
inline Link dp_cp_link(const RunConfig& c, const Topology& t) { return c.dims.dp > 1 ? dp_link(c, t) : cp_link(c, t); }
// A micro-batch's token rows on one rank of the context group.
inline double rank_rows(const RunConfig& c) { return (double)c.batch_size * c.seq_len / c.dims.cp; }

// ---- the step

struct StepEstimate {
    // seconds per optimizer step, adding up to step_s
    double compute_s = 0, recompute_s = 0, tp_exposed_s = 0, cp_exposed_s = 0, ep_exposed_s = 0, pp_exposed_s = 0,
           dp_exposed_s = 0, bubble_s = 0, optimizer_s = 0;
    double step_s = 0;
    double tokens_per_s_per_gpu = 0;
    double model_tflops_per_gpu = 0;  // model FLOPs per token (mfu.h's count) x tokens/s
    double hw_tflops_per_gpu = 0;     // also counting recomputation
    double mfu = 0;
    double bubble_fraction = 0;
};

// One micro-batch's work on one rank of the stage holding `layers` layers (+ head / embedding).
struct MicroBatchWork {
    double forward_s = 0, backward_s = 0, recompute_s = 0;
    double tp_exposed_s = 0, cp_exposed_s = 0, ep_exposed_s = 0;
    double forward_flops = 0, recompute_flops = 0;  // per rank
};

namespace detail {

struct Kernel {
    double flops = 0, bytes = 0;
};
// A kernel runs at its kind's share of the peak (bf16's, or `peak_tflops` where given: FP8's) or of
// the memory bandwidth, whichever binds.
inline double kernel_s(Kernel k, double efficiency, const Topology& t, double peak_tflops = 0) {
    const double peak = peak_tflops > 0 ? peak_tflops : t.peak_tflops;
    return std::max(k.flops / (peak * 1e12 * efficiency), k.bytes / (t.hbm_gbps * 1e9 * t.memory_efficiency));
}

// With --fp8 on a GPU with FP8 tensor cores: the FP8 peak the blocks' products run at (0: bf16).
inline double fp8_peak_tflops(const RunConfig& c, const Topology& t) { return c.fp8 ? t.fp8_peak_tflops : 0; }

// One layer's forward on one tensor rank, bf16 activations: matmuls, attention, and the elementwise
// kernels (2 LayerNorms and 2 residual adds on the rank's rows, the MLP activation on its columns).
struct LayerForward {
    Kernel matmul, attention, elementwise, gelu, layernorm;
    Kernel fp8_forward_casts, fp8_backward_casts, fp8_recompute_casts;  // --fp8 only (kernels/fp8.cuh)
};

// --fp8's casts of one layer on one tensor rank, in bytes moved, as fp8_linears.cuh makes them: a cast
// reads bf16 (2 bytes an element) and writes FP8 (1) once, or twice with the transpose a backward
// product reads; current scaling reads the tensor once more for its amax, except where the kernel
// writing it measures it (one rank: LayerNorm, attention, GELU and their backward measure every
// input and gradient but, at -r 0, the fc projection's input, which cuBLASLt's GELU epilogue
// writes). The forward casts each product's input; the backward casts it again with the forward's
// scale (the transpose only) and the output gradient (both copies); -r 3's recomputation casts the inputs up to the fc projection again (one copy, the
// forward's scales). The weights (both copies) are cast once a step under ZeRO 0-2 (a micro-batch
// pays 1 / grad_accum_steps of it), at every micro-batch under ZeRO-3 with --fp8-gather 0 (a rank
// holds a layer's weights only while they are gathered); with --fp8-gather 1 each rank casts its
// slice once a step, and every gather's codes are unpacked (read and written once), the backward's
// also transposed (fp8_gather.cuh).
inline bool fp8_weights_gathered(const RunConfig& c) {
    return c.fp8 && c.fp8_gather && c.zero_stage >= 3 && c.dims.dp * c.dims.cp > 1;
}
inline void add_fp8_casts(LayerForward& f, const ModelShape& s, const RunConfig& c) {
    if (!c.fp8) return;
    const double n = rank_rows(c), tp = c.dims.tp, C = s.hidden, F = s.ffn_hidden * (s.swiglu ? 2.0 : 1.0);
    const double amax = c.fp8_scaling == "current" ? 2 : 0;
    const bool fused = tp == 1 && !s.swiglu;
    const double qkv_out = C + 2.0 * C * s.kv_heads / s.heads, fcproj_in = n * s.ffn_hidden / tp;
    const double inputs = n * (C + C / tp + C) + fcproj_in;  // qkv, attention projection, fc, fc projection
    const double inputs_measured = fused ? (c.recompute == 0 ? fcproj_in : 0) : inputs;
    const double grads = n * (qkv_out / tp + C + F / tp + C), grads_measured = fused ? 0 : grads;
    const double w = s.layer_matmul_params() / tp, dp = c.dims.dp * c.dims.cp;
    double weights_forward = 0, weights_backward = 0;
    if (fp8_weights_gathered(c)) {
        weights_forward = (3 + amax) * w / dp / c.grad_accum_steps + 2 * w;  // the slice's cast, the unpacking
        weights_backward = 4 * w;                                            // the unpacking, the transpose
    } else {
        const bool sharded = c.zero_stage >= 3 && dp > 1;  // one rank runs ZeRO-0 (and caches)
        weights_forward = (4 + amax) * w * (sharded ? 1.0 : 1.0 / c.grad_accum_steps);
    }
    f.fp8_forward_casts = {0, 3 * inputs + amax * inputs_measured + weights_forward};
    f.fp8_backward_casts = {0, 3 * inputs + 4 * grads + amax * grads_measured + weights_backward};
    f.fp8_recompute_casts = {0, 3 * (inputs - fcproj_in)};
}
// A layer's forward; `moe`: one with experts, whose MLP runs (top_k + shared) rows per token and
// reads the weights of the experts the rank holds (experts / ep, and the shared one), plus the router.
inline LayerForward layer_forward(const ModelShape& s, const RunConfig& c, bool moe = false) {
    const double n = rank_rows(c), tp = c.dims.tp, C = s.hidden, F = s.ffn_hidden;
    const double rows = c.dims.tp > 1 && c.sequence_parallel ? n / tp : n;
    const double mlp_rows = moe ? s.top_k + s.moe_shared : 1;                     // MLP rows per token
    const double mlps_held = moe ? (double)s.experts / c.dims.ep + s.moe_shared : 1;  // MLPs whose weights it reads
    const double active = s.attention_params() + mlp_rows * s.mlp_params();
    const double held = s.attention_params() + mlps_held * s.mlp_params();
    LayerForward f;
    f.matmul = {2 * n * active / tp, 2 * (4 * n * C + mlp_rows * 2 * n * F / tp) + 2 * held / tp};
    if (moe) f.matmul.flops += 2 * n * C * s.experts;                 // the router (fp32, small)
    f.attention = {2 * n * c.seq_len * C / tp, 2 * 4 * n * C / tp};  // causal QK^T and PV: half of 4 n T C
    f.layernorm = {0, 2 * 2 * 2 * rows * C};                          // 2 norms, read + write
    f.gelu = {0, 2 * 2 * mlp_rows * n * F / tp * (s.swiglu ? 1.5 : 1)};
    f.elementwise = {0, 2 * 2 * 3 * rows * C};                        // 2 residual adds with bias
    add_fp8_casts(f, s, c);
    return f;
}

// Expert parallelism's all-to-alls of one MoE layer per micro-batch: its tokens' top_k rows (bf16)
// to their experts' ranks and back, in forward and again in backward, over the expert group.
inline double layer_ep_s(const ModelShape& s, const RunConfig& c, const Topology& t) {
    const int ep = c.dims.ep;
    if (ep <= 1) return 0;
    const double rows = s.top_k * rank_rows(c), bytes = 2.0 * rows * s.hidden;
    return 4 * all_to_all_s(bytes, ep, ep_link(c, t));
}

// One layer's tp collectives on the B x T x C activation (bf16). With SP the forward gathers twice
// and reduce-scatters twice; backward gathers the residual's gradient twice (exposed), and gathers
// the LayerNorm rows twice and reduce-scatters the input gradients twice under the weight-gradient
// matmuls. Without SP the forward all-reduces twice and backward twice, under the weight gradients.
// (The LayerNorm weight-gradient sums and the classifier's statistics, a few floats a row, are
// left out.)
struct LayerTp {
    double forward_s = 0, backward_exposed_s = 0, backward_overlapped_s = 0;
};
inline LayerTp layer_tp(const ModelShape& s, const RunConfig& c, Link l) {
    const int tp = c.dims.tp;
    const double act = 2.0 * rank_rows(c) * s.hidden;
    if (tp <= 1) return {};
    if (!c.sequence_parallel) return {2 * all_reduce_s(act, tp, l), 0, 2 * all_reduce_s(act, tp, l)};
    const double gather = ring_all_gather_s(act, tp, l), scatter = ring_reduce_scatter_s(act, tp, l);
    return {2 * (gather + scatter), 2 * gather, 2 * (gather + scatter)};
}

// One layer's ring (cp > 1): cp - 1 steps, each a K and V block (bf16) to the next rank in forward,
// and with its fp32 dK and dV in backward, under the attention of one of the cp blocks in hand.
inline double layer_cp_exposed_s(const RunConfig& c, double attention_forward_s, Link l) {
    const int cp = c.dims.cp;
    if (cp <= 1) return 0;
    const double kv = 2.0 * 2 * rank_rows(c) * c.model_config.channels / c.dims.tp;  // K and V, bf16
    const double forward = std::max(0.0, p2p_s(kv, l) - attention_forward_s / cp);
    const double backward = std::max(0.0, p2p_s(3 * kv, l) - 2 * attention_forward_s / cp);  // + dK, dV in fp32
    return (cp - 1) * (forward + backward);
}

}  // namespace detail

// What one layer costs the rank per micro-batch (a dense one, or with `moe` one with experts).
inline MicroBatchWork layer_work(const ModelShape& s, const RunConfig& c, const Topology& t, bool moe) {
    using detail::kernel_s;
    const detail::LayerForward f = detail::layer_forward(s, c, moe);
    const double matmul = kernel_s(f.matmul, t.matmul_efficiency, t, detail::fp8_peak_tflops(c, t));
    const double attn = kernel_s(f.attention, t.attention_efficiency, t);
    const double elementwise = kernel_s(f.elementwise, 1, t), gelu = kernel_s(f.gelu, 1, t), ln = kernel_s(f.layernorm, 1, t);
    const bool fp8 = detail::fp8_peak_tflops(c, t) > 0;
    const double casts_fwd = fp8 ? kernel_s(f.fp8_forward_casts, 1, t) : 0;
    const double casts_bwd = fp8 ? kernel_s(f.fp8_backward_casts, 1, t) : 0;
    const double casts_recompute = fp8 ? kernel_s(f.fp8_recompute_casts, 1, t) : 0;
    const double layer_fwd = matmul + attn + elementwise + gelu + ln + casts_fwd;
    const detail::LayerTp tp = detail::layer_tp(s, c, tp_link(c, t));
    MicroBatchWork w;
    w.forward_s = layer_fwd;
    w.backward_s = 2 * matmul + 2 * attn + 2 * (elementwise + gelu + ln) + casts_bwd;
    w.forward_flops = f.matmul.flops + f.attention.flops;
    w.tp_exposed_s = tp.forward_s + tp.backward_exposed_s + std::max(0.0, tp.backward_overlapped_s - matmul);
    w.cp_exposed_s = detail::layer_cp_exposed_s(c, attn, cp_link(c, t));
    w.ep_exposed_s = moe ? detail::layer_ep_s(s, c, t) : 0;
    const double recompute[] = {0, gelu, gelu + ln, layer_fwd - casts_fwd + casts_recompute + tp.forward_s};
    w.recompute_s = recompute[c.recompute];
    w.recompute_flops = c.recompute == 3 ? w.forward_flops : 0;
    return w;
}

// What one micro-batch costs the rank of the busiest stage (the layers `layers`, the head if `head`).
inline MicroBatchWork micro_batch_work(const ModelShape& s, const RunConfig& c, const Topology& t,
                                       const std::vector<int>& layers, bool head) {
    using detail::kernel_s;
    MicroBatchWork w;
    for (bool moe : {false, true}) {
        int count = 0;
        for (int l : layers) count += s.is_moe_layer(l) == moe;
        if (count == 0) continue;
        const MicroBatchWork one = layer_work(s, c, t, moe);
        w.forward_s += count * one.forward_s, w.backward_s += count * one.backward_s;
        w.recompute_s += count * one.recompute_s, w.forward_flops += count * one.forward_flops;
        w.recompute_flops += count * one.recompute_flops, w.tp_exposed_s += count * one.tp_exposed_s;
        w.cp_exposed_s += count * one.cp_exposed_s, w.ep_exposed_s += count * one.ep_exposed_s;
    }
    if (head) {
        const double n = rank_rows(c), tp = c.dims.tp;
        const detail::Kernel logits{2 * n * s.vocab * s.hidden / tp, 2 * (n * s.hidden + (double)s.vocab * s.hidden / tp)};
        const detail::Kernel loss{0, 2 * 3 * n * s.vocab / tp};  // logits read, dlogits written, in place
        const double h = kernel_s(logits, t.matmul_efficiency, t);
        w.forward_s += h + kernel_s(loss, 1, t);
        w.backward_s += 2 * h;
        w.forward_flops += logits.flops;
    }
    return w;
}

// Data-parallel communication per step that no compute hides, over the dp x cp ranks that hold the
// same parameters. `rank_params`: the parameters of one rank of the busiest stage (its tp piece);
// `window_s`: one micro-batch's backward, under which gradient reduction runs; `layers`: buckets
// in flight one after another; `coded_params`: those of them ZeRO-3 gathers as FP8 codes (a byte
// each, fp8_gather.cuh).
inline double dp_exposed_s(const RunConfig& c, const Topology& t, double rank_params, double window_s,
                           double forward_s, int layers, double coded_params = 0) {
    const int dp = c.dims.dp * c.dims.cp, m = c.grad_accum_steps;
    if (dp <= 1) return 0;
    const Link l = dp_cp_link(c, t);
    const double grads = 4 * rank_params;  // fp32 gradients
    const double params = 2 * rank_params - coded_params;  // bf16, and codes where ZeRO-3 gathers them
    const double bucket = 1.0 / std::max(1, layers);
    auto hidden_under = [&](double comm_s, double compute_s) {
        return std::max(0.0, comm_s - compute_s) + comm_s * bucket;  // the last bucket waits anyway
    };
    switch (c.zero_stage) {
    case 0: return hidden_under(all_reduce_s(grads, dp, l), window_s);
    case 1: return hidden_under(ring_reduce_scatter_s(grads, dp, l), window_s) + ring_all_gather_s(params, dp, l);
    case 2: return m * hidden_under(ring_reduce_scatter_s(grads, dp, l), window_s) + ring_all_gather_s(params, dp, l);
    default:
        return m * (hidden_under(ring_reduce_scatter_s(grads, dp, l) + ring_all_gather_s(params, dp, l), window_s) +
                    hidden_under(ring_all_gather_s(params, dp, l), forward_s));
    }
}

// The busiest pipeline stage: the most layers, and the head where it breaks the tie.
inline int busiest_stage(const PipelineSplit& split) {
    int best = 0;
    for (int r = 1; r < split.stages; r++) {
        const size_t a = split.rank_layers(r).size(), b = split.rank_layers(best).size();
        if (a > b || (a == b && split.holds_last(r))) best = r;
    }
    return best;
}

// The step of rank 0 of the busiest stage. `flops_per_token`: shape_flops_per_token's.
inline StepEstimate estimate_step(const ModelShape& s, const RunConfig& c, const Topology& t, double flops_per_token) {
    const PipelineSplit split = pipeline_split(c);
    const int stage = busiest_stage(split), m = c.grad_accum_steps;
    const std::vector<int> stage_layers = split.rank_layers(stage);
    const int layers = (int)stage_layers.size();
    const MicroBatchWork w = micro_batch_work(s, c, t, stage_layers, split.holds_last(stage));
    StepEstimate e;
    e.compute_s = m * (w.forward_s + w.backward_s);
    e.recompute_s = m * w.recompute_s;
    e.tp_exposed_s = m * w.tp_exposed_s;
    e.cp_exposed_s = m * w.cp_exposed_s;
    e.ep_exposed_s = m * w.ep_exposed_s;
    if (c.dims.pp > 1) {
        const double rows = c.dims.tp > 1 && c.sequence_parallel ? 1.0 / c.dims.tp : 1.0;
        const double message = 2.0 * rank_rows(c) * s.hidden * rows;
        e.pp_exposed_s = m * split.chunks * 2 * p2p_s(message, pp_link(c, t));  // a send forward, one back
    }
    // The rank's parameters: dense ones, and the experts it holds (with the router), whose gradients
    // go to dp / ep ranks; the reduction is costed over dp for both (its bytes per rank barely change).
    const bool embedding = split.holds_first(stage) || split.holds_last(stage);
    double dense = embedding * (double)s.vocab * s.hidden, experts = 0;
    for (int l : stage_layers) {
        if (!s.is_moe_layer(l)) { dense += s.layer_matmul_params(); continue; }
        dense += s.attention_params() + s.moe_shared * s.mlp_params();
        experts += (double)s.experts / c.dims.ep * s.mlp_params() + (double)s.hidden * s.experts;
    }
    const double rank_params = (dense + experts) / c.dims.tp;
    const double coded = detail::fp8_weights_gathered(c) ? (double)stage_layers.size() * s.layer_matmul_params() / c.dims.tp : 0;
    e.dp_exposed_s = dp_exposed_s(c, t, rank_params, w.backward_s, w.forward_s, layers, coded);
    const double owners = c.zero_stage >= 1 ? c.dims.dp * c.dims.cp : 1;  // ranks sharing a dense optimizer slice
    const double shard = (dense / owners + experts / std::max(1.0, owners / c.dims.ep)) / c.dims.tp;
    e.optimizer_s = shard * 30 / (t.hbm_gbps * 1e9 * t.memory_efficiency);  // AdamW: ~30 bytes per parameter
    const double busy = e.compute_s + e.recompute_s + e.tp_exposed_s + e.cp_exposed_s + e.ep_exposed_s + e.pp_exposed_s;
    e.bubble_fraction = c.dims.pp > 1 ? pipeline_bubble_fraction(c.dims.pp, m, split.chunks) : 0;
    e.bubble_s = busy * e.bubble_fraction / (1 - e.bubble_fraction);
    e.step_s = busy + e.bubble_s + e.dp_exposed_s + e.optimizer_s;
    const double gpus = c.world_size;
    e.tokens_per_s_per_gpu = c.total_batch_tokens / e.step_s / gpus;
    e.model_tflops_per_gpu = flops_per_token * e.tokens_per_s_per_gpu / 1e12;
    const double recompute_per_token = w.recompute_flops * c.dims.tp * c.dims.pp / rank_rows(c);
    e.hw_tflops_per_gpu = (flops_per_token + recompute_per_token) * e.tokens_per_s_per_gpu / 1e12;
    const double fp8_flops_per_token = c.fp8 ? 6.0 * s.layers * s.layer_matmul_params() : 0;
    e.mfu = model_flops_utilization(flops_per_token, e.tokens_per_s_per_gpu, t.peak_tflops, 1, fp8_flops_per_token,
                                    detail::fp8_peak_tflops(c, t));
    return e;
}

}  // namespace llmc
