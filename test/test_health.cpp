// Tests for llmc/failures/health.h: the median and the straggler rule (the start-up check and the per-step
// times under mpirun are in test/mpi/run_supervisor_tests.sh).
#include <catch2/catch.hpp>

#include "llmc/failures/health.h"

using namespace llmc;

TEST_CASE("health: the lower median and the straggler rule", "[health]") {
    REQUIRE(lower_median({}) == 0);
    REQUIRE(lower_median({5}) == 5);
    REQUIRE(lower_median({30, 10}) == 10);  // even count: the lower of the middle two
    REQUIRE(lower_median({4, 1, 3, 2}) == 2);
    REQUIRE(lower_median({3, 1, 2}) == 2);

    // Two ranks: the slower one is compared with the faster.
    REQUIRE(find_stragglers({10, 310}, 2.0) == std::vector<int>{1});
    REQUIRE(find_stragglers({310, 10}, 2.0) == std::vector<int>{0});
    // Over the factor but within the noise floor: not named.
    REQUIRE(find_stragglers({0.2, 1.5}, 2.0).empty());
    // Under the factor: not named; factor 0 or one rank: no check.
    REQUIRE(find_stragglers({10, 19, 12, 11}, 2.0).empty());
    REQUIRE(find_stragglers({10, 500}, 0).empty());
    REQUIRE(find_stragglers({500}, 2.0).empty());
    REQUIRE(find_stragglers({10, 50, 11, 60, 12}, 2.0) == std::vector<int>{1, 3});
}

TEST_CASE("health: one rank has nothing to compare and skips the check", "[health]") {
    RunConfig cfg;
    cfg.straggler_action = "refuse";
    CHECK(health_check(cfg, local_communicator()) == cfg.straggler_factor);  // does not throw, prints nothing
    REQUIRE(time_matmul_ms(0, 64) >= 0);
}

TEST_CASE("health: a host with more ranks than CPUs among them is named as oversubscribed", "[health]") {
    CHECK(crowded_hosts({"a 0", "a 1"}) == "");                  // bound to a CPU each
    CHECK(crowded_hosts({"a 0,1", "a 0,1"}) == "");              // two ranks free on two CPUs
    CHECK(crowded_hosts({"a 0", "b 0", "c 0"}) == "");           // one rank per host
    CHECK(crowded_hosts({"a 0,1", "a 0,1", "a 0,1"}) == "a: 3 ranks on 2 CPU(s)");
    CHECK(crowded_hosts({"a 0", "a 0", "b 0", "b 1"}) == "a: 2 ranks on 1 CPU(s)");
    CHECK(crowded_hosts({"a 0", "a 0", "b 3", "b 3"}) == "a: 2 ranks on 1 CPU(s); b: 2 ranks on 1 CPU(s)");
    const std::string mine = host_and_cpus();
    CHECK(mine.find(' ') != std::string::npos);
    CHECK(crowded_hosts({mine}) == "");
}
