// Pipeline schedules without a model (llmc/dist/pipeline_schedule.h): the action lists of 1F1B and
// interleaved 1F1B run to the end in a simulation of the ranks' messages, respect every dependency,
// hold as few micro-batches as planned, and idle as little as the bubble formula says.
#include <catch2/catch.hpp>

#include "llmc/ckpt/manifest.h"
#include "llmc/config.h"
#include "llmc/dist/pipeline_schedule.h"
#include "llmc/dist/pipeline_stage.h"
#include "llmc/models/gpt2/params.h"
#include "llmc/planning/planner.h"

using namespace llmc;
using Catch::Matchers::Contains;

TEST_CASE("1F1B: every rank's list, the held micro-batches and the bubble", "[pipeline]") {
    const PipeSchedule s = make_pipeline_schedule(4, 8);
    // rank 0 warms up with 3 forwards, then alternates; rank 3 (the last) alternates from the start
    CHECK(pipeline_schedule_text(s).find("rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7") != std::string::npos);
    CHECK(pipeline_schedule_text(s).find("rank 3: F0 B0 F1 B1") != std::string::npos);
    for (int P : {1, 2, 4}) {
        for (int m : {1, 2, 4, 8, 16}) {
            const PipeSchedule sched = make_pipeline_schedule(P, m);
            const PipeSimulation sim = simulate_pipeline(sched, 1.0, 1.0);
            for (int r = 0; r < P; r++) {
                REQUIRE(sched.ranks[r].size() == 2u * m);
                REQUIRE(sim.peak_in_flight[r] == std::min(P - r, m));  // not all m, as GPipe would
            }
            // equal forward and backward times: idle exactly the formula
            REQUIRE(sim.bubble() == Approx(pipeline_bubble_fraction(P, m)).margin(1e-12));
        }
    }
}

TEST_CASE("interleaved 1F1B: dependencies, fewer idle slots, and its limits", "[pipeline]") {
    for (int P : {2, 4}) {
        for (int V : {2, 3}) {
            for (int m : {P, 2 * P, 4 * P}) {
                const PipeSchedule sched = make_pipeline_schedule(P, m, V);
                const PipeSimulation sim = simulate_pipeline(sched, 1.0, 1.0);
                for (int r = 0; r < P; r++) REQUIRE(sched.ranks[r].size() == 2u * m * V);
                // the interleaved schedule idles less than plain 1F1B on the same pipeline
                const double plain = simulate_pipeline(make_pipeline_schedule(P, m), 1.0, 1.0).bubble();
                REQUIRE(sim.bubble() < plain);
                // and holds at most its warm-up plus one chunk-micro-batch
                for (int r = 0; r < P; r++) REQUIRE(sim.peak_in_flight[r] <= std::min((P - 1 - r) * 2 + (V - 1) * P, m * V) + 1);
            }
        }
    }
    REQUIRE_THROWS_WITH(make_pipeline_schedule(4, 6, 2), Contains("multiple of --pp (4)"));
    REQUIRE_THROWS_WITH(make_pipeline_schedule(0, 4), Contains("--pp must be at least 1"));
}

TEST_CASE("the head's backward directly follows its forward on the last rank (the CUDA model relies on it)",
          "[pipeline]") {
    for (int P : {1, 2, 4})
        for (int V : {1, 2, 3})
            for (int m : {P, 2 * P, 3 * P}) {
                if (V > 1 && P == 1) continue;
                const PipeSchedule s = make_pipeline_schedule(P, m, V);
                for (int r = 0; r < P; r++) REQUIRE(head_backward_follows_forward(s, r));
            }
    // a last rank that runs two heads' forwards before their backwards fails the check
    PipeSchedule s = make_pipeline_schedule(2, 4);
    std::swap(s.ranks[1][1], s.ranks[1][2]);  // F0 B0 F1 -> F0 F1 B0
    REQUIRE_FALSE(head_backward_follows_forward(s, 1));
    REQUIRE(head_backward_follows_forward(s, 0));  // no head on rank 0
}

TEST_CASE("the tied embedding's gradient is summed between the first and the last stage only", "[pipeline]") {
    const PipelineSplit four = make_pipeline_split(8, 4, 1);
    CHECK(four.last_rank() == 3);
    CHECK(four.tied_embedding_peer(0) == 3);
    CHECK(four.tied_embedding_peer(3) == 0);
    CHECK(four.tied_embedding_peer(1) == -1);
    CHECK(four.tied_embedding_peer(2) == -1);
    const PipelineSplit interleaved = make_pipeline_split(8, 2, 2);  // virtual stage 3 on rank 1
    CHECK(interleaved.tied_embedding_peer(0) == 1);
    CHECK(interleaved.tied_embedding_peer(1) == 0);
    CHECK(make_pipeline_split(8, 1, 1).tied_embedding_peer(0) == -1);  // one rank holds both
}

TEST_CASE("per-edge links: each edge's split has exactly its two ranks, and every send meets its receive",
          "[pipeline]") {
    for (int P : {2, 3, 4, 8}) {
        for (int e = 0; e < 2 * P; e++) {
            const PipelineEdge x = pipeline_edge(e, P);
            REQUIRE(x.sender == e / 2);
            REQUIRE(x.receiver == (x.activations ? (x.sender + 1) % P : (x.sender + P - 1) % P));
            // the ranks that pass colour e are the edge's two; every other rank's colour is its own
            std::vector<int> colours;
            for (int r = 0; r < P; r++) colours.push_back(pipeline_edge_color(e, P, r));
            for (int r = 0; r < P; r++) {
                const bool member = r == x.sender || r == x.receiver;
                REQUIRE((colours[r] == e) == member);
                for (int q = 0; q < P; q++)
                    if (q != r && !member) REQUIRE(colours[q] != colours[r]);
            }
        }
        // each rank sends activations to the next and gradients to the previous on its own edges,
        // and receives each on the sender's edge
        for (int r = 0; r < P; r++) {
            int sends = 0, receives = 0;
            for (int e = 0; e < 2 * P; e++) {
                const PipelineEdge x = pipeline_edge(e, P);
                sends += x.sender == r;
                receives += x.receiver == r;
            }
            REQUIRE(sends == 2);
            REQUIRE(receives == 2);
        }
    }
}

TEST_CASE("the simulation catches a schedule that would hang or skip work", "[pipeline]") {
    PipeSchedule s = make_pipeline_schedule(2, 2);
    // rank 0 starting with a backward, whose gradient needs forwards it has not run
    std::swap(s.ranks[0][0], s.ranks[0][3]);
    REQUIRE_THROWS_WITH(simulate_pipeline(s), Contains("deadlock"));
    PipeSchedule missing = make_pipeline_schedule(2, 2);
    missing.ranks[0].pop_back();  // the first stage's last backward: nobody waits for it
    REQUIRE_THROWS_WITH(simulate_pipeline(missing), Contains("never runs"));
}

TEST_CASE("the layer split: even by default, --pp-layers, and its errors", "[pipeline]") {
    PipelineSplit even = make_pipeline_split(12, 4, 1);
    CHECK(even.layers == std::vector<int>{3, 3, 3, 3});
    // The spare layers go to the stages after the first, which also runs the embedding.
    PipelineSplit spare = make_pipeline_split(10, 4, 1);
    CHECK(spare.layers == std::vector<int>{2, 3, 3, 2});
    CHECK(spare.first_layer(2) == 5);
    // Interleaved: rank r holds virtual stages r, r + P, ...
    PipelineSplit inter = make_pipeline_split(8, 2, 2, "1,3,2,2");
    CHECK(inter.rank_layers(0) == std::vector<int>{0, 4, 5});
    CHECK(inter.rank_layers(1) == std::vector<int>{1, 2, 3, 6, 7});
    CHECK(inter.holds_first(0));
    CHECK(inter.holds_last(1));
    CHECK(!inter.holds_last(0));
    CHECK(inter.describe() == "1,3,2,2");
    CHECK_THROWS_WITH(make_pipeline_split(4, 4, 2), Catch::Contains("8 virtual stages, more than the model's 4 layers"));
    CHECK_THROWS_WITH(make_pipeline_split(8, 2, 1, "3,4"), Catch::Contains("adds up to 7 layers but the model has 8"));
    CHECK_THROWS_WITH(make_pipeline_split(8, 2, 1, "4,3,1"), Catch::Contains("names 3 stage(s)"));
    CHECK_THROWS_WITH(make_pipeline_split(8, 2, 1, "4,x"), Catch::Contains("'x' is not a layer count"));
    CHECK_THROWS_WITH(make_pipeline_split(8, 2, 1, "8,0"), Catch::Contains("'0' is not a layer count"));
}

TEST_CASE("activation slots: 1F1B holds P - r micro-batches, interleaved more", "[pipeline]") {
    for (int P : {2, 4})
        for (int m : {1, 2, 8}) {
            const PipeSchedule s = make_pipeline_schedule(P, m);
            for (int r = 0; r < P; r++) CHECK(pipeline_activation_slots(s, r) == std::min(P - r, m));
        }
    // Interleaved: a micro-batch's slot is held from its chunk-0 forward to its chunk-0 backward.
    const PipeSchedule s = make_pipeline_schedule(2, 4, 2);
    CHECK(pipeline_activation_slots(s, 0) == 4);
    CHECK(pipeline_activation_slots(s, 1) == 3);
}

TEST_CASE("stage layouts: each stage's layers, the tied embedding's copy, whole <-> pieces", "[pipeline]") {
    ModelConfig c;
    c.num_layers = 6;
    c.num_heads = 2;
    c.channels = 8;
    c.vocab_size = 30;
    c.padded_vocab_size = 32;
    c.max_seq_len = 8;
    using P = GPT2Params;
    const ParamLayout whole = P::layout(c);
    std::vector<float> w(whole.num_params);
    for (size_t i = 0; i < w.size(); i++) w[i] = 1.0f + (float)i;
    for (int tp : {1, 2}) {
        const PipelineSplit split = make_pipeline_split(6, 2, 2);  // virtual stages of 2,1,2,1... as even as it goes
        std::vector<float> rebuilt(w.size(), 0.0f);
        std::vector<int> primaries(w.size(), 0);
        for (int r = 0; r < 2; r++)
            for (int t = 0; t < tp; t++) {
                const ParamLayout piece = P::layout(c, {t, tp}, P::stage_slice(split, r));
                CHECK(piece.num_layers() == (int)split.rank_layers(r).size());
                CHECK(piece.global_layer(piece.num_layers() - 1) == split.rank_layers(r).back());
                CHECK(piece.holds(P::WTE));  // rank 0 embeds, rank 1 (the last virtual stage) runs the head
                CHECK(piece.holds(P::LNFW) == (r == 1));
                CHECK(piece.is_stage_copy(P::WTE) == (r == 1));
                std::vector<float> local(piece.num_params);
                copy_between_layouts(whole, w.data(), piece, local.data(), true);
                std::vector<float> mine(w.size(), 0.0f);
                copy_between_layouts(whole, mine.data(), piece, local.data(), false, /*primary_only=*/true);
                for (size_t i = 0; i < w.size(); i++)
                    if (mine[i] != 0.0f) {
                        rebuilt[i] += mine[i];
                        primaries[i]++;
                    }
                // The checkpoint's description of the pieces names global positions: layer l of a
                // per-layer tensor sits at l x its size in the tensor.
                for (const TensorPiece& tp_piece : tensor_pieces(piece, {0, piece.num_params}))
                    if (piece.is_per_layer(tp_piece.tensor) && !piece.is_split(tp_piece.tensor))
                        CHECK(w[whole.offset(tp_piece.tensor, (int)(tp_piece.begin / piece.global_tensor_size(tp_piece.tensor)))] ==
                              local[tp_piece.flat_begin - tp_piece.begin % piece.global_tensor_size(tp_piece.tensor)]);
            }
        CHECK(rebuilt == w);  // every element from exactly one (stage, tensor rank)
        CHECK(std::all_of(primaries.begin(), primaries.end(), [](int n) { return n == 1; }));
    }
    CHECK_THROWS_WITH(P::layout(c, {}, P::stage_slice(make_pipeline_split(6, 2, 1), 0)).file_offset(P::WTE),
                      Catch::Contains("file offsets are for a whole-model layout"));
    CHECK_THROWS_WITH(P::layout(c, {}, P::stage_slice(make_pipeline_split(6, 3, 1), 1)).bucket_of(P::WTE),
                      Catch::Contains("does not hold wte"));
}

// The tensor-parallel bytes --plan gives every rank of the job, summed: the same work (model,
// tokens per step, tp) over 8 ranks, cut into `pp` stages of `virtual_stages` chunks each.
static double job_tensor_parallel_bytes(int pp, int virtual_stages, int sequence_parallel) {
    RunConfig cfg;
    cfg.model = "d12";
    cfg.batch_size = 4;
    cfg.seq_len = 64;
    cfg.total_batch_tokens = 4 * 64 * 8;
    cfg.tp = 2;
    cfg.sequence_parallel = sequence_parallel;
    cfg.pp = pp;
    cfg.pp_virtual = virtual_stages;
    if (virtual_stages > 1) cfg.pp_schedule = "interleaved";
    resolve_run_config(cfg, 8, nullptr);
    double job = 0;
    for (int stage = 0; stage < pp; stage++) {
        const ParamLayout layout = GPT2Params::layout(cfg.model_config, {0, cfg.dims.tp},
                                                      GPT2Params::stage_slice(pipeline_split(cfg), stage));
        const ZeroPlan zero(layout, cfg.zero_stage, 0, cfg.dims.dp);
        job += plan_memory(cfg, zero, {}, FP32_PARAMETERS, stage).tp_comm_bytes_per_rank * cfg.dims.dp * cfg.dims.tp;
    }
    return job;
}

TEST_CASE("--plan counts each stage's own layers' tensor-parallel traffic: the job's total does not depend on --pp",
          "[pipeline][plan]") {
    for (int sp : {1, 0}) {
        const double whole = job_tensor_parallel_bytes(1, 1, sp);
        REQUIRE(whole > 0);
        CHECK(job_tensor_parallel_bytes(2, 1, sp) == Approx(whole));
        CHECK(job_tensor_parallel_bytes(4, 1, sp) == Approx(whole));
        CHECK(job_tensor_parallel_bytes(2, 2, sp) == Approx(whole));  // interleaved: each rank's chunks
    }
}
