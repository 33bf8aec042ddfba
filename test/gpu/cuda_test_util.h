// cuda_test_util.h: what the CUDA model's multi-rank tests (test_tp_cuda, test_pp_cuda, test_cp_cuda,
// test_moe_cuda) share, on top of test/mpi/mpi_test_util.h: the model of a mesh with its planned
// bytes checked, training it through the trainer, the 1-rank CUDA and CPU references every rank
// trains for itself, and the same-on-every-rank check.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#ifndef LLMC_NO_MPI
#include "llmc/dist/heartbeat.h"
#endif
#include "llmc/dist/process_groups.h"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/models/cpu_backend.h"
#include "llmc/models/cuda_backend.cuh"
#include "llmc/models/cpu_model.h"
#include "llmc/models/cuda_model.cuh"
#include "llmc/planning/planner.h"
#include "llmc/train_loop.h"
#include "test/mpi/mpi_test_util.h"

namespace llmc::mpi_test {

// Trains `model` from the config's seed and gathers the whole model on every rank (`replicas`: the
// ranks that hold the same parameters, as train_gpt passes them; dp by default).
inline RunResult train_cuda(const RunConfig& cfg, Communicator& dp, Communicator* world, CUDAModel& model,
                            Communicator* replicas = nullptr) {
    model.init_random(cfg.seed);
    RunResult r;
    r.losses = Trainer(cfg, model, dp, "", world, replicas).run().train_losses;
    r.params.resize(model.whole_num_params());
    model.get_master_weights(r.params.data());
    return r;
}

// Token ids in [0, vocab) that differ with `seed`.
inline std::vector<int> pseudo_tokens(int n, int vocab, int seed) {
    std::vector<int> t(n);
    for (int i = 0; i < n; i++) t[i] = (i * 37 + seed * 11 + 5) % vocab;
    return t;
}

// The 1-rank references of a run config `rc` (a LocalComm model whose micro-batch is the mesh's
// data-parallel micro-batches side by side, so it reads the same tokens), trained on this rank's GPU
// (the one CudaBackend picks for it): `model` (kept, for evaluation checks) and the CPU model, whose
// curve the CUDA one must follow within bf16 tolerance. Returns the CUDA run.
inline RunResult train_references(const RunConfig& rc, CUDAModel& model, RunResult* cpu) {
    LocalComm local;
    const RunResult cuda = train_cuda(rc, local, nullptr, model);
    CPUModel cpu_model(rc.model_config, rc.batch_size, rc.seq_len, local, 0);
    cpu_model.set_moe_options({rc.capacity_factor, rc.moe_balance_coef, rc.moe_z_coef});
    *cpu = train(rc, local, nullptr, cpu_model);
    check(cuda.losses.back() < cuda.losses.front(),
          strformat("the 1-rank CUDA reference does not learn: loss %.4f -> %.4f", cuda.losses.front(),
                    cuda.losses.back()));
    const double cuda_vs_cpu = worst_loss_difference(cuda.losses, cpu->losses);
    check(cuda_vs_cpu <= 1e-2,
          strformat("the 1-rank CUDA run differs from the CPU run by %.3g relative (limit 1e-2)", cuda_vs_cpu));
    say(strformat("1-rank CUDA reference learns (%.4f -> %.4f) and matches the CPU model (worst %.2g)",
                  cuda.losses.front(), cuda.losses.back(), cuda_vs_cpu));
    return cuda;
}
// The GPU CudaBackend picks for this rank (local rank modulo the node's GPUs), for the references.
inline void use_this_ranks_gpu() {
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    CUDA_CHECK(cudaSetDevice(launch.local_rank % devices));
}

// This rank's model for `cfg`, made by CudaBackend::make_model exactly as train_gpt makes it (into
// `built`, which owns it and its device communicators), its allocations checked against
// CudaBackend::memory_plan for its place in the mesh: every memory kind's bytes equal the plan's.
inline CUDAModel& make_planned_model(BuiltModel& built, const RunConfig& cfg, const ProcessGroups& groups,
                                    const std::string& what) {
    built = CudaBackend::make_model(cfg, groups, launch);
    CUDAModel* model = dynamic_cast<CUDAModel*>(built.model.get());
    check(model != nullptr, what + ": CudaBackend::make_model did not make a CUDAModel");
    const MemoryPlan plan = CudaBackend::memory_plan(cfg, groups.dp_cp().rank(), groups.tp().rank(), groups.pp().rank());
    for (int k = 0; k < (int)MemoryKind::Count; k++)
        check(plan.bytes[k] == model->allocated_bytes((MemoryKind)k),
              strformat("%s: planned %zu bytes of %s, allocated %zu", what.c_str(), plan.bytes[k],
                        memory_kind_name((MemoryKind)k), model->allocated_bytes((MemoryKind)k)));
    return *model;
}

// The main() of a CUDA multi-rank test: the launch; where there is no GPU, its exit status (0, or 3
// in a GPU session); else body(comm, argc, argv) with the world's host communicator, an exception
// from it a failure (check), then the launch finalized. Its collectives time out after
// LLMC_TEST_COMM_TIMEOUT_S (300 s by default; a GPU session's step budget may be shorter), and, as
// in train_gpt, a heartbeat lets a timeout name the ranks missing and a SIGTERM (timeout, mpirun)
// print each rank's last operations (flight_recorder.h), so a hang says where it is.
template <typename Body>
int run_cuda_test(int argc, char** argv, const char* name, Body body) {
    launch = bootstrap_launch(&argc, &argv);
    std::string why;
    if (!cuda_device_present(&why)) {
        const int status = no_gpu_exit_status(name, why);
        finalize_launch(launch);
        return status;
    }
    // The CPU references share the node's cores out among the ranks, as train_gpt_cpu's do: a thread
    // per core in each of 4 ranks (spinning, by default) slowed test_cp_cuda's CPU runs past its budget.
    set_threads_per_rank(launch);
    try {
        std::unique_ptr<Communicator> comm = make_host_communicator(launch);
        const char* timeout = getenv("LLMC_TEST_COMM_TIMEOUT_S");
        comm->timeout_s = timeout ? std::atof(timeout) : 300;
        if (!(comm->timeout_s > 0))
            fail(strformat("LLMC_TEST_COMM_TIMEOUT_S=%s: expected a positive number of seconds", timeout));
#ifndef LLMC_NO_MPI
        std::unique_ptr<Heartbeat> heartbeat;
        if (launch.world_size > 1) {
            heartbeat = std::make_unique<Heartbeat>(0.5, 5);
            install_termination_report();
        }
#endif
        body(*comm, argc, argv);
    } catch (const std::exception& e) {
        check(false, e.what());
    }
    finalize_launch(launch);
    return 0;
}

// The test's data, `dir`/`name`_train_000000.bin (write_shard's 60000 tokens), written by rank 0
// for every rank of `comm`; returns its path.
inline std::string shared_shard(Communicator& comm, const std::string& dir, const char* name) {
    const std::string shard = dir + "/" + name + "_train_000000.bin";
    if (launch.rank == 0) write_shard(shard, 60000);
    comm.barrier().wait();
    return shard;
}

// The same bits on every rank of `comm` as on its rank 0.
inline void check_same_on_every_rank(const std::vector<float>& values, Communicator& comm, const std::string& what) {
    std::vector<float> rank0 = values;
    comm.broadcast(rank0.data(), rank0.size() * sizeof(float), 0).wait();
    check(std::memcmp(rank0.data(), values.data(), rank0.size() * sizeof(float)) == 0,
          what + ": differs between ranks");
}

}  // namespace llmc::mpi_test
