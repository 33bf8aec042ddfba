// The FP8 formats and scaling (llmc/numerics/fp8.h): every code decodes to the value the format defines and
// encodes back to itself, midpoints round to the even neighbour, what lies beyond the range
// saturates, scales are the largest power of two that keeps amax in range, and quantizing counts
// what it clipped. The CPU model's FP8 products (cpu/fp8_linear.h): exact on operands already on
// the grids, the products of the quantized operands otherwise, and delayed scaling's history. (That encode gives CUDA's own bits is checked in test/gpu/test_cuda_host.cu,
// which has CUDA's headers.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "llmc/cpu/fp8_linear.h"
#include "llmc/numerics/fp8.h"
#include "test/rel_error.h"

using namespace llmc;
using fp8::Format;

namespace {
const Format kFormats[] = {Format::E4M3, Format::E5M2};

bool is_nan_code(uint8_t code, Format f) { return std::isnan(fp8::decode(code, f)); }
}  // namespace

TEST_CASE("fp8 codes decode to the formats' values", "[fp8]") {
    CHECK(fp8::decode(0x38, Format::E4M3) == 1.0f);
    CHECK(fp8::decode(0x7e, Format::E4M3) == 448.0f);
    CHECK(fp8::decode(0x08, Format::E4M3) == 0x1p-6f);  // smallest normal
    CHECK(fp8::decode(0x01, Format::E4M3) == 0x1p-9f);  // smallest subnormal
    CHECK(fp8::decode(0xc5, Format::E4M3) == -3.25f);
    CHECK(std::isnan(fp8::decode(0x7f, Format::E4M3)));
    CHECK(std::isnan(fp8::decode(0xff, Format::E4M3)));
    CHECK(fp8::decode(0x3c, Format::E5M2) == 1.0f);
    CHECK(fp8::decode(0x7b, Format::E5M2) == 57344.0f);
    CHECK(fp8::decode(0x01, Format::E5M2) == 0x1p-16f);
    CHECK(fp8::decode(0x7c, Format::E5M2) == INFINITY);
    CHECK(fp8::decode(0xfc, Format::E5M2) == -INFINITY);
    CHECK(std::isnan(fp8::decode(0x7d, Format::E5M2)));
    // Finite codes ascend with their bits on each side of zero.
    for (Format f : kFormats)
        for (int c = 1; c < 0x7f; c++)
            if (!is_nan_code((uint8_t)c, f) && std::isfinite(fp8::decode((uint8_t)c, f)))
                CHECK(fp8::decode((uint8_t)c, f) > fp8::decode((uint8_t)(c - 1), f));
}

TEST_CASE("every finite fp8 code encodes back to itself; midpoints round to the even code", "[fp8]") {
    for (Format f : kFormats) {
        CAPTURE(fp8::info(f).name);
        for (int c = 0; c < 256; c++) {
            const float v = fp8::decode((uint8_t)c, f);
            if (!std::isfinite(v)) continue;
            CHECK((int)fp8::encode(v, f) == c);
        }
        for (int c = 0; c < fp8::info(f).largest_code; c++) {
            const float lo = fp8::decode((uint8_t)c, f), hi = fp8::decode((uint8_t)(c + 1), f);
            const float mid = lo + (hi - lo) / 2;
            CAPTURE(c, lo, hi);
            CHECK((int)fp8::encode(mid, f) == (c % 2 == 0 ? c : c + 1));
            CHECK((int)fp8::encode(std::nextafter(mid, lo), f) == c);
            CHECK((int)fp8::encode(std::nextafter(mid, hi), f) == c + 1);
            CHECK((int)fp8::encode(-mid, f) == (0x80 | (c % 2 == 0 ? c : c + 1)));
        }
    }
}

TEST_CASE("fp8 encoding saturates beyond the largest value and keeps NaN", "[fp8]") {
    for (Format f : kFormats) {
        const fp8::FormatInfo fi = fp8::info(f);
        CAPTURE(fi.name);
        for (float big : {fi.largest * 1.0625f, fi.largest * 4, 1e30f, INFINITY}) {
            CHECK((int)fp8::encode(big, f) == fi.largest_code);
            CHECK((int)fp8::encode(-big, f) == (0x80 | fi.largest_code));
        }
        CHECK((int)fp8::encode(NAN, f) == fi.nan_code);
        CHECK((int)fp8::encode(-NAN, f) == fi.nan_code);
        CHECK((int)fp8::encode(fi.min_normal / 1024, f) == 0);  // below half the smallest subnormal
        CHECK((int)fp8::encode(-0.0f, f) == 0x80);
    }
}

TEST_CASE("rounding to an fp8 format on the float's bits gives the value its code decodes to", "[fp8]") {
    // Every float whose low 16 bits are one of the patterns around a rounding boundary: every
    // midpoint between fp8 values, both sides of it, subnormals, saturation, infinities, NaN.
    const uint32_t low_bits[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x3fff, 0x4000, 0xc000};
    long mismatches = 0;
    for (Format f : kFormats)
        for (uint32_t high = 0; high < 0x10000; high++)
            for (uint32_t low : low_bits) {
                const float x = std::bit_cast<float>(high << 16 | low);
                const float want = fp8::decode(fp8::encode(x, f), f), got = fp8::round_to_format(x, f);
                mismatches += !(std::bit_cast<uint32_t>(want) == std::bit_cast<uint32_t>(got) ||
                                (std::isnan(want) && std::isnan(got)));
            }
    CHECK(mismatches == 0);
}

TEST_CASE("an fp8 scale is the largest power of two that keeps amax in range", "[fp8]") {
    for (Format f : kFormats) {
        const float largest = fp8::info(f).largest;
        for (float amax : {1e-12f, 3e-3f, 0.5f, 1.0f, 447.0f, 448.0f, 449.0f, 6e4f, 1e9f}) {
            const float s = fp8::scale_for_amax(amax, f, 1.0f);
            CAPTURE(fp8::info(f).name, amax, s);
            int e;
            CHECK(std::frexp(s, &e) == 0.5f);  // a power of two
            CHECK(amax * s <= largest);
            CHECK(amax * s * 2 > largest);
        }
        for (float unknown : {0.0f, INFINITY, NAN}) CHECK(fp8::scale_for_amax(unknown, f, 0.25f) == 0.25f);
    }
}

TEST_CASE("quantizing counts the elements it saturated or flushed to zero", "[fp8]") {
    std::vector<float> x = {1.0f, -300.0f, 500.0f, 1e-4f, 0.0f, -1e-3f, 2.0f};
    fp8::Clipping clipping;
    const float amax = fp8::quantize(x.data(), (int64_t)x.size(), 1.0f, Format::E4M3, &clipping);
    CHECK(amax == 500.0f);
    CHECK(clipping.overflows == 1);   // 500 > 448
    CHECK(clipping.underflows == 1);  // 1e-4 < 2^-10; -1e-3 is the subnormal 2^-10 + ... rounded, not zero
    CHECK(x[0] == 1.0f);
    CHECK(x[2] == 448.0f);
    CHECK(x[3] == 0.0f);
    CHECK(x[1] == -288.0f);  // E4M3 between 256 and 512 steps by 32: 300 -> 288
    // With the scale of the amax nothing saturates, and dequantizing is exact for codes' values.
    std::vector<float> y = {1.0f, -300.0f, 500.0f, 2.0f};
    const float s = fp8::scale_for_amax(500.0f, Format::E4M3, 1.0f);
    fp8::Clipping none;
    fp8::quantize(y.data(), (int64_t)y.size(), s, Format::E4M3, &none);
    CHECK(none.overflows == 0);
    CHECK(y[2] == 512.0f);  // 500 x 0.5 = 250 rounds to 256 (steps of 16 there); / 0.5
    CHECK(y[0] == 1.0f);
}

// ---- the CPU model's FP8 products (cpu/fp8_linear.h) ----

namespace {

// n values on the format's grid (every finite code equally likely, then one at the largest value, so
// the scale is 1 and quantizing them changes nothing).
std::vector<float> on_grid(size_t n, Format f, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> v;
    while (v.size() < n) {
        const float x = fp8::decode((uint8_t)(rng() & 0xff), f);
        if (std::isfinite(x)) v.push_back(x);
    }
    v[n / 2] = fp8::info(f).largest;
    return v;
}

std::vector<float> normal(size_t n, float sigma, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

constexpr int kRows = 12, kC = 16, kOC = 24;

}  // namespace

TEST_CASE("FP8 products of operands already on the fp8 grids equal the fp32 products bit for bit", "[fp8]") {
    for (Fp8Scaling scaling : {Fp8Scaling::Current, Fp8Scaling::Delayed}) {
        cpu::Fp8Linears fp8(1, {true, scaling, 4});
        const std::vector<float> inp = on_grid(kRows * kC, Format::E4M3, 1), w = on_grid(kOC * kC, Format::E4M3, 2);
        const std::vector<float> dout = on_grid(kRows * kOC, Format::E5M2, 3), bias = normal(kOC, 1.0f, 4);
        std::vector<float> out(kRows * kOC), want(kRows * kOC);
        fp8.forward(0, FP8_FC, out.data(), inp.data(), w.data(), bias.data(), nullptr, kRows, kC, kOC);
        cpu::matmul_forward(want.data(), inp.data(), w.data(), bias.data(), nullptr, kRows, kC, kOC);
        CHECK(out == want);
        std::vector<float> dinp(kRows * kC), dw(kOC * kC, 0.5f), db(kOC, 0.25f);
        std::vector<float> want_dinp = dinp, want_dw = dw, want_db = db;
        fp8.backward(0, FP8_FC, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), kRows, kC, kOC);
        cpu::matmul_backward(want_dinp.data(), want_dw.data(), want_db.data(), dout.data(), inp.data(), w.data(), kRows,
                             kC, kOC);
        CHECK(dinp == want_dinp);
        CHECK(dw == want_dw);
        CHECK(db == want_db);
    }
}

TEST_CASE("FP8 products of other operands are the products of their quantized values", "[fp8]") {
    cpu::Fp8Linears fp8(1, {true, Fp8Scaling::Current, 4});
    const std::vector<float> inp = normal(kRows * kC, 1.0f, 5), w = normal(kOC * kC, 0.02f, 6);
    std::vector<float> out(kRows * kOC), fp32(kRows * kOC), want(kRows * kOC);
    fp8.forward(0, FP8_QKV, out.data(), inp.data(), w.data(), nullptr, nullptr, kRows, kC, kOC);
    cpu::matmul_forward(fp32.data(), inp.data(), w.data(), nullptr, nullptr, kRows, kC, kOC);
    // The reference quantizes each operand here, value by value, with its own power-of-two scale.
    auto quantized = [](std::vector<float> v) {
        float amax = 0;
        for (float x : v) amax = std::max(amax, std::fabs(x));
        const float s = fp8::scale_for_amax(amax, Format::E4M3, 1.0f);
        for (float& x : v) x = fp8::round_trip(x, s, Format::E4M3) / s;
        return v;
    };
    cpu::matmul_forward(want.data(), quantized(inp).data(), quantized(w).data(), nullptr, nullptr, kRows, kC, kOC);
    CHECK(out == want);
    const double err = llmc::rel_error(out.data(), fp32.data(), out.size());
    CHECK(err > 1e-3);  // quantizing happened
    CHECK(err < 0.1);   // E4M3 keeps 3 mantissa bits: a few percent
    const Fp8Stats stats = fp8.take_stats();
    CHECK(stats.counts[FP8_QKV][FP8_INPUT].elements == (uint64_t)kRows * kC);
    CHECK(stats.counts[FP8_QKV][FP8_WEIGHT].elements == (uint64_t)kOC * kC);
    CHECK(stats.total().overflows == 0);  // current scaling never saturates
    CHECK(fp8.take_stats().total().elements == 0);
}

TEST_CASE("delayed FP8 scaling follows the largest amax of the last steps, saturating a spike", "[fp8]") {
    const int history = 3;
    cpu::Fp8Linears delayed(1, {true, Fp8Scaling::Delayed, history});
    cpu::Fp8Linears current(1, {true, Fp8Scaling::Current, history});
    std::vector<float> out(kRows * kOC), out_current(kRows * kOC);
    const std::vector<float> w = normal(kOC * kC, 0.02f, 7);
    std::vector<float> amaxes;  // of each step's input
    auto step = [&](float sigma, uint32_t seed) {
        const std::vector<float> inp = normal(kRows * kC, sigma, seed);
        amaxes.push_back(std::fabs(*std::max_element(inp.begin(), inp.end(), [](float a, float b) {
            return std::fabs(a) < std::fabs(b);
        })));
        delayed.forward(0, FP8_FC, out.data(), inp.data(), w.data(), nullptr, nullptr, kRows, kC, kOC);
        current.forward(0, FP8_FC, out_current.data(), inp.data(), w.data(), nullptr, nullptr, kRows, kC, kOC);
        delayed.end_step(local_communicator());
        return delayed.take_stats().counts[FP8_FC][FP8_INPUT];
    };
    // The fc input's scale, from the state: tensor (layer 0, FP8_FC, FP8_INPUT), its first value.
    auto input_scale = [&] { return delayed.state()[((size_t)FP8_FC * FP8_OPERANDS + FP8_INPUT) * (3 + history)]; };
    auto scale_of_last_steps = [&] {
        const float largest = *std::max_element(amaxes.end() - std::min<size_t>(amaxes.size(), history), amaxes.end());
        return fp8::scale_for_amax(largest, Format::E4M3, 1.0f);
    };
    // The first step has no history: it is scaled as current scaling scales it.
    CHECK(step(1.0f, 10).overflows == 0);
    CHECK(out == out_current);
    CHECK(input_scale() == scale_of_last_steps());
    // A step whose amax is 8x the history's saturates with the history's scale.
    CHECK(step(8.0f, 11).overflows > 0);
    CHECK(out != out_current);
    const float spike_scale = input_scale();
    CHECK(spike_scale == scale_of_last_steps());
    // The spike sets the scale for `history` steps, then leaves the history.
    for (int s = 0; s < history - 1; s++) {
        step(1.0f, 20 + s);
        CHECK(input_scale() == spike_scale);
    }
    step(1.0f, 30);
    CHECK(input_scale() == scale_of_last_steps());
    CHECK(input_scale() > spike_scale);
    const std::vector<float> state = delayed.state();
    CHECK(state.size() == (size_t)FP8_PRODUCTS * FP8_OPERANDS * (3 + history));
    cpu::Fp8Linears restored(1, {true, Fp8Scaling::Delayed, history});
    restored.set_state(state, "test");
    CHECK(restored.state() == state);
    cpu::Fp8Linears longer(1, {true, Fp8Scaling::Delayed, history + 1});
    CHECK_THROWS_WITH(longer.set_state(state, "ckpt/manifest.json"), Catch::Contains("--fp8-history 4"));
}
