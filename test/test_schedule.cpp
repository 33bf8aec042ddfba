// Learning-rate schedules: warmup, then cosine, linear, constant or warmup-stable-decay.
#include <catch2/catch.hpp>

#include "llmc/training/schedule.h"

using namespace llmc;
using Catch::Contains;

namespace {
LrSchedule make(LrScheduleKind kind, int warmup = 10, int total = 111) {
    LrSchedule s;
    s.kind = kind;
    s.max_lr = 1.0f;
    s.warmup_steps = warmup;
    s.total_steps = total;
    s.final_lr_frac = 0.1f;
    s.wsd_decay_frac = 0.2f;
    return s;
}
}  // namespace

TEST_CASE("warmup rises linearly to the peak at the last warmup step", "[schedule]") {
    for (auto kind : {LrScheduleKind::Cosine, LrScheduleKind::Linear, LrScheduleKind::Constant, LrScheduleKind::Wsd}) {
        LrSchedule s = make(kind);
        CHECK(s.lr_at(0) == Approx(0.1f));
        CHECK(s.lr_at(4) == Approx(0.5f));
        CHECK(s.lr_at(9) == Approx(1.0f));
    }
}

TEST_CASE("cosine decays from the peak to final_lr_frac at the last step", "[schedule]") {
    LrSchedule s = make(LrScheduleKind::Cosine);
    CHECK(s.lr_at(10) == Approx(1.0f));
    CHECK(s.lr_at(60) == Approx(0.55f));  // halfway: the mean of peak and floor
    CHECK(s.lr_at(110) == Approx(0.1f));  // 100 decay steps after warmup: 10..110
    for (int step = 11; step <= 110; step++) CHECK(s.lr_at(step) < s.lr_at(step - 1));
}

TEST_CASE("linear decays in equal steps to final_lr_frac", "[schedule]") {
    LrSchedule s = make(LrScheduleKind::Linear);
    CHECK(s.lr_at(10) == Approx(1.0f));
    CHECK(s.lr_at(35) == Approx(0.775f));
    CHECK(s.lr_at(110) == Approx(0.1f));
}

TEST_CASE("constant stays at the peak after warmup", "[schedule]") {
    LrSchedule s = make(LrScheduleKind::Constant);
    for (int step = 10; step <= 110; step++) CHECK(s.lr_at(step) == 1.0f);
}

TEST_CASE("wsd holds the peak, then cools down over the last decay_frac of the steps", "[schedule]") {
    LrSchedule s = make(LrScheduleKind::Wsd, 10, 110);  // 110 steps, 22 of cooldown starting at step 88
    CHECK(s.lr_at(87) == 1.0f);
    CHECK(s.lr_at(88) == Approx(1.0f));
    CHECK(s.lr_at(109) == Approx(0.1f));
    CHECK(s.lr_at(88 + 21 / 4) < 1.0f);
    // 1 - sqrt cooldown: a quarter of the way through, half of the drop is already done
    LrSchedule q = make(LrScheduleKind::Wsd, 0, 105);  // cooldown of 21 steps: 84..104, p = (step-84)/20
    CHECK(q.lr_at(89) == Approx(0.1f + 0.9f * 0.5f));
}

TEST_CASE("schedule names parse, unknown names are errors", "[schedule]") {
    CHECK(parse_lr_schedule("cosine") == LrScheduleKind::Cosine);
    CHECK(parse_lr_schedule("wsd") == LrScheduleKind::Wsd);
    REQUIRE_THROWS_WITH(parse_lr_schedule("exp"), Contains("unknown learning-rate schedule 'exp'"));
}
