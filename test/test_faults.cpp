// Tests for llmc/faults.h: the fault list's syntax, matching by step and rank, and its errors.
#include <catch2/catch.hpp>

#include "llmc/faults.h"

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
