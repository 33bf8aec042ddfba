// The CUDA model's mixture of experts under data and expert parallelism, end to end under mpirun
// (make test-gpu and make test-emu, through test/gpu/run_gpu_moe_tests.sh): N ranks at ZeRO 0-3, and
// with an even N expert groups of 2 (--ep 2, each rank holding 2 of the 4 experts) at ZeRO 0 and 3,
// reproduce the 1-rank CUDA run and the CPU run of the same global batch.
//
//   mpirun --oversubscribe -np N build/test_moe_cuda DIR   (DIR: an empty directory shared by the ranks)
//
// The ranks share the node's GPUs (--gpu-comm mpi: StagedComm); the model is made by
// CudaBackend::make_model, as train_gpt makes it. The model: 2 layers, 2 heads of 32, vocabulary
// 250 padded to 256, T 32, both blocks with 4 experts, top 2, capacity factor 1 (tokens dropped).
// The capacity and the balance loss count each forward's tokens, so the 1-rank references (the CUDA
// model and CPUModel, trained by every rank itself) take the mesh's batch as N micro-batches of the
// ranks' size: the same groups of tokens are routed together. For every ZeRO stage it checks:
//   - the bytes allocated per memory kind (the expert activations included): equal to the plan's;
//   - the 10 per-step losses within 2e-4 relative of the 1-rank CUDA run's (and the reference's
//     within 1e-2 of the CPU run's);
//   - the final parameters, gathered whole: within 2e-2 of the 1-rank run's, the same on every rank.
// Prints one "ok" line per property on rank 0; any failure exits non-zero (MPI_Abort, exit 2).
// Without a GPU it skips (exit 0), or fails with exit 3 in a GPU session (LLMC_GPU_SESSION=1).
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"
#include "llmc/models/cuda_backend.cuh"
#include "llmc/models/cuda_model.cuh"
#include "test/gpu/cuda_test_util.h"

using namespace llmc;
using namespace llmc::mpi_test;

namespace {

constexpr int STEPS = 10, BATCH = 4, SEQ = 32;
constexpr double LOSS_LIMIT = 2e-4;

RunConfig make_config(const std::string& shard, int stage, int world_size, int ep = 1) {
    RunConfig cfg = base_config(shard);
    cfg.num_layers = 2;
    cfg.num_heads = 2;
    cfg.channels = 64;
    cfg.max_seq_len = SEQ;
    cfg.experts = 4;
    cfg.top_k = 2;
    cfg.capacity_factor = 1.0f;
    cfg.batch_size = BATCH;
    cfg.seq_len = SEQ;
    cfg.total_batch_tokens = 4 * BATCH * SEQ;  // 1, 2 and 4 ranks all divide it
    cfg.steps = STEPS;
    cfg.lr = 1e-3f;
    cfg.zero_stage = stage;
    cfg.gpu_comm = "mpi";
    cfg.ep = ep;
    resolve_run_config(cfg, world_size, nullptr);
    return cfg;
}

}  // namespace

int main(int argc, char** argv) {
    return run_cuda_test(argc, argv, "test_moe_cuda", [](Communicator& comm, int argc, char** argv) {
        if (argc != 2) fail("usage: test_moe_cuda DIR");
        const int W = comm.world_size();
        const std::string shard = shared_shard(comm, argv[1], "moe_cuda");

        // The 1-rank references, on every rank: the mesh's batch as 4 micro-batches of BATCH.
        const RunConfig rc = make_config(shard, 0, 1);
        use_this_ranks_gpu();
        CUDAModel reference_model(rc.model_config, rc.batch_size, rc.seq_len, CudaBackend::options(rc));
        RunResult cpu;
        const RunResult reference = train_references(rc, reference_model, &cpu);

        struct Mesh {
            int ep, stage;
        };
        std::vector<Mesh> meshes = {{1, 0}, {1, 1}, {1, 2}, {1, 3}};
        if (W % 2 == 0) meshes.insert(meshes.end(), {{2, 0}, {2, 3}});
        for (const Mesh& mesh : meshes) {
            const RunConfig cfg = make_config(shard, mesh.stage, W, mesh.ep);
            ProcessGroups groups(comm, cfg.dims);
            const std::string what = strformat("%d ranks%s, ZeRO-%d, 4 experts top 2, capacity 1", W,
                                               mesh.ep > 1 ? strformat(" (ep %d)", mesh.ep).c_str() : "", mesh.stage);
            BuiltModel built;
            CUDAModel& model = make_planned_model(built, cfg, groups, what);
            const RunResult run = train_cuda(cfg, groups.dp(), &groups.world(), model,
                                             mesh.ep > 1 ? &groups.expert_data() : nullptr);
            const double worst = worst_loss_difference(run.losses, reference.losses);
            check(worst <= LOSS_LIMIT, strformat("%s: loss differs from the 1-rank CUDA run by %.3g relative (limit "
                                                 "%g)", what.c_str(), worst, LOSS_LIMIT));
            const double params_diff = relative_difference(run.params, reference.params);
            check(params_diff <= 2e-2, strformat("%s: final parameters differ from the 1-rank CUDA run by %.3g "
                                                 "relative (limit 2e-2)", what.c_str(), params_diff));
            check_same_on_every_rank(run.params, comm, what + ": the gathered whole model");
            say(strformat("%s: planned bytes allocated; %d losses match 1 CUDA rank (worst %.2g), final parameters "
                          "too (%.2g), the same on every rank", what.c_str(), STEPS, worst, params_diff));
        }
    });
}
