// attention_table.h: the attention forward kernel measured fastest, per card and T
// (attention_tuning.h reads it when the kernels are left to choose: set_attention_kernels(Auto)).
//
// Written by the attention workbench on the card itself, in one run:
//   dev/cuda/build/attention_forward --tune llmc/kernels/attention_table.h
// (dev/bench/gpu_session.sh's `kernels` stage runs it and brings the file back.) It times every
// forward kernel of head size 64 at the T it lists, B x T = 8192 tokens of 12 heads, after checking
// each against version 2's output (itself checked against the CPU reference by --check). `version`
// is the workbench's: 2 mma.sync, 3 and 4 wgmma with tiles of 128 and 64 keys, 5 and 6 wgmma fed
// by TMA through 2 and 3 stages.
#pragma once

namespace llmc {

struct AttentionTuned {
    const char* device;  // cudaDeviceProp::name
    int T;
    int version;
};

inline constexpr AttentionTuned ATTENTION_TUNED[] = {
    {"NVIDIA H200", 1024, 4},  // ms: v2 0.070 v3 0.074 v4 0.058 v5 0.064 v6 0.064
    {"NVIDIA H200", 2048, 5},  // ms: v2 0.119 v3 0.115 v4 0.094 v5 0.092 v6 0.093
    {"NVIDIA H200", 4096, 5},  // ms: v2 0.219 v3 0.198 v4 0.165 v5 0.151 v6 0.153
};

}  // namespace llmc
