// fp8.h: the two 8-bit float formats of FP8 training, on the host, and per-tensor scaling.
//
// E4M3 (4 exponent bits, 3 mantissa bits, bias 7, largest value 448, no infinity) carries
// activations and weights in the forward pass; E5M2 (bias 15, largest 57344) carries gradients,
// which need range more than precision. A value is encoded by rounding to nearest even and
// saturating to the largest finite value (CUDA's __NV_SATFINITE), and NaN stays NaN: the same
// bits as CUDA's __nv_cvt_float_to_fp8, which test_fp8 checks value by value.
//
// A tensor is multiplied by its scale before it is encoded and the product is multiplied by the
// scales' inverses after (cuBLASLt's A/B scale pointers). The one idea: every scale is a power of
// two, 2^floor(log2(max / amax)). Multiplying by a power of two is exact in fp32, so the CPU
// model's FP8 simulation and the GPU's kernels encode every element to the same bits whatever
// order they compute in, and dequantizing loses nothing; the price is up to one bit of the
// format's range left unused.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "llmc/utils.h"

namespace llmc::fp8 {

enum class Format { E4M3, E5M2 };

struct FormatInfo {
    const char* name;
    int mantissa_bits, exponent_bias;
    float largest;       // the largest finite value
    float min_normal;    // 2^(1 - bias)
    uint8_t largest_code;
    uint8_t nan_code;    // what NaN encodes to (the sign is dropped, as CUDA does)
};

inline constexpr FormatInfo info(Format f) {
    return f == Format::E4M3 ? FormatInfo{"e4m3", 3, 7, 448.0f, 0x1p-6f, 0x7e, 0x7f}
                             : FormatInfo{"e5m2", 2, 15, 57344.0f, 0x1p-14f, 0x7b, 0x7f};
}

// Round to nearest even, saturating to +-largest; inf saturates too.
inline uint8_t encode(float x, Format f) {
    const FormatInfo fi = info(f);
    if (std::isnan(x)) return fi.nan_code;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const float a = std::fabs(x);
    if (std::isinf(a)) return sign | fi.largest_code;
    const int steps = 1 << fi.mantissa_bits;  // mantissa values per binade
    uint32_t code;
    if (a < fi.min_normal) {
        // Subnormals are multiples of min_normal / steps; a result of `steps` is the smallest normal.
        code = (uint32_t)std::nearbyint(a / fi.min_normal * (float)steps);
    } else {
        int e;
        const float m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
        int exponent = e - 1;
        uint32_t q = (uint32_t)std::nearbyint((m * 2.0f - 1.0f) * (float)steps);
        if (q == (uint32_t)steps) q = 0, exponent++;
        code = ((uint32_t)(exponent + fi.exponent_bias) << fi.mantissa_bits) | q;  // past largest_code: saturated below
    }
    return sign | (uint8_t)(code > fi.largest_code ? fi.largest_code : code);
}

inline float decode(uint8_t code, Format f) {
    const FormatInfo fi = info(f);
    const float sign = code & 0x80 ? -1.0f : 1.0f;
    const uint32_t magnitude = code & 0x7f;
    const uint32_t field = magnitude >> fi.mantissa_bits, mantissa = magnitude & ((1u << fi.mantissa_bits) - 1);
    const int steps = 1 << fi.mantissa_bits;
    if (f == Format::E4M3 && magnitude == 0x7f) return NAN;
    if (f == Format::E5M2 && field == 0x1f) return mantissa ? NAN : sign * INFINITY;
    if (field == 0) return sign * fi.min_normal * ((float)mantissa / (float)steps);
    return sign * std::ldexp(1.0f + (float)mantissa / (float)steps, (int)field - fi.exponent_bias);
}

// The value x encodes to, as a float: decode(encode(x, f), f) for every x (test_fp8 checks it around
// every rounding boundary), computed on the float's bits instead of the fields, so that a whole
// tensor vectorizes: a normal value keeps its top mantissa bits, rounded to nearest even by an
// integer add that carries into the exponent when it must; a subnormal one is a multiple of the
// smallest step (the division by a power of two is exact); then the range saturates.
inline float round_to_format(float x, Format f) {
    const FormatInfo fi = info(f);
    const float a = std::fabs(x);
    float r;
    if (a >= fi.min_normal) {
        const int dropped = 23 - fi.mantissa_bits;
        uint32_t bits = std::bit_cast<uint32_t>(a);
        bits += ((1u << (dropped - 1)) - 1) + ((bits >> dropped) & 1);
        r = std::bit_cast<float>(bits & ~((1u << dropped) - 1));
    } else {
        const float step = fi.min_normal / (float)(1 << fi.mantissa_bits);
        r = std::nearbyint(a / step) * step;
    }
    if (std::isnan(x)) return x;
    return std::copysign(std::fmin(r, fi.largest), x);
}

// The value x * scale encodes to, as a float (divide by scale to dequantize).
inline float round_trip(float x, float scale, Format f) { return round_to_format(x * scale, f); }

// The power of two that brings amax to at most the format's largest value. An amax of zero, inf or
// NaN says nothing about the range, so the previous scale stands.
inline float scale_for_amax(float amax, Format f, float previous_scale) {
    if (!(amax > 0.0f) || !std::isfinite(amax)) return previous_scale;
    int e;
    std::frexp(info(f).largest / amax, &e);  // largest/amax = m 2^e, m in [0.5, 1): floor(log2) = e - 1
    return std::ldexp(1.0f, e - 1);
}

// What quantizing one tensor lost: elements beyond the format's range (saturated) and nonzero
// elements that became zero.
struct Clipping {
    uint64_t overflows = 0, underflows = 0;
};

// Quantizes n values in place to what the GPU computes with (x * scale encoded, then decoded,
// then divided by scale), counting what was clipped; returns the amax of the input.
inline float quantize(float* x, int64_t n, float scale, Format f, Clipping* clipping) {
    const float largest = info(f).largest;
    float amax = 0.0f;
    uint64_t overflows = 0, underflows = 0;
#pragma omp parallel for reduction(max : amax) reduction(+ : overflows, underflows) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float scaled = x[i] * scale;
        amax = std::fmax(amax, std::fabs(x[i]));
        const float q = round_to_format(scaled, f);
        overflows += std::fabs(scaled) > largest;
        underflows += scaled != 0.0f && q == 0.0f;
        x[i] = q / scale;
    }
    if (clipping) clipping->overflows += overflows, clipping->underflows += underflows;
    return amax;
}

}  // namespace llmc::fp8

namespace llmc {

// --fp8, --fp8-scaling, --fp8-history: which products run in FP8 and how their scales are chosen
// (cpu/fp8_linear.h says what each means); --fp8-gather: how ZeRO-3 gathers the CUDA model's
// weights (models/cuda/fp8_gather.cuh; the same values either way, so the CPU model ignores it).
enum class Fp8Scaling { Current, Delayed };
struct Fp8Options {
    bool enabled = false;
    Fp8Scaling scaling = Fp8Scaling::Current;
    int history = 16;    // delayed scaling: steps of amax kept
    bool gather = true;  // ZeRO-3: the weights travel as their E4M3 codes
};

// The quantized operands of one product: input and weight in E4M3, output gradient in E5M2.
enum Fp8Operand { FP8_INPUT, FP8_WEIGHT, FP8_GRAD, FP8_OPERANDS };
inline const char* fp8_operand_name(int o) {
    static const char* names[] = {"input", "weight", "grad"};
    return names[o];
}
inline fp8::Format fp8_format(int operand) { return operand == FP8_GRAD ? fp8::Format::E5M2 : fp8::Format::E4M3; }

// A block's four products.
enum Fp8Product { FP8_QKV, FP8_ATTPROJ, FP8_FC, FP8_FCPROJ, FP8_PRODUCTS };
// Scaled tensors per block: every product's operands.
constexpr int FP8_TENSORS_PER_LAYER = (int)FP8_PRODUCTS * (int)FP8_OPERANDS;
inline const char* fp8_product_name(int p) {
    static const char* names[] = {"qkv", "attproj", "fc", "fcproj"};
    return names[p];
}

// What quantizing clipped since the last report, per product and operand over every block:
// elements quantized, saturated (beyond the format's range) and flushed (nonzero, became zero).
struct Fp8Counts {
    uint64_t elements = 0, overflows = 0, underflows = 0;
};
struct Fp8Stats {
    Fp8Counts counts[FP8_PRODUCTS][FP8_OPERANDS];
    Fp8Counts total() const {
        Fp8Counts t;
        for (const auto& product : counts)
            for (const Fp8Counts& c : product)
                t.elements += c.elements, t.overflows += c.overflows, t.underflows += c.underflows;
        return t;
    }
};

// Delayed scaling's checkpoint state ("fp8_scaling", the same for both models): per scaled tensor
// its scale, whether it has one, its history's length and `history` amaxes, oldest first.
inline size_t fp8_state_floats_per_tensor(int history) { return 3 + (size_t)history; }
inline void check_fp8_state_size(size_t values, size_t tensors, int history, const std::string& where) {
    const size_t expected = tensors * fp8_state_floats_per_tensor(history);
    if (values != expected)
        fail(strformat("%s: the FP8 scaling state holds %zu values; this model (%zu scaled tensors, --fp8-history "
                       "%d) expects %zu (resume with the checkpoint's --fp8-history)",
                       where.c_str(), values, tensors, history, expected));
}

}  // namespace llmc
