// Pipeline parallelism of the CUDA model end to end under mpirun (make test-gpu, through
// test/gpu/run_gpu_pp_tests.sh): a dp x pp x tp mesh with the same global batch reproduces the 1-rank
// CUDA run and the fp32 CPU reference, for every ZeRO stage over the data-parallel group, with the
// 1F1B or the interleaved schedule.
//
//   mpirun --oversubscribe -np N build/test_pp_cuda DIR PP TP VIRTUAL [LAYERS]
//     DIR: an empty directory shared by the ranks; PP x TP divides N; VIRTUAL: chunks per rank
//     (1: 1F1B, more: interleaved); LAYERS: --pp-layers (default: the even split)
//
// The ranks share the node's GPUs (local rank modulo their count), so the collectives and the
// pipeline's sends and receives go through MPI (--gpu-comm mpi: StagedComm); the device
// communicators and the model are made by CudaBackend::make_model, exactly as train_gpt makes them.
// Every rank also trains the two 1-rank references itself (a LocalComm model whose micro-batch is
// the dp groups' micro-batches side by side, B = batch x dp, so it reads the very same tokens): the
// CUDA model and CPUModel. Then, for ZeRO stages 0-3, it checks:
//   - the bytes allocated per memory kind: equal to CudaBackend::memory_plan's for this rank's
//     stage (whose activations hold as many micro-batches as the schedule keeps in flight there);
//   - the 10 per-step losses: relative difference at most 1e-2 (bf16) from the 1-rank CUDA run and
//     from the CPU run;
//   - the final parameters, gathered whole (the model.bin a run would save): relative difference at
//     most 2e-2 from the 1-rank CUDA run's, and bitwise identical on every rank;
// and the losses of recomputation -r 3 (ZeRO-1) within 1e-2 of 1 rank. And once (ZeRO-0), with the
// 1-rank model's weights given to the pipeline: evaluate() (the same loss on every rank) and
// next_token_logits of 7 tokens (the whole row on every rank) agree with 1 rank within bf16
// tolerance.
// The model (4 layers, 2 heads of 32 channels, vocabulary 250 padded to 256) cuts into 2 x 2 virtual
// stages and divides by tp = 2; a step is 16 sequences, 8 / dp micro-batches of 2 per rank (a
// multiple of pp = 2 for dp 1 and 2, as the interleaved schedule needs). Prints one "ok" line per
// property on rank 0; any failure exits non-zero (MPI_Abort, exit 2). Without a GPU it skips
// (exit 0), or fails with exit 3 in a GPU session (LLMC_GPU_SESSION=1).
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

constexpr int STEPS = 10, BATCH = 2, SEQ = 32, SEQUENCES = 16;

RunConfig make_config(const std::string& shard, int stage, int world_size, int pp, int tp, int virtual_chunks,
                      const std::string& layers, int batch_size, int recompute = 0) {
    RunConfig cfg = base_config(shard);
    cfg.num_layers = 4;
    cfg.num_heads = 2;
    cfg.channels = 64;
    cfg.max_seq_len = SEQ;
    cfg.batch_size = batch_size;
    cfg.seq_len = SEQ;
    cfg.total_batch_tokens = SEQUENCES * SEQ;  // 16 sequences: 8 / dp micro-batches of 2 per rank
    cfg.steps = STEPS;
    cfg.lr = 1e-3f;
    cfg.zero_stage = stage;
    cfg.tp = tp;
    cfg.pp = pp;
    cfg.pp_schedule = virtual_chunks > 1 ? "interleaved" : "1f1b";
    cfg.pp_virtual = virtual_chunks;
    cfg.pp_layers = layers;
    cfg.gpu_comm = "mpi";
    cfg.recompute = recompute;
    resolve_run_config(cfg, world_size, nullptr);
    return cfg;
}

}  // namespace

int main(int argc, char** argv) {
    return run_cuda_test(argc, argv, "test_pp_cuda", [](Communicator& comm, int argc, char** argv) {
        if (argc != 5 && argc != 6) fail("usage: test_pp_cuda DIR PP TP VIRTUAL [LAYERS]");
        const int W = comm.world_size(), pp = std::atoi(argv[2]), tp = std::atoi(argv[3]), V = std::atoi(argv[4]);
        const std::string layers = argc == 6 ? argv[5] : "";
        if (pp < 2 || tp < 1 || V < 1 || W % (pp * tp) != 0)
            fail(strformat("test_pp_cuda: PP (%d) must be >= 2, TP (%d) and VIRTUAL (%d) >= 1, and PP x TP divide the "
                           "%d ranks", pp, tp, V, W));
        const int dp = W / (pp * tp);
        if (SEQUENCES % (BATCH * dp) != 0)
            fail(strformat("test_pp_cuda: dp %d does not divide the step's %d sequences into micro-batches of %d", dp,
                           SEQUENCES, BATCH));
        const std::string shard = shared_shard(comm, argv[1], "pp_cuda");

        // The 1-rank references, computed on every rank: the CUDA model and the CPU model.
        const RunConfig rc = make_config(shard, 0, 1, 1, 1, 1, "", BATCH * dp);
        use_this_ranks_gpu();
        CUDAModel reference_model(rc.model_config, rc.batch_size, rc.seq_len);
        RunResult cpu;
        const RunResult reference = train_references(rc, reference_model, &cpu);

        for (int stage = 0; stage <= 3; stage++) {
            const RunConfig cfg = make_config(shard, stage, W, pp, tp, V, layers, BATCH);
            ProcessGroups groups(comm, cfg.dims);
            const std::string what =
                strformat("dp %d x pp %d x tp %d, %s, layers %s, ZeRO-%d", dp, pp, tp,
                          V > 1 ? strformat("interleaved (%d chunks per rank)", V).c_str() : "1F1B",
                          pipeline_split(cfg).describe().c_str(), stage);
            BuiltModel built;
            CUDAModel* model = &make_planned_model(built, cfg, groups, what);

            const RunResult run = train_cuda(cfg, groups.dp(), &groups.world(), *model);
            const double worst = worst_loss_difference(run.losses, reference.losses);
            check(worst <= 1e-2, strformat("%s: loss differs from the 1-rank CUDA run by %.3g relative (limit 1e-2)",
                                           what.c_str(), worst));
            const double worst_cpu = worst_loss_difference(run.losses, cpu.losses);
            check(worst_cpu <= 1e-2, strformat("%s: loss differs from the CPU run by %.3g relative (limit 1e-2)",
                                               what.c_str(), worst_cpu));
            check(run.params.size() == reference.params.size(),
                  strformat("%s: the gathered model has %zu parameters, the 1-rank one %zu", what.c_str(),
                            run.params.size(), reference.params.size()));
            const double params_diff = relative_difference(run.params, reference.params);
            check(params_diff <= 2e-2, strformat("%s: final parameters differ from the 1-rank CUDA run by %.3g "
                                                 "relative (limit 2e-2)", what.c_str(), params_diff));
            check_same_on_every_rank(run.params, comm, what + ": the gathered whole model");
            say(strformat("%s: planned bytes allocated on every stage; %d losses match 1 CUDA rank (worst %.2g) and "
                          "the CPU (worst %.2g), final parameters too (%.2g), the same on every rank",
                          what.c_str(), STEPS, worst, worst_cpu, params_diff));

            // Once: the same weights give the same evaluation and next-token logits as 1 rank, on every
            // rank (the first stage holds the embedding, the last the head: both are collective).
            if (stage != 0) continue;
            model->set_master_weights(reference.params.data());
            reference_model.set_master_weights(reference.params.data());
            const std::vector<int> inputs = pseudo_tokens(BATCH * SEQ, 250, 1), targets = pseudo_tokens(BATCH * SEQ, 250, 2);
            const float loss_pp = model->evaluate(inputs.data(), targets.data(), BATCH, SEQ);
            const float loss_one = reference_model.evaluate(inputs.data(), targets.data(), BATCH, SEQ);
            check(std::fabs(loss_pp - loss_one) <= 1e-2 * std::fabs(loss_one),
                  strformat("%s: evaluate() gives %.5f, 1 rank %.5f", what.c_str(), loss_pp, loss_one));
            check_same_on_every_rank({loss_pp}, comm, what + ": evaluate()");
            const int Vp = cfg.model_config.padded_vocab_size;
            std::vector<float> logits_pp(Vp), logits_one(Vp);
            model->next_token_logits(inputs.data(), 7, logits_pp.data());
            reference_model.next_token_logits(inputs.data(), 7, logits_one.data());
            const double logits_diff = relative_difference(logits_pp, logits_one);
            check(logits_diff <= 2e-2, strformat("%s: next_token_logits of 7 tokens differ from 1 rank by %.3g "
                                                 "relative (limit 2e-2)", what.c_str(), logits_diff));
            check_same_on_every_rank(logits_pp, comm, what + ": next_token_logits");
            say(strformat("%s: with the same weights, evaluate() (%.5f vs %.5f) and next_token_logits (%.2g) match 1 "
                          "rank, the same on every rank", what.c_str(), loss_pp, loss_one, logits_diff));
        }
        // Recomputation under the pipeline: -r 3 re-runs each stage's blocks inside its backward, for
        // every micro-batch the schedule keeps in flight.
        {
            const RunConfig cfg = make_config(shard, 1, W, pp, tp, V, layers, BATCH, 3);
            ProcessGroups groups(comm, cfg.dims);
            const std::string what = strformat("dp %d x pp %d x tp %d, %s, ZeRO-1, -r 3", dp, pp, tp,
                                               V > 1 ? strformat("interleaved (%d chunks per rank)", V).c_str() : "1F1B");
            BuiltModel built;
            CUDAModel* model = &make_planned_model(built, cfg, groups, what);
            const RunResult run = train_cuda(cfg, groups.dp(), &groups.world(), *model);
            const double worst = worst_loss_difference(run.losses, reference.losses);
            check(worst <= 1e-2, strformat("%s: loss differs from the 1-rank CUDA run by %.3g relative (limit 1e-2)",
                                           what.c_str(), worst));
            say(strformat("%s: planned bytes allocated; %d losses match 1 CUDA rank (worst %.2g)", what.c_str(), STEPS,
                          worst));
        }
    });
}
