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
    static BuiltModel make_model(const RunConfig& cfg, Communicator& comm, const Launch& launch) {
        if (comm.rank() == 0)
            printf("device: CPU, %d OpenMP threads per rank (OMP_NUM_THREADS sets them)\n", omp_get_max_threads());
        // Nothing is allocated before the plan is known to fit (planner.h).
        const std::string warning = check_plan_fits_host(cfg, memory_plan(cfg, comm.rank()), launch.local_size);
        if (!warning.empty() && comm.rank() == 0) fprintf(stderr, "%s\n", warning.c_str());
        BuiltModel built;
        try {
            built.model = std::make_unique<GPT2CPU>(cfg.model_config, cfg.batch_size, cfg.seq_len, comm, cfg.zero_stage);
        } catch (const std::bad_alloc&) {
            fail(strformat("out of memory allocating the CPU model for B %d x T %d (activations grow with B*T, the "
                           "logits with B*T*vocab): reduce -b or -t, or shard more with -z",
                           cfg.batch_size, cfg.seq_len));
        }
        return built;
    }

    // --plan: the memory of rank 0 of cfg.dims.dp data-parallel ranks, computed without allocating anything.
    static std::string plan_report(const RunConfig& cfg) {
        ZeroPlan zero(GPT2Params::layout(cfg.model_config), cfg.zero_stage, 0, cfg.dims.dp);
        return memory_plan_report(cfg, zero, memory_plan(cfg, 0), "fp32 CPU model");
    }

    // What rank `rank` of cfg.dims.dp allocates.
    static MemoryPlan memory_plan(const RunConfig& cfg, int rank) {
        ZeroPlan zero(GPT2Params::layout(cfg.model_config), cfg.zero_stage, rank, cfg.dims.dp);
        std::vector<BufferSpec> buffers = GPT2CPU::memory_specs(zero, cfg.model_config, cfg.batch_size, cfg.seq_len);
        return plan_memory(cfg, zero, buffers, HostMemory::precision);
    }
};

}  // namespace llmc
