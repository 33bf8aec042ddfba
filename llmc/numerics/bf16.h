// bf16.h: bfloat16 as raw bits on the host: the top half of an fp32. Used where bf16 crosses host
// memory (MPI's bf16 sums, llm.c's bf16 model files); the GPU code has CUDA's own __nv_bfloat16.
// Rounding to nearest even keeps sums unbiased and matches PyTorch's .to(torch.bfloat16).
#pragma once

#include <cstdint>
#include <cstring>

namespace llmc {

inline float bf16_bits_to_float(uint16_t bits) {
    uint32_t word = (uint32_t)bits << 16;
    float value;
    std::memcpy(&value, &word, sizeof value);
    return value;
}
inline uint16_t float_to_bf16_bits(float value) {
    uint32_t word;
    std::memcpy(&word, &value, sizeof word);
    if ((word & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((word >> 16) | 0x40);  // NaN stays a quiet NaN
    word += 0x7fffu + ((word >> 16) & 1);  // carries into the exponent when rounding up, reaching inf on overflow
    return (uint16_t)(word >> 16);
}

}  // namespace llmc
