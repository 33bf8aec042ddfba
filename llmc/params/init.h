// params/init.h: a model's random initialisation of the flat parameter buffer, following each
// tensor's init rule in its ParamTable.
//
// Reproducibility without a serial bottleneck: the parameters, taken in model FILE order (so the
// init is a property of the model, not of our bucket-major memory layout), are cut into fixed chunks
// of INIT_CHUNK_ELEMS elements and chunk j draws from its own Rng seeded by (seed, j), in file order,
// writing each value to its flat offset. The values depend only on the seed and the table, never on
// the thread count, and the CUDA model calls this same function on the host, so both models start
// from bitwise identical weights.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "llmc/params/layout.h"
#include "llmc/numerics/rng.h"

namespace llmc {

constexpr size_t INIT_CHUNK_ELEMS = size_t(1) << 16;

inline void init_params(const ParamLayout& layout, float* params, uint64_t seed) {
    const std::vector<ParamLayout::Segment> segments = layout.file_order_segments();
    const size_t num_chunks = (layout.num_params + INIT_CHUNK_ELEMS - 1) / INIT_CHUNK_ELEMS;
#pragma omp parallel for schedule(static)
    for (size_t chunk = 0; chunk < num_chunks; chunk++) {
        // A distinct, well-mixed seed per chunk (Rng's splitmix64 seeding then spreads it).
        Rng rng(seed ^ ((chunk + 1) * 0xD1B54A32D192ED03ull));
        const size_t begin = chunk * INIT_CHUNK_ELEMS;  // file-order element indices
        const size_t end = std::min(begin + INIT_CHUNK_ELEMS, layout.num_params);
        for (const ParamLayout::Segment& s : segments) {
            const size_t file_begin = layout.file_offset(s.tensor, s.layer), file_end = file_begin + (s.end - s.begin);
            const size_t lo = std::max(begin, file_begin), hi = std::min(end, file_end);
            if (lo >= hi) continue;
            const ParamInit& init = layout.init(s.tensor);
            float* out = params + s.begin;  // file element i goes to out[i - file_begin]
            for (size_t i = lo; i < hi; i++) {
                float& x = out[i - file_begin];
                if (init.rule != InitRule::Normal) x = init.rule == InitRule::Ones ? 1.0f : 0.0f;
                else if (i - file_begin >= init.random_elems) x = 0.0f;
                else x = (float)(init.std * rng.normal());
            }
        }
    }
}

}  // namespace llmc
