// file_order.h (tests only): whole-buffer copies between the flat (bucket-major) parameter buffer and
// llm.c's file order, for tests that compare a model file's bytes with a buffer. The library itself
// streams a model file slice by slice (models/gpt2/model_file.h) and never needs the whole copy.
#pragma once

#include <cstring>

#include "llmc/params/layout.h"

namespace llmc {

// Copies a whole flat (bucket-major) buffer into llm.c file order, and back; num_params floats each.
inline void to_file_order(const ParamLayout& layout, const float* flat, float* file_order) {
    for (const ParamLayout::Segment& s : layout.file_order_segments())
        std::memcpy(file_order + layout.file_offset(s.tensor, s.layer), flat + s.begin, (s.end - s.begin) * sizeof(float));
}
inline void from_file_order(const ParamLayout& layout, const float* file_order, float* flat) {
    for (const ParamLayout::Segment& s : layout.file_order_segments())
        std::memcpy(flat + s.begin, file_order + layout.file_offset(s.tensor, s.layer), (s.end - s.begin) * sizeof(float));
}

}  // namespace llmc
