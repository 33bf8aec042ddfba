// Pipeline schedules without a model (llmc/dist/pipeline_schedule.h): the action lists of 1F1B and
// interleaved 1F1B run to the end in a simulation of the ranks' messages, respect every dependency,
// hold as few micro-batches as planned, and idle as little as the bubble formula says.
#include <catch2/catch.hpp>

#include "llmc/dist/pipeline_schedule.h"

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

TEST_CASE("the simulation catches a schedule that would hang or skip work", "[pipeline]") {
    PipeSchedule s = make_pipeline_schedule(2, 2);
    // rank 0 starting with a backward, whose gradient needs forwards it has not run
    std::swap(s.ranks[0][0], s.ranks[0][3]);
    REQUIRE_THROWS_WITH(simulate_pipeline(s), Contains("deadlock"));
    PipeSchedule missing = make_pipeline_schedule(2, 2);
    missing.ranks[0].pop_back();  // the first stage's last backward: nobody waits for it
    REQUIRE_THROWS_WITH(simulate_pipeline(missing), Contains("never runs"));
}
