// Llama 3's CPU layers (cpu/llama_ops.h) against PyTorch in float64 (dev/ref/make_llama_fixture.py): RMSNorm,
// rotate-half RoPE at ordinary and at global positions, grouped-query attention with 4, 2 and 1 kv heads and the
// SwiGLU MLP through ops.h's products, every output and gradient; and what needs no PyTorch: RoPE's backward undoes
// its forward, one kv head per query head is GPT-2's attention bit for bit, the group sums do not depend on the
// thread count, and RMSNorm's gradient agrees with finite differences.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "llmc/cpu/llama_ops.h"
#include "test/fixture_reader.h"
#include "test/rel_error.h"

using namespace llmc;

namespace {

const char* FIXTURE = "test/fixtures/llama_ops.bin";
constexpr double TOL = 1e-5;

struct RmsNormCase {
    int N = 0, C = 0;
    float eps = 0;
    std::vector<float> x, w, dout, out, rstd, dx, dw;
};

struct RopeCase {
    int B = 0, T = 0, NH = 0, KVH = 0, HS = 0;
    bool has_positions = false;
    float theta = 0;
    std::vector<int> positions;
    std::vector<float> qkv, dout, out, dqkv;
    const int* positions_or_null() const { return has_positions ? positions.data() : nullptr; }
};

struct AttentionCase {
    int B = 0, T = 0, NH = 0, KVH = 0, HS = 0;
    std::vector<float> qkv, dout, out, att, dqkv;
};

struct MlpCase {
    int N = 0, C = 0, H = 0;
    std::vector<float> x, w_gate_up, w_down, dout, gate_up, h, out, dh, dgate_up, dx, dw_gate_up, dw_down;
};

struct Fixture {
    RmsNormCase rmsnorm;
    std::vector<RopeCase> ropes;
    std::vector<AttentionCase> attentions;
    MlpCase mlp;
};

Fixture read_fixture() {
    FixtureReader r(FIXTURE);
    const std::vector<int32_t> header = r.read<int32_t>(4);
    REQUIRE(header[0] == 20261201);
    REQUIRE(header[1] == 1);
    Fixture fx;
    RmsNormCase& n = fx.rmsnorm;
    const std::vector<int32_t> nd = r.read<int32_t>(4);
    n.N = nd[0], n.C = nd[1], n.eps = r.read<float>(4)[0];
    const size_t NC = (size_t)n.N * n.C;
    n.x = r.read<float>(NC), n.w = r.read<float>(n.C), n.dout = r.read<float>(NC);
    n.out = r.read<float>(NC), n.rstd = r.read<float>(n.N), n.dx = r.read<float>(NC), n.dw = r.read<float>(n.C);
    fx.ropes.resize(header[2]);
    for (RopeCase& c : fx.ropes) {
        const std::vector<int32_t> d = r.read<int32_t>(8);
        c.B = d[0], c.T = d[1], c.NH = d[2], c.KVH = d[3], c.HS = d[4], c.has_positions = d[5] != 0;
        c.theta = r.read<float>(4)[0];
        c.positions = r.read<int32_t>(c.T);
        const size_t n_qkv = (size_t)c.B * c.T * (c.NH + 2 * c.KVH) * c.HS;
        c.qkv = r.read<float>(n_qkv), c.dout = r.read<float>(n_qkv), c.out = r.read<float>(n_qkv);
        c.dqkv = r.read<float>(n_qkv);
    }
    fx.attentions.resize(header[3]);
    for (AttentionCase& c : fx.attentions) {
        const std::vector<int32_t> d = r.read<int32_t>(8);
        c.B = d[0], c.T = d[1], c.NH = d[2], c.KVH = d[3], c.HS = d[4];
        const size_t rows = (size_t)c.B * c.T, n_qkv = rows * (c.NH + 2 * c.KVH) * c.HS, n_out = rows * c.NH * c.HS;
        c.qkv = r.read<float>(n_qkv), c.dout = r.read<float>(n_out), c.out = r.read<float>(n_out);
        c.att = r.read<float>((size_t)c.B * c.NH * c.T * c.T), c.dqkv = r.read<float>(n_qkv);
    }
    MlpCase& m = fx.mlp;
    const std::vector<int32_t> md = r.read<int32_t>(4);
    m.N = md[0], m.C = md[1], m.H = md[2];
    const size_t N = m.N, C = m.C, H = m.H;
    m.x = r.read<float>(N * C), m.w_gate_up = r.read<float>(2 * H * C), m.w_down = r.read<float>(C * H);
    m.dout = r.read<float>(N * C), m.gate_up = r.read<float>(N * 2 * H), m.h = r.read<float>(N * H);
    m.out = r.read<float>(N * C), m.dh = r.read<float>(N * H), m.dgate_up = r.read<float>(N * 2 * H);
    m.dx = r.read<float>(N * C), m.dw_gate_up = r.read<float>(2 * H * C), m.dw_down = r.read<float>(C * H);
    CHECK(r.at_end());  // every byte read: the format and the generator agree
    return fx;
}

double err(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    return rel_error(a.data(), b.data(), b.size());
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = normal(gen);
    return v;
}

// Runs fn with the OpenMP thread count set to n, then restores it.
template <typename Fn>
void with_threads(int n, Fn fn) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(n);
    fn();
    omp_set_num_threads(before);
}

}  // namespace

TEST_CASE("RMSNorm matches PyTorch: output, rstd, and the input's and weight's gradients", "[llama]") {
    const RmsNormCase c = read_fixture().rmsnorm;
    std::vector<float> out(c.out.size()), rstd(c.N), dx(c.dx.size()), dw(c.C);
    cpu::rmsnorm_forward(out.data(), rstd.data(), c.x.data(), c.w.data(), c.N, c.C, c.eps);
    CHECK(err(out, c.out) < TOL);
    CHECK(err(rstd, c.rstd) < TOL);
    cpu::rmsnorm_backward(dx.data(), dw.data(), c.dout.data(), c.x.data(), c.w.data(), rstd.data(), c.N, c.C);
    CHECK(err(dx, c.dx) < TOL);
    CHECK(err(dw, c.dw) < TOL);
}

TEST_CASE("RMSNorm's backward adds to dinp and dweight (the residual's share is kept)", "[llama]") {
    const RmsNormCase c = read_fixture().rmsnorm;
    std::vector<float> out(c.out.size()), rstd(c.N), dx(c.dx.size()), dw(c.C);
    cpu::rmsnorm_forward(out.data(), rstd.data(), c.x.data(), c.w.data(), c.N, c.C, c.eps);
    cpu::rmsnorm_backward(dx.data(), dw.data(), c.dout.data(), c.x.data(), c.w.data(), rstd.data(), c.N, c.C);
    std::vector<float> dx_acc = random_floats(dx.size(), 1), dw_acc = random_floats(dw.size(), 2);
    std::vector<float> dx_expected = dx_acc, dw_expected = dw_acc;
    for (size_t i = 0; i < dx.size(); i++) dx_expected[i] += dx[i];
    for (size_t i = 0; i < dw.size(); i++) dw_expected[i] += dw[i];
    cpu::rmsnorm_backward(dx_acc.data(), dw_acc.data(), c.dout.data(), c.x.data(), c.w.data(), rstd.data(), c.N, c.C);
    CHECK(err(dx_acc, dx_expected) < 1e-6);  // not bitwise: the add may be fused into the last product
    CHECK(err(dw_acc, dw_expected) < 1e-6);
}

TEST_CASE("RMSNorm's gradient agrees with central finite differences of its loss, summed in double", "[llama]") {
    const RmsNormCase c = read_fixture().rmsnorm;
    std::vector<float> x = c.x, w = c.w, out(c.out.size()), rstd(c.N);
    auto loss = [&]() {
        cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), c.N, c.C, c.eps);
        double sum = 0.0;
        for (size_t i = 0; i < out.size(); i++) sum += (double)out[i] * c.dout[i];
        return sum;
    };
    // A step of 2^-7 keeps x +- h exact in fp32 and the truncation error (h^2) near 1e-5; the
    // forward's own fp32 rounding, divided by 2h, is what limits the agreement to about 1e-4.
    const float h = 1.0f / 128;
    auto central = [&](std::vector<float>& v, size_t i) {
        const float saved = v[i];
        v[i] = saved + h;
        const double up = loss();
        v[i] = saved - h;
        const double down = loss();
        v[i] = saved;
        return (float)((up - down) / (2.0 * h));
    };
    std::vector<float> fd_dx(x.size()), fd_dw(w.size());
    for (size_t i = 0; i < x.size(); i++) fd_dx[i] = central(x, i);
    for (size_t i = 0; i < w.size(); i++) fd_dw[i] = central(w, i);
    std::vector<float> dx(x.size()), dw(w.size());
    loss();
    cpu::rmsnorm_backward(dx.data(), dw.data(), c.dout.data(), x.data(), w.data(), rstd.data(), c.N, c.C);
    CHECK(err(dx, fd_dx) < 1e-3);
    CHECK(err(dw, fd_dw) < 1e-3);
}

TEST_CASE("RoPE (rotate-half) matches PyTorch on q and k, leaves v, at positions 0..T-1 and at global ones",
          "[llama]") {
    const std::vector<RopeCase> ropes = read_fixture().ropes;
    REQUIRE(ropes.size() == 2);
    CHECK_FALSE(ropes[0].has_positions);
    CHECK(ropes[1].positions.back() == 131071);  // an angle of 131071 rad: fp32 angles are off by up to 0.008
    for (const RopeCase& c : ropes) {
        CAPTURE(c.KVH, c.theta, c.has_positions);
        std::vector<float> qkv = c.qkv, dqkv = c.dout;
        cpu::rope_forward(qkv.data(), c.B, c.T, c.NH, c.KVH, c.HS, c.theta, c.positions_or_null());
        CHECK(err(qkv, c.out) < TOL);
        cpu::rope_backward(dqkv.data(), c.B, c.T, c.NH, c.KVH, c.HS, c.theta, c.positions_or_null());
        CHECK(err(dqkv, c.dqkv) < TOL);
        const size_t row = (size_t)(c.NH + 2 * c.KVH) * c.HS, v0 = (size_t)(c.NH + c.KVH) * c.HS;
        for (size_t r = 0; r < (size_t)c.B * c.T; r++)
            CHECK(std::memcmp(&qkv[r * row + v0], &c.qkv[r * row + v0], (row - v0) * sizeof(float)) == 0);
    }
}

TEST_CASE("RoPE's backward undoes its forward: the rotation is orthogonal, norms are kept", "[llama]") {
    const int B = 2, T = 7, NH = 4, KVH = 2, HS = 16;
    const int positions[T] = {0, 5, 99, 1000, 8191, 65535, 500000};
    const std::vector<float> grad = random_floats((size_t)B * T * (NH + 2 * KVH) * HS, 3);
    std::vector<float> g = grad;
    cpu::rope_forward(g.data(), B, T, NH, KVH, HS, cpu::LLAMA3_ROPE_THETA, positions);
    CHECK(err(g, grad) > 0.1);  // it did rotate
    double norm_before = 0.0, norm_after = 0.0;
    for (size_t i = 0; i < g.size(); i++) norm_before += (double)grad[i] * grad[i], norm_after += (double)g[i] * g[i];
    CHECK(std::fabs(norm_after - norm_before) / norm_before < 1e-6);
    cpu::rope_backward(g.data(), B, T, NH, KVH, HS, cpu::LLAMA3_ROPE_THETA, positions);
    CHECK(err(g, grad) < 1e-6);
}

TEST_CASE("grouped-query attention matches PyTorch (out, att, dqkv) with 4, 2 and 1 kv heads for 4 query heads",
          "[llama]") {
    const std::vector<AttentionCase> cases = read_fixture().attentions;
    REQUIRE(cases.size() == 3);
    for (const AttentionCase& c : cases) {
        CAPTURE(c.NH, c.KVH);
        std::vector<float> out(c.out.size()), att(c.att.size(), 0.0f), dqkv(c.dqkv.size());
        cpu::gqa_attention_forward(out.data(), att.data(), c.qkv.data(), c.B, c.T, c.NH, c.KVH, c.HS);
        CHECK(err(out, c.out) < TOL);
        CHECK(err(att, c.att) < TOL);
        cpu::gqa_attention_backward(dqkv.data(), c.dout.data(), att.data(), c.qkv.data(), c.B, c.T, c.NH, c.KVH, c.HS);
        CHECK(err(dqkv, c.dqkv) < TOL);
    }
}

TEST_CASE("grouped-query attention with one kv head per query head is GPT-2's attention (ops.h), bit for bit",
          "[llama]") {
    const int B = 2, T = 9, NH = 4, HS = 16, C = NH * HS;
    const std::vector<float> qkv = random_floats((size_t)B * T * 3 * C, 4), dout = random_floats((size_t)B * T * C, 5);
    std::vector<float> out(dout.size()), att((size_t)B * NH * T * T), dqkv(qkv.size());
    std::vector<float> gpt2_out = out, gpt2_att = att, gpt2_dqkv = dqkv;
    cpu::attention_forward(gpt2_out.data(), gpt2_att.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(gpt2_dqkv.data(), dout.data(), gpt2_att.data(), qkv.data(), B, T, C, NH);
    cpu::gqa_attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, NH, HS);
    cpu::gqa_attention_backward(dqkv.data(), dout.data(), att.data(), qkv.data(), B, T, NH, NH, HS);
    CHECK(bitwise_equal(out, gpt2_out));
    CHECK(bitwise_equal(att, gpt2_att));
    CHECK(bitwise_equal(dqkv, gpt2_dqkv));
}

TEST_CASE("grouped-query attention's dK and dV group sums are bitwise the same with 1, 2 and 3 threads", "[llama]") {
    const int B = 3, T = 11, NH = 8, KVH = 2, HS = 16;
    const std::vector<float> qkv = random_floats((size_t)B * T * (NH + 2 * KVH) * HS, 6);
    const std::vector<float> dout = random_floats((size_t)B * T * NH * HS, 7);
    auto run = [&](int threads) {
        std::vector<float> out(dout.size()), att((size_t)B * NH * T * T), dqkv(qkv.size());
        with_threads(threads, [&] {
            cpu::gqa_attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, KVH, HS);
            cpu::gqa_attention_backward(dqkv.data(), dout.data(), att.data(), qkv.data(), B, T, NH, KVH, HS);
        });
        return dqkv;
    };
    const std::vector<float> one = run(1);
    CHECK(bitwise_equal(run(2), one));
    CHECK(bitwise_equal(run(3), one));
}

TEST_CASE("RMSNorm's weight gradient is bitwise the same with 1, 2 and 3 threads", "[llama]") {
    const int N = 37, C = 80;
    const std::vector<float> x = random_floats((size_t)N * C, 8), w = random_floats(C, 9);
    const std::vector<float> dout = random_floats((size_t)N * C, 10);
    auto run = [&](int threads) {
        std::vector<float> out(x.size()), rstd(N), dx(x.size()), dw(C);
        with_threads(threads, [&] {
            cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C);
            cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
        });
        return dw;
    };
    const std::vector<float> one = run(1);
    CHECK(bitwise_equal(run(2), one));
    CHECK(bitwise_equal(run(3), one));
}

TEST_CASE("SwiGLU matches PyTorch: the elementwise part alone, and the MLP through ops.h's bias-free products",
          "[llama]") {
    const MlpCase m = read_fixture().mlp;
    const int N = m.N, C = m.C, H = m.H;
    SECTION("the elementwise part, from PyTorch's own gate_up and dh") {
        std::vector<float> h(m.h.size()), dgate_up(m.dgate_up.size());
        cpu::swiglu_forward(h.data(), m.gate_up.data(), N, H);
        CHECK(err(h, m.h) < TOL);
        cpu::swiglu_backward(dgate_up.data(), m.dh.data(), m.gate_up.data(), N, H);
        CHECK(err(dgate_up, m.dgate_up) < TOL);
    }
    SECTION("the MLP: down(silu(gate(x)) * up(x)), forward and every gradient") {
        std::vector<float> gate_up(m.gate_up.size()), h(m.h.size()), out(m.out.size());
        cpu::matmul_forward(gate_up.data(), m.x.data(), m.w_gate_up.data(), nullptr, nullptr, N, C, 2 * H);
        cpu::swiglu_forward(h.data(), gate_up.data(), N, H);
        cpu::matmul_forward(out.data(), h.data(), m.w_down.data(), nullptr, nullptr, N, H, C);
        CHECK(err(gate_up, m.gate_up) < TOL);
        CHECK(err(h, m.h) < TOL);
        CHECK(err(out, m.out) < TOL);
        std::vector<float> dh(m.dh.size()), dgate_up(m.dgate_up.size()), dx(m.dx.size());
        std::vector<float> dw_down(m.dw_down.size()), dw_gate_up(m.dw_gate_up.size());
        cpu::matmul_backward(dh.data(), dw_down.data(), nullptr, m.dout.data(), h.data(), m.w_down.data(), N, H, C);
        cpu::swiglu_backward(dgate_up.data(), dh.data(), gate_up.data(), N, H);
        cpu::matmul_backward(dx.data(), dw_gate_up.data(), nullptr, dgate_up.data(), m.x.data(), m.w_gate_up.data(), N,
                             C, 2 * H);
        CHECK(err(dh, m.dh) < TOL);
        CHECK(err(dgate_up, m.dgate_up) < TOL);
        CHECK(err(dx, m.dx) < TOL);
        CHECK(err(dw_down, m.dw_down) < TOL);
        CHECK(err(dw_gate_up, m.dw_gate_up) < TOL);
    }
}

TEST_CASE("SwiGLU saturates cleanly: a very negative gate gives 0, a very positive one gate * up, never NaN",
          "[llama]") {
    const int H = 4;
    const std::vector<float> gate_up = {-200.0f, -90.0f, 90.0f, 200.0f, 1.0f, 2.0f, 3.0f, 4.0f};
    std::vector<float> h(H), dgate_up(2 * H);
    const std::vector<float> dh(H, 1.0f);
    cpu::swiglu_forward(h.data(), gate_up.data(), 1, H);
    cpu::swiglu_backward(dgate_up.data(), dh.data(), gate_up.data(), 1, H);
    CHECK(std::fabs(h[0]) < 1e-30f);
    CHECK(std::fabs(h[1]) < 1e-30f);
    CHECK(h[2] == 90.0f * 3.0f);
    CHECK(h[3] == 200.0f * 4.0f);
    for (float v : dgate_up) CHECK(std::isfinite(v));
    CHECK(dgate_up[3] == 4.0f);   // d/dgate = up * silu'(gate), silu' -> 1
    CHECK(dgate_up[7] == 200.0f);  // d/dup = silu(gate)
}
