// Tensor and sequence parallelism of the CUDA model end to end under mpirun (make test-gpu, through
// test/gpu/run_gpu_tp_tests.sh): a dp x tp mesh with the same global batch reproduces the 1-rank
// CUDA run and the fp32 CPU reference, for every ZeRO stage over the data-parallel group, with
// sequence parallelism on and off.
//
//   mpirun --oversubscribe -np N build/test_tp_cuda DIR TP   (DIR: an empty directory shared by the ranks)
//
// The ranks share the node's GPUs (local rank modulo their count), so the collectives go through MPI
// (--gpu-comm mpi: StagedComm); the device communicators and the model are made by
// CudaBackend::make_model, exactly as train_gpt makes them. Every rank also trains the two 1-rank
// references itself (a LocalComm model whose micro-batch is the dp groups' micro-batches side by side,
// B = batch x dp, so it reads the very same tokens): the CUDA model and CPUModel. Then, for ZeRO
// stages 0-3 and --sp 1 and 0, it checks:
//   - the bytes allocated per memory kind: equal to the memory plan's for this rank's piece;
//   - the 10 per-step losses: relative difference at most 1e-2 (bf16) from the 1-rank CUDA run and
//     from the CPU run;
//   - the final parameters, gathered whole (the model.bin a run would save): relative difference at
//     most 2e-2 from the 1-rank CUDA run's, and bitwise identical on every rank;
//   - sequence parallelism on and off: losses within 1e-2 of each other;
// and the losses of recomputation -r 2 and -r 3 (ZeRO-1, sequence parallel) within 1e-2 of 1 rank.
// And once, with the 1-rank model's weights given to the tp model: evaluate() and next_token_logits
// (7 tokens: not a multiple of tp, so sequence parallelism pads) agree within bf16 tolerance.
// The model (2 layers, 2 heads of 32, vocabulary 250 padded to 256) divides by tp = 2; the last
// vocabulary slice holds padding. Prints one "ok" line per property on rank 0; any failure exits
// non-zero (MPI_Abort, exit 2). Without a GPU it skips (exit 0), or fails with exit 3 in a GPU
// session (LLMC_GPU_SESSION=1).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"
#include "llmc/models/cuda_backend.cuh"
#include "llmc/models/cpu_model.h"
#include "llmc/models/cuda_model.cuh"
#include "llmc/planning/planner.h"
#include "llmc/train_loop.h"
#include "test/gpu/cuda_test_util.h"

using namespace llmc;
using namespace llmc::mpi_test;

namespace {

constexpr int STEPS = 10, BATCH = 4, SEQ = 32;

RunConfig make_config(const std::string& shard, int stage, int world_size, int tp, int sp, int batch_size,
                      int recompute = 0) {
    RunConfig cfg = base_config(shard);
    cfg.num_layers = 2;
    cfg.num_heads = 2;
    cfg.channels = 64;
    cfg.max_seq_len = SEQ;
    cfg.batch_size = batch_size;
    cfg.seq_len = SEQ;
    cfg.total_batch_tokens = 16 * SEQ;  // 16 sequences: dp = 1, 2 and 4 all divide it
    cfg.steps = STEPS;
    cfg.lr = 1e-3f;
    cfg.zero_stage = stage;
    cfg.tp = tp;
    cfg.sequence_parallel = sp;
    cfg.gpu_comm = "mpi";
    cfg.recompute = recompute;
    resolve_run_config(cfg, world_size, nullptr);
    return cfg;
}

}  // namespace

int main(int argc, char** argv) {
    return run_cuda_test(argc, argv, "test_tp_cuda", [](Communicator& comm, int argc, char** argv) {
        if (argc != 3) fail("usage: test_tp_cuda DIR TP");
        const int W = comm.world_size(), tp = std::atoi(argv[2]);
        if (tp < 2 || W % tp != 0) fail(strformat("test_tp_cuda: TP (%d) must be >= 2 and divide the %d ranks", tp, W));
        const int dp = W / tp;
        const std::string shard = shared_shard(comm, argv[1], "tp_cuda");

        // The 1-rank references, computed on every rank: the CUDA model and the CPU model.
        const RunConfig rc = make_config(shard, 0, 1, 1, 0, BATCH * dp);
        use_this_ranks_gpu();
        CUDAModel reference_model(rc.model_config, rc.batch_size, rc.seq_len);
        RunResult cpu;
        const RunResult reference = train_references(rc, reference_model, &cpu);

        for (int stage = 0; stage <= 3; stage++) {
            std::vector<float> sp_losses;
            for (int sp : {1, 0}) {
                const RunConfig cfg = make_config(shard, stage, W, tp, sp, BATCH);
                ProcessGroups groups(comm, cfg.dims);
                const std::string what =
                    strformat("dp %d x tp %d, ZeRO-%d, sequence parallel %s", dp, tp, stage, sp ? "on" : "off");
                BuiltModel built;
                CUDAModel* model = &make_planned_model(built, cfg, groups, what);

                const RunResult run = train_cuda(cfg, groups.dp(), &groups.world(), *model);
                const double worst = worst_loss_difference(run.losses, reference.losses);
                check(worst <= 1e-2, strformat("%s: loss differs from the 1-rank CUDA run by %.3g relative (limit "
                                               "1e-2)", what.c_str(), worst));
                const double worst_cpu = worst_loss_difference(run.losses, cpu.losses);
                check(worst_cpu <= 1e-2, strformat("%s: loss differs from the CPU run by %.3g relative (limit 1e-2)",
                                                   what.c_str(), worst_cpu));
                const double params_diff = relative_difference(run.params, reference.params);
                check(params_diff <= 2e-2, strformat("%s: final parameters differ from the 1-rank CUDA run by %.3g "
                                                     "relative (limit 2e-2)", what.c_str(), params_diff));
                check_same_on_every_rank(run.params, comm, what + ": the gathered whole model");
                say(strformat("%s: planned bytes allocated; %d losses match 1 CUDA rank (worst %.2g) and the CPU "
                              "(worst %.2g), final parameters too (%.2g), the same on every rank",
                              what.c_str(), STEPS, worst, worst_cpu, params_diff));
                if (sp) {
                    sp_losses = run.losses;
                } else {
                    const double sp_diff = worst_loss_difference(run.losses, sp_losses);
                    check(sp_diff <= 1e-2, strformat("%s: sequence parallelism on and off differ by %.3g relative "
                                                     "(limit 1e-2)", what.c_str(), sp_diff));
                    say(strformat("dp %d x tp %d, ZeRO-%d: sequence parallelism on and off agree (worst %.2g)", dp,
                                  tp, stage, sp_diff));
                }

                // Once: the same weights give the same evaluation and next-token logits as 1 rank.
                if (stage != 0) continue;
                model->set_master_weights(reference.params.data());
                reference_model.set_master_weights(reference.params.data());
                const std::vector<int> inputs = pseudo_tokens(BATCH * SEQ, 250, 1), targets = pseudo_tokens(BATCH * SEQ, 250, 2);
                const float loss_tp = model->evaluate(inputs.data(), targets.data(), BATCH, SEQ);
                const float loss_one = reference_model.evaluate(inputs.data(), targets.data(), BATCH, SEQ);
                check(std::fabs(loss_tp - loss_one) <= 1e-2 * std::fabs(loss_one),
                      strformat("%s: evaluate() gives %.5f, 1 rank %.5f", what.c_str(), loss_tp, loss_one));
                const int Vp = cfg.model_config.padded_vocab_size;
                std::vector<float> logits_tp(Vp), logits_one(Vp);
                model->next_token_logits(inputs.data(), 7, logits_tp.data());
                reference_model.next_token_logits(inputs.data(), 7, logits_one.data());
                const double logits_diff = relative_difference(logits_tp, logits_one);
                check(logits_diff <= 2e-2, strformat("%s: next_token_logits of 7 tokens differ from 1 rank by %.3g "
                                                     "relative (limit 2e-2)", what.c_str(), logits_diff));
                say(strformat("%s: with the same weights, evaluate() (%.5f vs %.5f) and next_token_logits (%.2g) "
                              "match 1 rank", what.c_str(), loss_tp, loss_one, logits_diff));
            }
        }
        // Recomputation under tensor parallelism: -r 2 recomputes the LayerNorms on the rank's rows,
        // -r 3 re-runs whole blocks, with their gathers and reductions, inside backward.
        for (int recompute : {2, 3}) {
            const RunConfig cfg = make_config(shard, 1, W, tp, 1, BATCH, recompute);
            ProcessGroups groups(comm, cfg.dims);
            const std::string what = strformat("dp %d x tp %d, ZeRO-1, sequence parallel on, -r %d", dp, tp, recompute);
            BuiltModel built;
            CUDAModel* model = &make_planned_model(built, cfg, groups, what);
            const RunResult run = train_cuda(cfg, groups.dp(), &groups.world(), *model);
            const double worst = worst_loss_difference(run.losses, reference.losses);
            check(worst <= 1e-2, strformat("%s: loss differs from the 1-rank CUDA run by %.3g relative (limit 1e-2)",
                                           what.c_str(), worst));
            say(strformat("%s: %d losses match 1 CUDA rank (worst %.2g)", what.c_str(), STEPS, worst));
        }
    });
}
