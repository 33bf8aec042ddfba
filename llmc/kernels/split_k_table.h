// split_k_table.h: the weight gradients' split of k measured fastest, per card and shape
// (split_k.h reads it; a shape not listed gets the wave model's split).
//
// Written by the matmul workbench on the card itself, in one run:
//   dev/cuda/build/matmul --tune llmc/kernels/split_k_table.h
// (dev/bench/gpu_session.sh's `kernels` stage runs it and brings the file back.) It times every
// split from 1 to 16 of each weight gradient of GPT-2's presets at the batch sizes the benchmarks
// run, after checking each split against the product over the whole of k (itself checked against
// the CPU reference by the workbench's checks). m, n, k are cuBLASLt's: m = C (the product's input
// channels), n = OC (its output channels), k = B x T.
#pragma once

namespace llmc {

struct SplitKTuned {
    const char* device;  // cudaDeviceProp::name
    int m, n, k;
    int slices;          // 1: no split
};

inline constexpr SplitKTuned SPLIT_K_TUNED[] = {
    {"NVIDIA H200", 768, 2304, 8192, 1},  // d12 qkv: 0.054 ms whole, 0.054 ms split
    {"NVIDIA H200", 768, 2304, 16384, 1},  // d12 qkv: 0.093 ms whole, 0.093 ms split
    {"NVIDIA H200", 768, 2304, 32768, 1},  // d12 qkv: 0.176 ms whole, 0.176 ms split
    {"NVIDIA H200", 768, 2304, 65536, 1},  // d12 qkv: 0.332 ms whole, 0.332 ms split
    {"NVIDIA H200", 768, 2304, 131072, 2},  // d12 qkv: 0.650 ms whole, 0.647 ms split
    {"NVIDIA H200", 768, 768, 8192, 1},  // d12 attproj: 0.029 ms whole, 0.029 ms split
    {"NVIDIA H200", 768, 768, 16384, 4},  // d12 attproj: 0.378 ms whole, 0.042 ms split
    {"NVIDIA H200", 768, 768, 32768, 4},  // d12 attproj: 0.733 ms whole, 0.064 ms split
    {"NVIDIA H200", 768, 768, 65536, 4},  // d12 attproj: 1.429 ms whole, 0.114 ms split
    {"NVIDIA H200", 768, 768, 131072, 2},  // d12 attproj: 2.830 ms whole, 0.231 ms split
    {"NVIDIA H200", 768, 3072, 8192, 1},  // d12 fc: 0.063 ms whole, 0.063 ms split
    {"NVIDIA H200", 768, 3072, 16384, 1},  // d12 fc: 0.115 ms whole, 0.115 ms split
    {"NVIDIA H200", 768, 3072, 32768, 1},  // d12 fc: 0.212 ms whole, 0.212 ms split
    {"NVIDIA H200", 768, 3072, 65536, 2},  // d12 fc: 0.417 ms whole, 0.391 ms split
    {"NVIDIA H200", 768, 3072, 131072, 2},  // d12 fc: 0.842 ms whole, 0.776 ms split
    {"NVIDIA H200", 3072, 768, 8192, 1},  // d12 fcproj: 0.068 ms whole, 0.068 ms split
    {"NVIDIA H200", 3072, 768, 16384, 1},  // d12 fcproj: 0.120 ms whole, 0.120 ms split
    {"NVIDIA H200", 3072, 768, 32768, 2},  // d12 fcproj: 0.219 ms whole, 0.215 ms split
    {"NVIDIA H200", 3072, 768, 65536, 2},  // d12 fcproj: 0.419 ms whole, 0.399 ms split
    {"NVIDIA H200", 3072, 768, 131072, 2},  // d12 fcproj: 0.847 ms whole, 0.782 ms split
    {"NVIDIA H200", 1024, 3072, 8192, 1},  // d24 qkv: 0.080 ms whole, 0.080 ms split
    {"NVIDIA H200", 1024, 3072, 16384, 1},  // d24 qkv: 0.144 ms whole, 0.144 ms split
    {"NVIDIA H200", 1024, 3072, 32768, 1},  // d24 qkv: 0.270 ms whole, 0.270 ms split
    {"NVIDIA H200", 1024, 3072, 65536, 1},  // d24 qkv: 0.522 ms whole, 0.522 ms split
    {"NVIDIA H200", 1024, 3072, 131072, 1},  // d24 qkv: 1.055 ms whole, 1.055 ms split
    {"NVIDIA H200", 1024, 1024, 8192, 1},  // d24 attproj: 0.038 ms whole, 0.038 ms split
    {"NVIDIA H200", 1024, 1024, 16384, 1},  // d24 attproj: 0.058 ms whole, 0.058 ms split
    {"NVIDIA H200", 1024, 1024, 32768, 2},  // d24 attproj: 0.706 ms whole, 0.102 ms split
    {"NVIDIA H200", 1024, 1024, 65536, 2},  // d24 attproj: 1.384 ms whole, 0.184 ms split
    {"NVIDIA H200", 1024, 1024, 131072, 2},  // d24 attproj: 2.744 ms whole, 0.353 ms split
    {"NVIDIA H200", 1024, 4096, 8192, 1},  // d24 fc: 0.099 ms whole, 0.099 ms split
    {"NVIDIA H200", 1024, 4096, 16384, 1},  // d24 fc: 0.183 ms whole, 0.183 ms split
    {"NVIDIA H200", 1024, 4096, 32768, 1},  // d24 fc: 0.345 ms whole, 0.345 ms split
    {"NVIDIA H200", 1024, 4096, 65536, 1},  // d24 fc: 0.683 ms whole, 0.683 ms split
    {"NVIDIA H200", 1024, 4096, 131072, 1},  // d24 fc: 1.334 ms whole, 1.334 ms split
    {"NVIDIA H200", 4096, 1024, 8192, 1},  // d24 fcproj: 0.097 ms whole, 0.097 ms split
    {"NVIDIA H200", 4096, 1024, 16384, 1},  // d24 fcproj: 0.179 ms whole, 0.179 ms split
    {"NVIDIA H200", 4096, 1024, 32768, 1},  // d24 fcproj: 0.339 ms whole, 0.339 ms split
    {"NVIDIA H200", 4096, 1024, 65536, 1},  // d24 fcproj: 0.671 ms whole, 0.671 ms split
    {"NVIDIA H200", 4096, 1024, 131072, 1},  // d24 fcproj: 1.324 ms whole, 1.324 ms split
    {"NVIDIA H200", 1280, 1280, 8192, 1},  // d36 attproj: 0.057 ms whole, 0.057 ms split
    {"NVIDIA H200", 1280, 1280, 16384, 1},  // d36 attproj: 0.093 ms whole, 0.093 ms split
    {"NVIDIA H200", 1280, 1280, 32768, 1},  // d36 attproj: 0.175 ms whole, 0.175 ms split
    {"NVIDIA H200", 1280, 1280, 65536, 2},  // d36 attproj: 1.388 ms whole, 0.326 ms split
    {"NVIDIA H200", 1280, 1280, 131072, 2},  // d36 attproj: 2.740 ms whole, 0.636 ms split
    {"NVIDIA H200", 1600, 1600, 8192, 1},  // d48 attproj: 0.067 ms whole, 0.067 ms split
    {"NVIDIA H200", 1600, 1600, 16384, 1},  // d48 attproj: 0.122 ms whole, 0.122 ms split
    {"NVIDIA H200", 1600, 1600, 32768, 1},  // d48 attproj: 0.223 ms whole, 0.223 ms split
    {"NVIDIA H200", 1600, 1600, 65536, 1},  // d48 attproj: 0.435 ms whole, 0.435 ms split
    {"NVIDIA H200", 1600, 1600, 131072, 1},  // d48 attproj: 0.858 ms whole, 0.858 ms split
};

}  // namespace llmc
