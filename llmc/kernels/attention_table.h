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

// No card has been tuned yet: every device takes the default (version 3).
inline constexpr AttentionTuned ATTENTION_TUNED[] = {
    {"", 0, 3},  // (a placeholder that matches no card)
};

}  // namespace llmc
