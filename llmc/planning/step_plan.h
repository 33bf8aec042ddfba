// step_plan.h: what --plan adds to the memory plan: the predicted step (step_model.h) as text or
// JSON (--plan-format), and --plan-search, which ranks every layout of N GPUs for the global batch.
//
// Memory and time come from one description of the run: each layout is a resolved RunConfig, its
// memory the backend's own plan (the buffers the model would allocate) and its time estimate_step's.
// A --model-shape that GPT-2 cannot express (SwiGLU, fewer KV heads, an untied head) is planned as
// the GPT-2 of the same layers, width, heads and vocabulary, with the parameter-sized buffers scaled
// by the two models' parameter ratio.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/planning/goodput.h"
#include "llmc/planning/planner.h"
#include "llmc/planning/step_model.h"

namespace llmc {

// --model-shape (with --plan or --plan-search only): the preset's shape flags take the file's
// values, so the mesh checks, the pipeline split and the memory plan see the model's layers, width,
// heads and vocabulary.
inline void apply_model_shape(RunConfig& cfg) {
    if (cfg.plan == 0 && cfg.plan_search == 0)
        fail(strformat("--model-shape '%s' describes a model for --plan or --plan-search only; llmc trains GPT-2 (-e)",
                       cfg.model_shape.c_str()));
    if (cfg.given.count("model"))
        fail(strformat("--model-shape '%s' replaces the -e model: give one of them", cfg.model_shape.c_str()));
    for (const char* flag : {"num-layers", "num-heads", "channels", "vocab-size", "max-seq-len"}) {
        std::string name = flag;
        std::replace(name.begin(), name.end(), '-', '_');
        if (cfg.given.count(name))
            fail(strformat("--model-shape '%s' gives the model's shape: drop --%s", cfg.model_shape.c_str(), flag));
    }
    const ModelShape s = read_model_shape(cfg.model_shape);
    cfg.num_layers = s.layers, cfg.num_heads = s.heads, cfg.channels = s.hidden, cfg.vocab_size = s.vocab;
    cfg.max_seq_len = std::max(1024, cfg.seq_len);
}

// The run's shape: the --model-shape file's, or the resolved GPT-2's.
inline ModelShape run_shape(const RunConfig& cfg) {
    return cfg.model_shape.empty() ? shape_of(cfg.model_config) : read_model_shape(cfg.model_shape);
}

inline StepEstimate estimate_run(const RunConfig& cfg, const Topology& t) {
    const ModelShape s = run_shape(cfg);
    return estimate_step(s, cfg, t, shape_flops_per_token(s, cfg.model_config, cfg.seq_len));
}

// A rank's bytes from its memory plan, the parameter-sized parts scaled to the shape's parameters.
inline double shape_memory_bytes(const MemoryPlan& plan, const ModelShape& s, const ModelConfig& m) {
    const double ratio = s.is_built ? 1.0 : s.params() / (double)num_params(m);
    double bytes = 0;
    for (int k = 0; k < (int)MemoryKind::Count; k++)
        bytes += plan.bytes[k] * ((MemoryKind)k == MemoryKind::Activations ? 1.0 : ratio);
    return bytes;
}

// The most any pipeline stage's rank 0 needs: `stage_plan(cfg, stage)` is the backend's memory plan.
using StagePlan = std::function<MemoryPlan(const RunConfig&, int)>;
inline double most_over_stages(const RunConfig& cfg, const std::function<double(int stage)>& bytes) {
    const PipelineSplit split = pipeline_split(cfg);
    double most = 0;
    for (int stage : {0, busiest_stage(split), split.last_rank()}) most = std::max(most, bytes(stage));
    return most;
}
inline double peak_rank_bytes(const RunConfig& cfg, const StagePlan& stage_plan) {
    const ModelShape s = run_shape(cfg);
    return most_over_stages(cfg, [&](int stage) { return shape_memory_bytes(stage_plan(cfg, stage), s, cfg.model_config); });
}
// The most training state any rank checkpoints (its snapshot: its owned slice of every saved buffer).
inline double checkpoint_rank_bytes(RunConfig cfg, const StagePlan& stage_plan) {
    cfg.checkpoint_every = 1;
    const ModelShape s = run_shape(cfg);
    const double ratio = s.is_built ? 1.0 : s.params() / (double)num_params(cfg.model_config);
    return most_over_stages(cfg, [&](int stage) { return ratio * stage_plan(cfg, stage).snapshot_bytes; });
}

inline std::string link_name(Link l) { return l.network ? "network" : "NVLink"; }

inline std::string format_seconds(double s) { return s >= 1 ? strformat("%.2f s", s) : strformat("%.1f ms", 1e3 * s); }

inline std::string step_report(const RunConfig& c, const Topology& t, const StepEstimate& e) {
    auto share = [&](double s) { return strformat("%s (%.1f%%)", format_seconds(s).c_str(), 100 * s / e.step_s); };
    std::string out = strformat(
        "predicted step on %s (%d GPUs per node): %s, %.0f tokens/s per GPU, %.1f model TFLOP/s per GPU "
        "(%.1f with recomputation), MFU %.1f%%\n",
        t.name.c_str(), t.gpus_per_node, format_seconds(e.step_s).c_str(), e.tokens_per_s_per_gpu, e.model_tflops_per_gpu,
        e.hw_tflops_per_gpu, 100 * e.mfu);
    out += strformat("  compute %s, recompute %s, optimizer %s\n", share(e.compute_s).c_str(),
                     share(e.recompute_s).c_str(), share(e.optimizer_s).c_str());
    if (c.fp8 && t.fp8_peak_tflops > 0)
        out += strformat("  --fp8 1: the blocks' products at the FP8 peak (%.0f TFLOP/s) with their casts; the MFU "
                         "counts them against it\n", t.fp8_peak_tflops);
    else if (c.fp8)
        out += strformat("  --fp8 1: %s has no FP8 tensor cores (no fp8_peak_tflops): planned in bf16\n",
                         t.name.c_str());
    std::string exposed;
    auto axis = [&](const char* name, int size, double s, Link l) {
        if (size > 1) exposed += strformat(" %s %s over %s,", name, share(s).c_str(), link_name(l).c_str());
    };
    axis("tp", c.dims.tp, e.tp_exposed_s, tp_link(c, t));
    axis("cp", c.dims.cp, e.cp_exposed_s, cp_link(c, t));
    axis("ep", c.dims.ep, e.ep_exposed_s, ep_link(c, t));
    axis("pp", c.dims.pp, e.pp_exposed_s, pp_link(c, t));
    axis("dp", c.dims.dp, e.dp_exposed_s, dp_link(c, t));
    return out + strformat("  exposed communication:%s bubble %s\n", exposed.empty() ? " none," : exposed.c_str(),
                           share(e.bubble_s).c_str());
}

inline nlohmann::json step_json(const RunConfig& c, const Topology& t, const StepEstimate& e, double memory_bytes) {
    return {
        {"step_time_s", e.step_s},
        {"tokens_per_s_per_gpu", e.tokens_per_s_per_gpu},
        {"model_tflops_per_gpu", e.model_tflops_per_gpu},
        {"hw_tflops_per_gpu", e.hw_tflops_per_gpu},
        {"mfu", e.mfu},
        {"memory_gib", memory_bytes / (1024.0 * 1024 * 1024)},
        {"fits", memory_bytes <= t.memory_gib * 1024 * 1024 * 1024},
        {"topology", t.name},
        {"layout", {{"gpus", c.world_size}, {"dp", c.dims.dp}, {"tp", c.dims.tp}, {"pp", c.dims.pp}, {"cp", c.dims.cp},
                    {"ep", c.dims.ep},
                    {"zero_stage", c.zero_stage}, {"recompute", c.recompute}, {"micro_batch", c.batch_size},
                    {"grad_accum_steps", c.grad_accum_steps}}},
        {"breakdown_s", {{"compute", e.compute_s}, {"recompute", e.recompute_s}, {"tp_exposed", e.tp_exposed_s},
                         {"cp_exposed", e.cp_exposed_s}, {"ep_exposed", e.ep_exposed_s},
                         {"pp_exposed", e.pp_exposed_s}, {"dp_exposed", e.dp_exposed_s}, {"bubble", e.bubble_s},
                         {"optimizer", e.optimizer_s}}},
        {"bubble_fraction", e.bubble_fraction},
    };
}

// ---- goodput (goodput.h)

// What a checkpoint costs the busiest rank, whose state is `rank_bytes`: the copy to host memory over
// PCIe, counted as stall (the CUDA model overlaps it with the next forward and backward, so this is
// an upper bound); the local tier's replica sent to the next node over the network (its own copy
// into node-local memory runs beside it); shared storage written or read by all of a node's ranks
// at once. A restore reads the file (a replaced node's ranks fetch their replica) and copies it in.
inline CheckpointCosts checkpoint_costs(const RunConfig& c, const Topology& t, double step_s, double rank_bytes) {
    CheckpointCosts k;
    k.step_s = step_s;
    k.copy_s = rank_bytes / (t.host_gbps * 1e9);
    k.local_write_s = rank_bytes / (t.network_gbps * 1e9);
    k.shared_write_s = rank_bytes * std::min(t.gpus_per_node, c.world_size) / (c.storage_gbps * 1e9);
    k.local_restore_s = k.local_write_s + k.copy_s;
    k.shared_restore_s = k.shared_write_s + k.copy_s;
    return k;
}

struct GoodputPlan {
    FailureModel failures;
    CheckpointCosts costs;
    double rank_bytes = 0;
    Intervals best, shared_only;  // with the local tier, and without it
    Goodput expected, expected_shared_only;
    double simulated = 0;         // simulate_goodput at `best`
    static constexpr int kSimulatedFailures = 20000;
};

inline GoodputPlan plan_goodput(const RunConfig& c, const Topology& t, double step_s, double rank_bytes) {
    GoodputPlan g;
    g.failures = {c.failure_rate, c.world_size, c.restart_s, c.local_recovers};
    g.costs = checkpoint_costs(c, t, step_s, rank_bytes);
    g.rank_bytes = rank_bytes;
    g.best = best_intervals(g.failures, g.costs, true);
    g.shared_only = best_intervals(g.failures, g.costs, false);
    g.expected = expected_goodput(g.failures, g.costs, g.best);
    g.expected_shared_only = expected_goodput(g.failures, g.costs, g.shared_only);
    g.simulated = simulate_goodput(g.failures, g.costs, g.best, GoodputPlan::kSimulatedFailures, 1);
    return g;
}

// 850 ms, 12.5 s, 9.3 min, 6.3 h
inline std::string format_span(double s) {
    if (s < 100) return format_seconds(s);
    if (s < 2 * 3600) return strformat("%.1f min", s / 60);
    return strformat("%.1f h", s / 3600);
}

inline std::string goodput_report(const RunConfig& c, const GoodputPlan& g) {
    const CheckpointCosts& k = g.costs;
    const Goodput& e = g.expected;
    auto every = [&](long long steps) { return format_span(steps * k.step_s); };
    std::string out = strformat("goodput: a failure every %s on %d GPUs (%.3g per GPU-hour), restart %s\n",
                                format_span(g.failures.mtbf_s()).c_str(), c.world_size,
                                g.failures.failures_per_gpu_hour, format_span(g.failures.restart_s).c_str());
    out += strformat("  checkpoint: %s per rank; copy to host %s, replica to the next node %s, shared write %s "
                     "(%g GB/s per node); restore %s local, %s shared\n",
                     format_bytes(g.rank_bytes).c_str(), format_seconds(k.copy_s).c_str(),
                     format_seconds(k.local_write_s).c_str(), format_span(k.shared_write_s).c_str(), c.storage_gbps,
                     format_span(k.local_restore_s).c_str(), format_span(k.shared_restore_s).c_str());
    out += strformat("  best: --local-ckpt-every %lld -n %lld (every %s and %s): %.2f%% effective training time\n"
                     "    (checkpoint stalls %.2f%%, lost work %.2f%%, restarts %.2f%%; %.0f%% of failures restart "
                     "from the local tier); simulated over %d failures: %.2f%%\n",
                     g.best.local_every, g.best.shared_every, every(g.best.local_every).c_str(),
                     every(g.best.shared_every).c_str(), 100 * e.effective, 100 * e.checkpoint, 100 * e.rework,
                     100 * e.restart, 100 * g.failures.local_recovers, GoodputPlan::kSimulatedFailures,
                     100 * g.simulated);
    return out + strformat("  shared tier only: -n %lld (every %s): %.2f%%, with %.1fx the writes to shared storage\n",
                           g.shared_only.shared_every, every(g.shared_only.shared_every).c_str(),
                           100 * g.expected_shared_only.effective,
                           (double)g.best.shared_every / g.shared_only.shared_every);
}

inline nlohmann::json goodput_json(const GoodputPlan& g) {
    const Goodput& e = g.expected;
    return {
        {"failures_per_gpu_hour", g.failures.failures_per_gpu_hour},
        {"mtbf_h", g.failures.mtbf_s() / 3600},
        {"restart_s", g.failures.restart_s},
        {"checkpoint_bytes_per_rank", g.rank_bytes},
        {"local_ckpt_every", g.best.local_every},
        {"checkpoint_every", g.best.shared_every},
        {"effective", e.effective},
        {"shares", {{"checkpoint", e.checkpoint}, {"rework", e.rework}, {"restart", e.restart}}},
        {"simulated", g.simulated},
        {"shared_only", {{"checkpoint_every", g.shared_only.shared_every}, {"effective", g.expected_shared_only.effective}}},
    };
}

// ---- --plan-search

struct Layout {
    RunConfig cfg;
    StepEstimate step;
    double memory_bytes = 0;
    bool fits = false;
};

// Context-parallel sizes to try: the given --cp only, where one is given; else cp 1, and cp 2, 4
// and 8 where the sequence is long, each rank still holding SEARCH_MIN_CONTEXT_ROWS of its positions
// (shorter sequences fit a rank without splitting, and their ring steps would have little attention
// to hide under). At most 8: the ring then stays inside a node.
constexpr int SEARCH_MIN_CONTEXT_ROWS = 4096;
inline std::vector<int> candidate_context_sizes(const RunConfig& base) {
    if (base.given.count("cp")) return {base.cp};
    std::vector<int> out{1};
    for (int cp : {2, 4, 8})
        if (base.seq_len / cp >= SEARCH_MIN_CONTEXT_ROWS) out.push_back(cp);
    return out;
}

// Every layout of `gpus` ranks to try: tp x pp x cp dividing them (candidate_context_sizes), pipelines
// 1F1B or interleaved with 2 or 4 chunks per rank, ZeRO 0-3, -r 0-3, micro-batches of 1, 2, 4, ...
// up to the -d batch.
inline std::vector<RunConfig> candidate_layouts(const RunConfig& base, int gpus) {
    std::vector<RunConfig> out;
    for (int tp = 1; tp <= gpus; tp++)
        for (int pp = 1; gpus % tp == 0 && pp <= gpus / tp; pp++)
            for (int cp : candidate_context_sizes(base)) {
                if ((gpus / tp) % pp || (gpus / tp / pp) % cp) continue;
                const long long tokens_per_sequence_row = (long long)base.seq_len * (gpus / tp / pp / cp);
                for (int chunks : {1, 2, 4})
                    for (int zero = 0; zero <= 3 && (pp > 1 || chunks == 1); zero++)
                        for (int r = 0; r <= 3; r++)
                            for (int b = 1; b * tokens_per_sequence_row <= base.total_batch_tokens; b *= 2) {
                                RunConfig c = base;
                                c.tp = tp, c.pp = pp, c.cp = cp, c.zero_stage = zero, c.recompute = r, c.batch_size = b;
                                c.pp_schedule = chunks > 1 ? "interleaved" : "1f1b", c.pp_virtual = chunks;
                                c.pp_layers = "";
                                out.push_back(c);
                            }
            }
    return out;
}

// The candidates the run can take (`resolve` refuses the others: a head count tp does not divide,
// a batch the micro-batches do not divide, ...), those that fit first, fastest first.
using Resolve = std::function<void(RunConfig&, int)>;
inline std::vector<Layout> search_layouts(const RunConfig& base, int gpus, const Topology& t, const Resolve& resolve,
                                          const StagePlan& stage_plan) {
    std::vector<Layout> out;
    for (RunConfig& c : candidate_layouts(base, gpus)) {
        try {
            resolve(c, gpus);
        } catch (const Error&) {
            continue;
        }
        Layout l{c, estimate_run(c, t), peak_rank_bytes(c, stage_plan)};
        l.fits = l.memory_bytes <= t.memory_gib * 1024 * 1024 * 1024;
        out.push_back(l);
    }
    std::stable_sort(out.begin(), out.end(), [](const Layout& a, const Layout& b) {
        return a.fits != b.fits ? a.fits : a.step.step_s < b.step.step_s;
    });
    return out;
}

inline std::string layout_name(const RunConfig& c) {
    const std::string chunks = c.pp_virtual > 1 ? strformat(" (interleaved, %d chunks)", c.pp_virtual) : "";
    const std::string cp = c.dims.cp > 1 ? strformat(" x cp %d", c.dims.cp) : "";
    return strformat("dp %d x tp %d x pp %d%s%s, ZeRO-%d, -r %d, -b %d", c.dims.dp, c.dims.tp, c.dims.pp, chunks.c_str(),
                     cp.c_str(), c.zero_stage, c.recompute, c.batch_size);
}

// Why `l` loses to `best`: it does not fit, or the part of the step where it spends the most more.
// The reason's name comes first, its figures after a colon.
inline std::string why_it_loses(const Layout& l, const Layout& best, const Topology& t) {
    if (!l.fits)
        return strformat("does not fit in memory: %.1f GiB per rank > %.0f GiB", l.memory_bytes / (1024.0 * 1024 * 1024),
                         t.memory_gib);
    const StepEstimate &a = l.step, &b = best.step;
    const std::pair<const char*, double> parts[] = {
        {"compute", a.compute_s - b.compute_s},          {"recomputation", a.recompute_s - b.recompute_s},
        {"exposed tp traffic", a.tp_exposed_s - b.tp_exposed_s}, {"exposed ring traffic", a.cp_exposed_s - b.cp_exposed_s},
        {"exposed all-to-all", a.ep_exposed_s - b.ep_exposed_s},
        {"pipeline sends", a.pp_exposed_s - b.pp_exposed_s},
        {"exposed dp traffic", a.dp_exposed_s - b.dp_exposed_s}, {"bubble", a.bubble_s - b.bubble_s},
        {"optimizer", a.optimizer_s - b.optimizer_s},
    };
    const auto* worst = std::max_element(std::begin(parts), std::end(parts),
                                         [](const auto& x, const auto& y) { return x.second < y.second; });
    return strformat("%s: +%s", worst->first, format_seconds(worst->second).c_str());
}

// The best `show` layouts in full, the next ones a line each with why they lose, and how many lose
// for each reason.
inline std::string search_report(const std::vector<Layout>& layouts, const Topology& t, int show = 5) {
    if (layouts.empty()) return "plan search: no layout of these GPUs can run this model and batch\n";
    std::string out = strformat("plan search: %zu layouts on %s, the best %d:\n", layouts.size(), t.name.c_str(),
                                std::min(show, (int)layouts.size()));
    for (int i = 0; i < show && i < (int)layouts.size(); i++)
        out += strformat("%d. %s: %s per rank%s\n", i + 1, layout_name(layouts[i].cfg).c_str(),
                         format_bytes(layouts[i].memory_bytes).c_str(), layouts[i].fits ? "" : " (does not fit)") +
               step_report(layouts[i].cfg, t, layouts[i].step);
    std::map<std::string, int> reasons;
    for (int i = show; i < (int)layouts.size(); i++) {
        const std::string why = why_it_loses(layouts[i], layouts[0], t);
        reasons[why.substr(0, why.find(':'))]++;
        if (i < show + 15)
            out += strformat("  %-44s %10s  loses on %s\n", layout_name(layouts[i].cfg).c_str(),
                             format_seconds(layouts[i].step.step_s).c_str(), why.c_str());
    }
    out += "why the other layouts lose:\n";
    for (const auto& [why, count] : reasons) out += strformat("  %5d  %s\n", count, why.c_str());
    return out;
}

}  // namespace llmc
