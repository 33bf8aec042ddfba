// bench_train_step --best's sweep (dev/bench/batch_sweep.h): which micro-batches and recomputation
// levels it tries, when it stops, and which one wins, against a pretend GPU.
#include <catch2/catch.hpp>

#include <map>
#include <utility>

#include "dev/bench/batch_sweep.h"

using namespace llmc;

namespace {

// A pretend GPU: B fits at -r r up to largest[r]; tokens/s grows with B by `speed` and falls 10% a
// level of recomputation; each try takes B / 8 seconds.
struct PretendGpu {
    int largest[4] = {16, 32, 64, 128};
    double (*speed)(int B) = [](int B) { return 1000.0 * B; };
    std::vector<std::pair<int, int>> tried;

    MeasureTrial measure() {
        return [this](int B, int r) {
            tried.emplace_back(B, r);
            TrialMeasure m;
            m.seconds = B / 8.0;
            if (B > largest[r]) return m;
            m.fits = true;
            m.tokens_per_s = speed(B) * (1 - 0.1 * r);
            return m;
        };
    }
};

using Tries = std::vector<std::pair<int, int>>;

}  // namespace

TEST_CASE("each batch is tried at the lowest recomputation that fits it, up to the first -r 3 cannot fit",
          "[bench]") {
    PretendGpu gpu;
    SweepLimits limits;
    limits.min_B = 4;
    const SweepResult sweep = sweep_batch_and_recompute(limits, gpu.measure());
    CHECK(gpu.tried == Tries{{4, 0}, {8, 0}, {16, 0}, {32, 0}, {32, 1}, {64, 1}, {64, 2}, {128, 2}, {128, 3},
                             {256, 3}});
    CHECK(sweep.end == SweepEnd::Exhausted);
    REQUIRE(sweep.trials.size() == gpu.tried.size());
    CHECK_FALSE(sweep.trials.back().measure.fits);
    const auto best = fastest(sweep.trials);
    REQUIRE(best);
    CHECK(best->B == 128);
    CHECK(best->recompute == 3);
}

TEST_CASE("no recomputation is tried when every batch up to max_B fits without it", "[bench]") {
    PretendGpu gpu;
    gpu.largest[0] = 1 << 20;
    SweepLimits limits;
    limits.min_B = 8, limits.max_B = 64;
    const SweepResult sweep = sweep_batch_and_recompute(limits, gpu.measure());
    CHECK(gpu.tried == Tries{{8, 0}, {16, 0}, {32, 0}, {64, 0}});
    CHECK(sweep.end == SweepEnd::Exhausted);
}

TEST_CASE("a level that fits no larger batch passes the batch on to the next level", "[bench]") {
    PretendGpu gpu;
    gpu.largest[1] = 16;  // -r 1 saves too little for B 32
    SweepLimits limits;
    limits.min_B = 16;
    sweep_batch_and_recompute(limits, gpu.measure());
    CHECK(gpu.tried == Tries{{16, 0}, {32, 0}, {32, 1}, {32, 2}, {64, 2}, {128, 2}, {128, 3}, {256, 3}});
}

TEST_CASE("when nothing fits the sweep tries min_B at every level and has no winner", "[bench]") {
    PretendGpu gpu;
    for (int& b : gpu.largest) b = 2;
    SweepLimits limits;
    limits.min_B = 4;
    const SweepResult sweep = sweep_batch_and_recompute(limits, gpu.measure());
    CHECK(gpu.tried == Tries{{4, 0}, {4, 1}, {4, 2}, {4, 3}});
    CHECK_FALSE(fastest(sweep.trials));
}

TEST_CASE("a doubled batch that gains less than min_gain ends the sweep; the fastest so far wins", "[bench]") {
    PretendGpu gpu;
    gpu.speed = [](int B) { return B < 16 ? 1000.0 * B : 16000.0 + B; };  // saturated from B 16
    SweepLimits limits;
    limits.min_B = 4;
    const SweepResult sweep = sweep_batch_and_recompute(limits, gpu.measure());
    CHECK(gpu.tried == Tries{{4, 0}, {8, 0}, {16, 0}, {32, 0}, {32, 1}});  // B 32 needs -r 1, and is slower
    CHECK(sweep.end == SweepEnd::Saturated);
    CHECK(sweep.next.B == 32);
    CHECK(sweep.next.recompute == 1);
    CHECK(fastest(sweep.trials)->B == 16);

    SECTION("min_gain 0 tries every batch that fits") {
        PretendGpu all;
        all.speed = gpu.speed;
        limits.min_gain = 0;
        CHECK(sweep_batch_and_recompute(limits, all.measure()).end == SweepEnd::Exhausted);
        CHECK(all.tried.back() == std::make_pair(256, 3));
    }
}

TEST_CASE("the budget stops before a try predicted to end past it, from the last fitting try's time per batch",
          "[bench]") {
    PretendGpu gpu;  // a try takes B / 8 s: 0.5, 1, 2, 4 s for B 4..32 (B 32 does not fit at -r 0)
    SweepLimits limits;
    limits.min_B = 4;
    limits.budget_s = 7.6;  // 0.5 + 1 + 2 + 4 spent: B 32 -r 1, predicted 4 s, would end at 11.5
    const SweepResult sweep = sweep_batch_and_recompute(limits, gpu.measure());
    CHECK(gpu.tried == Tries{{4, 0}, {8, 0}, {16, 0}, {32, 0}});
    CHECK(sweep.end == SweepEnd::Budget);
    CHECK(sweep.next.B == 32);
    CHECK(sweep.next.recompute == 1);
    CHECK(fastest(sweep.trials)->B == 16);

    SECTION("the first try runs whatever the budget") {
        PretendGpu first;
        limits.budget_s = 0.01;
        const SweepResult one = sweep_batch_and_recompute(limits, first.measure());
        CHECK(first.tried == Tries{{4, 0}});
        CHECK(one.end == SweepEnd::Budget);
    }
}

TEST_CASE("the fastest trial wins, the first of equals, never one that did not fit", "[bench]") {
    auto trial = [](int B, int r, bool fits, double tokens_per_s) {
        Trial t{B, r, {}};
        t.measure.fits = fits, t.measure.tokens_per_s = tokens_per_s;
        return t;
    };
    const auto best = fastest({trial(4, 0, true, 10), trial(8, 0, true, 30), trial(16, 1, true, 30),
                               trial(16, 0, false, 99)});
    REQUIRE(best);
    CHECK(best->B == 8);
    CHECK(best->recompute == 0);
}
