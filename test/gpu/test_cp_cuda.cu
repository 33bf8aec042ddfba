// Context parallelism of the CUDA model end to end under mpirun (make test-gpu and make test-emu,
// through test/gpu/run_gpu_cp_tests.sh): meshes of context parallelism with the other axes, the same
// global batch, reproduce the 1-rank CUDA run, the fp32 CPU reference and the CPU model's run of the
// same mesh, with ZeRO over the data x context group.
//
//   mpirun --oversubscribe -np N build/test_cp_cuda DIR MESH...   (DIR: an empty directory shared by the ranks)
//
// Each MESH names the context group and what is combined with it, axes joined by dots: cpC, tpT,
// spS (sequence parallelism with tp, 1 by default), ppP; the ranks left over are data-parallel, and
// every MESH of a run must leave the same number (one 1-rank reference serves them all). "cp2" on 4
// ranks is dp 2 x cp 2; "cp2.tp2", "cp2.tp2.sp0" and "pp2.cp2" use 4 ranks each.
// The ranks share the node's GPUs (--gpu-comm mpi: StagedComm); the device communicators and the
// model are made by CudaBackend::make_model, exactly as train_gpt makes them. Every rank also trains
// the two 1-rank references itself (B = batch x dp, the very same tokens): the CUDA model and CPUModel.
// Then, for ZeRO stages 0-3 (dp x cp meshes) or 0 and 3 (meshes with tp or pp), it checks:
//   - the bytes allocated per memory kind: equal to the memory plan's for this rank (activations of
//     T / cp rows per sequence, and the ring's buffers);
//   - the 10 per-step losses: relative difference at most 2e-4 from the 1-rank CUDA run, from the CPU
//     run and from the CPU model's run of the same mesh (CPUModel's ring attention). Tighter than the
//     tp test's 1e-2: the loss of this small model is nearly uniform, and a broken ring (keys and
//     values not forwarded) moves it by only 8e-4, a correct one by 2e-5 (emulated);
//   - the final parameters, gathered whole: relative difference at most 2e-2 from the 1-rank CUDA
//     run's, and bitwise identical on every rank;
// and, for dp x cp meshes, the losses of recomputation -r 3 (ring attention re-run inside backward)
// within 2e-4 of 1 rank, and a Llama's step (4 heads sharing 2 kv heads, RoPE at the global
// positions): its loss within 1e-2 and every tensor's gradient within 5e-2 of the CPU model's on 1 rank. And once per mesh, with the 1-rank model's weights given to it: evaluate()
// and next_token_logits (7 tokens: not a multiple of 2 x cp, so sampling pads, and the rank holding
// position 6 broadcasts) agree within bf16 tolerance, the same on every rank. The model: 2 layers, 2
// heads of 32, vocabulary 250 padded to 256, T 32 (chunks of 8 rows at cp 2). Prints one "ok" line
// per property on rank 0; any failure exits non-zero (MPI_Abort, exit 2). Without a GPU it skips
// (exit 0), or fails with exit 3 in a GPU session (LLMC_GPU_SESSION=1).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"
#include "llmc/models/cuda_backend.cuh"
#include "llmc/models/cpu_model.h"
#include "llmc/models/cuda_model.cuh"
#include "llmc/train_loop.h"
#include "test/gpu/cuda_test_util.h"

using namespace llmc;
using namespace llmc::mpi_test;

namespace {

constexpr int STEPS = 10, BATCH = 4, SEQ = 32;
constexpr double LOSS_LIMIT = 2e-4;

// A mesh under test: the context group and the axes combined with it (the world's other ranks are dp).
struct Mesh {
    int cp = 1, tp = 1, sp = 1, pp = 1;
    bool with_dp_only() const { return tp == 1 && pp == 1; }
    std::string describe(int dp) const {
        std::string d = strformat("dp %d x pp %d x cp %d x tp %d", dp, pp, cp, tp);
        return tp > 1 ? d + (sp ? " (sequence parallel)" : " (no sequence parallelism)") : d;
    }
};

// "cp2", "cp2.tp2.sp0", "pp2.cp2": axes joined by dots, each a name and its size.
Mesh parse_mesh(const std::string& spec) {
    Mesh m;
    size_t at = 0;
    while (at <= spec.size()) {
        const size_t end = std::min(spec.find('.', at), spec.size());
        const std::string axis = spec.substr(at, 2), value = spec.substr(at + 2, end - at - 2);
        int* field = axis == "cp" ? &m.cp : axis == "tp" ? &m.tp : axis == "sp" ? &m.sp : axis == "pp" ? &m.pp : nullptr;
        if (!field || value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
            fail(strformat("test_cp_cuda: mesh '%s': expected axes cpN, tpN, spN, ppN joined by dots", spec.c_str()));
        *field = std::atoi(value.c_str());
        at = end + 1;
    }
    if (m.cp < 2) fail(strformat("test_cp_cuda: mesh '%s' has no context group (cp2 or more)", spec.c_str()));
    return m;
}

RunConfig make_config(const std::string& shard, int stage, int world_size, const Mesh& mesh, int batch_size,
                      int recompute = 0, bool llama = false) {
    RunConfig cfg = base_config(shard);
    cfg.num_layers = 2;
    cfg.num_heads = llama ? 4 : 2;  // a Llama's 4 heads of 32 share 2 kv heads
    cfg.channels = llama ? 128 : 64;
    if (llama) {
        cfg.arch = "llama";
        cfg.kv_heads = 2;
    }
    cfg.max_seq_len = SEQ;
    cfg.batch_size = batch_size;
    cfg.seq_len = SEQ;
    cfg.total_batch_tokens = 16 * SEQ;  // 16 sequences: dp = 1, 2 and 4 all divide it
    cfg.steps = STEPS;
    cfg.lr = 1e-3f;
    cfg.zero_stage = stage;
    cfg.cp = mesh.cp;
    cfg.tp = mesh.tp;
    cfg.sequence_parallel = mesh.sp;
    cfg.pp = mesh.pp;
    cfg.gpu_comm = "mpi";
    cfg.recompute = recompute;
    resolve_run_config(cfg, world_size, nullptr);
    return cfg;
}

// The CPU model's run of the same mesh: CPUModel on the same groups (ring attention in fp32).
RunResult train_cpu_mesh(const RunConfig& cfg, const ProcessGroups& groups) {
    CPUModel model(cfg.model_config, cfg.batch_size, cfg.seq_len, groups.dp_cp(), cfg.zero_stage, groups.tp(),
                  cfg.dims.tp > 1 && cfg.sequence_parallel, groups.pp(), pipeline_of(cfg), groups.cp());
    return train(cfg, groups.dp(), &groups.world(), model);
}

// The worst relative loss difference of `losses` from `reference`'s, checked against LOSS_LIMIT.
double checked_loss_difference(const std::vector<float>& losses, const std::vector<float>& reference,
                               const std::string& what, const char* against) {
    const double worst = worst_loss_difference(losses, reference);
    check(worst <= LOSS_LIMIT, strformat("%s: loss differs from %s by %.3g relative (limit %g)", what.c_str(), against,
                                         worst, LOSS_LIMIT));
    return worst;
}

// The 1-rank references every mesh is checked against.
struct References {
    CUDAModel& model;  // the 1-rank CUDA model, for evaluation checks
    const RunResult &cuda, &cpu;
};

// With the 1-rank model's weights, `model` gives its evaluate() and next-token logits, on every rank.
void check_same_weights_same_outputs(CUDAModel& model, const References& ref, Communicator& world,
                                     const RunConfig& cfg, const std::string& what) {
    model.set_master_weights(ref.cuda.params.data());
    ref.model.set_master_weights(ref.cuda.params.data());
    const std::vector<int> inputs = pseudo_tokens(BATCH * SEQ, 250, 1), targets = pseudo_tokens(BATCH * SEQ, 250, 2);
    const float loss_cp = model.evaluate(inputs.data(), targets.data(), BATCH, SEQ);
    const float loss_one = ref.model.evaluate(inputs.data(), targets.data(), BATCH, SEQ);
    check(std::fabs(loss_cp - loss_one) <= LOSS_LIMIT * std::fabs(loss_one),
          strformat("%s: evaluate() gives %.5f, 1 rank %.5f", what.c_str(), loss_cp, loss_one));
    check_same_on_every_rank({loss_cp}, world, what + ": evaluate()");
    const int Vp = cfg.model_config.padded_vocab_size;
    std::vector<float> logits_cp(Vp), logits_one(Vp);
    model.next_token_logits(inputs.data(), 7, logits_cp.data());
    ref.model.next_token_logits(inputs.data(), 7, logits_one.data());
    const double logits_diff = relative_difference(logits_cp, logits_one);
    check(logits_diff <= 2e-2, strformat("%s: next_token_logits of 7 tokens differ from 1 rank by %.3g relative "
                                         "(limit 2e-2)", what.c_str(), logits_diff));
    check_same_on_every_rank(logits_cp, world, what + ": next_token_logits");
    say(strformat("%s: with the same weights, evaluate() (%.5f vs %.5f) and next_token_logits (%.2g) match 1 rank, "
                  "the same on every rank", what.c_str(), loss_cp, loss_one, logits_diff));
}

// One mesh at ZeRO stage `stage`: its planned bytes, losses and final parameters (see the header).
void check_mesh(const std::string& shard, Communicator& world, const Mesh& mesh, int stage, const References& ref) {
    const RunConfig cfg = make_config(shard, stage, world.world_size(), mesh, BATCH);
    ProcessGroups groups(world, cfg.dims);
    const std::string what = strformat("%s, ZeRO-%d", mesh.describe(cfg.dims.dp).c_str(), stage);
    BuiltModel built;
    CUDAModel& model = make_planned_model(built, cfg, groups, what);
    const RunResult run = train_cuda(cfg, groups.dp(), &groups.world(), model);
    const double worst = checked_loss_difference(run.losses, ref.cuda.losses, what, "the 1-rank CUDA run");
    const double worst_cpu = checked_loss_difference(run.losses, ref.cpu.losses, what, "the CPU run");
    const double worst_cpu_mesh = checked_loss_difference(run.losses, train_cpu_mesh(cfg, groups).losses, what,
                                                          "the CPU model's run of the same mesh");
    const double params_diff = relative_difference(run.params, ref.cuda.params);
    check(params_diff <= 2e-2, strformat("%s: final parameters differ from the 1-rank CUDA run by %.3g relative "
                                         "(limit 2e-2)", what.c_str(), params_diff));
    check_same_on_every_rank(run.params, world, what + ": the gathered whole model");
    say(strformat("%s: planned bytes allocated; %d losses match 1 CUDA rank (worst %.2g), the CPU (worst %.2g) and "
                  "the CPU model's same mesh (worst %.2g), final parameters too (%.2g), the same on every rank",
                  what.c_str(), STEPS, worst, worst_cpu, worst_cpu_mesh, params_diff));
    if (stage == 0) check_same_weights_same_outputs(model, ref, world, cfg, what);
}

// Recomputation: -r 3 re-runs whole blocks, the ring attention's forward with them, inside backward.
void check_recomputation(const std::string& shard, Communicator& world, const Mesh& mesh, const References& ref) {
    const RunConfig cfg = make_config(shard, 1, world.world_size(), mesh, BATCH, 3);
    ProcessGroups groups(world, cfg.dims);
    const std::string what = strformat("%s, ZeRO-1, -r 3", mesh.describe(cfg.dims.dp).c_str());
    BuiltModel built;
    CUDAModel& model = make_planned_model(built, cfg, groups, what);
    const RunResult run = train_cuda(cfg, groups.dp(), &groups.world(), model);
    const double worst = checked_loss_difference(run.losses, ref.cuda.losses, what, "the 1-rank CUDA run");
    say(strformat("%s: %d losses match 1 CUDA rank (worst %.2g)", what.c_str(), STEPS, worst));
}

// A Llama on the mesh (4 heads of 32 sharing 2 kv heads, RoPE): one step's loss and every tensor's
// gradient against the fp32 CPU model's on one rank, from the same weights and batch. The gradients
// of the qkv product name a rank that rotates q and k at its local positions, not the global ones,
// or a ring that loses a kv head's group; a loss curve barely sees either at this size.
void check_llama_step(const std::string& shard, Communicator& world, const Mesh& mesh) {
    const RunConfig cfg = make_config(shard, 0, world.world_size(), mesh, BATCH, 0, true);
    const ModelConfig& c = cfg.model_config;
    ProcessGroups groups(world, cfg.dims);
    const std::string what = strformat("a Llama on %s, ZeRO-0", mesh.describe(cfg.dims.dp).c_str());
    std::vector<float> weights(num_params(c));
    init_model_params(c, weights.data(), 5);
    for (float& x : weights) x = __bfloat162float(__float2bfloat16_rn(x));  // the same weights in bf16
    const std::vector<int> inputs = pseudo_tokens(BATCH * SEQ, 250, 3), targets = pseudo_tokens(BATCH * SEQ, 250, 4);
    CPUModel cpu(c, BATCH, SEQ);
    std::copy(weights.begin(), weights.end(), cpu.params());
    cpu.zero_grad();
    const float cpu_loss = cpu.forward_backward(inputs.data(), targets.data(), BATCH, SEQ, 1.0f, true);

    BuiltModel built;
    CUDAModel& model = make_planned_model(built, cfg, groups, what);
    model.set_master_weights(weights.data());
    model.zero_grad();
    const float loss = model.forward_backward(inputs.data(), targets.data(), BATCH, SEQ, 1.0f, true);
    check(std::fabs(loss - cpu_loss) <= 1e-2 * std::fabs(cpu_loss),
          strformat("%s: the loss of a step is %.5f, the CPU model's %.5f", what.c_str(), loss, cpu_loss));
    std::vector<float> grads(model.num_params());
    model.get_grads(grads.data());
    const ParamLayout layout = model_layout(c);
    double worst = 0.0;
    for (const ParamLayout::Segment& seg : layout.segments()) {
        const std::vector<float> mine(grads.begin() + seg.begin, grads.begin() + seg.end),
            expected(cpu.grads() + seg.begin, cpu.grads() + seg.end);
        const double diff = relative_difference(mine, expected);
        check(diff <= 5e-2, strformat("%s: the gradient of %s (layer %d) differs from the CPU model's by %.3g relative "
                                      "(limit 5e-2)", what.c_str(), layout.name(seg.tensor).c_str(), seg.layer, diff));
        worst = std::max(worst, diff);
    }
    say(strformat("%s: a step's loss (%.5f vs %.5f) and every gradient (worst %.2g) match the CPU model on 1 rank",
                  what.c_str(), loss, cpu_loss, worst));
}

}  // namespace

int main(int argc, char** argv) {
    return run_cuda_test(argc, argv, "test_cp_cuda", [](Communicator& comm, int argc, char** argv) {
        if (argc < 3) fail("usage: test_cp_cuda DIR MESH... (a MESH: cpN with tpN, spN, ppN, joined by dots)");
        const int W = comm.world_size();
        std::vector<Mesh> meshes;
        for (int i = 2; i < argc; i++) meshes.push_back(parse_mesh(argv[i]));
        const int group = meshes[0].cp * meshes[0].tp * meshes[0].pp;
        for (const Mesh& m : meshes)
            if (W % group != 0 || m.cp * m.tp * m.pp != group)
                fail(strformat("test_cp_cuda: every MESH must divide the %d ranks into the same data-parallel size "
                               "(%s does not)", W, m.describe(W / (m.cp * m.tp * m.pp)).c_str()));
        const int dp = W / group;
        const std::string shard = shared_shard(comm, argv[1], "cp_cuda");

        // The 1-rank references, computed on every rank: the CUDA model and the CPU model.
        const RunConfig rc = make_config(shard, 0, 1, Mesh{}, BATCH * dp);
        use_this_ranks_gpu();
        CUDAModel reference_model(rc.model_config, rc.batch_size, rc.seq_len);
        RunResult cpu;
        const RunResult reference = train_references(rc, reference_model, &cpu);
        const References ref{reference_model, reference, cpu};

        for (const Mesh& mesh : meshes) {
            for (int stage : mesh.with_dp_only() ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0, 3})
                check_mesh(shard, comm, mesh, stage, ref);
            if (mesh.with_dp_only()) check_recomputation(shard, comm, mesh, ref);
            if (mesh.with_dp_only()) check_llama_step(shard, comm, mesh);
        }
    });
}
