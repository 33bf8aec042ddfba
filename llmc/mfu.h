// mfu.h: model FLOPs utilization: the share of the GPUs' dense bf16 peak that training uses.
//
// MFU = model FLOPs per token (models/gpt2/params.h, the count dev/bench uses) x tokens/s over all
// ranks / (the peak of one GPU x ranks). The peak comes from a table by the device's name (dense,
// not sparse, bf16 tensor-core FLOP/s with fp32 accumulation, from the vendors' data sheets), or
// from --peak-tflops, which wins; a device that is not in the table gets no MFU unless given one.
#pragma once

#include <string>

namespace llmc {

// Dense bf16 peak TFLOP/s of a GPU by its CUDA device name; 0 when the name is not in the table.
// More specific names come first ("H100 PCIe" before "H100"; GH200 is an H200 here).
inline double gpu_peak_bf16_tflops(const std::string& device_name) {
    static const struct {
        const char* name_contains;
        double tflops;
    } table[] = {
        {"GB200", 2500}, {"B200", 2250}, {"H200", 989}, {"H100 PCIe", 756},
        {"H100 NVL", 835}, {"H100", 989}, {"H800", 989}, {"A100", 312}, {"A800", 312},
        {"L40S", 362}, {"L40", 181}, {"L4", 121}, {"A10G", 70}, {"A10", 125},
        {"RTX 4090", 165}, {"RTX 3090", 71},
    };
    for (const auto& row : table)
        if (device_name.find(row.name_contains) != std::string::npos) return row.tflops;
    return 0;
}

// MFU in [0, 1] of `ranks` devices of peak_tflops each; -1 when the peak is unknown (0).
inline double model_flops_utilization(double flops_per_token, double tokens_per_s, double peak_tflops, int ranks) {
    if (peak_tflops <= 0) return -1;
    return flops_per_token * tokens_per_s / (peak_tflops * 1e12 * ranks);
}

}  // namespace llmc
