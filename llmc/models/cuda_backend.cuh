// models/cuda_backend.cuh: the CUDA backend (models/backend.h): train_gpt's bf16 GPT-2 on this
// rank's GPU, its collectives over NCCL (a GPU per rank) or over MPI staged through host memory
// (ranks may share a GPU), data parallel (ZeRO), tensor parallel (--tp, --sp), pipelined (--pp) and
// context parallel (--cp: ring attention, with any of the other axes; ZeRO over dp x cp); a
// mixture-of-experts model with data and expert parallelism (--ep), and FP8 products (--fp8) with
// data parallelism only.
//
// The device communicators mirror ProcessGroups (dist/process_groups.h): one over the world, split
// into the data-parallel, tensor-parallel, pipeline and context groups with the same colours and keys
// (the group's id and the rank's coordinate along it, parallel_dims.h), and the data x context group
// with ProcessGroups::dp_cp_split's, so each device group has exactly the ranks, in the same order, of
// its host group. A group that spans the world is the world's communicator
// itself, and a group of one needs none (the model uses its local one).
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "llmc/config.h"
#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"
#include "llmc/dist/comm.h"
#include "llmc/dist/staged_comm.cuh"
#include "llmc/planning/mfu.h"
#include "llmc/model.h"
#include "llmc/models/backend.h"
#include "llmc/models/cuda_model.cuh"
#include "llmc/planning/planner.h"
#ifndef LLMC_NO_NCCL
#include "llmc/dist/comm_nccl.cuh"
#endif

namespace llmc {

struct CudaBackend {
    // One rank has nothing to shard: the CUDA model runs ZeRO-0 there (CUDAModel::zero_plan). ZeRO's
    // group is the data x context group (context ranks' gradients add up like data-parallel ones).
    static int effective_zero_stage(const RunConfig& cfg) {
        return CUDAModel::effective_stage(cfg.zero_stage, zero_world(cfg));
    }
    static int zero_world(const RunConfig& cfg) { return cfg.dims.shard_size() * cfg.dims.cp; }

    // This rank's model on its GPU (local rank modulo the node's GPUs), sharded by ZeRO over the
    // data-parallel group, cut over the tensor-parallel group, and one stage of the pipeline, on
    // device communicators made here: NCCL, or the host groups staged through pinned memory.
    static BuiltModel make_model(const RunConfig& cfg, const ProcessGroups& groups, const Launch& launch) {
        refuse_unsupported(cfg);
        set_attention_kernels(parse_attention_kernels(cfg.attention, "--attention"));
        Communicator& world = groups.world();
        const bool nccl = launch.under_launcher && cfg.gpu_comm == "nccl";
        const int device = pick_device(launch, nccl);
        BuiltModel built;
        built.peak_tflops = peak_tflops(cfg, device);
        if (world.rank() == 0) print_device(cfg, world, device, nccl, built.peak_tflops);
        built.device_comm = make_device_comm(cfg, world, device, nccl);
        DataParallel dp;
        dp.comm = cfg.dims.cp > 1 ? dp_cp_device_group(built, groups) : device_group(built, groups, MeshDim::DP);
        dp.host = &groups.dp_cp();
        dp.zero_stage = cfg.zero_stage;
        if (cfg.dims.hybrid()) {  // ZeRO inside each shard group; the whole group for FP8's scales
            const int rank = world.rank();
            dp.whole = dp.comm;
            dp.comm = split_device_group(built, groups.hybrid_split(rank, false), groups.zero_shard(), "shard");
            dp.host = &groups.zero_shard();
            dp.replicas = split_device_group(built, groups.hybrid_split(rank, true), groups.zero_replicas(), "replica");
        }
        TensorParallelGroup tp;
        tp.comm = device_group(built, groups, MeshDim::TP);
        tp.host = &groups.tp();
        tp.sequence_parallel = cfg.sequence_parallel != 0;
        PipelineGroup pp;
        pp.comm = device_group(built, groups, MeshDim::PP);
        pp.host = &groups.pp();
        pp.pipe = pipeline_of(cfg);
        ContextParallelGroup cp;
        cp.comm = device_group(built, groups, MeshDim::CP);
        cp.host = &groups.cp();
        ExpertParallelGroup ep;
        if (cfg.dims.ep > 1) {
            const int rank = groups.world().rank();
            ep.comm = split_device_group(built, groups.expert_split(rank, false), groups.ep(), "expert");
            ep.host = &groups.ep();
            ep.expert_data = split_device_group(built, groups.expert_split(rank, true), groups.expert_data(),
                                                "expert data");
        }
        built.model = std::make_unique<CUDAModel>(cfg.model_config, cfg.batch_size, cfg.seq_len, options(cfg), dp, tp,
                                                 pp, cp, ep);
        const std::string gather = fp8_gather_line(cfg);
        if (world.rank() == 0 && !gather.empty()) printf("fp8: %s\n", gather.c_str());
        return built;
    }

    // --plan: rank 0's device memory (every tensor-parallel rank holds an equal piece, so rank 0
    // speaks for all), under pipeline parallelism the first rank of every stage (each holds other
    // layers), and a line with the activations of every -r setting.
    static std::string plan_report(const RunConfig& cfg) {
        refuse_unsupported(cfg);
        const ZeroPlan zero = zero_plan_of(cfg, 0, tp_shape(cfg, 0), 0);
        std::string out = memory_plan_report(
            cfg, zero, memory_plan(cfg, 0, 0, 0),
            "CUDA model (bf16 weights and activations, fp32 master weights, gradients and moments)");
        if (cfg.dims.pp > 1) {
            std::vector<MemoryPlan> stages;
            for (int s = 0; s < cfg.dims.pp; s++) stages.push_back(memory_plan(cfg, 0, 0, s));
            out += pipeline_plan_report(cfg, pipeline_split(cfg), stages);
        }
        const std::string gather = fp8_gather_line(cfg);
        if (!gather.empty()) out += gather + "\n";
        out += "activations by recomputation setting (-r)";
        if (cfg.dims.pp > 1) out += " on pipeline rank 0";
        out += ":";
        for (int r = 0; r <= 3; r++) {
            RunConfig alt = cfg;
            alt.recompute = r;
            const size_t bytes = CudaActivationLayout::bytes_for(cfg.model_config, cfg.batch_size,
                                                                 cfg.seq_len / cfg.dims.cp, options(alt),
                                                                 tp_shape(cfg, 0),
                                                                 pipeline_stage_shape(pipeline_of(cfg), 0), cfg.dims.cp);
            out += strformat(" %d: %s%s", r, format_bytes((double)bytes).c_str(), r < 3 ? "," : "\n");
        }
        return out;
    }

    // --fp8 1 -z 3: what rank 0's gathers of a layer send with the weights as codes, or empty.
    static std::string fp8_gather_line(const RunConfig& cfg) {
        const auto [packed, bf16] = CUDAModel::fp8_gather_chunk_bytes(
            cfg.model_config, zero_plan_of(cfg, 0, tp_shape(cfg, 0), 0), options(cfg).fp8);
        if (packed == 0) return "";
        return strformat("ZeRO-3 gathers each layer's weights as FP8 codes: %s a rank and layer (bf16: %s, %.2fx)",
                         format_bytes((double)packed).c_str(), format_bytes((double)bf16).c_str(),
                         (double)packed / (double)bf16);
    }

    // What rank `zero_rank` of the data x context group (ProcessGroups::dp_cp; the data-parallel rank
    // without --cp) of tensor rank `tp_rank` in pipeline stage `pp_rank` allocates on its GPU (the
    // constructor's allocations add up to the same bytes).
    static MemoryPlan memory_plan(const RunConfig& cfg, int zero_rank, int tp_rank, int pp_rank) {
        const TpShape tp = tp_shape(cfg, tp_rank);
        const ZeroPlan zero = zero_plan_of(cfg, zero_rank, tp, pp_rank);
        return plan_memory(cfg, zero,
                           CUDAModel::memory_specs(cfg.model_config, cfg.batch_size, cfg.seq_len, options(cfg), zero,
                                                  tp, pipeline_stage_shape(pipeline_of(cfg), pp_rank), cfg.dims.cp,
                                                  cfg.dims.ep),
                           DeviceMemory::precision, pp_rank,
                           CUDAModel::fp8_gather_bytes_saved(cfg.model_config, zero, options(cfg).fp8));
    }
    // ZeRO's plan for data-parallel rank zero_rank (its place in the expert group and in the expert
    // data group follow from it: ep consecutive data-parallel ranks form an expert group).
    static ZeroPlan zero_plan_of(const RunConfig& cfg, int zero_rank, const TpShape& tp, int pp_rank) {
        const int ep = cfg.dims.ep;
        return CUDAModel::zero_plan(cfg.model_config, cfg.zero_stage, zero_rank, zero_world(cfg), tp,
                                   model_stage_slice(cfg.model_config, pipeline_split(cfg), pp_rank), {zero_rank % ep, ep},
                                   zero_rank / ep, zero_world(cfg) / ep);
    }

    // What the CUDA model does not run yet: a mixture of experts (kernels/moe.cuh) with tensor,
    // pipeline or context parallelism.
    static void refuse_unsupported(const RunConfig& cfg) {
        if (cfg.model_config.num_experts > 0 && (cfg.dims.tp > 1 || cfg.dims.pp > 1 || cfg.dims.cp > 1))
            fail(strformat("--experts %d with --tp %d / --pp %d / --cp %d: the CUDA model runs a mixture of experts "
                           "with data and expert parallelism (-z 0-3, --ep) only; drop them, or train with "
                           "train_gpt_cpu",
                           cfg.model_config.num_experts, cfg.dims.tp, cfg.dims.pp, cfg.dims.cp));
    }
    // The model options of a config (recomputation, the experts' capacity and losses' weights, FP8).
    static CUDAModelOptions options(const RunConfig& cfg) {
        CUDAModelOptions o;
        o.recompute = (Recompute)cfg.recompute;
        o.moe = {cfg.capacity_factor, cfg.moe_balance_coef, cfg.moe_z_coef};
        o.fp8 = fp8_options(cfg);
        return o;
    }
    // Tensor rank tp_rank's shape of the config's mesh.
    static TpShape tp_shape(const RunConfig& cfg, int tp_rank) {
        return {cfg.dims.tp, tp_rank, cfg.dims.tp > 1 && cfg.sequence_parallel != 0};
    }

private:
    // The device communicator of this rank's group along `dim`: none (nullptr: the model's local
    // one) for a tensor-parallel group of one; the world's where the group spans it (so a one-rank
    // launch with --gpu-comm nccl still runs its data-parallel collectives through NCCL, as a check
    // of NCCL); none for another group of one; else split from the world's with ProcessGroups'
    // colour and key. Every rank makes the same splits in the same order (the mesh is the same
    // everywhere), as a split is collective over the world.
    static Communicator* device_group(BuiltModel& built, const ProcessGroups& groups, MeshDim dim) {
        const ParallelDims& dims = groups.dims();
        const int rank = groups.world().rank();
        if (dims.size(dim) == 1 && dim != MeshDim::DP) return nullptr;
        if (dims.size(dim) == groups.world().world_size()) return built.device_comm.get();
        if (dims.size(dim) == 1) return nullptr;
        built.device_groups.push_back(built.device_comm->split(dims.group_id(dim, rank), dims.coord_of(rank)[dim]));
        Communicator& group = *built.device_groups.back();
        Communicator& host = groups.group(dim);
        if (group.world_size() != host.world_size() || group.rank() != host.rank())
            fail(strformat("the device %s group of rank %d has %d ranks with this one at %d; its host group %d ranks "
                           "with it at %d", mesh_dim_name(dim), rank, group.world_size(), group.rank(),
                           host.world_size(), host.rank()));
        return &group;
    }

    // The data x context group's device communicator: the world's where it spans the world, else split
    // from it with ProcessGroups' colour and key for that group.
    static Communicator* dp_cp_device_group(BuiltModel& built, const ProcessGroups& groups) {
        if (groups.dp_cp().world_size() == groups.world().world_size()) return built.device_comm.get();
        return split_device_group(built, groups.dp_cp_split(groups.world().rank()), groups.dp_cp(), "dp x cp");
    }
    // The device communicator split from the world's with `split` (colour, key) that mirrors `host`.
    static Communicator* split_device_group(BuiltModel& built, std::pair<int, int> split, Communicator& host,
                                            const char* name) {
        built.device_groups.push_back(built.device_comm->split(split.first, split.second));
        Communicator& group = *built.device_groups.back();
        if (group.world_size() != host.world_size() || group.rank() != host.rank())
            fail(strformat("the device %s group has %d ranks with this one at %d; its host group %d ranks with it at %d",
                           name, group.world_size(), group.rank(), host.world_size(), host.rank()));
        return &group;
    }


    // NCCL needs a GPU per rank; through MPI several ranks may share one.
    static int pick_device(const Launch& launch, bool nccl) {
        std::string why;
        if (!cuda_device_present(&why))
            fail(strformat("no CUDA device available (%s); train on the CPU with ./train_gpt_cpu", why.c_str()));
        int devices = 0;
        CUDA_CHECK(cudaGetDeviceCount(&devices));
        if (nccl && launch.local_rank >= devices)
            fail(strformat("--gpu-comm nccl needs a GPU per rank, but local rank %d of %d has only %d GPU(s) on its "
                           "node; launch fewer ranks per node, or pass --gpu-comm mpi to let ranks share GPUs",
                           launch.local_rank, launch.local_size, devices));
        const int device = launch.local_rank % devices;
        CUDA_CHECK(cudaSetDevice(device));
        return device;
    }

    // --peak-tflops, else the device's from mfu.h's table (0: unknown, no MFU).
    static double peak_tflops(const RunConfig& cfg, int device) {
        if (cfg.peak_tflops > 0) return cfg.peak_tflops;
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        return gpu_peak_bf16_tflops(prop.name);
    }

    static void print_device(const RunConfig& cfg, Communicator& host, int device, bool nccl, double peak) {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        printf("device: %s, %.1f GiB, bf16 with fp32 master weights, recompute %d%s, %s\n", prop.name,
               prop.totalGlobalMem / 1073741824.0, cfg.recompute,
               nccl ? ", collectives over NCCL" : host.world_size() > 1 ? ", collectives over MPI via host memory" : "",
               peak > 0 ? strformat("MFU against %g TFLOP/s dense bf16", peak).c_str()
                        : "no MFU (GPU not in llmc/planning/mfu.h's table; pass --peak-tflops)");
        printf("attention: %s\n", attention_kernels_line(cfg).c_str());
    }
    // Which attention kernels --attention gives on this device (attention_hopper.cuh)
    static std::string attention_kernels_line(const RunConfig& cfg) {
        using namespace attention_detail;
        const int HS = cfg.model_config.head_size();
        if (!attention_on_wgmma(HS))
            return strformat("mma.sync (--attention %s, head size %d)", cfg.attention.c_str(), HS);
        return strformat("wgmma (--attention %s): forward version %d at T %d (dev/cuda/attention_forward's "
                         "numbering), backward fed by %s",
                         cfg.attention.c_str(), attention_forward_version(HS, cfg.seq_len), cfg.seq_len,
                         attention_kernels_setting() == AttentionKernels::Wgmma ? "cp.async" : "TMA");
    }

    static std::unique_ptr<Communicator> make_device_comm(const RunConfig& cfg, Communicator& host, int device,
                                                          bool nccl) {
#ifdef LLMC_NO_NCCL
        (void)cfg;
        (void)device;
        if (nccl)
            fail("--gpu-comm nccl: this train_gpt was built without NCCL (make NO_NCCL=1); pass --gpu-comm mpi, or "
                 "rebuild with NCCL");
        return std::make_unique<StagedComm>(host);
#else
        if (nccl) return std::make_unique<NcclComm>(host, device, cfg.comm_timeout_s);
        return std::make_unique<StagedComm>(host);
#endif
    }
};

}  // namespace llmc
