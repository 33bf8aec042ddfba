// models/backend.h: what a backend gives train_gpt.cu. Each binary has one backend (CpuBackend in
// cpu_backend.h for train_gpt_cpu, CudaBackend in cuda_backend.cuh for train_gpt), and every backend
// offers the same three static functions, so the main has no per-backend code:
//
//   int effective_zero_stage(const RunConfig&)     the ZeRO stage that will run
//   BuiltModel make_model(const RunConfig&, const ProcessGroups&, const Launch&)
//                                                  this rank's model, with what it needs to live
//   std::string plan_report(const RunConfig&)      --plan: rank 0's memory, nothing allocated
#pragma once

#include <memory>
#include <vector>

#include "llmc/dist/comm.h"
#include "llmc/model.h"

namespace llmc {

// A model and what it needs to live. Members are destroyed in reverse order, so the communicator
// the model keeps a reference to outlives it.
struct BuiltModel {
    std::unique_ptr<Communicator> device_comm;  // collectives on device buffers (CUDA backend), or null
    // the mesh's groups split from device_comm (CUDA backend; those that are not the world's itself)
    std::vector<std::unique_ptr<Communicator>> device_groups;
    std::unique_ptr<Model> model;
    double peak_tflops = 0;  // the device's dense bf16 peak, for MFU (mfu.h); 0: unknown
};

}  // namespace llmc
