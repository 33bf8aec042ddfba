// models/cpu_backend.h: the CPU backend (models/backend.h): train_gpt_cpu's fp32 CPU reference
// model, made from a resolved run config.
#pragma once

#include <omp.h>

#include <cstdio>
#include <memory>
#include <new>
#include <string>

#include "llmc/config.h"
#include "llmc/dist/bootstrap.h"
#include "llmc/dist/comm.h"
#include "llmc/model.h"
#include "llmc/models/backend.h"
#include "llmc/models/gpt2/gpt2_cpu.h"
#include "llmc/planner.h"

namespace llmc {

struct CpuBackend {
    // The ZeRO stage that runs (the one asked for: the CPU model shards on any world size).
    static int effective_zero_stage(const RunConfig& cfg) { return cfg.zero_stage; }

    // This rank's model, sharded over `comm` (the data-parallel group) by the config's ZeRO stage.
    static BuiltModel make_model(const RunConfig& cfg, Communicator& comm, const Launch&) {
        if (comm.rank() == 0)
            printf("device: CPU, %d OpenMP threads per rank (OMP_NUM_THREADS sets them)\n", omp_get_max_threads());
        BuiltModel built;
        try {
            built.model = std::make_unique<GPT2CPU>(cfg.model_config, cfg.batch_size, cfg.seq_len, comm, cfg.zero_stage);
        } catch (const std::bad_alloc&) {
            fail(strformat("out of memory allocating the CPU model for B %d x T %d (activations grow with B*T, the "
                           "logits with B*T*vocab): reduce -b or -t, or shard more with -z",
                           cfg.batch_size, cfg.seq_len));
        }
        built.peak_tflops = cfg.peak_tflops;  // MFU on the CPU only when asked for
        return built;
    }

    // --plan: the memory of rank 0 of cfg.dims.dp data-parallel ranks, computed without allocating anything.
    static std::string plan_report(const RunConfig& cfg) {
        ZeroPlan zero(GPT2Params::layout(cfg.model_config), cfg.zero_stage, 0, cfg.dims.dp);
        std::vector<BufferSpec> buffers = GPT2CPU::memory_specs(zero, cfg.model_config, cfg.batch_size, cfg.seq_len);
        return memory_plan_report(cfg, zero, plan_memory(cfg, zero, buffers, HostMemory::precision), "fp32 CPU model");
    }
};

}  // namespace llmc
