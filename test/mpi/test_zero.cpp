// ZeRO end to end under mpirun: N ranks with the same global batch reproduce the 1-rank run, for
// every stage, and allocate exactly what the planner says.
//
//   mpirun -np N build/test_zero DIR      (DIR: an empty directory shared by the ranks)
//
// Every rank also trains the 1-rank reference itself: a LocalComm model whose micro-batch is the N
// ranks' micro-batches side by side (B = 2N), so it reads the very same tokens in every step, under
// the same shuffled order. Then, for ZeRO stages 0-3, it compares:
//   - the 20 per-step losses: relative difference at most 1e-6;
//   - the final parameters: relative difference (norm of difference over norm) at most 1e-6, and
//     bitwise identical on every rank;
//   - the bytes allocated per memory kind: equal to plan_memory's figures.
// The model's parameter count is not divisible by 2, 3 or 4, so padding is exercised everywhere.
// Prints one "ok" line per property on rank 0; any failure exits non-zero (MPI_Abort).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/models/cpu_model.h"
#include "llmc/planning/planner.h"
#include "llmc/train_loop.h"
#include "test/mpi/mpi_test_util.h"

using namespace llmc;
using namespace llmc::mpi_test;

namespace {

RunConfig make_config(const std::string& shard, int stage, int world_size, int batch_size) {
    RunConfig cfg = base_config(shard);
    cfg.num_layers = 3;  // with 35 channels: 55055 parameters, odd and not a multiple of 3
    cfg.num_heads = 5;
    cfg.channels = 35;
    cfg.max_seq_len = 16;
    cfg.batch_size = batch_size;
    cfg.seq_len = 16;
    cfg.total_batch_tokens = 12 * 2 * 16;  // 12 sequences: 1, 2, 3 and 4 ranks all divide it
    cfg.steps = 20;
    cfg.lr = 1e-2f;
    cfg.zero_stage = stage;
    resolve_run_config(cfg, world_size, nullptr);
    return cfg;
}

}  // namespace

int main(int argc, char** argv) {
    launch = bootstrap_launch(&argc, &argv);
    try {
        if (argc != 2) fail("usage: test_zero DIR");
        std::unique_ptr<Communicator> comm = make_host_communicator(launch);
        comm->timeout_s = 120;
        const int W = comm->world_size();
        const std::string shard = std::string(argv[1]) + "/zero_train_000000.bin";
        if (launch.rank == 0) write_shard(shard, 60000);
        comm->barrier().wait();

        // The 1-rank reference, computed on every rank.
        LocalComm local;
        RunConfig reference_cfg = make_config(shard, 0, 1, 2 * W);
        CPUModel reference_model(reference_cfg.model_config, 2 * W, 16, local, 0);
        const RunResult reference = train(reference_cfg, local, nullptr, reference_model);
        const size_t num_params = reference.params.size();
        check(num_params % 2 && num_params % 3 && num_params % 4,
              strformat("the test model has %zu parameters; it must not divide by 2, 3 or 4", num_params));
        check(reference.losses.back() < reference.losses.front() - 0.3f,
              strformat("the reference run does not learn: loss %.4f -> %.4f", reference.losses.front(),
                        reference.losses.back()));

        for (int stage = 0; stage <= 3; stage++) {
            RunConfig cfg = make_config(shard, stage, W, 2);
            CPUModel model(cfg.model_config, cfg.batch_size, cfg.seq_len, *comm, stage);
            const std::string what = strformat("%d rank(s), ZeRO-%d", W, stage);

            const ParamLayout layout = GPT2Params::layout(cfg.model_config);
            const ZeroPlan zero(layout, stage, comm->rank(), W);
            const MemoryPlan plan = plan_memory(cfg, zero, CPUModel::memory_specs(zero, cfg.model_config, 2, 16));
            for (int k = 0; k < (int)MemoryKind::Count; k++)
                check(plan.bytes[k] == model.allocated_bytes((MemoryKind)k),
                      strformat("%s: planned %zu bytes of %s, allocated %zu", what.c_str(), plan.bytes[k],
                                memory_kind_name((MemoryKind)k), model.allocated_bytes((MemoryKind)k)));
            say(what + ": allocated bytes equal the plan for every kind of memory");

            const RunResult run = train(cfg, *comm, nullptr, model);
            check(run.losses.size() == reference.losses.size(), what + ": wrong number of steps");
            const double worst = worst_loss_difference(run.losses, reference.losses);
            check(worst <= 1e-6, strformat("%s: loss differs from 1 rank by %.3g relative (limit 1e-6)", what.c_str(), worst));
            say(strformat("%s: 20 losses match the 1-rank curve (worst relative difference %.2g)", what.c_str(), worst));

            const double params_diff = relative_difference(run.params, reference.params);
            check(params_diff <= 1e-4, strformat("%s: final parameters differ from 1 rank by %.3g relative", what.c_str(),
                                                 params_diff));
            // Every rank must hold the very same parameters: compare rank 0's bits with everyone's.
            std::vector<float> rank0 = run.params;
            comm->broadcast(rank0.data(), rank0.size() * sizeof(float), 0).wait();
            check(std::memcmp(rank0.data(), run.params.data(), rank0.size() * sizeof(float)) == 0,
                  what + ": ranks ended with different parameters");
            say(strformat("%s: final parameters equal the 1-rank run's (relative difference %.2g) and are identical on "
                          "every rank", what.c_str(), params_diff));
        }
    } catch (const std::exception& e) {
        check(false, e.what());
    }
    finalize_launch(launch);
    return 0;
}
