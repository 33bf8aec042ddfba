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
#include "llmc/dist/process_groups.h"
#include "llmc/model.h"
#include "llmc/models/backend.h"
#include "llmc/models/gpt2/gpt2_cpu.h"
#include "llmc/planner.h"

namespace llmc {

struct CpuBackend {
    // The ZeRO stage that runs (the one asked for: the CPU model shards on any world size).
    static int effective_zero_stage(const RunConfig& cfg) { return cfg.zero_stage; }

    // This rank's model, sharded over the data-parallel group by the config's ZeRO stage and cut over
    // the tensor-parallel group.
    static BuiltModel make_model(const RunConfig& cfg, const ProcessGroups& groups, const Launch&) {
        if (groups.world().rank() == 0)
            printf("device: CPU, %d OpenMP threads per rank (OMP_NUM_THREADS sets them)\n", omp_get_max_threads());
        BuiltModel built;
        try {
            built.model = std::make_unique<GPT2CPU>(cfg.model_config, cfg.batch_size, cfg.seq_len, groups.dp(),
                                                    cfg.zero_stage, groups.tp(), cfg.sequence_parallel);
        } catch (const std::bad_alloc&) {
            fail(strformat("out of memory allocating the CPU model for B %d x T %d (activations grow with B*T, the "
                           "logits with B*T*vocab): reduce -b or -t, or shard more with -z",
                           cfg.batch_size, cfg.seq_len));
        }
        return built;
    }

    // --plan: the memory of rank 0 of the dims.dp x dims.tp mesh, computed without allocating anything
    // (every tensor rank holds an equal piece, so rank 0 speaks for all).
    static std::string plan_report(const RunConfig& cfg) {
        const TensorParallel tp{cfg.dims.tp, 0, cfg.dims.tp > 1 && cfg.sequence_parallel};
        ZeroPlan zero(GPT2Params::layout(cfg.model_config, {0, cfg.dims.tp}), cfg.zero_stage, 0, cfg.dims.dp);
        std::vector<BufferSpec> buffers =
            GPT2CPU::memory_specs(zero, cfg.model_config, cfg.batch_size, cfg.seq_len, tp);
        return memory_plan_report(cfg, zero, plan_memory(cfg, zero, buffers, HostMemory::precision), "fp32 CPU model");
    }
};

}  // namespace llmc
