// split_k_table.h: the weight gradients' split of k measured fastest, per card and shape
// (split_k.h reads it; a shape not listed gets the wave model's split).
//
// Written by the matmul workbench on the card itself, in one run:
//   dev/cuda/build/matmul --tune > llmc/kernels/split_k_table.h
// (dev/bench/gpu_session.sh's `kernels` stage runs it and brings the file back.) It times every
// split from 1 to 16 of each weight gradient of GPT-2's presets at the batch sizes the benchmarks
// run, after checking each split against the CPU reference. m, n, k are cuBLASLt's: m = C (the
// product's input channels), n = OC (its output channels), k = B x T.
#pragma once

namespace llmc {

struct SplitKTuned {
    const char* device;  // cudaDeviceProp::name
    int m, n, k;
    int slices;          // 1: no split
};

// No card has been tuned yet: every shape takes the wave model's split.
inline constexpr SplitKTuned SPLIT_K_TUNED[] = {
    {"", 0, 0, 0, 1},  // (a placeholder that matches no card)
};

}  // namespace llmc
