// nvtx.cuh: named ranges on the Nsight Systems timeline, so a profile of train_gpt reads like the
// code: "layer 3 forward", "layer 3 backward", "adamw", "grad norm", and each collective by what it
// moves ("all_reduce of 1048576 f32").
//
// NVTX 3 ships with the CUDA toolkit and is header-only: without a profiler attached each push and
// pop is a call through a null function pointer (nanoseconds), so the ranges stay compiled in.
#pragma once

#include <nvtx3/nvToolsExt.h>

#include <string>

#include "llmc/utils.h"

namespace llmc {

// RAII: the range is open for the lifetime of the object, on the calling host thread.
class NvtxRange {
public:
    explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
    explicit NvtxRange(const std::string& name) : NvtxRange(name.c_str()) {}
    NvtxRange(const char* what, int layer) : NvtxRange(strformat("layer %d %s", layer, what)) {}
    ~NvtxRange() { nvtxRangePop(); }
    NvtxRange(const NvtxRange&) = delete;
    NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace llmc
