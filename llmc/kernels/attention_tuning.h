// attention_tuning.h: which attention forward kernel a card runs at a sequence length, from the
// table the workbench's --tune writes (attention_table.h). Host logic only, so the choice is tested
// without a GPU (test/test_attention_tuning.cpp).
#pragma once

#include <cstddef>
#include <cstring>

#include "llmc/kernels/attention_table.h"

namespace llmc {

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
