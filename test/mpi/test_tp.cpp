// Tensor and sequence parallelism end to end under mpirun: a dp x tp mesh with the same global
// batch reproduces the 1-rank run, for every ZeRO stage over the data-parallel group, with
// sequence parallelism on and off.
//
//   mpirun -np N build/test_tp DIR TP      (DIR: an empty directory shared by the ranks; TP divides N)
//
// Every rank also trains the 1-rank reference itself: a LocalComm model whose micro-batch is the dp
// groups' micro-batches side by side (B = 2 dp), so it reads the very same tokens in every step.
// Then, for ZeRO stages 0-3 and --sp 1 and 0, it checks:
//   - the 20 per-step losses: relative difference from the reference at most 1e-5;
//   - the final parameters, gathered whole (the model.bin a run would save): relative difference
//     at most 1e-4, and bitwise identical on every rank;
//   - sequence parallelism on and off: losses within 1e-6 of each other;
//   - the bytes allocated per memory kind: equal to the planner's figures for this rank.
// The model (4 heads, 36 channels, vocabulary 250 padded to 256) divides by tp = 1, 2 and 4.
// Prints one "ok" line per property on rank 0; any failure exits non-zero (MPI_Abort).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"
#include "llmc/models/cpu_model.h"
#include "llmc/planning/planner.h"
#include "llmc/train_loop.h"
#include "test/mpi/mpi_test_util.h"

using namespace llmc;
using namespace llmc::mpi_test;

namespace {

RunConfig make_config(const std::string& shard, int stage, int world_size, int tp, int sp, int batch_size) {
    RunConfig cfg = base_config(shard);
    cfg.num_layers = 3;
    cfg.num_heads = 4;
    cfg.channels = 36;
    cfg.max_seq_len = 16;
    cfg.batch_size = batch_size;
    cfg.seq_len = 16;
    cfg.total_batch_tokens = 12 * 2 * 16;  // 24 sequences: dp = 1, 2 and 4 all divide it
    cfg.steps = 20;
    cfg.lr = 1e-2f;
    cfg.zero_stage = stage;
    cfg.tp = tp;
    cfg.sequence_parallel = sp;
    resolve_run_config(cfg, world_size, nullptr);
    return cfg;
}

}  // namespace

int main(int argc, char** argv) {
    launch = bootstrap_launch(&argc, &argv);
    try {
        if (argc != 3) fail("usage: test_tp DIR TP");
        std::unique_ptr<Communicator> comm = make_host_communicator(launch);
        comm->timeout_s = 120;
        const int W = comm->world_size(), tp = std::atoi(argv[2]), dp = W / tp;
        const std::string shard = std::string(argv[1]) + "/tp_train_000000.bin";
        if (launch.rank == 0) write_shard(shard, 60000);
        comm->barrier().wait();

        // The 1-rank reference, computed on every rank.
        LocalComm local;
        RunConfig reference_cfg = make_config(shard, 0, 1, 1, 0, 2 * dp);
        CPUModel reference_model(reference_cfg.model_config, 2 * dp, 16, local, 0);
        const RunResult reference = train(reference_cfg, local, nullptr, reference_model);
        check(reference.losses.back() < reference.losses.front() - 0.2f,
              strformat("the reference run does not learn: loss %.4f -> %.4f", reference.losses.front(),
                        reference.losses.back()));

        for (int stage = 0; stage <= 3; stage++) {
            std::vector<float> sp_losses;
            for (int sp : {1, 0}) {
                RunConfig cfg = make_config(shard, stage, W, tp, sp, 2);
                ProcessGroups groups(*comm, cfg.dims);
                const std::string what =
                    strformat("dp %d x tp %d, ZeRO-%d, sequence parallel %s", dp, tp, stage, sp ? "on" : "off");
                CPUModel model(cfg.model_config, cfg.batch_size, cfg.seq_len, groups.dp(), stage, groups.tp(), sp);

                const ParamLayout layout = GPT2Params::layout(cfg.model_config, {groups.tp().rank(), tp});
                const ZeroPlan zero(layout, stage, groups.dp().rank(), dp);
                const TensorParallel tensor{tp, groups.tp().rank(), sp == 1 && tp > 1};
                const MemoryPlan plan =
                    plan_memory(cfg, zero, CPUModel::memory_specs(zero, cfg.model_config, 2, 16, tensor));
                for (int k = 0; k < (int)MemoryKind::Count; k++)
                    check(plan.bytes[k] == model.allocated_bytes((MemoryKind)k),
                          strformat("%s: planned %zu bytes of %s, allocated %zu", what.c_str(), plan.bytes[k],
                                    memory_kind_name((MemoryKind)k), model.allocated_bytes((MemoryKind)k)));

                const RunResult run = train(cfg, groups.dp(), &groups.world(), model);
                const auto [worst, params_diff] = check_matches_reference(run, reference, *comm, what);
                say(strformat("%s: planned bytes allocated; 20 losses match 1 rank (worst %.2g), final parameters "
                              "too (%.2g), the same on every rank",
                              what.c_str(), worst, params_diff));
                if (sp) {
                    sp_losses = run.losses;
                } else {
                    const double sp_diff = worst_loss_difference(run.losses, sp_losses);
                    check(sp_diff <= 1e-6, strformat("%s: sequence parallelism on and off differ by %.3g relative "
                                                     "(limit 1e-6)", what.c_str(), sp_diff));
                    say(strformat("dp %d x tp %d, ZeRO-%d: sequence parallelism on and off give the same losses "
                                  "(worst %.2g)", dp, tp, stage, sp_diff));
                }
            }
        }
    } catch (const std::exception& e) {
        check(false, e.what());
    }
    finalize_launch(launch);
    return 0;
}
