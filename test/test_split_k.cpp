// How a weight gradient's k is cut (llmc/kernels/split_k.h): the slices cover k exactly, the wave
// model splits only outputs too small to fill the GPU and then fills its waves, the partials stay
// within their buffer, and a forced split is honoured as far as k allows. (The products over the
// slices are checked against the CPU reference in dev/cuda/matmul.cu and test/gpu/test_cuda_model.cu.)
#include <catch2/catch.hpp>

#include "llmc/kernels/split_k.h"

using namespace llmc;

namespace {
constexpr size_t PARTIALS = size_t(32) << 20;
constexpr int H100_SMS = 132;

// Every slice but the last has slice_k rows, the last between 1 and slice_k, and together they are k.
void check_covers(const SplitK& s, int k) {
    INFO("k " << k << ", " << s.slices << " slices of " << s.slice_k);
    REQUIRE(s.slices >= 1);
    CHECK(s.last_k(k) >= 1);
    CHECK(s.last_k(k) <= s.slice_k);
    CHECK((long)(s.slices - 1) * s.slice_k + s.last_k(k) == k);
    CHECK(s.full_slices(k) == (s.last_k(k) == s.slice_k ? s.slices : s.slices - 1));
}
}  // namespace

TEST_CASE("split_k_even cuts k into whole granules, the last slice the rest", "[split_k]") {
    for (int k : {16, 100, 128, 1000, 4096, 131072, 131072 + 48})
        for (int slices : {1, 2, 3, 5, 7, 16})
            for (int granule : {16, 64}) {
                const SplitK s = split_k_even(k, slices, granule);
                check_covers(s, k);
                CHECK(s.slices <= slices);
                if (s.slices > 1) CHECK(s.slice_k % granule == 0);
            }
    CHECK(split_k_even(131072, 4, 64).slices == 4);
    CHECK(split_k_even(131072, 4, 64).slice_k == 32768);
    const SplitK seven = split_k_even(131072, 7, 64);  // 18725 rounds up to 18752; the last has 18560
    CHECK(seven.slices == 7);
    CHECK(seven.slice_k == 18752);
    CHECK(seven.last_k(131072) == 18560);
    CHECK(seven.full_slices(131072) == 6);
    CHECK(split_k_even(128, 3, 16).slices == 3);   // 43 rounds up to 48: 48, 48, 32
    CHECK(split_k_even(16, 4, 16).slices == 1);    // one granule cannot be cut
}

TEST_CASE("the wave model splits small outputs over long k in powers of two until every SM has a CTA", "[split_k]") {
    // GPT-2 124M's attention projection at B 128, T 1024: 36 tiles on 132 SMs; 4 slices give 144 CTAs
    // (2 give 72). GPT-2 350M's (1024 x 1024: 64 tiles): 2 give 128 CTAs, so 4.
    const SplitK attproj = split_k_by_waves(768, 768, 131072, H100_SMS, PARTIALS);
    CHECK(attproj.slices == 4);
    check_covers(attproj, 131072);
    CHECK(split_k_by_waves(1024, 1024, 65536, H100_SMS, PARTIALS).slices == 4);
    // On a card of 72 SMs, 2 slices of the 36 tiles give each a CTA; on one of 64 the tiles alone fill
    // more than half of it, so no split.
    CHECK(split_k_by_waves(768, 768, 131072, 72, PARTIALS).slices == 2);
    CHECK(split_k_by_waves(768, 768, 131072, 64, PARTIALS).slices == 1);
    // Never a count that is not a power of two, whatever the SMs.
    for (int sms : {40, 80, 100, 132, 200, 400})
        for (int k : {4096, 16384, 131072}) {
            const int s = split_k_by_waves(768, 768, k, sms, PARTIALS).slices;
            INFO(sms << " SMs, k " << k << ": " << s << " slices");
            CHECK((s & (s - 1)) == 0);
        }
    // Outputs whose tiles already fill half the SMs are left alone: the fc and qkv weights (144 and 108
    // tiles), GPT-2 1.5B's attention projection (1600 x 1600: 169 tiles).
    CHECK(split_k_by_waves(768, 3072, 131072, H100_SMS, PARTIALS).slices == 1);
    CHECK(split_k_by_waves(768, 2304, 131072, H100_SMS, PARTIALS).slices == 1);
    CHECK(split_k_by_waves(1600, 1600, 16384, H100_SMS, PARTIALS).slices == 1);
    // Short k: no slice shorter than MIN_SLICE_K.
    CHECK(split_k_by_waves(768, 768, 1024, H100_SMS, PARTIALS).slices == 1);
    for (int k : {2048, 4096, 8192, 16384, 65536}) {
        const SplitK s = split_k_by_waves(768, 768, k, H100_SMS, PARTIALS);
        check_covers(s, k);
        if (s.slices > 1) CHECK(s.slice_k >= split_k_detail::MIN_SLICE_K);
    }
    // The partials must fit: 768 x 768 floats are 2.25 MiB a slice, so 4 MiB holds one slice only.
    CHECK(split_k_by_waves(768, 768, 131072, H100_SMS, size_t(4) << 20).slices == 1);
    CHECK(split_k_by_waves(768, 768, 131072, H100_SMS, size_t(5) << 20).slices == 2);
    // Short k: the slices stop at MIN_SLICE_K rows (k 2048: 2 slices of 1024, not 4 of 512).
    CHECK(split_k_by_waves(768, 768, 2048, H100_SMS, PARTIALS).slices == 2);
    // No SM count known: no split.
    CHECK(split_k_by_waves(768, 768, 131072, 0, PARTIALS).slices == 1);
}

TEST_CASE("choose_split_k: forced, then the tuned table, then the wave model; never past the partials", "[split_k]") {
    const char* card = "NVIDIA H100 80GB HBM3";
    CHECK(choose_split_k(768, 768, 131072, card, H100_SMS, PARTIALS).slices ==
          split_k_by_waves(768, 768, 131072, H100_SMS, PARTIALS).slices);
    // Forced: as many slices as k allows, in granules of 16 rows, even where the model would not split.
    CHECK(choose_split_k(64, 64, 256, card, H100_SMS, PARTIALS, 3).slices == 3);
    CHECK(choose_split_k(768, 3072, 131072, card, H100_SMS, PARTIALS, 2).slices == 2);
    CHECK(choose_split_k(64, 64, 16, card, H100_SMS, PARTIALS, 4).slices == 1);
    CHECK(choose_split_k(64, 64, 256, card, H100_SMS, PARTIALS, 1).slices == 1);
    // Forced past what the partials hold: capped at what fits (1536 x 1536 floats: 9 MiB a slice).
    CHECK(choose_split_k(1536, 1536, 131072, card, H100_SMS, PARTIALS, 8).slices == 3);
    CHECK(split_k_tuned(card, 768, 768, 131072) == 0);  // the H100 is not tuned yet
    // The H200's rows (split_k_table.h, from matmul --tune on one, 2026-11-28) come before the model.
    const char* h200 = "NVIDIA H200";
    CHECK(split_k_tuned(h200, 768, 768, 65536) == 4);
    CHECK(choose_split_k(768, 768, 65536, h200, H100_SMS, PARTIALS).slices == 4);
    CHECK(choose_split_k(768, 768, 131072, h200, H100_SMS, PARTIALS).slices == 2);
}
