// The step-time model (step_model.h, cluster.h): collective costs, where the mesh puts its groups,
// the bubble, the throughput identities, the input files' errors, and Megatron-LM's 2021 table.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <set>

#include "llmc/planning/step_plan.h"

using namespace llmc;
using Catch::Contains;

namespace {

RunConfig resolved(const char* model, int gpus, int tp, int pp, int batch, int seq, int total_sequences) {
    RunConfig c;
    c.model = model;
    c.tp = tp, c.pp = pp, c.batch_size = batch, c.seq_len = seq;
    c.total_batch_tokens = total_sequences * seq;
    resolve_run_config(c, gpus, nullptr);
    return c;
}

std::string write_temp(const char* name, const std::string& text) {
    const std::string path = std::string("/tmp/llmc_test_") + name;
    std::ofstream(path) << text;
    return path;
}

}  // namespace

TEST_CASE("a ring all-reduce costs 2 (g-1) latencies and sends 2 (g-1)/g of the buffer", "[plan]") {
    const Link l{100, 1e-5, false};
    const double bytes = 1e9, g = 8;
    CHECK(ring_all_reduce_s(bytes, 8, l) == Approx(2 * 7 * 1e-5 + 2 * 7 / g * bytes / 100e9));
    CHECK(ring_reduce_scatter_s(bytes, 8, l) == Approx(ring_all_reduce_s(bytes, 8, l) / 2));
    CHECK(ring_all_gather_s(bytes, 1, l) == 0);
    // tiny messages: the tree's log2(g) steps beat the ring's g - 1
    CHECK(all_reduce_s(8, 1024, l) == Approx(tree_all_reduce_s(8, 1024, l)));
    CHECK(all_reduce_s(bytes, 8, l) == Approx(ring_all_reduce_s(bytes, 8, l)));
    CHECK(p2p_s(1e9, l) == Approx(1e-5 + 0.01));
    CHECK(all_to_all_s(bytes, 8, l) == Approx(7 * 1e-5 + 7 / g * bytes / 100e9));
}

TEST_CASE("tp groups stay inside a node on NVLink; pp and dp cross the network once the node is full", "[plan]") {
    const Topology t = topology_preset("h100");
    const RunConfig c = resolved("d12", 64, 4, 4, 1, 64, 4);  // pp spans 4 x 4 = 16 ranks: two nodes
    CHECK_FALSE(tp_link(c, t).network);
    CHECK(tp_link(c, t).gbps == 450);
    CHECK(pp_link(c, t).network);
    CHECK(dp_link(c, t).network);
    CHECK(dp_link(c, t).gbps == 50);
    const RunConfig small = resolved("d12", 8, 2, 2, 1, 64, 2);
    CHECK_FALSE(dp_link(small, t).network);  // 2 x 2 x 2 = 8 ranks: one node
    const RunConfig wide = resolved("d24", 16, 16, 1, 1, 64, 1);  // 16 heads over 16 ranks: two nodes
    CHECK(tp_link(wide, t).network);
    CHECK(tp_link(wide, t).gbps == 50);
}

TEST_CASE("the step adds up, and tokens/s, model TFLOP/s and MFU follow from it", "[plan]") {
    const Topology t = topology_preset("h100");
    const RunConfig c = resolved("d12", 16, 2, 2, 4, 1024, 64);
    const double fpt = shape_flops_per_token(shape_of(c.model_config), c.model_config, c.seq_len);
    const StepEstimate e = estimate_step(shape_of(c.model_config), c, t, fpt);
    CHECK(e.step_s == Approx(e.compute_s + e.recompute_s + e.tp_exposed_s + e.pp_exposed_s + e.dp_exposed_s +
                             e.bubble_s + e.optimizer_s));
    CHECK(e.tokens_per_s_per_gpu == Approx(64.0 * 1024 / e.step_s / 16));
    CHECK(e.model_tflops_per_gpu == Approx(fpt * e.tokens_per_s_per_gpu / 1e12));
    CHECK(e.mfu == Approx(e.model_tflops_per_gpu / 989));
    CHECK(e.hw_tflops_per_gpu == Approx(e.model_tflops_per_gpu));  // no recomputation
    // the bubble is the schedule's share of the step's busy time
    CHECK(e.bubble_fraction == Approx(pipeline_bubble_fraction(2, c.grad_accum_steps)));
    CHECK(e.bubble_s / (e.step_s - e.dp_exposed_s - e.optimizer_s) == Approx(e.bubble_fraction));
}

TEST_CASE("recomputing whole blocks adds a forward: hardware FLOPs exceed model FLOPs, the step is slower", "[plan]") {
    const Topology t = topology_preset("a100");
    RunConfig c = resolved("d12", 8, 1, 1, 4, 1024, 32);
    const double fpt = shape_flops_per_token(shape_of(c.model_config), c.model_config, c.seq_len);
    const StepEstimate none = estimate_step(shape_of(c.model_config), c, t, fpt);
    c.recompute = 3;
    const StepEstimate block = estimate_step(shape_of(c.model_config), c, t, fpt);
    CHECK(block.step_s > none.step_s);
    CHECK(block.hw_tflops_per_gpu > block.model_tflops_per_gpu * 1.2);
    c.recompute = 1;
    CHECK(estimate_step(shape_of(c.model_config), c, t, fpt).recompute_s < block.recompute_s);
}

TEST_CASE("a GPT-2 shape counts the same model FLOPs as the MFU line", "[plan]") {
    const ModelConfig m = model_preset("d12", 1024, 50257);
    ModelShape s = shape_of(m);
    const double preset = shape_flops_per_token(s, m, 1024);
    s.is_built = false;  // the generic formula leaves out only biases and LayerNorms
    CHECK(shape_flops_per_token(s, m, 1024) == Approx(preset).epsilon(0.002));
}

TEST_CASE("--model-shape and --topology files: every bad value is named", "[plan]") {
    const std::string good = R"({"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672,
                                 "ffn": "swiglu", "vocab": 128256, "tied": false})";
    const ModelShape s = read_model_shape(write_temp("shape.json", good));
    CHECK(s.swiglu);
    CHECK(s.params() == Approx(70.6e9).epsilon(0.01));  // Llama-3-70B's published 70.6B
    CHECK_THROWS_WITH(read_model_shape("/nonexistent.json"), Contains("--model-shape '/nonexistent.json' cannot be opened"));
    CHECK_THROWS_WITH(read_model_shape(write_temp("bad.json", "{")), Contains("is not valid JSON"));
    std::string no_heads = good;
    no_heads.replace(no_heads.find("\"heads\": 64,"), 12, "");
    CHECK_THROWS_WITH(read_model_shape(write_temp("s1.json", no_heads)), Contains("has no \"heads\""));
    std::string bad_ffn = good;
    bad_ffn.replace(bad_ffn.find("swiglu"), 6, "relu");
    CHECK_THROWS_WITH(read_model_shape(write_temp("s2.json", bad_ffn)), Contains("\"ffn\" must be \"gelu\" or \"swiglu\""));
    CHECK_THROWS_WITH(read_model_shape(write_temp("s3.json", R"({"layers": -1})")),
                      Contains("\"layers\" must be a positive integer, got -1"));
    CHECK_THROWS_WITH(read_model_shape(write_temp("s4.json", R"({"layer": 1})")), Contains("unknown key \"layer\""));

    CHECK(read_topology("a100").nvlink_gbps == 300);
    CHECK_THROWS_WITH(read_topology("v100"), Contains("--topology must be h100, a100 or a .json file, got 'v100'"));
    const Topology t = read_topology(write_temp("topo.json", R"({"base": "h100", "gpus_per_node": 4, "network_gbps": 100})"));
    CHECK(t.gpus_per_node == 4);
    CHECK(t.network_gbps == 100);
    CHECK(t.peak_tflops == 989);
    CHECK_THROWS_WITH(read_topology(write_temp("t1.json", R"({"gpus_per_node": 4})")), Contains("\"base\" must be"));
    CHECK_THROWS_WITH(read_topology(write_temp("t2.json", R"({"base": "h100", "matmul_efficiency": 2})")),
                      Contains("at most 1"));
    CHECK_THROWS_WITH(read_topology(write_temp("t3.json", R"({"base": "h100", "nvlink_gbps": "fast"})")),
                      Contains("\"nvlink_gbps\" must be a positive number, got \"fast\""));
    // measured rates (dev/bench/measured_topology.sh) stand for the assumed efficiencies
    const Topology m = read_topology(write_temp("t4.json", R"({"base": "h100", "matmul_tflops": 600,
        "attention_tflops": 400, "memory_gbps": 2680})"));
    CHECK(m.matmul_efficiency == Approx(600 / 989.0));
    CHECK(m.attention_efficiency == Approx(400 / 989.0));
    CHECK(m.memory_efficiency == Approx(0.8));
    CHECK_THROWS_WITH(read_topology(write_temp("t5.json", R"({"base": "h100", "matmul_tflops": 600, "matmul_efficiency": 0.6})")),
                      Contains("give \"matmul_efficiency\" or the measured \"matmul_tflops\", not both"));
    CHECK_THROWS_WITH(read_topology(write_temp("t6.json", R"({"base": "a100", "matmul_tflops": 400})")), Contains("at most 1"));
}

// Megatron-LM's weak-scaling table (Narayanan et al. 2021, "Efficient Large-Scale Language Model
// Training on GPU Clusters", Table 1; the same table as NVIDIA/Megatron-LM's
// images/cases_april2021.png): GPT models with vocabulary 51,200 and sequence length 2048 on DGX A100
// nodes, full activation recomputation, TFLOP/s per GPU counting it. The table gives the model-
// parallel size; the repository's README says tensor parallelism was 8 wherever it exceeds 8
// (tp = min(mp, 8), pp = mp / tp), without sequence parallelism (it came in 2022). Not in the table: the head count (taken as hidden / 128; the
// FLOPs do not depend on it), the micro-batch size (taken as 1) and the schedule (taken as 1F1B).
// With the a100 preset's assumed efficiencies the model predicts too much on every row, by +11% to
// +30% (1.7B +29.8, 3.6B +23.9, 7.5B +13.1, 18B +21.5, 39B +26.3, 76B +25.9, 145B +22.4, 310B
// +18.1, 530B +10.7, 1T +11.3; +20% on average): its attention is a fused kernel, Megatron's of
// 2021 was not, and its matmul efficiency is assumed, not measured. The test keeps every row within
// +-32% (LLMC_PRINT_MEGATRON=1 prints the rows, with the H100 prediction for each).
TEST_CASE("Megatron-LM 2021's table, row by row on the a100 topology, within the tolerance reached", "[plan]") {
    struct Row {
        int hidden, layers, mp, gpus, batch;
        double tflops;
    } rows[] = {
        {2304, 24, 1, 32, 512, 137},     {3072, 30, 2, 64, 512, 138},     {4096, 36, 4, 128, 512, 142},
        {6144, 40, 8, 256, 1024, 135},   {8192, 48, 16, 512, 1536, 138},  {10240, 60, 32, 1024, 1792, 140},
        {12288, 80, 64, 1536, 2304, 148}, {16384, 96, 128, 1920, 2160, 155}, {20480, 105, 280, 2520, 2520, 163},
        {25600, 128, 512, 3072, 3072, 163},
    };
    const Topology t = topology_preset("a100");
    for (const Row& r : rows) {
        RunConfig c;
        c.num_layers = r.layers, c.channels = r.hidden, c.num_heads = r.hidden / 128;
        c.vocab_size = 51200, c.max_seq_len = 2048, c.seq_len = 2048, c.batch_size = 1;
        c.tp = std::min(r.mp, 8), c.pp = r.mp / c.tp, c.recompute = 3, c.sequence_parallel = 0;
        c.total_batch_tokens = r.batch * 2048;
        resolve_run_config(c, r.gpus, nullptr);
        const ModelShape s = shape_of(c.model_config);
        const StepEstimate e = estimate_step(s, c, t, shape_flops_per_token(s, c.model_config, c.seq_len));
        const double error = e.hw_tflops_per_gpu / r.tflops - 1;
        CAPTURE(r.hidden, r.layers, e.hw_tflops_per_gpu, r.tflops);
        CHECK(std::abs(error) <= 0.32);
        if (getenv("LLMC_PRINT_MEGATRON")) {
            const StepEstimate h100 = estimate_run(c, topology_preset("h100"));
            printf("megatron %6.1fB on %4d: a100 %5.1f TFLOP/s predicted, %5.1f published (%+.1f%%); h100 %5.1f "
                   "(MFU %.0f%%)\n", s.params() / 1e9, r.gpus, e.hw_tflops_per_gpu, r.tflops, 100 * error,
                   h100.hw_tflops_per_gpu, 100 * h100.mfu);
        }
    }
}

TEST_CASE("--plan-format json holds the keys the issue names, consistent with the estimate", "[plan]") {
    const Topology t = topology_preset("h100");
    const RunConfig c = resolved("d12", 16, 2, 2, 4, 1024, 64);
    const StepEstimate e = estimate_run(c, t);
    const nlohmann::json j = step_json(c, t, e, 3.0 * 1024 * 1024 * 1024);
    for (const char* key : {"step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "hw_tflops_per_gpu", "mfu",
                            "memory_gib", "breakdown_s", "layout"})
        CHECK(j.contains(key));
    CHECK(j["step_time_s"].get<double>() == Approx(e.step_s));
    CHECK(j["memory_gib"].get<double>() == Approx(3.0));
    CHECK(j["fits"].get<bool>());
    CHECK(j["layout"]["tp"] == 2);
    CHECK(j["layout"]["dp"] == 4);
}

TEST_CASE("--model-shape replaces the preset's shape flags, and refuses them or -e beside it", "[plan]") {
    RunConfig c;
    c.model_shape = write_temp("shape_ok.json", R"({"layers": 4, "hidden": 256, "heads": 4, "kv_heads": 1,
        "ffn_hidden": 768, "ffn": "swiglu", "vocab": 1000, "tied": false})");
    c.plan = 8;
    apply_model_shape(c);
    resolve_run_config(c, 8, nullptr);
    CHECK(c.model_config.num_layers == 4);
    CHECK(c.model_config.channels == 256);
    CHECK(run_shape(c).swiglu);
    RunConfig with_layers = c;
    with_layers.given.insert("num_layers");
    CHECK_THROWS_WITH(apply_model_shape(with_layers), Contains("drop --num-layers"));
    RunConfig with_model = c;
    with_model.given.insert("model");
    CHECK_THROWS_WITH(apply_model_shape(with_model), Contains("replaces the -e model"));
    RunConfig training = c;
    training.plan = 0;
    CHECK_THROWS_WITH(apply_model_shape(training), Contains("for --plan or --plan-search only"));
}

TEST_CASE("--plan-search puts layouts that fit first, fastest first, and says why the others lose", "[plan]") {
    const Topology t = topology_preset("h100");
    RunConfig base;
    base.model = "d12", base.seq_len = 1024, base.total_batch_tokens = 64 * 1024;
    // a memory plan by hand: 1 GiB per rank, 100 GiB without tensor parallelism
    const StagePlan plan = [](const RunConfig& c, int) {
        MemoryPlan p;
        p.bytes[(int)MemoryKind::Parameters] = (c.dims.tp > 1 ? 1ull : 100ull) << 30;
        return p;
    };
    const std::vector<Layout> layouts = search_layouts(base, 8, t, [](RunConfig& c, int n) { resolve_run_config(c, n, nullptr); }, plan);
    REQUIRE(layouts.size() > 10);
    CHECK(layouts.front().fits);
    CHECK(layouts.front().cfg.dims.tp > 1);
    for (size_t i = 1; i < layouts.size(); i++) {
        CHECK(layouts[i - 1].fits >= layouts[i].fits);
        if (layouts[i - 1].fits == layouts[i].fits) CHECK(layouts[i - 1].step.step_s <= layouts[i].step.step_s);
    }
    CHECK_THAT(why_it_loses(layouts.back(), layouts.front(), t), Contains("does not fit in memory: 100.0 GiB per rank > 80 GiB"));
    const std::string report = search_report(layouts, t);
    CHECK_THAT(report, Contains("the best 5"));
    CHECK_THAT(report, Contains("why the other layouts lose"));
}

TEST_CASE("--plan-search tries interleaved pipelines, and only where there is a pipeline", "[plan]") {
    RunConfig base;
    base.model = "d12", base.seq_len = 1024, base.total_batch_tokens = 64 * 1024;
    int interleaved = 0;
    for (const RunConfig& c : candidate_layouts(base, 8)) {
        CHECK((c.pp_virtual == 1) == (c.pp_schedule == "1f1b"));
        if (c.pp_virtual > 1) {
            CHECK(c.pp > 1);
            interleaved++;
        }
    }
    CHECK(interleaved > 0);
    RunConfig c = resolved("d12", 8, 1, 4, 1, 1024, 64);
    CHECK(layout_name(c) == "dp 2 x tp 1 x pp 4, ZeRO-0, -r 0, -b 1");
    c.pp_virtual = 2;
    CHECK_THAT(layout_name(c), Contains("pp 4 (interleaved, 2 chunks)"));
}

TEST_CASE("--plan-search tries cp 2, 4, 8 where each rank keeps 4096 positions, only the given --cp if one is given", "[plan]") {
    auto context_sizes = [](int seq_len, int given_cp) {
        RunConfig base;
        base.model = "d12", base.seq_len = seq_len, base.max_seq_len = seq_len, base.total_batch_tokens = 16 * seq_len;
        if (given_cp) base.cp = given_cp, base.given.insert("cp");
        std::set<int> sizes;
        for (const RunConfig& c : candidate_layouts(base, 16)) {
            CHECK(16 % (c.tp * c.pp * c.cp) == 0);
            CHECK((long long)c.batch_size * seq_len * (16 / (c.tp * c.pp * c.cp)) <= base.total_batch_tokens);
            sizes.insert(c.cp);
        }
        return sizes;
    };
    CHECK(context_sizes(1024, 0) == std::set<int>{1});
    CHECK(context_sizes(16384, 0) == std::set<int>{1, 2, 4});  // cp 8 would leave 2048 positions per rank
    CHECK(context_sizes(32768, 0) == std::set<int>{1, 2, 4, 8});
    CHECK(context_sizes(32768, 2) == std::set<int>{2});
    CHECK(context_sizes(1024, 1) == std::set<int>{1});
    RunConfig c = resolved("d12", 8, 1, 1, 1, 1024, 64);
    c.cp = 2, c.dims.cp = 2, c.dims.dp = 4;
    CHECK(layout_name(c) == "dp 4 x tp 1 x pp 1 x cp 2, ZeRO-0, -r 0, -b 1");
}

TEST_CASE("context parallelism: each rank computes 1/cp of the sequence, the ring's K and V hide under attention", "[plan]") {
    Topology t = topology_preset("h100");
    auto with_cp = [](int cp, int seq) {
        RunConfig c;
        c.model = "d12", c.cp = cp, c.batch_size = 1, c.seq_len = seq, c.max_seq_len = seq;
        c.total_batch_tokens = 2 * seq;  // two sequences over 2 GPUs
        resolve_run_config(c, 2, nullptr);
        return c;
    };
    const RunConfig dp2 = with_cp(1, 8192), cp2 = with_cp(2, 8192);
    REQUIRE(cp2.dims.cp == 2);
    REQUIRE(cp2.dims.dp == 1);
    const StepEstimate a = estimate_run(dp2, t), b = estimate_run(cp2, t);
    // the same work per GPU: dp 2 runs one sequence each once, cp 2 half of each of two
    CHECK(b.compute_s == Approx(a.compute_s).epsilon(0.02));
    CHECK(b.cp_exposed_s == 0);           // over NVLink, a K/V block takes less than a block's attention
    CHECK(b.dp_exposed_s > 0);            // the gradients are still reduced over dp x cp = 2 ranks
    CHECK(b.tokens_per_s_per_gpu == Approx(a.tokens_per_s_per_gpu).epsilon(0.05));
    t.nvlink_gbps = 0.05;                 // a link so slow that the ring shows
    CHECK(estimate_run(cp2, t).cp_exposed_s > 0);
    CHECK_THAT(step_report(cp2, t, estimate_run(cp2, t)), Contains("cp "));
    CHECK(step_json(cp2, t, b, 0)["layout"]["cp"] == 2);
}

TEST_CASE("--fp8 runs the blocks' products at the FP8 peak, pays their casts, and counts MFU against both peaks", "[plan]") {
    const Topology h100 = topology_preset("h100");
    RunConfig c = resolved("d48", 64, 1, 1, 16, 1024, 1024);
    const ModelShape s = shape_of(c.model_config);
    const double fpt = shape_flops_per_token(s, c.model_config, c.seq_len);
    const StepEstimate bf16 = estimate_step(s, c, h100, fpt);
    c.fp8 = 1;
    const StepEstimate fp8 = estimate_step(s, c, h100, fpt);
    // The products take half the time (1979 against 989 TFLOP/s); the casts give part of it back. In
    // bytes, each a read of 2 bytes and writes of 1 or 2: the inputs (3C + F an element of a row)
    // forward, row-major, and backward, transposed: 3 + 3; the gradients (3C + C + F + C) both
    // copies: 4; the weights both copies once a step: 4; current scaling's amax, 2, for the weights
    // and, at -r 0, the fc projection's input F (cuBLASLt's GELU epilogue writes it): the kernels
    // that write every other input and gradient measure it.
    const double rows = 16.0 * 1024, C = 1600, F = 6400, L = 48, m = c.grad_accum_steps;
    const double product_flops = 3 * 2 * rows * s.layer_matmul_params() * L * m;  // forward + 2 backward
    const double halved = product_flops / (989e12 * h100.matmul_efficiency) - product_flops / (1979e12 * h100.matmul_efficiency);
    const double inputs = rows * (3 * C + F), grads = rows * (3 * C + C + F + C), weights = s.layer_matmul_params() / m;
    const double measured = rows * F + weights;
    auto cast_s = [&](double bytes) { return bytes * L * m / (3350e9 * h100.memory_efficiency); };
    const double casts = cast_s(6 * inputs + 4 * grads + 4 * weights + 2 * measured);
    CHECK(fp8.compute_s == Approx(bf16.compute_s - halved + casts).epsilon(1e-6));
    CHECK(fp8.compute_s < bf16.compute_s);
    // The weights are cast once a step (ZeRO 0-2): 4 micro-batches pay them once, ZeRO-3 four times.
    RunConfig accum = resolved("d48", 16, 1, 1, 16, 1024, 1024);
    accum.fp8 = 1;
    REQUIRE(accum.grad_accum_steps == 4);
    const double weight_cast_s = 6 * s.layer_matmul_params() * L / (3350e9 * h100.memory_efficiency);  // with its amax
    const StepEstimate z1 = estimate_step(s, accum, h100, fpt);
    accum.zero_stage = 3;
    accum.fp8_gather = 0;  // gathered in bf16, cast at every micro-batch
    CHECK(estimate_step(s, accum, h100, fpt).compute_s == Approx(z1.compute_s + 3 * weight_cast_s).epsilon(1e-6));
    // Gathered as codes: each rank casts its slice once a step (with its amax), and every micro-batch
    // unpacks each layer's codes twice (2 bytes a weight each) and transposes them once (2 more).
    accum.fp8_gather = 1;
    const double dp = accum.dims.dp * accum.dims.cp, w_s = s.layer_matmul_params() * L / (3350e9 * h100.memory_efficiency);
    REQUIRE(dp > 1);
    const StepEstimate gathered = estimate_step(s, accum, h100, fpt);
    CHECK(gathered.compute_s == Approx(z1.compute_s - weight_cast_s + (5 / dp + 4 * 6) * w_s).epsilon(1e-6));
    // ... and its gathers move a byte a weight instead of two.
    const double P = 1e9, coded = 0.9e9;
    const Link link = dp_cp_link(accum, h100);
    const double saved = ring_all_gather_s(2 * P, (int)dp, link) - ring_all_gather_s(2 * P - coded, (int)dp, link);
    CHECK(dp_exposed_s(accum, h100, P, 0, 0, 48, 0) - dp_exposed_s(accum, h100, P, 0, 0, 48, coded) ==
          Approx(accum.grad_accum_steps * 2 * saved * (1 + 1.0 / 48)).epsilon(1e-9));
    CHECK(gathered.dp_exposed_s < [&] { RunConfig bf16_gather = accum; bf16_gather.fp8_gather = 0;
                                        return estimate_step(s, bf16_gather, h100, fpt).dp_exposed_s; }());
    c.fp8_scaling = "delayed";  // no amax pass
    const double delayed_casts = cast_s(6 * inputs + 4 * grads + 4 * weights);
    CHECK(estimate_step(s, c, h100, fpt).compute_s == Approx(bf16.compute_s - halved + delayed_casts).epsilon(1e-6));
    // At -r 1 GELU is a kernel of its own, which measures the fc projection's input: F less of the amax
    c.recompute = 1;
    const StepEstimate r1 = estimate_step(s, c, h100, fpt);
    c.fp8_scaling = "current";
    const double gelu_measures = cast_s(2 * rows * F);
    CHECK(estimate_step(s, c, h100, fpt).compute_s == Approx(r1.compute_s + casts - delayed_casts - gelu_measures).epsilon(1e-6));
    c.recompute = 0;
    // MFU: the products' FLOPs against 1979, the rest against 989.
    const double fp8_fpt = 6 * s.layer_matmul_params() * L;
    CHECK(fp8.mfu == Approx(fp8.tokens_per_s_per_gpu * ((fpt - fp8_fpt) / 989e12 + fp8_fpt / 1979e12)));
    CHECK(fp8.mfu < bf16.mfu);  // FP8 buys tokens/s, not MFU
    CHECK(fp8.tokens_per_s_per_gpu > bf16.tokens_per_s_per_gpu);
    CHECK(model_flops_utilization(fpt, 1000, 989, 1, fp8_fpt, 0) == Approx(model_flops_utilization(fpt, 1000, 989, 1)));
    // A GPU without FP8 tensor cores plans it in bf16, and says so.
    const Topology a100 = topology_preset("a100");
    c.fp8_scaling = "current";
    const StepEstimate on_a100 = estimate_step(s, c, a100, fpt);
    c.fp8 = 0;
    CHECK(on_a100.step_s == Approx(estimate_step(s, c, a100, fpt).step_s));
    c.fp8 = 1;
    CHECK_THAT(step_report(c, a100, on_a100), Contains("a100 has no FP8 tensor cores"));
    CHECK_THAT(step_report(c, h100, fp8), Contains("FP8 peak (1979 TFLOP/s)"));
    CHECK(gpu_peak_fp8_tflops("NVIDIA H100 80GB HBM3") == 1978);
    CHECK(gpu_peak_fp8_tflops("NVIDIA A100-SXM4-80GB") == 0);
}

TEST_CASE("experts: a MoE layer runs the top-k experts' products and the router, reads the experts it holds, "
          "and pays the expert group's all-to-alls", "[plan]") {
    const Topology h100 = topology_preset("h100");
    auto run = [](int experts, int top_k, int ep, int gpus) {
        RunConfig c;
        c.model = "d12", c.experts = experts, c.top_k = top_k, c.ep = ep, c.batch_size = 8, c.seq_len = 1024;
        c.total_batch_tokens = (long long)gpus * 8 * 1024;
        resolve_run_config(c, gpus, nullptr);
        return c;
    };
    const RunConfig dense = run(0, 2, 1, 8);
    const StepEstimate d = estimate_run(dense, h100);
    const double n = 8 * 1024, C = 768, L = 12, mlp = 8 * C * C;
    const double rate = 989e12 * h100.matmul_efficiency;  // d12's products at B 8 are FLOP-bound
    // One expert, top 1: the dense model plus the router's product (forward and backward: 3 x 2 n C).
    const StepEstimate one = estimate_run(run(1, 1, 1, 8), h100);
    CHECK(one.compute_s == Approx(d.compute_s + L * 3 * 2 * n * C * 1 / rate).epsilon(1e-9));
    // 8 experts, top 2: each token's MLP (and its GELU, a pass over 4C bf16 values read and written)
    // runs twice, and the router is 8 wide.
    const StepEstimate top2 = estimate_run(run(8, 2, 1, 8), h100);
    const double gelu_s = 2 * 2 * n * 4 * C / (h100.hbm_gbps * 1e9 * h100.memory_efficiency);
    CHECK(top2.compute_s ==
          Approx(d.compute_s + L * 3 * ((2 * n * mlp + 2 * n * C * 8) / rate + gelu_s)).epsilon(1e-9));
    CHECK(top2.ep_exposed_s == 0);
    // ep 2 inside a node: the same products, and 4 all-to-alls of the top-2 rows per layer and micro-batch.
    const RunConfig ep2 = run(8, 2, 2, 8);
    const StepEstimate e2 = estimate_run(ep2, h100);
    CHECK(e2.compute_s == Approx(top2.compute_s).epsilon(0.01));
    const double a2a = all_to_all_s(2 * 2 * n * C, 2, {h100.nvlink_gbps, h100.nvlink_latency_s, false});
    CHECK(e2.ep_exposed_s == Approx(ep2.grad_accum_steps * L * 4 * a2a).epsilon(1e-9));
    // ep 16 crosses nodes: the network's all-to-all costs more.
    const StepEstimate e16 = estimate_run(run(16, 2, 16, 16), h100);
    CHECK(e16.ep_exposed_s > 2 * e2.ep_exposed_s);
    // ZeRO-1: a rank's slice of the experts' optimizer state is over dp / ep ranks: ep 2 keeps more.
    RunConfig z1 = run(8, 2, 1, 8), z1_ep2 = run(8, 2, 2, 8);
    z1.zero_stage = z1_ep2.zero_stage = 1;
    CHECK(estimate_run(z1_ep2, h100).optimizer_s > estimate_run(z1, h100).optimizer_s);
    // The report and the JSON name the expert group.
    CHECK_THAT(step_report(ep2, h100, e2), Contains("ep "));
    CHECK(step_json(ep2, h100, e2, 0)["layout"]["ep"] == 2);
    CHECK(step_json(ep2, h100, e2, 0)["breakdown_s"]["ep_exposed"] == Approx(e2.ep_exposed_s));
}
