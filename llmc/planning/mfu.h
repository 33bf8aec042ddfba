// mfu.h: model FLOPs utilization: the share of the GPUs' dense peak that training uses.
//
// MFU = model FLOPs per token (models/gpt2/params.h, the count dev/bench uses) x tokens/s over all
// ranks / (the peak of one GPU x ranks). The peak comes from a table by the device's name (dense,
// not sparse, bf16 tensor-core FLOP/s with fp32 accumulation, from the vendors' data sheets), or
// from --peak-tflops, which wins; a device that is not in the table gets no MFU unless given one.
// With --fp8 the blocks' products run on the FP8 tensor cores at twice the rate: their FLOPs are
// counted against the FP8 peak and the rest against the bf16 one (the time the model's FLOPs take
// at the peaks, over the time they took), so FP8 shows as more tokens/s, never as MFU past 100%.
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

// Dense FP8 (E4M3/E5M2, fp32 accumulation) peak TFLOP/s by device name: twice the bf16 peak on the
// GPUs with FP8 tensor cores (Ada, Hopper, Blackwell); 0 on the others (A100, A10, RTX 3090).
inline double gpu_peak_fp8_tflops(const std::string& device_name) {
    for (const char* without : {"A100", "A800", "A10", "RTX 3090"})
        if (device_name.find(without) != std::string::npos) return 0;
    return 2 * gpu_peak_bf16_tflops(device_name);
}

// MFU in [0, 1] of `ranks` devices of peak_tflops each; -1 when the peak is unknown (0). Of the
// flops_per_token, fp8_flops_per_token run at fp8_peak_tflops (where it is > 0).
inline double model_flops_utilization(double flops_per_token, double tokens_per_s, double peak_tflops, int ranks,
                                      double fp8_flops_per_token = 0, double fp8_peak_tflops = 0) {
    if (peak_tflops <= 0) return -1;
    const double fp8_flops = fp8_peak_tflops > 0 ? fp8_flops_per_token : 0;
    double ideal_s_per_token = (flops_per_token - fp8_flops) / (peak_tflops * 1e12);
    if (fp8_flops > 0) ideal_s_per_token += fp8_flops / (fp8_peak_tflops * 1e12);
    return ideal_s_per_token * tokens_per_s / ranks;
}

}  // namespace llmc
