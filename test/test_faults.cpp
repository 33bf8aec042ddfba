// Tests for llmc/failures/faults.h: the fault list's syntax, matching by step and rank, and its errors; and
// the refusal of faults that cannot fire in a run (train_loop.h's why_fault_never_fires).
#include <catch2/catch.hpp>

#include "llmc/failures/faults.h"
#include "llmc/train_loop.h"

using namespace llmc;
using Catch::Contains;

TEST_CASE("faults: a list of KIND@STEP[:RANK] matches its step and rank only", "[faults]") {
    FaultPlan plan;
    REQUIRE(plan.empty());
    plan.add("kill@12:1,nan_grad@5,slow@250:3", "test");
    plan.add("", "test");
    REQUIRE(!plan.empty());
    REQUIRE(plan.at("kill", 12, 1));
    REQUIRE(!plan.at("kill", 12, 0));
    REQUIRE(!plan.at("kill", 11, 1));
    REQUIRE(plan.at("nan_grad", 5, 0));  // no rank: every rank
    REQUIRE(plan.at("nan_grad", 5, 7));
    REQUIRE(!plan.at("hang", 5, 0));
    REQUIRE(plan.value("slow", 3) == 250);
    REQUIRE(plan.value("slow", 2) == 0);
}

TEST_CASE("faults: a malformed list is an error naming its source and the item", "[faults]") {
    FaultPlan plan;
    REQUIRE_THROWS_WITH(plan.add("kill", "--faults"), Contains("--faults: fault 'kill' has no '@'"));
    REQUIRE_THROWS_WITH(plan.add("explode@3", "LLMC_FAULTS"), Contains("LLMC_FAULTS: fault 'explode@3' is of an unknown kind"));
    REQUIRE_THROWS_WITH(plan.add("kill@x", "f"), Contains("has a bad step"));
    REQUIRE_THROWS_WITH(plan.add("kill@3:-1", "f"), Contains("has a bad rank"));
}

TEST_CASE("faults: one that can never fire in the run is refused, naming its source and why", "[faults]") {
    RunConfig cfg;
    cfg.steps = 20;
    cfg.val_every = 5;
    cfg.checkpoint_every = 8;
    cfg.world_size = 2;
    auto refused = [&](const std::string& list, const char* source = "--faults", bool launched = true) {
        FaultPlan plan;
        plan.add(list, source);
        try {
            plan.refuse_unreachable([&](const Fault& f) { return why_fault_never_fires(f, cfg, launched); });
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    // Each can fire: nothing refused.
    CHECK(refused("kill@1:1,hang@20,nan_grad@5:0,flip_bit@7,slow@300:1,nan_val@0,nan_val@15,nan_val@20") == "");
    CHECK(refused("ckpt_fail@8:1,ckpt_pause@16,ckpt_fail@20") == "");  // every -n 8 steps and after the last
    CHECK(refused("slow_init@100:1", "LLMC_FAULTS") == "");
    // The three: past -x, a rank the run does not have, step 0.
    CHECK(refused("nan_grad@500") == "--faults: fault 'nan_grad@500' can never fire in this run: step 500 is not one "
                                     "of the run's steps, 1 to 20 (-x; steps count from 1)");
    CHECK_THAT(refused("kill@3:3"), Contains("fault 'kill@3:3' can never fire in this run: rank 3 does not exist: "
                                             "the run has 2 rank(s), 0 to 1"));
    CHECK_THAT(refused("hang@0"), Contains("step 0 is not one of the run's steps, 1 to 20"));
    CHECK_THAT(refused("nan_val@7", "LLMC_FAULTS"),
               Contains("LLMC_FAULTS: fault 'nan_val@7' can never fire in this run: there is no validation after step 7"));
    CHECK_THAT(refused("ckpt_fail@9:1"), Contains("no checkpoint is written after step 9 (-n 8"));
    CHECK_THAT(refused("slow@0"), Contains("a sleep of 0 ms does nothing"));
    CHECK_THAT(refused("slow_init@100:1"), Contains("slow_init acts before MPI_Init, which runs before the flags are "
                                                    "read: give it in LLMC_FAULTS"));
    CHECK_THAT(refused("slow_init@100", "LLMC_FAULTS", false), Contains("a run that mpirun or srun did not start"));
    // The first of a list that cannot fire is named, after good ones.
    CHECK_THAT(refused("kill@2:1,flip_bit@21:0"), Contains("fault 'flip_bit@21:0'"));
    cfg.val_data.clear();
    CHECK_THAT(refused("nan_val@5"), Contains("and -j is empty"));
}
