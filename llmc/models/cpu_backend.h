// models/cpu_backend.h: the CPU backend (models/backend.h): train_gpt_cpu's fp32 CPU reference
// model, made from a resolved run config.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <thread>

#include "llmc/config.h"
#include "llmc/dist/bootstrap.h"
#include "llmc/dist/comm.h"
#include "llmc/dist/process_groups.h"
#include "llmc/model.h"
#include "llmc/models/backend.h"
#include "llmc/models/cpu_model.h"
#include "llmc/planning/planner.h"

namespace llmc {

// How many ranks share this machine: Open MPI's and Slurm's own count where they give one, else the
// launch's (ranks that share memory; 1 without a launcher).
inline int ranks_on_this_node(const Launch& launch) {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
        const char* value = getenv(name);
        const int n = value ? atoi(value) : 0;  // SLURM_TASKS_PER_NODE reads "4(x2),3": this node's count leads
        if (n > 0) return n;
    }
    return std::max(1, launch.local_size);
}

// OpenMP threads per rank: OMP_NUM_THREADS wins; otherwise the machine's cores shared out among
// the ranks on it (at least 1, at most the cores this rank may run on), so several ranks on one
// machine do not each start a thread per core and fight over them. Returns how the count was chosen.
inline std::string set_threads_per_rank(const Launch& launch) {
    if (getenv("OMP_NUM_THREADS")) return "OMP_NUM_THREADS";
    const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    const int ranks = ranks_on_this_node(launch);
    omp_set_num_threads(std::max(1, std::min(omp_get_num_procs(), cores / ranks)));
    return strformat("%d core(s) / %d rank(s) on this node; OMP_NUM_THREADS overrides", cores, ranks);
}

struct CpuBackend {
    // The ZeRO stage that runs (the one asked for: the CPU model shards on any world size).
    static int effective_zero_stage(const RunConfig& cfg) { return cfg.zero_stage; }

    // This rank's model, sharded over the data x context group by the config's ZeRO stage, cut over
    // the tensor-parallel group, one stage of the pipeline, and its positions of each sequence.
    static BuiltModel make_model(const RunConfig& cfg, const ProcessGroups& groups, const Launch& launch) {
        const std::string threads_why = set_threads_per_rank(launch);
        const bool is_rank0 = groups.world().rank() == 0;
        if (is_rank0)
            printf("device: CPU, %d OpenMP thread(s) per rank (%s)\n", omp_get_max_threads(), threads_why.c_str());
        // Nothing is allocated before the plan is known to fit (planner.h).
        const std::string warning = check_plan_fits_host(
            cfg, memory_plan(cfg, groups.zero_shard().rank(), groups.tp().rank(), groups.pp().rank()), launch.local_size);
        if (!warning.empty() && is_rank0) fprintf(stderr, "%s\n", warning.c_str());
        BuiltModel built;
        try {
            // ZeRO over the shard group: the data x context group, or one block of it (--dp-shard)
            auto model = std::make_unique<CPUModel>(cfg.model_config, cfg.batch_size, cfg.seq_len, groups.zero_shard(),
                                                   cfg.zero_stage, groups.tp(), cfg.sequence_parallel, groups.pp(),
                                                   pipeline_of(cfg), groups.cp(), groups.ep(), &groups.expert_data(),
                                                   &groups.zero_replicas());
            model->set_moe_options({cfg.capacity_factor, cfg.moe_balance_coef, cfg.moe_z_coef});
            model->set_fp8_options(fp8_options(cfg));
            built.model = std::move(model);
        } catch (const std::bad_alloc&) {
            fail(strformat("out of memory allocating the CPU model for B %d x T %d (activations grow with B*T, the "
                           "logits with B*T*vocab): reduce -b or -t, or shard more with -z",
                           cfg.batch_size, cfg.seq_len));
        }
        built.peak_tflops = cfg.peak_tflops;  // MFU on the CPU only when asked for
        return built;
    }

    // --plan: the memory of rank 0 of the dp x pp x cp x tp mesh, computed without allocating
    // anything (every tensor and context rank holds an equal piece, so rank 0 speaks for all), and
    // under pipeline parallelism the first rank of every stage (each holds different layers).
    static std::string plan_report(const RunConfig& cfg) {
        auto zero_of = [&](int pp_rank) { return zero_plan(cfg, stage_layout(cfg, 0, pp_rank), 0); };
        std::string out = memory_plan_report(cfg, zero_of(0), memory_plan(cfg, 0, 0, 0), "fp32 CPU model");
        if (cfg.dims.pp > 1) {
            std::vector<MemoryPlan> stages;
            for (int s = 0; s < cfg.dims.pp; s++) stages.push_back(memory_plan(cfg, 0, 0, s));
            out += pipeline_plan_report(cfg, pipeline_split(cfg), stages);
        }
        return out;
    }

    // (Every expert-parallel rank holds an equal block of the experts: rank 0's speaks for all.)
    static ParamLayout stage_layout(const RunConfig& cfg, int tp_rank, int pp_rank) {
        return model_layout(cfg.model_config, {tp_rank, cfg.dims.tp},
                            model_stage_slice(cfg.model_config, pipeline_split(cfg), pp_rank), {0, cfg.dims.ep});
    }
    // ZeRO's plan for rank `zero_rank` of the data x context group (of one shard group of it under
    // --dp-shard); its experts' buckets are sharded over its expert data group (dp / ep ranks; rank
    // zero_rank / ep in it).
    static ZeroPlan zero_plan(const RunConfig& cfg, const ParamLayout& layout, int zero_rank) {
        const int zero_world = cfg.dims.shard_size() * cfg.dims.cp;
        return ZeroPlan(layout, cfg.zero_stage, zero_rank, zero_world, 1, zero_rank / cfg.dims.ep,
                        zero_world / cfg.dims.ep);
    }
    // What rank `zero_rank` of the data x context group (ZeRO's) of tensor rank `tp_rank` in pipeline
    // stage `pp_rank` allocates (every tensor rank holds an equal piece).
    static MemoryPlan memory_plan(const RunConfig& cfg, int zero_rank, int tp_rank, int pp_rank) {
        const TensorParallel tp{cfg.dims.tp, tp_rank, cfg.dims.tp > 1 && cfg.sequence_parallel};
        ZeroPlan zero = zero_plan(cfg, stage_layout(cfg, tp_rank, pp_rank), zero_rank);
        std::vector<BufferSpec> buffers =
            CPUModel::memory_specs(zero, cfg.model_config, cfg.batch_size, cfg.seq_len, tp,
                                  pipeline_stage_shape(pipeline_of(cfg), pp_rank), cfg.dims.cp, cfg.dims.ep);
        return plan_memory(cfg, zero, buffers, HostMemory::precision, pp_rank);
    }
};

}  // namespace llmc
