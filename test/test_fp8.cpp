// The FP8 formats and scaling (llmc/fp8.h): every code decodes to the value the format defines and
// encodes back to itself, midpoints round to the even neighbour, what lies beyond the range
// saturates, scales are the largest power of two that keeps amax in range, and quantizing counts
// what it clipped. (That encode gives CUDA's own bits is checked in test/gpu/test_cuda_host.cu,
// which has CUDA's headers.)
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "llmc/fp8.h"

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
