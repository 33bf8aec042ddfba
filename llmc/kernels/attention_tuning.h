// attention_tuning.h: the choices of attention kernels (--attention), and which attention forward
// kernel a card runs at a sequence length, from the table the workbench's --tune writes
// (attention_table.h). Host logic only, so the choice is tested without a GPU
// (test/test_attention_tuning.cpp).
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include "llmc/kernels/attention_table.h"
#include "llmc/utils.h"

namespace llmc {

// Which kernels attention and the ring pairs run for head size 64 (other head sizes always run
// mma.sync): mma.sync (attention.cuh), wgmma (attention_hopper.cuh, an sm_90 device only), wgmma
// with the forward fed by TMA from a producer warpgroup (attention_hopper_tma.cuh, which also feeds
// the backward), or, wherever the device is sm_90, the tuned forward with the TMA-fed backward.
// Host code, so the run config checks --attention with the same parser.
enum class AttentionKernels { MmaSync, Wgmma, Tma, Auto };

inline const char* attention_kernels_name(AttentionKernels k) {
    return k == AttentionKernels::MmaSync ? "mma"
           : k == AttentionKernels::Wgmma ? "wgmma"
           : k == AttentionKernels::Tma   ? "tma"
                                          : "auto";
}
// "mma", "wgmma", "tma" or "auto" (a flag's value); anything else fails naming `flag`.
inline AttentionKernels parse_attention_kernels(const std::string& value, const char* flag) {
    if (value == "mma") return AttentionKernels::MmaSync;
    if (value == "wgmma") return AttentionKernels::Wgmma;
    if (value == "tma") return AttentionKernels::Tma;
    if (value == "auto") return AttentionKernels::Auto;
    fail(strformat("%s must be mma, wgmma, tma or auto, got '%s'", flag, value.c_str()));
}

// The tuned version for `device` at T rows: the row of that device with the largest T not above
// the asked one (a longer sequence is more like the longest one measured below it), else that
// device's shortest row; `fallback` where the table has no row for the device.
inline int tuned_forward_version(const AttentionTuned* table, size_t rows, const char* device, int T, int fallback) {
    const AttentionTuned* below = nullptr;
    const AttentionTuned* shortest = nullptr;
    for (size_t i = 0; i < rows; i++) {
        const AttentionTuned& r = table[i];
        if (std::strcmp(r.device, device) != 0 || r.device[0] == '\0') continue;
        if (r.T <= T && (!below || r.T > below->T)) below = &r;
        if (!shortest || r.T < shortest->T) shortest = &r;
    }
    return below ? below->version : shortest ? shortest->version : fallback;
}

inline int tuned_forward_version(const char* device, int T, int fallback) {
    return tuned_forward_version(ATTENTION_TUNED, sizeof(ATTENTION_TUNED) / sizeof(ATTENTION_TUNED[0]), device, T,
                                 fallback);
}

}  // namespace llmc
