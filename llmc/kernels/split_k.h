// split_k.h: how many parts a weight gradient's k is cut into (host code only, no CUDA).
//
// A weight gradient dW (OC x C) += dout^T inp sums over k = B x T rows: a small output and a huge
// k. cuBLASLt gives each output tile one CTA, so GPT-2 124M's attention projection (768 x 768 out,
// 36 tiles of 128 x 128) keeps 36 of an H100's 132 SMs busy for the whole of k = 131,072. Cutting
// k into S slices makes S products of the same output shape, one cuBLASLt call with S batches that
// write S fp32 partial sums, and a kernel adds the partials to dW in slice order
// (matmul.cuh: split_k_sum_kernel). Each output element is then the same sums in the same order every
// run: the split is as reproducible as the product it replaces, and it depends only on the shape and
// the GPU (like cuBLASLt's choice of algorithm).
//
// How S is chosen, in order:
//   1. a forced S (MatmulContext::force_split_k: tests and the workbench's sweep);
//   2. the tuned table (split_k_table.h): the fastest S the matmul workbench measured for this
//      card and shape (`dev/cuda/build/matmul --tune`);
//   3. otherwise the wave model below.
// The wave model assumes cuBLASLt's 128 x 128 output tiles, one CTA per SM at a time. It leaves a
// product alone when its tiles already fill half the SMs, and otherwise picks the smallest power of
// two S that gives every SM a CTA (36 tiles on 132 SMs: S = 4), each slice at least MIN_SLICE_K long,
// the partials within the context's buffer; where none does, the largest that fits. Powers of two
// because cuBLASLt's batched products were slow at the others on the one card measured (an H200,
// 2026-11-28: GPT-2 124M's attention projection at k = 65,536 took 0.114 ms in 4 slices, 0.117 in 8,
// 0.124 in 2, but 0.33-0.57 in 3, 5, 6 or 7; the model had filled its waves with 7).
#pragma once

#include <cstddef>
#include <cstring>

#include "llmc/kernels/split_k_table.h"

namespace llmc {

// k cut into `slices` parts: every part but the last has slice_k rows, the last the rest (at most
// slice_k, at least 1).
struct SplitK {
    int slices = 1;
    int slice_k = 0;  // = k when slices == 1
    int last_k(int k) const { return k - (slices - 1) * slice_k; }
    // The parts that have exactly slice_k rows (one batched product); the last part is one more
    // product when it is shorter.
    int full_slices(int k) const { return last_k(k) == slice_k ? slices : slices - 1; }
};

namespace split_k_detail {
constexpr int TILE = 128;                // cuBLASLt's usual output tile on Hopper, both ways
constexpr int MIN_SLICE_K = 1024;        // shorter slices spend more on the partials than they save
constexpr int MAX_SLICES = 16;
constexpr int SLICE_GRANULE = 64;        // the wave model's slices: whole k tiles of cuBLASLt's kernels
constexpr int FORCED_SLICE_GRANULE = 16; // a forced split's: FP8 operands stay 16-byte aligned

inline int round_up(int x, int granule) { return (x + granule - 1) / granule * granule; }
}  // namespace split_k_detail

// k cut into at most `slices` parts of a whole number of `granule` rows each (the last part shorter);
// fewer parts when k is too short for that many.
inline SplitK split_k_even(int k, int slices, int granule) {
    using namespace split_k_detail;
    if (slices <= 1 || k <= granule) return SplitK{1, k};
    const int slice_k = round_up((k + slices - 1) / slices, granule);
    if (slice_k >= k) return SplitK{1, k};
    return SplitK{(k + slice_k - 1) / slice_k, slice_k};
}

// The wave model's split of an (m x n) output over k rows on a GPU with `sms` SMs, whose partials
// ((slices) x m x n floats) fit in partial_bytes.
inline SplitK split_k_by_waves(int m, int n, int k, int sms, size_t partial_bytes) {
    using namespace split_k_detail;
    const long tiles = (long)((m + TILE - 1) / TILE) * ((n + TILE - 1) / TILE);
    const SplitK none{1, k};
    if (sms < 1 || 2 * tiles > sms) return none;
    SplitK best = none;
    for (int s = 2; s <= MAX_SLICES; s *= 2) {
        const SplitK split = split_k_even(k, s, SLICE_GRANULE);
        // more slices are only shorter, and take more partials
        if (split.slices != s || split.slice_k < MIN_SLICE_K) break;
        if ((size_t)s * m * n * sizeof(float) > partial_bytes) break;
        best = split;
        if (tiles * s >= sms) break;  // every SM has a CTA
    }
    return best;
}

// The tuned table's slices for this card (by name, as cudaDeviceProp::name gives it) and shape, or
// 0 where it has no row.
inline int split_k_tuned(const char* device_name, int m, int n, int k) {
    for (const SplitKTuned& row : SPLIT_K_TUNED)
        if (std::strcmp(row.device, device_name) == 0 && row.m == m && row.n == n && row.k == k) return row.slices;
    return 0;
}

// The split a weight gradient's product uses: forced (> 0), else the tuned table's, else the wave
// model's; never more partials than partial_bytes holds.
inline SplitK choose_split_k(int m, int n, int k, const char* device_name, int sms, size_t partial_bytes,
                             int forced = 0) {
    using namespace split_k_detail;
    const size_t slice_bytes = (size_t)m * n * sizeof(float);
    const int fit = slice_bytes ? (int)(partial_bytes / slice_bytes) : 0;
    auto capped = [&](int slices, int granule) {
        return split_k_even(k, slices < fit ? slices : fit, granule);
    };
    if (forced > 0) return capped(forced, FORCED_SLICE_GRANULE);
    if (const int tuned = split_k_tuned(device_name, m, n, k); tuned > 0) return capped(tuned, SLICE_GRANULE);
    return split_k_by_waves(m, n, k, sms, partial_bytes);
}

}  // namespace llmc
