// model_init.h: GPT-2's random initialisation of the flat parameter buffer.
//
// Weights ~ N(0, 0.02); the two projections that write into the residual stream (attprojw, fcprojw)
// ~ N(0, 0.02 / sqrt(2 L)) so the residual's variance does not grow with depth; biases 0, LayerNorm
// gains 1; wte rows of padding tokens (id >= vocab_size) 0, so they never influence anything.
//
// Reproducibility without a serial bottleneck: the parameters, taken in model FILE order (llm.c's,
// so the init is a property of the model, not of our bucket-major memory layout), are cut into
// fixed chunks of INIT_CHUNK_ELEMS elements and chunk j draws from its own Rng seeded by (seed, j),
// in file order, writing each value to its flat offset. The values depend only on the seed and the
// shape, never on the thread count, and the CUDA model calls this same function on the host, so
// both start from bitwise identical weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "llmc/params/layout.h"
#include "llmc/models/gpt2/model_file.h"
#include "llmc/rng.h"

namespace llmc {

constexpr size_t INIT_CHUNK_ELEMS = size_t(1) << 16;

inline void init_gpt2_params(const ModelConfig& config, float* params, uint64_t seed) {
    config.validate();
    const ParamLayout layout(config);
    const float weight_std = 0.02f;
    const float residual_std = 0.02f / std::sqrt(2.0f * config.num_layers);
    const size_t wte_real = (size_t)config.vocab_size * config.channels;  // rows beyond are padding

    // The std of each randomly initialised tensor; 0 marks the constant ones (gains 1, biases 0).
    auto std_of = [&](int tensor) -> float {
        switch (tensor) {
            case ParamLayout::ATTPROJW: case ParamLayout::FCPROJW: return residual_std;
            case ParamLayout::WTE: case ParamLayout::WPE: case ParamLayout::QKVW: case ParamLayout::FCW:
                return weight_std;
            default: return 0.0f;
        }
    };
    auto is_gain = [](int tensor) {
        return tensor == ParamLayout::LN1W || tensor == ParamLayout::LN2W || tensor == ParamLayout::LNFW;
    };

    const std::vector<ParamLayout::Segment> segments = file_order_segments(layout);
    const size_t num_chunks = (layout.num_params + INIT_CHUNK_ELEMS - 1) / INIT_CHUNK_ELEMS;
#pragma omp parallel for schedule(static)
    for (size_t chunk = 0; chunk < num_chunks; chunk++) {
        // A distinct, well-mixed seed per chunk (Rng's splitmix64 seeding then spreads it).
        Rng rng(seed ^ ((chunk + 1) * 0xD1B54A32D192ED03ull));
        const size_t begin = chunk * INIT_CHUNK_ELEMS;  // file-order element indices
        const size_t end = std::min(begin + INIT_CHUNK_ELEMS, layout.num_params);
        for (const ParamLayout::Segment& s : segments) {
            const int t = s.tensor;
            const size_t file_begin = layout.file_offset(t, s.layer), file_end = file_begin + (s.end - s.begin);
            const size_t lo = std::max(begin, file_begin), hi = std::min(end, file_end);
            if (lo >= hi) continue;
            const float sd = std_of(t);
            float* out = params + s.begin;  // file element i goes to out[i - file_begin]
            for (size_t i = lo; i < hi; i++) {
                float& x = out[i - file_begin];
                if (sd == 0.0f) {
                    x = is_gain(t) ? 1.0f : 0.0f;
                } else if (t == ParamLayout::WTE && i - file_begin >= wte_real) {
                    x = 0.0f;
                } else {
                    x = (float)(sd * rng.normal());
                }
            }
        }
    }
}

}  // namespace llmc
