// The CPU mixture-of-experts layer (cpu/moe.h) against PyTorch in float64 (dev/ref/make_moe_fixture.py):
// routing, drops, output, both auxiliary losses and every gradient, the router's included, for top-1
// and top-2, dropless and capped, and a router that sends every token to one expert.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "llmc/cpu/moe.h"
#include "test/fixture_reader.h"
#include "test/rel_error.h"

using namespace llmc;

namespace {

const char* FIXTURE = "test/fixtures/moe_cases.bin";

struct Case {
    cpu::MoeShape shape;
    float dbalance = 0, dz = 0;
    std::vector<float> x, router, fcw, fcb, fcprojw, fcprojb, dout;
    std::vector<int> experts;
    int dropped = 0;
    std::vector<float> out, losses, dx, drouter, dfcw, dfcb, dfcprojw, dfcprojb;
};

std::vector<Case> read_cases() {
    FixtureReader r(FIXTURE);
    const std::vector<int32_t> header = r.read<int32_t>(4);
    REQUIRE(header[0] == 20261125);
    REQUIRE(header[1] == 1);
    std::vector<Case> cases(header[2]);
    for (Case& c : cases) {
        const std::vector<int32_t> dims = r.read<int32_t>(8);
        const std::vector<float> knobs = r.read<float>(4);
        cpu::MoeShape& s = c.shape;
        s.rows = dims[0], s.C = dims[1], s.F = dims[2], s.E = dims[3], s.K = dims[4], s.capacity_factor = knobs[0];
        c.dbalance = knobs[1], c.dz = knobs[2];
        const size_t N = s.rows, C = s.C, F = s.F, E = s.E;
        c.x = r.read<float>(N * C), c.router = r.read<float>(E * C), c.fcw = r.read<float>(E * F * C);
        c.fcb = r.read<float>(E * F), c.fcprojw = r.read<float>(E * C * F), c.fcprojb = r.read<float>(E * C);
        c.dout = r.read<float>(N * C);
        c.experts = r.read<int32_t>(N * s.K);
        c.dropped = r.read<int32_t>(1)[0];
        c.out = r.read<float>(N * C), c.losses = r.read<float>(2), c.dx = r.read<float>(N * C);
        c.drouter = r.read<float>(E * C), c.dfcw = r.read<float>(E * F * C), c.dfcb = r.read<float>(E * F);
        c.dfcprojw = r.read<float>(E * C * F), c.dfcprojb = r.read<float>(E * C);
    }
    CHECK(r.at_end());
    return cases;
}

double err(const std::vector<float>& a, const std::vector<float>& b) { return rel_error(a.data(), b.data(), b.size()); }

}  // namespace

TEST_CASE("the CPU mixture-of-experts layer matches PyTorch: routing, drops, output, losses, every gradient", "[moe]") {
    const std::vector<Case> cases = read_cases();
    REQUIRE(cases.size() == 6);
    for (const Case& c : cases) {
        const cpu::MoeShape& s = c.shape;
        CAPTURE(s.rows, s.E, s.K, s.capacity_factor);
        const cpu::MoeWeights w{c.router.data(), c.fcw.data(), c.fcb.data(), c.fcprojw.data(), c.fcprojb.data()};
        cpu::MoeRouting routing;
        cpu::MoeActivations acts;
        cpu::MoeScratch scratch;
        std::vector<float> out(c.out.size());
        cpu::moe_forward(out.data(), routing, acts, scratch, c.x.data(), w, s);
        CHECK(routing.expert == c.experts);
        CHECK(routing.dropped == c.dropped);
        CHECK(err(out, c.out) < 1e-5);
        CHECK(rel_error(routing.balance_loss, c.losses[0]) < 1e-5);
        CHECK(rel_error(routing.z_loss, c.losses[1]) < 1e-5);

        std::vector<float> dx(c.dx.size()), drouter(c.drouter.size()), dfcw(c.dfcw.size()), dfcb(c.dfcb.size()),
            dfcprojw(c.dfcprojw.size()), dfcprojb(c.dfcprojb.size());
        cpu::MoeGrads g{drouter.data(), dfcw.data(), dfcb.data(), dfcprojw.data(), dfcprojb.data()};
        cpu::moe_backward(dx.data(), g, scratch, c.dout.data(), c.x.data(), routing, acts, w, s, c.dbalance, c.dz);
        CHECK(err(dx, c.dx) < 1e-5);
        CHECK(err(drouter, c.drouter) < 1e-5);
        CHECK(err(dfcw, c.dfcw) < 1e-5);
        CHECK(err(dfcb, c.dfcb) < 1e-5);
        CHECK(err(dfcprojw, c.dfcprojw) < 1e-5);
        CHECK(err(dfcprojb, c.dfcprojb) < 1e-5);
    }
}

TEST_CASE("a mixture-of-experts router that sends every token to one expert: its balance loss shows it", "[moe]") {
    const std::vector<Case> cases = read_cases();
    const Case& skewed = cases[4];  // every token's first choice is expert 2
    for (int n = 0; n < skewed.shape.rows; n++) CHECK(skewed.experts[(size_t)n * skewed.shape.K] == 2);
    CHECK(skewed.losses[0] > 1.9f);   // E sum f P: near K's share at the crowded expert x E
    CHECK(cases[1].losses[0] < 1.1f);  // random routing: near 1
    const Case& capped = cases[5];
    cpu::MoeRouting routing;
    cpu::MoeActivations acts;
    cpu::MoeScratch scratch;
    std::vector<float> out(capped.out.size());
    const cpu::MoeWeights w{capped.router.data(), capped.fcw.data(), capped.fcb.data(), capped.fcprojw.data(),
                            capped.fcprojb.data()};
    cpu::moe_forward(out.data(), routing, acts, scratch, capped.x.data(), w, capped.shape);
    CHECK(routing.begin[3] - routing.begin[2] == capped.shape.capacity());  // expert 2 full, the rest dropped
    CHECK(routing.dropped == capped.dropped);
    CHECK(routing.dropped > 0);
}
