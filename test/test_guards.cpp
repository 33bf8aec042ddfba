// Tests for llmc/failures/guards.h (the z-score window of -sl / -sg, who diverges among replicas' parameter
// fingerprints) and for the once-per-process firing of the faults an in-process rollback replays.
#include <catch2/catch.hpp>

#include <cmath>

#include "llmc/failures/faults.h"
#include "llmc/failures/guards.h"

using namespace llmc;

TEST_CASE("guards: the z-score window says nothing before min_count values, then z against the window",
          "[guards]") {
    ZScoreWindow w(4, 3);
    REQUIRE(!w.zscore(1.0));
    w.push(1.0);
    w.push(3.0);
    REQUIRE(!w.zscore(10.0));  // 2 < min_count
    REQUIRE(!w.is_outlier(1e9, 1.0));
    w.push(2.0);                            // mean 2, population stddev sqrt(2/3)
    REQUIRE(w.zscore(2.0).value() == Approx(0.0));
    REQUIRE(w.zscore(3.0).value() == Approx(1.0 / std::sqrt(2.0 / 3.0)));
    REQUIRE(w.zscore(1.0).value() == Approx(-1.0 / std::sqrt(2.0 / 3.0)));
    REQUIRE(w.is_outlier(3.0, 1.0));
    REQUIRE(!w.is_outlier(3.0, 1.5));
    REQUIRE(!w.is_outlier(1.0, 1.0));  // only outliers above the window skip
    REQUIRE(!w.is_outlier(100.0, 0.0));  // threshold 0: off
}

TEST_CASE("guards: the window slides, keeps out non-finite values and ignores a constant history", "[guards]") {
    ZScoreWindow w(3, 2);
    w.push(5.0);
    w.push(5.0);
    REQUIRE(!w.zscore(6.0));  // stddev 0: no z-score, no skip
    w.push(NAN);
    w.push(INFINITY);
    REQUIRE(w.size() == 2);
    w.push(7.0);  // 5 5 7
    w.push(9.0);  // 5 7 9: the first 5 slid out
    REQUIRE(w.size() == 3);
    REQUIRE(w.zscore(7.0).value() == Approx(0.0));
    REQUIRE(!w.zscore(NAN));
}

TEST_CASE("guards: a loss spike over a noisy history is an outlier; the history's own values are not", "[guards]") {
    ZScoreWindow w;  // the defaults: 100 values, acting from 20
    for (int i = 0; i < 19; i++) w.push(3.0 + 0.01 * (i % 5));
    REQUIRE(!w.is_outlier(30.0, 5.0));  // 19 values: not yet
    w.push(3.02);
    REQUIRE(w.is_outlier(30.0, 5.0));
    REQUIRE(!w.is_outlier(3.03, 5.0));
    for (int i = 0; i < 200; i++) w.push(3.0 + 0.01 * (i % 5));
    REQUIRE(w.size() == ZScoreWindow::DEFAULT_WINDOW);
}

TEST_CASE("guards: diverging replicas are the minority; two that disagree have no majority", "[guards]") {
    bool no_majority = true;
    REQUIRE(diverging_replicas({7, 7, 7}, &no_majority).empty());
    REQUIRE(!no_majority);
    REQUIRE(diverging_replicas({7}).empty());
    REQUIRE(diverging_replicas({7, 9, 7}, &no_majority) == std::vector<int>{1});
    REQUIRE(!no_majority);
    REQUIRE(diverging_replicas({1, 7, 7, 2}) == std::vector<int>{0, 3});
    REQUIRE(diverging_replicas({7, 9}, &no_majority) == std::vector<int>{0, 1});
    REQUIRE(no_majority);
    REQUIRE(diverging_replicas({7, 9, 9, 7}, &no_majority) == std::vector<int>{0, 1, 2, 3});
    REQUIRE(no_majority);
}

TEST_CASE("faults: fire() strikes once per entry, so a replayed step meets a fault again only if listed twice",
          "[faults]") {
    FaultPlan plan;
    plan.add("nan_grad@5:1,flip_bit@7:1,flip_bit@7:1", "test");
    REQUIRE(!plan.fire("nan_grad", 5, 0));
    REQUIRE(plan.fire("nan_grad", 5, 1));
    REQUIRE(!plan.fire("nan_grad", 5, 1));
    REQUIRE(plan.at("nan_grad", 5, 1));  // at() stays a pure query
    REQUIRE(plan.fire("flip_bit", 7, 1));
    REQUIRE(plan.fire("flip_bit", 7, 1));
    REQUIRE(!plan.fire("flip_bit", 7, 1));
}
