// rng.h: a small, fast, fully specified random number generator (splitmix64 seeding xoshiro256**).
//
// Everything random in llmc (weight init, data shuffling, sampling) draws from this generator, never
// from std:: distributions, whose outputs differ between standard libraries. Same seed, same numbers,
// on every machine and in the CPU and CUDA builds alike; the state is four words, easy to checkpoint.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace llmc {

class Rng {
public:
    explicit Rng(uint64_t seed = 0) { reseed(seed); }

    void reseed(uint64_t seed) {
        for (auto& word : state_) {
            seed += 0x9E3779B97F4A7C15ull;  // splitmix64 spreads one seed over the four state words
            uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            word = z ^ (z >> 31);
        }
    }

    uint64_t next_u64() {
        uint64_t* s = state_.data();
        uint64_t result = rotl(s[1] * 5, 7) * 9;
        uint64_t t = s[1] << 17;
        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
        s[2] ^= t;
        s[3] = rotl(s[3], 45);
        return result;
    }
    // Uniform in [0, 1) with 24 random bits, exactly representable as float.
    float uniform() { return (float)(next_u64() >> 40) * (1.0f / 16777216.0f); }
    // Uniform integer in [0, n), n > 0 (multiply-shift; the bias is below 2^-32 for n < 2^32).
    uint64_t below(uint64_t n) { return (uint64_t)(((unsigned __int128)next_u64() * n) >> 64); }
    // Standard normal by Box-Muller, in double for accuracy, one value per call.
    double normal() {
        double u1 = ((next_u64() >> 11) + 1) * (1.0 / 9007199254740993.0);  // (0, 1]
        double u2 = (next_u64() >> 11) * (1.0 / 9007199254740992.0);       // [0, 1)
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }

    const std::array<uint64_t, 4>& state() const { return state_; }
    void set_state(const std::array<uint64_t, 4>& s) { state_ = s; }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    std::array<uint64_t, 4> state_{};
};

// Fisher-Yates shuffle driven by Rng, so a permutation depends only on the seed.
template <typename T>
void shuffle(T* items, size_t n, Rng& rng) {
    for (size_t i = n; i > 1; i--) {
        size_t j = rng.below(i);
        T tmp = items[i - 1];
        items[i - 1] = items[j];
        items[j] = tmp;
    }
}

}  // namespace llmc
