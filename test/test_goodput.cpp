// The goodput model (goodput.h): its shares add up, it finds Young's interval, the single writer's
// waits count, the intervals it recommends are the best a simulation finds, and the simulation of
// the same run agrees with it from a cluster like Llama 3's to one that fails every few minutes.
#include <catch2/catch.hpp>

#include <cmath>

#include "llmc/planning/step_plan.h"

using namespace llmc;
using Catch::Contains;

namespace {

// A run on 1,024 GPUs as --plan predicts a 70B model's (step 4 s), and ones that fail far more often.
struct Case {
    const char* name;
    FailureModel f;
    CheckpointCosts c;
};
const Case kCases[] = {
    {"1,024 GPUs, Llama 3's failure rate", {kLlama3FailuresPerGpuHour, 1024, 600, 0.9}, {3.97, 0.014, 0.018, 7.0, 0.03, 7.1}},
    {"16,384 GPUs, Llama 3's failure rate", {kLlama3FailuresPerGpuHour, 16384, 600, 0.9}, {1.42, 0.001, 0.0012, 0.47, 0.002, 0.47}},
    {"a failure an hour", {1.0 / 1024, 1024, 600, 0.5}, {2.0, 1.0, 5.0, 60.0, 6.0, 61.0}},
    {"a failure every 15 minutes", {4.0 / 1024, 1024, 300, 0.5}, {2.0, 1.0, 5.0, 60.0, 6.0, 61.0}},
};
constexpr int kFailures = 200000;

}  // namespace

TEST_CASE("the goodput's shares add up to the wall time; without failures only the stalls are lost", "[goodput]") {
    for (const Case& k : kCases)
        for (Intervals iv : {Intervals{0, 50}, Intervals{10, 50}, Intervals{1, 1}}) {
            const Goodput g = expected_goodput(k.f, k.c, iv);
            CAPTURE(k.name, iv.local_every, iv.shared_every);
            CHECK(g.effective + g.checkpoint + g.rework + g.restart == Approx(1));
            CHECK(g.effective > 0);
        }
    FailureModel never = kCases[0].f;
    never.failures_per_gpu_hour = 1e-15;
    const CheckpointCosts& c = kCases[2].c;  // copy 1 s; local write 5 s; shared 60 s
    // every 10 steps (20 s): the copy, and no wait; the shared write (5 + 60 s) delays the next snapshot 45 s
    const Goodput g = expected_goodput(never, c, {10, 100});
    CHECK(g.effective == Approx(1 / (1 + 1.0 / 20 + 45.0 / 200)).epsilon(1e-6));
    CHECK(g.rework + g.restart < 1e-9);
}

TEST_CASE("with one tier and stalls only, the best interval is Young's sqrt(2 x stall x MTBF)", "[goodput]") {
    const FailureModel f{0.1, 1, 0, 0};  // a failure every 10 hours, restarts free
    CheckpointCosts c;
    c.step_s = 1, c.copy_s = 10;
    long long argmax = 1;
    for (long long n = 1; n < 5000; n++)
        if (expected_goodput(f, c, {0, n}).effective > expected_goodput(f, c, {0, argmax}).effective) argmax = n;
    const double young = std::sqrt(2 * c.copy_s * f.mtbf_s());
    CHECK(argmax == Approx(young).epsilon(0.02));
    // the recommendation: the longest interval within kGoodputTolerance of the best
    const Intervals pick = best_intervals(f, c, false);
    CHECK(pick.shared_every > argmax);
    const double best = expected_goodput(f, c, {0, argmax}).effective;
    CHECK(expected_goodput(f, c, pick).effective >= best - kGoodputTolerance);
    CHECK(expected_goodput(f, c, {0, (long long)(pick.shared_every * 1.1)}).effective < best - kGoodputTolerance);
}

TEST_CASE("the simulated run keeps what the model expects, from Llama 3's failure rate to one every 15 minutes", "[goodput]") {
    for (const Case& k : kCases)
        for (bool local_tier : {true, false}) {
            const Intervals iv = best_intervals(k.f, k.c, local_tier);
            const double expected = expected_goodput(k.f, k.c, iv).effective;
            const double simulated = simulate_goodput(k.f, k.c, iv, kFailures, 7);
            CAPTURE(k.name, local_tier, iv.local_every, iv.shared_every, expected, simulated);
            CHECK(std::abs(simulated - expected) < 0.002);
            // the simulation sees what the model sees: halving the shared interval of a run that
            // must restart from it costs what the model says it does
            const Intervals shorter{iv.local_every, std::max(std::max(1LL, iv.local_every), iv.shared_every / 2)};
            const double change = expected_goodput(k.f, k.c, shorter).effective - expected;
            CHECK(simulate_goodput(k.f, k.c, shorter, kFailures, 7) - simulated == Approx(change).margin(0.002));
        }
}

TEST_CASE("no interval the simulation tries beats the recommended ones by more than the tolerance", "[goodput]") {
    for (const Case& k : kCases) {
        const Intervals best = best_intervals(k.f, k.c, true);
        const double at_best = simulate_goodput(k.f, k.c, best, kFailures, 11);
        for (double local_scale : {0.25, 0.5, 1.0, 2.0, 4.0})
            for (long long shared_scale : {1, 2, 4, 8}) {
                const long long local = std::max(1LL, (long long)std::lround(best.local_every * local_scale));
                const Intervals other{local, local * std::max(1LL, best.shared_every / best.local_every * shared_scale / 4)};
                CAPTURE(k.name, best.local_every, best.shared_every, other.local_every, other.shared_every);
                CHECK(simulate_goodput(k.f, k.c, other, kFailures, 11) <= at_best + kGoodputTolerance + 0.001);
            }
    }
}

TEST_CASE("the local tier pays where restarts from shared storage are slow and failures frequent", "[goodput]") {
    const Case& k = kCases[3];  // a failure every 15 minutes, 61 s to restore from shared storage
    const Goodput with_local = expected_goodput(k.f, k.c, best_intervals(k.f, k.c, true));
    const Goodput shared_only = expected_goodput(k.f, k.c, best_intervals(k.f, k.c, false));
    CHECK(with_local.effective > shared_only.effective + 0.01);
}

TEST_CASE("--plan's goodput: checkpoint costs from the rank's bytes and the cluster, and its report", "[goodput]") {
    RunConfig c;
    c.model = "d12", c.seq_len = 1024, c.batch_size = 4, c.total_batch_tokens = 64 * 4 * 1024;
    resolve_run_config(c, 64, nullptr);
    const Topology t = topology_preset("h100");
    const double bytes = 2e9;
    const CheckpointCosts k = checkpoint_costs(c, t, 0.5, bytes);
    CHECK(k.copy_s == Approx(bytes / 64e9));          // PCIe Gen5, one direction
    CHECK(k.local_write_s == Approx(bytes / 50e9));   // the replica, over the node's NICs
    CHECK(k.shared_write_s == Approx(8 * bytes / 1e9));  // 8 ranks of a node at 1 GB/s per node
    const GoodputPlan g = plan_goodput(c, t, 0.5, bytes);
    CHECK(g.failures.mtbf_s() == Approx(3600 / (kLlama3FailuresPerGpuHour * 64)));
    CHECK(g.best.shared_every % g.best.local_every == 0);
    CHECK(std::abs(g.simulated - g.expected.effective) < 0.002);
    const std::string report = goodput_report(c, g);
    CHECK_THAT(report, Contains(strformat("--local-ckpt-every %lld -n %lld", g.best.local_every, g.best.shared_every)));
    CHECK_THAT(report, Contains("effective training time"));
    const nlohmann::json j = goodput_json(g);
    CHECK(j["checkpoint_every"] == g.best.shared_every);
    CHECK(j["effective"].get<double>() == Approx(g.expected.effective));
}

TEST_CASE("the goodput flags refuse values that mean nothing", "[goodput]") {
    auto check = [](const char* flag, const char* value, const char* message) {
        RunConfig c;
        const char* args[] = {"train_gpt", flag, value};
        REQUIRE(parse_run_args(c, 3, args));
        CHECK_THROWS_WITH(resolve_run_config(c, 1, nullptr), Contains(message));
    };
    check("--failure-rate", "0", "--failure-rate must be a positive number");
    check("--restart-s", "-1", "--restart-s must be a number of seconds >= 0");
    check("--storage-gbps", "0", "--storage-gbps must be a positive bandwidth");
    check("--local-recovers", "1.5", "--local-recovers must be a share between 0 and 1");
}
