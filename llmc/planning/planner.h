// planner.h: the per-rank memory plan printed by --plan, and the step's FLOPs and communication.
//
// The plan is not an estimate: it lists the very buffers ZeroEngine allocates (buffer_specs) plus
// the model's activation buffer, as returned by the model's own size function, so a test can
// require plan == allocation for every stage.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/config.h"
#include "llmc/dist/context_parallel.h"
#include "llmc/dist/zero.h"

namespace llmc {

// Token rows of a micro-batch one rank of a context group holds (all B x T without --cp).
inline double context_rows(const RunConfig& cfg) { return (double)cfg.batch_size * cfg.seq_len / cfg.dims.cp; }

struct MemoryPlan {
    std::vector<BufferSpec> buffers;                 // everything, activations included
    size_t bytes[(int)MemoryKind::Count] = {};       // per category, per rank
    double flops_per_step = 0;                       // forward + backward, all ranks together
    double comm_bytes_per_rank = 0;                  // bytes each rank sends per optimizer step in its data-parallel group (ring algorithms)
    double replica_comm_bytes_per_rank = 0;          // and to its shard's replicas (hybrid sharding, --dp-shard)
    double tp_comm_bytes_per_rank = 0;               // and in its tensor-parallel group
    double pp_comm_bytes_per_rank = 0;               // and to its pipeline neighbours
    double cp_comm_bytes_per_rank = 0;               // and around its context ring (ring attention)
    double ep_comm_bytes_per_rank = 0;               // and to the other ranks of its expert group (all-to-all)
    size_t snapshot_bytes = 0;                       // host memory for checkpoint snapshots (with -n), per rank
    size_t total_bytes() const {
        size_t total = 0;
        for (size_t b : bytes) total += b;
        return total;
    }
};

// Bytes one rank of pipeline stage `pp_rank` sends in its tensor-parallel group per micro-batch
// (forward and backward) for the layers it holds, as the CPU model (models/cpu_model.h) communicates: with
// sequence parallelism, per layer 6 all-gathers and 4 reduce-scatters of the B x T x C activations
// (forward: gather before qkv and fc, reduce-scatter after the two projections; backward: the
// mirror, with the LayerNorm outputs gathered again) and an all-reduce of its 4 LayerNorm weight
// gradients; the embedding (first stage) 1 of each; the head (last stage) 2 gathers, 1
// reduce-scatter and the final norm's weight gradients. Without it, 4 all-reduces per layer and 1
// each for the embedding and the head. Either way the head all-gathers each row's cross-entropy
// statistics (3 floats). A mixture-of-experts block all-reduces its experts' outputs (top-k rows
// per token, even routing) in place of the MLP's forward reduce (beside it, with the shared
// expert). So every layer is counted on the one stage that runs it, and the job's total does not
// depend on --pp. activation_bytes: the size of an activation element (4: the CPU model's fp32; 2:
// the CUDA model's bf16); the statistics and the LayerNorm weight gradients travel in fp32 in both.
// Under context parallelism the rows are the rank's context_rows.
inline double tensor_parallel_comm_bytes(const RunConfig& cfg, int pp_rank, size_t activation_bytes = sizeof(float)) {
    const double tp = cfg.dims.tp;
    if (tp <= 1) return 0;
    const PipelineSplit split = pipeline_split(cfg);
    const ModelConfig& m = cfg.model_config;
    const double L = (double)split.rank_layers(pp_rank).size(), C = m.channels;
    const double embedding = split.holds_first(pp_rank), head = split.holds_last(pp_rank);
    const double activation = context_rows(cfg) * C * activation_bytes;
    const double share = (tp - 1) / tp;  // of a gathered or scattered buffer, what one rank sends in a ring
    const double stats = head * (tp - 1) * context_rows(cfg) * 3 * sizeof(float);
    double moe_blocks = 0;
    for (int l : split.rank_layers(pp_rank)) moe_blocks += m.is_moe_layer(l);
    const double experts = moe_blocks * 2 * share * m.moe_top_k * activation;
    const double mlp_reduces = L - (m.moe_shared ? 0 : moe_blocks);  // the forward's, after the MLP
    if (!cfg.sequence_parallel) return (3 * L + mlp_reduces + embedding + head) * 2 * share * activation + stats + experts;
    const double gathers = 6 * L + embedding + 2 * head, scatters = 3 * L + mlp_reduces + embedding + head;
    const double layernorm_grads = 2 * share * (4 * L + 2 * head) * C * sizeof(float);
    return (gathers + scatters) * share * activation + layernorm_grads + stats + experts;
}

// Bytes one rank of pipeline stage `rank` sends to its neighbours per optimizer step: each of its
// chunks sends every micro-batch's output forward (but the last virtual stage) and the gradient of
// its input back (but the first), this rank's rows of B x T x C floats each; the first and the last
// stage also swap their part of the tied embedding's gradient.
inline double pipeline_comm_bytes(const RunConfig& cfg, const PipelineSplit& split, int rank,
                                  size_t embedding_grad_floats) {
    const int S = split.virtual_stages();
    const double rows = cfg.dims.tp > 1 && cfg.sequence_parallel ? context_rows(cfg) / cfg.dims.tp : context_rows(cfg);
    const double message = rows * cfg.model_config.channels * sizeof(float);
    double bytes = 0;
    for (int c = 0; c < split.chunks; c++) {
        const int v = c * split.stages + rank;
        bytes += (v < S - 1) * message * cfg.grad_accum_steps + (v > 0) * message * cfg.grad_accum_steps;
    }
    if (split.tied_embedding_peer(rank) >= 0) bytes += embedding_grad_floats * sizeof(float);
    return bytes;
}

// Bytes one rank of pipeline stage `pp_rank` sends to the other ranks of its expert group per
// optimizer step (expert parallelism, dist/expert_parallel.h): each MoE block it holds sends its
// experts' counts once per micro-batch (E / ep integers to each other rank) and its assignments' rows
// four times (the inputs out, the outputs back, their gradients out and back): rows x top-k rows of
// C activations, of which (ep - 1) / ep go to other ranks when the routing is even.
inline double expert_parallel_comm_bytes(const RunConfig& cfg, int pp_rank, size_t activation_bytes = sizeof(float)) {
    const int ep = cfg.dims.ep;
    const ModelConfig& m = cfg.model_config;
    if (ep <= 1 || m.num_experts == 0) return 0;
    int blocks = 0;
    for (int l : pipeline_split(cfg).rank_layers(pp_rank)) blocks += m.is_moe_layer(l);
    const double share = (ep - 1.0) / ep, rows = context_rows(cfg) * m.moe_top_k;
    const double per_micro_batch = share * (4 * rows * m.channels * activation_bytes + m.num_experts * sizeof(int));
    return blocks * per_micro_batch * cfg.grad_accum_steps;
}

// buffers: everything the model allocates per rank (its own size function's list); precision: how
// its parameters travel in the all-gathers (gradients are reduced in fp32 by both models); pp_rank:
// the rank's pipeline stage; packed_gather_saving: the bytes one rank's ZeRO-3 gathers of every
// bucket send less than `precision` says (the CUDA model's FP8 weight codes, fp8_gather.cuh).
inline MemoryPlan plan_memory(const RunConfig& cfg, const ZeroPlan& zero, std::vector<BufferSpec> buffers,
                              ParamPrecision precision = FP32_PARAMETERS, int pp_rank = 0,
                              double packed_gather_saving = 0) {
    MemoryPlan plan;
    plan.buffers = std::move(buffers);
    for (const BufferSpec& b : plan.buffers) plan.bytes[(int)b.kind] += b.bytes();

    if (cfg.checkpoint_every > 0) plan.snapshot_bytes = checkpoint_snapshot_bytes(zero, precision);
    const ModelConfig& m = cfg.model_config;
    plan.flops_per_step = model_flops_per_token(m, cfg.seq_len) * cfg.total_batch_tokens;

    // one ring reduce-scatter or all-gather of the whole padded buffer sends (W-1)/W of it
    const double W = zero.world_size, ring = (W - 1) / W * (double)zero.padded_num_params;
    const double grads = ring * sizeof(float), params = ring * (double)precision.param_bytes;
    const double accum = cfg.grad_accum_steps;
    switch (zero.stage) {
    case 0: plan.comm_bytes_per_rank = 2 * grads; break;                      // all-reduce
    case 1: plan.comm_bytes_per_rank = grads + params; break;                 // reduce-scatter + all-gather
    case 2: plan.comm_bytes_per_rank = accum * grads + params; break;         // a reduce-scatter per micro-batch
    case 3: plan.comm_bytes_per_rank = accum * (grads + 2 * (params - packed_gather_saving)); break;  // + 2 gathers
    }
    // Hybrid sharding: the above inside a shard group (zero.world_size ranks); then the step's reduced
    // gradient this rank holds (its slice, or all of it at stage 0) is all-reduced over R replicas.
    const double R = cfg.dims.replicas();
    const double held = zero.shards_optimizer() ? (double)zero.shard_num_params : (double)zero.padded_num_params;
    plan.replica_comm_bytes_per_rank = 2 * (R - 1) / R * held * sizeof(float);
    // The activations travel in the parameters' precision (fp32 on the CPU, bf16 on the GPU).
    plan.tp_comm_bytes_per_rank = tensor_parallel_comm_bytes(cfg, pp_rank, precision.param_bytes) * accum;
    plan.ep_comm_bytes_per_rank = expert_parallel_comm_bytes(cfg, pp_rank, precision.param_bytes);
    plan.cp_comm_bytes_per_rank = ring_bytes_per_layer(cfg.batch_size, cfg.seq_len, cfg.dims.cp,
                                                       m.channels / cfg.dims.tp, (int)precision.param_bytes) *
                                  (double)pipeline_split(cfg).rank_layers(pp_rank).size() * accum;
    if (cfg.dims.pp > 1) {
        const PipelineSplit split = pipeline_split(cfg);
        size_t embedding = 0;  // the tied embedding's gradient floats this rank updates (and swaps)
        for (const ZeroPlan::Bucket& k : zero.buckets)
            if (k.name == "embeddings") embedding = zero.shards_optimizer() ? k.owned_end - k.owned_begin : k.size;
        plan.pp_comm_bytes_per_rank = pipeline_comm_bytes(cfg, split, pp_rank, embedding);
    }
    return plan;
}

inline std::string format_bytes(double bytes) {
    if (bytes >= 1024.0 * 1024 * 1024) return strformat("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    if (bytes >= 1024.0 * 1024) return strformat("%.2f MiB", bytes / (1024.0 * 1024));
    return strformat("%.1f KiB", bytes / 1024.0);
}

// What one rank holds of the experts (the expert buckets of its ZeroPlan): its block of them (its
// tensor piece of each, under tensor parallelism), and the share of them whose optimizer state it
// keeps (its ZeRO slice over the expert data group).
inline std::string expert_memory_line(const RunConfig& cfg, const ZeroPlan& zero, double ep_bytes) {
    const ModelConfig& m = cfg.model_config;
    size_t held = 0, owned = 0;
    for (const ZeroPlan::Bucket& k : zero.buckets)
        if (k.experts) held += k.size, owned += k.owned_end - k.owned_begin;
    const std::string cut = cfg.dims.tp > 1 ? strformat(", 1/%d of each one's MLP (tp %d)", cfg.dims.tp, cfg.dims.tp) : "";
    return strformat("experts: %d of each MoE block's %d on this rank (ep %d)%s: %.2fM parameters (%s in fp32), ZeRO-%d "
                     "over the %d rank(s) that hold the same, %.2fM of them this rank's slice; all-to-all: %s sent per "
                     "step to the expert group (even routing)\n",
                     m.num_experts / cfg.dims.ep, m.num_experts, cfg.dims.ep, cut.c_str(), held / 1e6,
                     format_bytes(held * sizeof(float)).c_str(), zero.stage, zero.expert_world_size,
                     (zero.shards_optimizer() ? owned : held) / 1e6, format_bytes(ep_bytes).c_str());
}

inline std::string memory_plan_report(const RunConfig& cfg, const ZeroPlan& zero, const MemoryPlan& plan,
                                      const char* model_kind) {
    const ModelConfig& m = cfg.model_config;
    std::string mesh = strformat("%d rank(s)", zero.world_size * cfg.dims.replicas());
    if (cfg.dims.tp > 1 || cfg.dims.pp > 1 || cfg.dims.cp > 1) {
        mesh = strformat("dp %d", cfg.dims.dp);
        if (cfg.dims.pp > 1) mesh += strformat(" x pp %d", cfg.dims.pp);
        if (cfg.dims.cp > 1) mesh += strformat(" x cp %d (T %d per rank)", cfg.dims.cp, cfg.seq_len / cfg.dims.cp);
        if (cfg.dims.tp > 1)
            mesh += strformat(" x tp %d (sequence parallel %s)", cfg.dims.tp, cfg.sequence_parallel ? "on" : "off");
        mesh += " ranks";
        if (cfg.dims.pp > 1) mesh += "; pipeline rank 0 (every stage below)";
    }
    if (cfg.dims.ep > 1) mesh += strformat(", data-parallel ranks in expert groups of %d", cfg.dims.ep);
    std::string out = strformat(
        "memory plan per rank: %s, %.2fM parameters, B %d x T %d, %d accumulation step(s), %s, ZeRO-%d, %s\n",
        cfg.model.c_str(), num_params(m) / 1e6, cfg.batch_size, cfg.seq_len, cfg.grad_accum_steps, mesh.c_str(),
        zero.stage, model_kind);
    for (int k = 0; k < (int)MemoryKind::Count; k++) {
        out += strformat("  %-16s %12s\n", memory_kind_name((MemoryKind)k), format_bytes(plan.bytes[k]).c_str());
        for (const BufferSpec& b : plan.buffers)
            if ((int)b.kind == k)
                out += strformat("      %-26s %12s  (%zu x %zu bytes)\n", b.name.c_str(), format_bytes((double)b.bytes()).c_str(),
                                 b.count, b.element_bytes);
    }
    out += strformat("  %-16s %12s\n", "total", format_bytes((double)plan.total_bytes()).c_str());
    if (plan.snapshot_bytes > 0)
        out += strformat("  plus %s of host memory for checkpoint snapshots (-n; pinned on a GPU)\n",
                         format_bytes((double)plan.snapshot_bytes).c_str());
    if (cfg.dims.hybrid())
        out += strformat("hybrid sharding: ZeRO-%d inside %d group(s) of %d data rank(s)%s; each rank sends %s in its "
                         "shard group and %s to the %d replicas of its shard per optimizer step\n",
                         zero.stage, cfg.dims.replicas(), cfg.dims.shard_size(),
                         cfg.dims.cp > 1 ? strformat(" x cp %d", cfg.dims.cp).c_str() : "",
                         format_bytes(plan.comm_bytes_per_rank).c_str(),
                         format_bytes(plan.replica_comm_bytes_per_rank).c_str(), cfg.dims.replicas());
    if (cfg.dims.tp > 1 || cfg.dims.cp > 1)
        out += strformat("per optimizer step: %.1f TFLOP over all ranks; each rank sends %s in its data-parallel%s "
                         "group%s%s\n",
                         plan.flops_per_step / 1e12, format_bytes(plan.comm_bytes_per_rank).c_str(),
                         cfg.dims.cp > 1 ? " x context" : "",
                         cfg.dims.tp > 1 ? strformat(" and %s in its tensor-parallel group",
                                                     format_bytes(plan.tp_comm_bytes_per_rank).c_str()).c_str() : "",
                         cfg.dims.cp > 1 ? strformat(" and %s around its context ring (ring attention)",
                                                     format_bytes(plan.cp_comm_bytes_per_rank).c_str()).c_str() : "");
    else
        out += strformat("per optimizer step: %.1f TFLOP over all ranks, %s sent by each rank\n",
                         plan.flops_per_step / 1e12, format_bytes(plan.comm_bytes_per_rank).c_str());
    if (m.num_experts > 0) out += expert_memory_line(cfg, zero, plan.ep_comm_bytes_per_rank);
    return out;
}

// --plan with --pp: one line per stage (its layers, memory, messages to its neighbours and, with --tp,
// in its tensor-parallel group) and the schedule's bubble.
inline std::string pipeline_plan_report(const RunConfig& cfg, const PipelineSplit& split,
                                        const std::vector<MemoryPlan>& stages) {
    const int P = split.stages, m = cfg.grad_accum_steps;
    std::string out = strformat("pipeline: %d stage(s), %s schedule%s, %d micro-batch(es) per step; layers per "
                                "virtual stage %s\n",
                                P, cfg.pp_schedule.c_str(),
                                split.chunks > 1 ? strformat(" (%d chunks per rank)", split.chunks).c_str() : "", m,
                                split.describe().c_str());
    const bool with_tp = cfg.dims.tp > 1;
    out += strformat("  %-5s %-12s %12s %12s %12s %12s %12s %12s%s\n", "stage", "layers", "parameters", "gradients",
                     "optimizer", "activations", "total", "p2p sent", with_tp ? "      tp sent" : "");
    for (int r = 0; r < P; r++) {
        const MemoryPlan& plan = stages.at(r);
        std::string layers;
        const std::vector<int> held = split.rank_layers(r);
        for (size_t i = 0; i < held.size(); i++) {
            size_t j = i;
            while (j + 1 < held.size() && held[j + 1] == held[j] + 1) j++;
            layers += strformat("%s%d-%d", layers.empty() ? "" : ",", held[i], held[j]);
            i = j;
        }
        if (split.holds_first(r)) layers += "+emb";
        if (split.holds_last(r)) layers += "+head";
        using K = MemoryKind;
        out += strformat("  %-5d %-12s %12s %12s %12s %12s %12s %12s%s\n", r, layers.c_str(),
                         format_bytes(plan.bytes[(int)K::Parameters] + plan.bytes[(int)K::MasterWeights]).c_str(),
                         format_bytes(plan.bytes[(int)K::Gradients]).c_str(),
                         format_bytes(plan.bytes[(int)K::OptimizerState]).c_str(),
                         format_bytes(plan.bytes[(int)K::Activations]).c_str(),
                         format_bytes((double)plan.total_bytes()).c_str(),
                         format_bytes(plan.pp_comm_bytes_per_rank).c_str(),
                         with_tp ? strformat(" %12s", format_bytes(plan.tp_comm_bytes_per_rank).c_str()).c_str() : "");
    }
    out += strformat("  bubble: (P - 1) / (m + P - 1)%s = %.1f%% of the step idle per stage (P %d, m %d%s)\n",
                     split.chunks > 1 ? " / V" : "", 100 * pipeline_bubble_fraction(P, m, split.chunks), P, m,
                     split.chunks > 1 ? strformat(", V %d", split.chunks).c_str() : "");
    if (cfg.pp_print_schedule) out += pipeline_schedule_text(make_pipeline_schedule(P, m, split.chunks));
    return out;
}

// Bytes of the machine's memory (MemTotal) and of what is available now (MemAvailable), from
// /proc/meminfo; 0 where it cannot be read.
inline void host_memory_bytes(double* total, double* available) {
    *total = *available = 0;
    FILE* f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char name[64];
    double kib = 0;
    while (fscanf(f, "%63s %lf kB", name, &kib) == 2) {
        if (!strcmp(name, "MemTotal:")) *total = kib * 1024;
        if (!strcmp(name, "MemAvailable:")) *available = kib * 1024;
    }
    fclose(f);
}

// Before a model allocates host memory: refuses a plan that the node cannot hold even empty (the
// plan per rank x the ranks on the node, against MemTotal), naming the largest part and --plan's
// full figure; warns (returns the warning) when it exceeds what is available right now.
inline std::string check_plan_fits_host(const RunConfig& cfg, const MemoryPlan& plan, int ranks_on_node) {
    double total = 0, available = 0;
    host_memory_bytes(&total, &available);
    const double need = (double)plan.total_bytes() * ranks_on_node;
    int largest = 0;
    for (int k = 1; k < (int)MemoryKind::Count; k++)
        if (plan.bytes[k] > plan.bytes[largest]) largest = k;
    const std::string what = strformat(
        "the memory plan needs %s per rank (largest part: %s %s) x %d rank(s) on this node = %s",
        format_bytes((double)plan.total_bytes()).c_str(), memory_kind_name((MemoryKind)largest),
        format_bytes((double)plan.bytes[largest]).c_str(), ranks_on_node, format_bytes(need).c_str());
    if (total > 0 && need > total)
        fail(strformat("%s, more than this machine's %s of memory (see --plan %d for every buffer): reduce -b or -t, "
                       "use a smaller model, or shard more with -z", what.c_str(), format_bytes(total).c_str(),
                       cfg.dims.dp));
    if (available > 0 && need > available)
        return strformat("warning: %s, more than the %s available now; the run may be slow or killed",
                         what.c_str(), format_bytes(available).c_str());
    return "";
}

}  // namespace llmc
