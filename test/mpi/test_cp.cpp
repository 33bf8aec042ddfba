// Context parallelism under mpirun: ring attention against the plain one, and the model on dp x cp
// (x tp) meshes against the 1-rank run.
//
//   mpirun -np N build/test_cp DIR CP [TP]   (DIR: an empty directory shared by the ranks; CP x TP divides N)
//
// 1. Ring attention (cpu/ring_attention.h) on a context group of CP ranks, on random queries, keys,
//    values and output gradients: each rank's rows of the output and of the qkv gradient are the
//    plain attention's (cpu/ops.h; cpu/llama_ops.h's with 4 query heads sharing 2 key/value heads)
//    rows at the same global positions, within 1e-5 relative.
// 2. The model: every rank also trains the 1-rank reference (a LocalComm model whose micro-batch is
//    the dp groups' micro-batches side by side, so it reads the very same tokens). For ZeRO stages
//    0-3 over the dp x cp group (and with TP > 1, sequence parallelism on and off) the 20 losses
//    match the reference within 1e-5 relative, the final parameters within 1e-4 and bitwise on
//    every rank, and the bytes allocated per memory kind equal the planner's figures; freshly
//    initialised, the next-token logits of prompts of lengths that the split does not divide (padded)
//    equal the reference's within 1e-5.
// Prints one "ok" line per property on rank 0; any failure exits non-zero (MPI_Abort).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/cpu/llama_ops.h"
#include "llmc/cpu/ring_attention.h"
#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"
#include "llmc/models/cpu_backend.h"
#include "llmc/models/cpu_model.h"
#include "llmc/planning/planner.h"
#include "llmc/numerics/rng.h"
#include "llmc/train_loop.h"
#include "test/mpi/mpi_test_util.h"

using namespace llmc;
using namespace llmc::mpi_test;

namespace {

std::vector<float> random_floats(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = 2.0f * rng.uniform() - 1.0f;
    return v;
}

// This rank's rows (B sequences of `split`'s local positions) of a B x T x width tensor.
std::vector<float> local_rows(const std::vector<float>& whole, const ContextSplit& split, int B, int width) {
    const int Tl = split.local_len();
    std::vector<float> mine((size_t)B * Tl * width);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tl; j++)
            std::copy_n(&whole[((size_t)b * split.T + split.global_position(j)) * width], width,
                        &mine[((size_t)b * Tl + j) * width]);
    return mine;
}

// Ring attention forward and backward over `cp` against the plain attention of the whole sequences:
// with as many key/value heads as query heads (GPT-2's), or fewer, each serving a group (a Llama's).
void check_ring_attention(Communicator& cp, int NH, int KVH) {
    const int B = 2, T = 8 * cp.world_size(), HS = 4, C = NH * HS, row = (NH + 2 * KVH) * HS;
    const std::vector<float> qkv = random_floats((size_t)B * T * row, 1);
    const std::vector<float> dout = random_floats((size_t)B * T * C, 2);
    std::vector<float> out((size_t)B * T * C), att((size_t)B * NH * T * T), dqkv(qkv.size());
    if (KVH == NH) {
        cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
        cpu::attention_backward(dqkv.data(), dout.data(), att.data(), qkv.data(), B, T, C, NH);
    } else {
        cpu::gqa_attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, KVH, HS);
        cpu::gqa_attention_backward(dqkv.data(), dout.data(), att.data(), qkv.data(), B, T, NH, KVH, HS);
    }

    const ContextSplit split{cp.world_size(), cp.rank(), T};
    const int Tl = split.local_len();
    const std::vector<float> my_qkv = local_rows(qkv, split, B, row), my_dout = local_rows(dout, split, B, C);
    std::vector<float> my_out((size_t)B * Tl * C), lse((size_t)B * NH * Tl), rowsum(lse.size());
    std::vector<float> ring(cpu::RingAttention::ring_floats(B, Tl, KVH * HS)), my_dqkv(my_qkv.size());
    cpu::RingAttention attention(cp);
    attention.forward(my_out.data(), lse.data(), my_qkv.data(), ring.data(), B, Tl, NH, KVH, HS);
    attention.backward(my_dqkv.data(), my_dout.data(), my_out.data(), lse.data(), my_qkv.data(), ring.data(),
                       rowsum.data(), B, Tl, NH, KVH, HS);
    const double out_diff = relative_difference(my_out, local_rows(out, split, B, C));
    const double grad_diff = relative_difference(my_dqkv, local_rows(dqkv, split, B, row));
    const std::string what = strformat("ring attention over cp %d, %d heads (%d kv)", cp.world_size(), NH, KVH);
    check(out_diff <= 1e-5 && grad_diff <= 1e-5,
          strformat("%s: output differs from plain attention by %.3g, the qkv gradient by %.3g (limit 1e-5)",
                    what.c_str(), out_diff, grad_diff));
    say(strformat("%s: output and qkv gradient equal plain attention's (%.2g, %.2g)", what.c_str(), out_diff,
                  grad_diff));
}

RunConfig make_config(const std::string& shard, int stage, int world_size, int cp, int tp, int sp, int batch_size) {
    RunConfig cfg = base_config(shard);
    cfg.num_layers = 2;
    cfg.num_heads = 4;
    cfg.channels = 32;
    cfg.max_seq_len = 32;
    cfg.batch_size = batch_size;
    cfg.seq_len = 32;
    cfg.total_batch_tokens = 4 * 2 * 32;  // 8 sequences: dp = 1, 2 and 4 all divide it
    cfg.steps = 20;
    cfg.lr = 1e-2f;
    cfg.zero_stage = stage;
    cfg.cp = cp;
    cfg.tp = tp;
    cfg.sequence_parallel = sp;
    resolve_run_config(cfg, world_size, nullptr);
    return cfg;
}

// Sampling's next-token logits of two fresh models from the same seed: `model` on the mesh, and the
// 1-rank `reference`, for prompts of 5 and 29 tokens (padded to what the split cuts).
void check_next_token_logits(CPUModel& model, CPUModel& reference, uint64_t seed, const std::string& what) {
    model.init_random(seed);
    reference.init_random(seed);
    const size_t Vp = model.config().padded_vocab_size;
    for (int T : {5, 29}) {
        std::vector<int> prompt(T);
        for (int t = 0; t < T; t++) prompt[t] = (7 * t + 3) % 250;
        std::vector<float> mine(Vp), expected(Vp);
        model.next_token_logits(prompt.data(), T, mine.data());
        reference.next_token_logits(prompt.data(), T, expected.data());
        mine.resize(250);
        expected.resize(250);
        const double diff = relative_difference(mine, expected);
        check(diff <= 1e-5, strformat("%s: the next-token logits of a %d-token prompt differ from 1 rank's by %.3g "
                                      "(limit 1e-5)", what.c_str(), T, diff));
    }
}

// The model on this launch's dp x cp x tp mesh against the 1-rank reference, for every ZeRO stage
// (and sequence parallelism on and off where tp > 1).
void check_model(Communicator& world, int cp, int tp, const std::string& shard) {
    const int W = world.world_size(), dp = W / (cp * tp);
    LocalComm local;
    RunConfig reference_cfg = make_config(shard, 0, 1, 1, 1, 0, 2 * dp);
    CPUModel reference_model(reference_cfg.model_config, 2 * dp, 32, local, 0);
    const RunResult reference = train(reference_cfg, local, nullptr, reference_model);
    for (int stage = 0; stage <= 3; stage++) {
        for (int sp : tp > 1 ? std::vector<int>{1, 0} : std::vector<int>{0}) {
            RunConfig cfg = make_config(shard, stage, W, cp, tp, sp, 2);
            ProcessGroups groups(world, cfg.dims);
            const std::string what = strformat("dp %d x cp %d x tp %d%s, ZeRO-%d over dp x cp", dp, cp, tp,
                                               tp == 1 ? "" : sp ? " (sequence parallel)" : " (no sequence parallel)",
                                               stage);
            CPUModel model(cfg.model_config, cfg.batch_size, cfg.seq_len, groups.dp_cp(), stage, groups.tp(), sp,
                          groups.pp(), {}, groups.cp());
            const MemoryPlan plan = CpuBackend::memory_plan(cfg, groups.dp_cp().rank(), groups.tp().rank(), 0);
            for (int k = 0; k < (int)MemoryKind::Count; k++)
                check(plan.bytes[k] == model.allocated_bytes((MemoryKind)k),
                      strformat("%s: planned %zu bytes of %s, allocated %zu", what.c_str(), plan.bytes[k],
                                memory_kind_name((MemoryKind)k), model.allocated_bytes((MemoryKind)k)));
            check_next_token_logits(model, reference_model, cfg.seed, what);
            const RunResult run = train(cfg, groups.dp(), &groups.world(), model);
            const auto [worst, params_diff] = check_matches_reference(run, reference, world, what);
            say(strformat("%s: planned bytes allocated; next-token logits as 1 rank's; 20 losses match 1 rank (worst "
                          "%.2g), final parameters too (%.2g), the same on every rank", what.c_str(), worst,
                          params_diff));
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    launch = bootstrap_launch(&argc, &argv);
    try {
        if (argc < 3 || argc > 4) fail("usage: test_cp DIR CP [TP]");
        std::unique_ptr<Communicator> comm = make_host_communicator(launch);
        comm->timeout_s = 120;
        const int W = comm->world_size(), cp = std::atoi(argv[2]), tp = argc == 4 ? std::atoi(argv[3]) : 1;
        ParallelDims dims;
        dims.cp = cp;
        dims.tp = tp;
        dims.dp = W / (cp * tp);
        ProcessGroups groups(*comm, dims);
        check_ring_attention(groups.cp(), 3, 3);
        check_ring_attention(groups.cp(), 4, 2);
        const std::string shard = std::string(argv[1]) + "/cp_train_000000.bin";
        if (launch.rank == 0) write_shard(shard, 60000);
        comm->barrier().wait();
        check_model(*comm, cp, tp, shard);
    } catch (const std::exception& e) {
        check(false, e.what());
    }
    finalize_launch(launch);
    return 0;
}
