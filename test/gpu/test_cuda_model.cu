// GPU tests of the CUDA model against the fp32 CPU reference (make test-gpu). Skipped, with a
// message and exit status 0, where no CUDA device is present (exit 3 in a GPU session,
// LLMC_GPU_SESSION=1: llmc::no_gpu_exit_status).
//
// Both models get the same weights: the random init rounded to bf16, which the CUDA model's bf16
// copy holds exactly, so what differs is only bf16 activations and summation order. Comparisons
// use relative error per tensor, ||a - b|| / ||b||, +inf when `a` holds a NaN or an inf.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "llmc/models/cpu_model.h"
#include "llmc/models/cuda_model.cuh"
#include "test/catch_session.h"
#include "test/gpu/shape_only_comm.h"
#include "test/rel_error.h"

using namespace llmc;

namespace {

// Two layers, 64-wide heads (GPT-2's head size), a vocabulary padded from 500 to 512.
ModelConfig test_config() {
    ModelConfig c;
    c.num_layers = 2;
    c.channels = 128;
    c.num_heads = 2;
    c.max_seq_len = 64;
    c.vocab_size = 500;
    c.padded_vocab_size = 512;
    return c;
}

// The family's random init (family.h), rounded to bf16.
std::vector<float> bf16_exact_init(const ModelConfig& c, uint64_t seed) {
    std::vector<float> full(num_params(c));
    init_model_params(c, full.data(), seed);
    for (float& x : full) x = __bfloat162float(__float2bfloat16_rn(x));
    return full;
}

struct Batch {
    std::vector<int> inputs, targets;
};
Batch random_batch(const ModelConfig& c, int B, int T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> token(0, c.vocab_size - 1);
    Batch b{std::vector<int>(B * T), std::vector<int>(B * T)};
    for (int i = 0; i < B * T; i++) {
        b.inputs[i] = token(rng);
        b.targets[i] = token(rng);
    }
    return b;
}

CUDAModelOptions options(Recompute r, int chunk_rows = 8192) {
    CUDAModelOptions o;
    o.recompute = r;
    o.classifier_chunk_rows = chunk_rows;
    return o;
}

std::vector<float> grads_of(CUDAModel& m) {
    std::vector<float> g(m.num_params());
    m.get_grads(g.data());
    return g;
}
std::vector<float> master_of(CUDAModel& m) {
    std::vector<float> p(m.num_params());
    m.get_master_weights(p.data());
    return p;
}

// The evaluation loss, every position's loss (evaluate_rows, what HellaSwag scores from) and the
// next-token logits of the same weights on the two models, within 1e-2.
void check_evaluation_matches(CUDAModel& gpu, CPUModel& cpu, const ModelConfig& c, const Batch& batch, int B, int T) {
    CHECK(rel_error(gpu.evaluate(batch.inputs.data(), batch.targets.data(), B, T),
                    cpu.evaluate(batch.inputs.data(), batch.targets.data(), B, T)) <= 1e-2);
    std::vector<float> gpu_rows((size_t)B * T), cpu_rows((size_t)B * T);
    gpu.evaluate_rows(batch.inputs.data(), batch.targets.data(), B, T, gpu_rows.data());
    cpu.evaluate_rows(batch.inputs.data(), batch.targets.data(), B, T, cpu_rows.data());
    CHECK(rel_error(gpu_rows.data(), cpu_rows.data(), B * T) <= 1e-2);
    std::vector<float> gpu_logits(c.padded_vocab_size), cpu_logits(c.padded_vocab_size);
    gpu.next_token_logits(batch.inputs.data(), T, gpu_logits.data());
    cpu.next_token_logits(batch.inputs.data(), T, cpu_logits.data());
    CHECK(rel_error(gpu_logits.data(), cpu_logits.data(), c.vocab_size) <= 1e-2);
}

// One training step's loss and gradients at each recomputation setting, the model options for -r r
// made by options_of(r).
template <typename OptionsOf>
void step_per_recompute(const ModelConfig& c, const std::vector<float>& weights, const Batch& batch, int B, int T,
                        OptionsOf options_of, float losses[4], std::vector<float> grads[4]) {
    for (int r = 0; r <= 3; r++) {
        CUDAModel gpu(c, B, T, options_of((Recompute)r));
        gpu.set_master_weights(weights.data());
        gpu.zero_grad();
        losses[r] = gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        grads[r] = grads_of(gpu);
    }
}

// What the memory plan of these options says a one-rank model allocates, kind by kind, is what `gpu`
// (made with them) allocated.
void check_plan_equals_allocation(const ModelConfig& c, int B, int T, const CUDAModelOptions& o, const CUDAModel& gpu) {
    size_t planned[(int)MemoryKind::Count] = {};
    for (const BufferSpec& s : CUDAModel::memory_specs(c, B, T, o, CUDAModel::zero_plan(c, 0, 0, 1)))
        planned[(int)s.kind] += s.bytes();
    for (int k = 0; k < (int)MemoryKind::Count; k++) {
        INFO("recompute " << (int)o.recompute << ", " << memory_kind_name((MemoryKind)k));
        CHECK(planned[k] == gpu.allocated_bytes((MemoryKind)k));
    }
}

// One training step of either family on both models from the same weights: the loss within 1e-2,
// every gradient tensor within 5e-2, at (4, 64) (whole attention tiles) and (3, 37) (ragged ones),
// with 50-row classifier chunks (several, ragged); with `evaluation`, check_evaluation_matches too.
void check_step_matches_cpu(const ModelConfig& c, const std::vector<float>& weights, bool evaluation) {
    const ParamLayout layout = model_layout(c);
    for (auto [B, T] : {std::pair{4, 64}, std::pair{3, 37}}) {
        const Batch batch = random_batch(c, B, T, 7 + B);
        CPUModel cpu(c, B, T);
        std::copy(weights.begin(), weights.end(), cpu.params());
        cpu.zero_grad();
        const float cpu_loss = cpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);

        CUDAModel gpu(c, B, T, options(Recompute::None, 50));
        gpu.set_master_weights(weights.data());
        gpu.zero_grad();
        const float gpu_loss = gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        INFO("B " << B << " T " << T << ": loss gpu " << gpu_loss << " cpu " << cpu_loss);
        CHECK(rel_error(gpu_loss, cpu_loss) <= 1e-2);

        const std::vector<float> g = grads_of(gpu);
        for (const ParamLayout::Segment& s : layout.segments()) {
            const double err = rel_error(g.data() + s.begin, cpu.grads() + s.begin, s.end - s.begin);
            INFO("gradient of " << layout.name(s.tensor) << " layer " << s.layer << ": rel. error " << err);
            CHECK(err <= 5e-2);
        }
        if (evaluation) check_evaluation_matches(gpu, cpu, c, batch, B, T);
    }
}

// 10 AdamW steps (grad clipping at 1) of both models from the same weights (init seed 3) on two
// batches, alternating, so the loss must fall: every loss within 2e-2.
void check_adamw_steps_track_cpu(const ModelConfig& c) {
    const std::vector<float> weights = bf16_exact_init(c, 3);
    const int B = 4, T = 64;
    CPUModel cpu(c, B, T);
    std::copy(weights.begin(), weights.end(), cpu.params());
    CUDAModel gpu(c, B, T);
    gpu.set_master_weights(weights.data());
    AdamWConfig opt;
    opt.lr = 1e-3f;
    opt.weight_decay = 0.1f;
    for (int step = 1; step <= 10; step++) {
        const Batch batch = random_batch(c, B, T, 100 + step % 2);
        float losses[2];
        Model* models[2] = {&gpu, &cpu};
        for (int i = 0; i < 2; i++) {
            models[i]->zero_grad();
            losses[i] = models[i]->forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
            const double norm = std::sqrt(models[i]->grad_norm_squared());
            models[i]->adamw_step(opt, step, norm > 1.0 ? (float)(1.0 / norm) : 1.0f);
        }
        INFO("step " << step << ": loss gpu " << losses[0] << " cpu " << losses[1]);
        CHECK(rel_error(losses[0], losses[1]) <= 2e-2);
    }
}

}  // namespace

TEST_CASE("one training step matches the CPU reference: loss within 1e-2, every gradient tensor within 5e-2") {
    const ModelConfig c = test_config();
    check_step_matches_cpu(c, bf16_exact_init(c, 42), false);
}

TEST_CASE("with the wgmma attention kernels (head size 64, with or without the TMA-fed forward), a training step "
          "matches the CPU reference as mma.sync's does") {
    const ModelConfig c = test_config();  // 2 heads of 64
    const std::vector<float> weights = bf16_exact_init(c, 42);
    const ParamLayout layout = GPT2Params::layout(c);
    struct Restore {
        ~Restore() { set_attention_kernels(AttentionKernels::MmaSync); }
    } restore;
    const AttentionKernels settings[] = {AttentionKernels::MmaSync, AttentionKernels::Wgmma, AttentionKernels::Tma};
    // T 64 and 37: a sequence shorter than one tile of queries or keys, so a TMA box of 128 rows
    // reaches into the next sequence's rows (and, for the last, past the matrix)
    for (auto [B, T] : {std::pair{4, 64}, std::pair{3, 37}}) {
        const Batch batch = random_batch(c, B, T, 7 + B);
        CPUModel cpu(c, B, T);
        std::copy(weights.begin(), weights.end(), cpu.params());
        cpu.zero_grad();
        const float cpu_loss = cpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        std::vector<float> grads[3];
        for (int k = 0; k < 3; k++) {
            set_attention_kernels(settings[k]);
            // the emulator is an H100
            CHECK(attention_detail::attention_on_wgmma(c.channels / c.num_heads) == (k > 0));
            CUDAModel gpu(c, B, T, options(Recompute::None, 50));
            gpu.set_master_weights(weights.data());
            gpu.zero_grad();
            const float loss = gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
            INFO("B " << B << " T " << T << " " << attention_kernels_name(settings[k]) << ": loss gpu " << loss
                      << " cpu " << cpu_loss);
            CHECK(rel_error(loss, cpu_loss) <= 1e-2);
            grads[k] = grads_of(gpu);
            for (const ParamLayout::Segment& s : layout.segments()) {
                const double err = rel_error(grads[k].data() + s.begin, cpu.grads() + s.begin, s.end - s.begin);
                INFO("gradient of " << layout.name(s.tensor) << " layer " << s.layer << ": rel. error " << err);
                CHECK(err <= 5e-2);
            }
        }
        // the wgmma kernels may round differently from mma.sync's (tiles of 128 keys, not 64); the
        // TMA-fed kernels run the same arithmetic as the wgmma ones, on the same tiles: the same bits
        CHECK(rel_error(grads[1].data(), grads[0].data(), grads[0].size()) <= 1e-2);
        CHECK(grads[2] == grads[1]);
    }
}

TEST_CASE("evaluation loss and next-token logits match the CPU reference within 1e-2") {
    const ModelConfig c = test_config();
    const std::vector<float> weights = bf16_exact_init(c, 5);
    const int B = 2, T = 40;
    const Batch batch = random_batch(c, B, T, 11);
    CPUModel cpu(c, B, T);
    std::copy(weights.begin(), weights.end(), cpu.params());
    CUDAModel gpu(c, B, T);
    gpu.set_master_weights(weights.data());
    check_evaluation_matches(gpu, cpu, c, batch, B, T);
}

TEST_CASE("10 AdamW steps track the CPU reference: every loss within 2e-2") {
    check_adamw_steps_track_cpu(test_config());
}

// The loss-tracking test above cannot see a wrong weight decay or bias correction (their effect on
// the loss is far below its tolerance); this one compares the updates themselves. adamw.cuh spells
// out the CPU's IEEE operations, so they should agree bit for bit; 1e-5 leaves room for an ulp.
TEST_CASE("adamw_step updates the master weights as the CPU AdamW on the same gradients, tensor by tensor") {
    const ModelConfig c = test_config();
    const ParamLayout layout = GPT2Params::layout(c);
    const size_t n = layout.num_params;
    const int B = 2, T = 32;
    CUDAModel gpu(c, B, T);
    gpu.set_master_weights(bf16_exact_init(c, 17).data());
    std::vector<float> cpu_master = master_of(gpu), m(n, 0.0f), v(n, 0.0f);
    AdamWConfig opt;
    opt.lr = 1e-3f;
    opt.weight_decay = 0.1f;
    for (int step = 1; step <= 2; step++) {
        // AdamW is scale invariant under a constant multiplier; a changing one shows in m and v
        const float multiplier = step == 1 ? 0.25f : 1.0f;
        const Batch batch = random_batch(c, B, T, 30 + step);
        gpu.zero_grad();
        gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        const std::vector<float> g = grads_of(gpu), before = master_of(gpu);
        double squares = 0.0;
        for (float x : g) squares += (double)x * x;
        CHECK(rel_error(gpu.grad_norm_squared(), squares) <= 1e-5);
        gpu.adamw_step(opt, step, multiplier);
        adamw_update(layout, cpu_master.data(), g.data(), m.data(), v.data(), 0, n, opt, step, multiplier);
        const std::vector<float> after = master_of(gpu);
        for (const ParamLayout::Segment& s : layout.segments()) {
            std::vector<float> gpu_delta(s.end - s.begin), cpu_delta(s.end - s.begin);
            for (size_t i = s.begin; i < s.end; i++) {
                gpu_delta[i - s.begin] = after[i] - before[i];
                cpu_delta[i - s.begin] = cpu_master[i] - before[i];
            }
            const double err = rel_error(gpu_delta.data(), cpu_delta.data(), gpu_delta.size());
            INFO("step " << step << ", update of " << layout.name(s.tensor) << " layer " << s.layer
                         << ": rel. error " << err);
            CHECK(err <= 1e-5);
        }
        cpu_master = after;  // the next step starts where the GPU is, so a mismatch is reported once
    }
}

TEST_CASE("two runs with the same seed give bitwise identical losses and weights") {
    const ModelConfig c = test_config();
    const int B = 4, T = 64;
    std::vector<float> losses[2], weights[2];
    for (int run = 0; run < 2; run++) {
        CUDAModel gpu(c, B, T, options(Recompute::None, 100));
        gpu.init_random(1337);
        AdamWConfig opt;
        opt.lr = 1e-3f;
        for (int step = 1; step <= 3; step++) {
            const Batch batch = random_batch(c, B, T, step);
            gpu.zero_grad();
            losses[run].push_back(gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true));
            (void)gpu.grad_norm_squared();
            gpu.adamw_step(opt, step, 1.0f);
        }
        weights[run] = master_of(gpu);
    }
    CHECK(losses[0] == losses[1]);
    CHECK(weights[0] == weights[1]);
}

TEST_CASE("recomputation 1-3 gives gradients bitwise equal to each other, and within 1e-2 of none") {
    const ModelConfig c = test_config();
    const std::vector<float> weights = bf16_exact_init(c, 9);
    const int B = 2, T = 50;
    const Batch batch = random_batch(c, B, T, 13);
    std::vector<float> grads[4];
    float losses[4];
    step_per_recompute(c, weights, batch, B, T, [](Recompute r) { return options(r); }, losses, grads);
    CHECK(losses[1] == losses[2]);
    CHECK(losses[1] == losses[3]);
    CHECK(grads[1] == grads[2]);
    CHECK(grads[1] == grads[3]);
    CHECK(rel_error(losses[1], losses[0]) <= 1e-2);
    CHECK(rel_error(grads[1].data(), grads[0].data(), grads[0].size()) <= 1e-2);
}

TEST_CASE("phase timing names every matrix product forward and backward (bench_train_step --profile)") {
    const ModelConfig c = test_config();
    const std::vector<float> weights = bf16_exact_init(c, 9);
    const int B = 2, T = 32;
    const Batch batch = random_batch(c, B, T, 13);
    for (bool fp8 : {false, true})
    for (Recompute r : {Recompute::None, Recompute::Block}) {
        CUDAModelOptions o = options(r);
        o.fp8 = {fp8, Fp8Scaling::Current, 4};
        CUDAModel gpu(c, B, T, o);
        gpu.set_master_weights(weights.data());
        gpu.zero_grad();
        gpu.enable_phase_timing(true);
        gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        std::map<std::string, double> phases;
        gpu.collect_phase_ms(phases);
        INFO("recompute " << (int)r << ", fp8 " << fp8);
        // FP8's casts count apart from their products (a phase inside another is taken out of it)
        CHECK(phases.count("fp8 amax") == (size_t)fp8);  // current scaling measures each input
        CHECK(phases.count("fp8 cast") == (size_t)fp8);
        for (const char* product : {"qkv", "attproj", "fc", "fcproj", "lm head"})
            for (const char* pass : {"", " backward"}) {
                const std::string name = std::string("matmul ") + product + pass;
                INFO(name);
                CHECK(phases.count(name) == 1);
            }
        CHECK(phases.count("matmul") == 0);  // no product left under the old, undivided name
        for (const char* kind : {"encoder", "layernorm", "attention", "classifier"}) CHECK(phases.count(kind) == 1);
        for (auto& [name, ms] : phases) CHECK(ms >= -1e-3);  // a phase's own time (the events' resolution aside)
    }
}

TEST_CASE("gradient accumulation: two half-scaled micro-batches equal the sum of their gradients") {
    const ModelConfig c = test_config();
    const std::vector<float> weights = bf16_exact_init(c, 21);
    const int B = 2, T = 32;
    const Batch a = random_batch(c, B, T, 1), b = random_batch(c, B, T, 2);
    CUDAModel gpu(c, B, T);
    gpu.set_master_weights(weights.data());
    gpu.zero_grad();
    gpu.forward_backward(a.inputs.data(), a.targets.data(), B, T, 0.5f, false);
    const std::vector<float> only_a = grads_of(gpu);
    gpu.forward_backward(b.inputs.data(), b.targets.data(), B, T, 0.5f, true);
    const std::vector<float> both = grads_of(gpu);
    gpu.zero_grad();
    gpu.forward_backward(b.inputs.data(), b.targets.data(), B, T, 0.5f, true);
    const std::vector<float> only_b = grads_of(gpu);
    std::vector<float> sum(both.size());
    for (size_t i = 0; i < sum.size(); i++) sum[i] = only_a[i] + only_b[i];
    CHECK(rel_error(both.data(), sum.data(), sum.size()) <= 1e-6);
}

TEST_CASE("save then load round-trips the model file exactly") {
    const ModelConfig c = test_config();
    const int B = 2, T = 16;
    const std::string dir = "build/test_gpu_tmp";
    make_dirs(dir);
    CUDAModel gpu(c, B, T);
    gpu.init_random(77);
    const Batch batch = random_batch(c, B, T, 3);
    gpu.zero_grad();
    gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
    AdamWConfig opt;
    gpu.adamw_step(opt, 1, 1.0f);  // master weights no longer bf16-exact
    gpu.save(dir + "/a.bin");
    CUDAModel loaded(c, B, T);
    loaded.load(dir + "/a.bin");
    CHECK(master_of(loaded) == master_of(gpu));
    loaded.save(dir + "/b.bin");
    File fa(dir + "/a.bin", "rb"), fb(dir + "/b.bin", "rb");
    std::vector<char> bytes_a(fa.size()), bytes_b(fb.size());
    fa.read(bytes_a.data(), bytes_a.size(), "model file");
    fb.read(bytes_b.data(), bytes_b.size(), "model file");
    CHECK(bytes_a == bytes_b);
}

TEST_CASE("the memory plan equals what the model allocates, for every recomputation setting") {
    const ModelConfig c = test_config();
    for (int r = 0; r <= 3; r++) {
        const CUDAModelOptions o = options((Recompute)r);
        check_plan_equals_allocation(c, 4, 64, o, CUDAModel(c, 4, 64, o));
    }
    // each setting keeps less than the one before
    size_t previous = SIZE_MAX;
    for (int r = 0; r <= 3; r++) {
        const size_t bytes = CudaActivationLayout::bytes_for(c, 4, 64, options((Recompute)r));
        CHECK(bytes < previous);
        previous = bytes;
    }
}

TEST_CASE("bad batches are refused with a message naming the value") {
    const ModelConfig c = test_config();
    CUDAModel gpu(c, 2, 16);
    const Batch batch = random_batch(c, 3, 16, 1);
    CHECK_THROWS_WITH(gpu.forward_backward(batch.inputs.data(), batch.targets.data(), 3, 16, 1.0f, true),
                      Catch::Contains("B = 3 is not in [1, 2]"));
    std::vector<int> bad(32, 0);
    bad[5] = c.vocab_size;
    CHECK_THROWS_WITH(gpu.evaluate(bad.data(), bad.data(), 2, 16), Catch::Contains("inputs[5] = 500"));
}

// Catch2's implementation is linked in from test/catch_impl.cpp (compiled once, by g++).
// ---- FP8 (--fp8 1): the CUDA model's FP8 products against the CPU model's simulation ----

namespace {

CUDAModelOptions fp8_options(Recompute r, Fp8Scaling scaling = Fp8Scaling::Current) {
    CUDAModelOptions o = options(r);
    o.fp8 = {true, scaling, 4};
    return o;
}

// One training step of the CPU model from `weights`, FP8 simulated or not; its gradients.
std::vector<float> cpu_step_grads(const ModelConfig& c, const std::vector<float>& weights, const Batch& batch, int B,
                                  int T, bool fp8, float* loss) {
    CPUModel cpu(c, B, T);
    cpu.set_fp8_options({fp8, Fp8Scaling::Current, 4});
    std::copy(weights.begin(), weights.end(), cpu.params());
    cpu.zero_grad();
    *loss = cpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
    return std::vector<float>(cpu.grads(), cpu.grads() + num_params(c));
}

// One training step of either family with FP8 products from `weights`: the GPU's gradients nearer
// the CPU model's FP8 simulation than its fp32 ones, and its products quantized (every element of
// the four products' operands counted, once).
void check_fp8_step_nearer_simulation(const ModelConfig& c, const std::vector<float>& weights) {
    const ParamLayout layout = model_layout(c);
    const BlockWidths w(c);
    const Fp8BlockWeights fp8_weights(c);
    const int B = 4, T = 64;
    const Batch batch = random_batch(c, B, T, 11);
    float cpu_fp8_loss = 0, cpu_loss = 0;
    const std::vector<float> cpu_fp8 = cpu_step_grads(c, weights, batch, B, T, true, &cpu_fp8_loss);
    const std::vector<float> cpu_fp32 = cpu_step_grads(c, weights, batch, B, T, false, &cpu_loss);
    std::vector<float> grads[2];
    float losses[2];
    for (int fp8 = 0; fp8 <= 1; fp8++) {
        CUDAModel gpu(c, B, T, fp8 ? fp8_options(Recompute::None) : options(Recompute::None));
        gpu.set_master_weights(weights.data());
        gpu.zero_grad();
        losses[fp8] = gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        grads[fp8] = grads_of(gpu);
        if (!fp8) continue;
        const Fp8Stats stats = gpu.take_fp8_stats();
        CHECK(stats.counts[FP8_FC][FP8_GRAD].elements == (uint64_t)c.num_layers * B * T * w.up);
        CHECK(stats.counts[FP8_FCPROJ][FP8_INPUT].elements == (uint64_t)c.num_layers * B * T * w.hidden);
        CHECK(stats.counts[FP8_QKV][FP8_WEIGHT].elements == (uint64_t)c.num_layers * w.qkv * c.channels);
        // current scaling measures each operand as cast: nothing overflows (an amax taken from other
        // values than the cast's, e.g. a Llama's qkv gradient before its reduction, would clip)
        CHECK(stats.total().overflows == 0);
        CHECK(gpu.take_fp8_stats().total().elements == 0);
    }
    CHECK(rel_error(losses[1], cpu_fp8_loss) <= 1e-2);
    // The GPU quantizes its bf16 activations and gradients, which differ from the CPU model's fp32
    // ones by the bf16 roundings of every layer above (the bf16 test's 5e-2); an element that near
    // an E4M3 or E5M2 rounding boundary takes the neighbouring code, a step of 1/8 or 1/4. So the two
    // models' FP8 gradients differ by several percent, more than their bf16 ones (each tensor within
    // 0.15), but the GPU's stay nearer the FP8 simulation than fp32, and far from its own bf16 ones.
    double to_fp8 = 0, to_fp32 = 0, to_bf16 = 0;  // over the FP8 products' weight gradients
    for (const ParamLayout::Segment& s : layout.segments()) {
        const float* g = grads[1].data() + s.begin;
        const size_t n = s.end - s.begin;
        const double err = rel_error(g, cpu_fp8.data() + s.begin, n);
        INFO("gradient of " << layout.name(s.tensor) << " layer " << s.layer << ": rel. error " << err);
        CHECK(err <= 0.15);
        if (std::find(std::begin(fp8_weights.tensor), std::end(fp8_weights.tensor), s.tensor) ==
            std::end(fp8_weights.tensor))
            continue;
        to_fp8 += err;
        to_fp32 += rel_error(g, cpu_fp32.data() + s.begin, n);
        to_bf16 += rel_error(g, grads[0].data() + s.begin, n);
    }
    INFO("FP8 weight gradients, summed rel. error: " << to_fp8 << " to the FP8 simulation, " << to_fp32
         << " to fp32, " << to_bf16 << " to the bf16 model");
    CHECK(to_fp8 < to_fp32);
    CHECK(to_bf16 > 0.5 * to_fp32);  // the products are quantized, not run in bf16
}

// One FP8 step of either family at recomputation r with the amax measured by the kernels that write
// the operands, and with every cast measuring its own: bitwise the same gradients, with 12 amax
// passes a layer without the fused ones, `fused_passes` with them.
void check_fused_amax_as_measured(const ModelConfig& c, Recompute r, int fused_passes) {
    const std::vector<float> weights = bf16_exact_init(c, 5);
    const int B = 2, T = 32;
    const Batch batch = random_batch(c, B, T, 3);
    std::vector<float> grads[2];
    uint64_t passes[2];
    for (bool fused : {false, true}) {
        CUDAModel gpu(c, B, T, fp8_options(r));
        gpu.set_fp8_fused_amax(fused);
        gpu.set_master_weights(weights.data());
        gpu.zero_grad();
        gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        grads[fused] = grads_of(gpu);
        passes[fused] = gpu.fp8_amax_passes();
    }
    INFO("recompute " << (int)r);
    CHECK(grads[1] == grads[0]);
    CHECK(passes[0] == (uint64_t)12 * c.num_layers);
    CHECK(passes[1] == (uint64_t)fused_passes * c.num_layers);
}

// Rank 0 of 3 at ZeRO-3 with FP8 products, the weights' codes gathered or not: what the memory plan
// says, kind by kind, is what the model allocates.
void check_fp8_zero3_plan_equals_allocation(const ModelConfig& c, bool gather) {
    ShapeOnlyComm three(3);  // the model issues no collective before its first pass
    DataParallel dp;
    dp.comm = &three, dp.host = &three, dp.zero_stage = 3;
    CUDAModelOptions o;
    o.fp8 = {true, Fp8Scaling::Current, 4, gather};
    size_t planned[(int)MemoryKind::Count] = {};
    for (const BufferSpec& s : CUDAModel::memory_specs(c, 2, 64, o, CUDAModel::zero_plan(c, 3, 0, 3)))
        planned[(int)s.kind] += s.bytes();
    const CUDAModel gpu(c, 2, 64, o, dp);
    for (int k = 0; k < (int)MemoryKind::Count; k++) {
        INFO("ZeRO-3, rank 0 of 3, --fp8-gather " << gather << ": " << memory_kind_name((MemoryKind)k));
        CHECK(planned[k] == gpu.allocated_bytes((MemoryKind)k));
    }
}

}  // namespace

TEST_CASE("FP8: one training step is nearer the CPU model's FP8 simulation than fp32, and its products quantized") {
    const ModelConfig c = test_config();
    check_fp8_step_nearer_simulation(c, bf16_exact_init(c, 42));
}

TEST_CASE("weight gradients split along k: within 1e-5 of whole ones, not their bits, and the same bits every run") {
    const ModelConfig c = test_config();
    const std::vector<float> weights = bf16_exact_init(c, 5);
    const ParamLayout layout = GPT2Params::layout(c);
    const int B = 4, T = 64;  // k = 256 rows: 3 slices of 96, 96 and 64 (FP8's multiples of 16)
    const Batch batch = random_batch(c, B, T, 17);
    for (bool fp8 : {false, true}) {
        auto step = [&](int split_k) {
            CUDAModelOptions o = fp8 ? fp8_options(Recompute::None) : options(Recompute::None);
            o.split_k = split_k;
            CUDAModel gpu(c, B, T, o);
            gpu.set_master_weights(weights.data());
            gpu.zero_grad();
            (void)gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
            return grads_of(gpu);
        };
        const std::vector<float> whole = step(1), split = step(3);
        INFO((fp8 ? "FP8" : "bf16") << " products");
        // Only the order of the sums differs (each slice's, then the slices'): every tensor within 1e-5
        // for bf16 products, and the weight gradients' bits differ somewhere (the split ran). FP8
        // products on Hopper's tensor cores accumulate in less than fp32 (an H200, 2026-11-28: split
        // against whole 0.9e-4 to 1.4e-4 in every weight gradient; the emulator's sums are exact fp32),
        // so FP8's are held to 1e-3, still far under what a lost or doubled slice gives (~0.3).
        const double limit = fp8 ? 1e-3 : 1e-5;
        for (const ParamLayout::Segment& s : layout.segments()) {
            const double err = rel_error(split.data() + s.begin, whole.data() + s.begin, s.end - s.begin);
            INFO("gradient of " << layout.name(s.tensor) << " layer " << s.layer << ": rel. error " << err);
            CHECK(err <= limit);
        }
        CHECK(split != whole);
        CHECK(step(3) == split);
    }
}

TEST_CASE("FP8: recomputation 1-3 give bitwise equal gradients, and the memory plan equals the allocation") {
    const ModelConfig c = test_config();
    const std::vector<float> weights = bf16_exact_init(c, 9);
    const int B = 2, T = 64;
    const Batch batch = random_batch(c, B, T, 13);
    auto delayed = [](Recompute r) { return fp8_options(r, Fp8Scaling::Delayed); };
    std::vector<float> grads[4];
    float losses[4];
    step_per_recompute(c, weights, batch, B, T, delayed, losses, grads);
    CHECK(grads[1] == grads[2]);
    CHECK(grads[1] == grads[3]);
    // -r 0 fuses GELU into the fc product's epilogue, -r 1-3 run the GELU kernel: bf16 values that
    // differ in their last bit, a few of which then take another FP8 code (5.7e-2 emulated).
    CHECK(rel_error(grads[1].data(), grads[0].data(), grads[0].size()) <= 0.1);
    for (int r = 0; r <= 3; r++) {
        CUDAModel gpu(c, B, T, delayed((Recompute)r));
        check_plan_equals_allocation(c, B, T, delayed((Recompute)r), gpu);
        gpu.set_master_weights(weights.data());
        gpu.zero_grad();
        gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        // a whole-block recomputation casts again without counting
        CHECK(gpu.take_fp8_stats().counts[FP8_QKV][FP8_INPUT].elements == (uint64_t)c.num_layers * B * T * c.channels);
    }
}

TEST_CASE("FP8: amax measured by the kernels that write the operands gives the step its own passes give") {
    // The kernels that write the products' operands measure them as they write: LayerNorm (the qkv
    // and fc inputs; backward, the residual gradients, the projections' output gradients),
    // attention (the attention projection's input; backward, the qkv gradient), GELU (the fc
    // projection's input, -r 1-3) and GELU's backward (the fc gradient). The same scales, so the same
    // codes and bitwise the same gradients, with 8 passes a layer fewer of the 12 current scaling
    // makes in a step (4 inputs, 4 gradients, 4 weights, which are measured once a step); 7 at -r 0,
    // where GELU is cuBLASLt's epilogue, which cannot measure.
    const ModelConfig c = test_config();
    for (Recompute r : {Recompute::None, Recompute::Gelu, Recompute::Block})
        check_fused_amax_as_measured(c, r, r == Recompute::None ? 5 : 4);
}

TEST_CASE("FP8: the weights are cast once a step, and recast whenever the parameters change") {
    const ModelConfig c = test_config();
    const int B = 2, T = 64;
    const uint64_t per_step = (uint64_t)c.num_layers * FP8_PRODUCTS;  // each block's four weights
    const Batch batch = random_batch(c, B, T, 17);
    // Whole-block recomputation: each weight is used by 2 micro-batches' forward, recomputation and
    // backward, and by an evaluation; cast at each use it would be 6 times a step.
    CUDAModel gpu(c, B, T, fp8_options(Recompute::Block));
    gpu.set_master_weights(bf16_exact_init(c, 3).data());
    for (int step = 1; step <= 2; step++) {
        gpu.zero_grad();
        for (int mb = 0; mb < 2; mb++) gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 0.5f, mb == 1);
        gpu.evaluate(batch.inputs.data(), batch.targets.data(), B, T);
        CHECK(gpu.fp8_weight_casts() == step * per_step);
        gpu.adamw_step(AdamWConfig{}, step, 1.0f);
    }
    gpu.evaluate(batch.inputs.data(), batch.targets.data(), B, T);  // casts the updated weights
    CHECK(gpu.fp8_weight_casts() == 3 * per_step);
    // New parameters are cast before their first use: the gradients are a fresh model's, bit for bit.
    const std::vector<float> weights = bf16_exact_init(c, 4);
    gpu.set_master_weights(weights.data());
    gpu.zero_grad();
    gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
    CHECK(gpu.fp8_weight_casts() == 4 * per_step);
    CUDAModel fresh(c, B, T, fp8_options(Recompute::Block));
    fresh.set_master_weights(weights.data());
    fresh.zero_grad();
    fresh.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
    CHECK(grads_of(gpu) == grads_of(fresh));
}

TEST_CASE("FP8 at ZeRO-3: the memory plan of rank 0 of 3 equals what it allocates, its weights' codes gathered or not") {
    ModelConfig c = model_preset("d4");  // 4 layers of C 256
    c.vocab_size = 512, c.padded_vocab_size = 512;
    for (bool gather : {true, false}) check_fp8_zero3_plan_equals_allocation(c, gather);
}

TEST_CASE("FP8: delayed scaling's state is the CPU model's, and a model given it continues the same way") {
    const ModelConfig c = test_config();
    const std::vector<float> weights = bf16_exact_init(c, 5);
    const int B = 2, T = 64;
    CUDAModel gpu(c, B, T, fp8_options(Recompute::None, Fp8Scaling::Delayed));
    gpu.set_master_weights(weights.data());
    CPUModel cpu(c, B, T);
    cpu.set_fp8_options({true, Fp8Scaling::Delayed, 4});
    std::copy(weights.begin(), weights.end(), cpu.params());
    for (int step = 1; step <= 3; step++) {
        const Batch batch = random_batch(c, B, T, 100 + step);
        for (Model* m : {(Model*)&gpu, (Model*)&cpu}) {
            m->zero_grad();
            m->forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
            m->adamw_step(AdamWConfig{}, step, 1.0f);
        }
    }
    const auto gpu_state = gpu.sharded_state().replicated_state()->named_values();
    const auto cpu_state = cpu.sharded_state().replicated_state()->named_values();
    REQUIRE(gpu_state.size() == 1);
    REQUIRE(cpu_state.size() == 1);
    CHECK(gpu_state[0].first == "fp8_scaling");
    const std::vector<float>& gs = gpu_state[0].second;
    const std::vector<float>& cs = cpu_state[0].second;
    REQUIRE(gs.size() == cs.size());
    // Same layout; the scales agree but for the few a bf16-rounded amax puts across a power of two.
    size_t scales = 0, agree = 0;
    for (size_t i = 0; i < gs.size(); i += 3 + 4) {
        scales++;
        agree += gs[i] == cs[i];
        CHECK(gs[i + 1] == 1.0f);   // primed
        CHECK(gs[i + 2] == 3.0f);   // three steps of history
    }
    CHECK(agree >= scales * 9 / 10);
    // A fresh model given the state continues exactly as the one it came from.
    CUDAModel restored(c, B, T, fp8_options(Recompute::None, Fp8Scaling::Delayed));
    restored.sharded_state().replicated_state()->restore("fp8_scaling", gs, "test");
    CHECK(restored.sharded_state().replicated_state()->named_values()[0].second == gs);
    std::vector<float> now(gpu.num_params());
    gpu.get_master_weights(now.data());
    gpu.set_master_weights(now.data());  // both bf16 copies rounded to nearest (AdamW rounds stochastically)
    restored.set_master_weights(now.data());
    const Batch next = random_batch(c, B, T, 200);
    float losses[2];
    std::vector<float> grads[2];
    CUDAModel* models[2] = {&gpu, &restored};
    for (int i = 0; i < 2; i++) {
        models[i]->zero_grad();
        losses[i] = models[i]->forward_backward(next.inputs.data(), next.targets.data(), B, T, 1.0f, true);
        grads[i] = grads_of(*models[i]);
    }
    CHECK(losses[0] == losses[1]);
    CHECK(grads[0] == grads[1]);
}

int main(int argc, char** argv) {
    std::string why;
    if (!cuda_device_present(&why)) return no_gpu_exit_status("test_cuda_model", why);
    return run_catch_session(argc, argv);
}

// ---- mixture of experts (kernels/moe.cuh) ----

namespace {

// test_config's two layers with 4 experts: top 2 in both blocks, dropless; or top 1 in the second
// block only, beside the shared expert, with a capacity that drops.
struct MoeCase {
    const char* name;
    int top_k, every, shared;
    float capacity_factor;
};
const MoeCase MOE_CASES[] = {{"4 experts, top 2, every block, dropless", 2, 1, 0, 0.0f},
                             {"4 experts, top 1, second block, shared expert, capacity 0.75", 1, 2, 1, 0.75f}};
ModelConfig moe_config(const MoeCase& m) {
    ModelConfig c = test_config();
    c.num_experts = 4, c.moe_top_k = m.top_k, c.moe_every = m.every, c.moe_shared = m.shared;
    return c;
}
CUDAModelOptions moe_options(const MoeCase& m, Recompute r = Recompute::None) {
    CUDAModelOptions o = options(r);
    o.moe = {m.capacity_factor, 0.05f, 0.01f};  // weights large enough to show in the router's gradient
    return o;
}

}  // namespace

// The routing is compared through its statistics (drops, the busiest expert's share, the losses)
// and the experts' gradients. A token whose two candidate experts' scores differ by less than the
// bf16 rounding of its ln2 row can go to another expert on each model (a near-tie, not a bug): that
// one token then moves every gradient downstream by 5-15%. Of the weight seeds 1-6 and 31, 1 and 31
// have such a token in the first case; seed 3 has none (and the workbench dev/cuda/moe.cu checks
// the routing itself choice by choice on fp32-exact inputs). A GPU's products round differently
// than the emulator's: a failure there with every tensor a little off is that, not a wrong kernel.
TEST_CASE("a mixture-of-experts training step matches the CPU reference: loss, routing, every gradient; and "
          "so do evaluation and next-token logits, which count no routing") {
    const int B = 2, T = 16;
    for (const MoeCase& m : MOE_CASES) {
        const ModelConfig c = moe_config(m);
        const std::vector<float> weights = bf16_exact_init(c, 3);
        const ParamLayout layout = GPT2Params::layout(c);
        const Batch batch = random_batch(c, B, T, 17);
        const CUDAModelOptions o = moe_options(m);
        CPUModel cpu(c, B, T);
        cpu.set_moe_options(o.moe);
        std::copy(weights.begin(), weights.end(), cpu.params());
        cpu.zero_grad();
        const float cpu_loss = cpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        const RouterStats cpu_routing = cpu.take_router_stats();

        CUDAModel gpu(c, B, T, o);
        gpu.set_master_weights(weights.data());
        gpu.zero_grad();
        const float gpu_loss = gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        const RouterStats gpu_routing = gpu.take_router_stats();
        INFO(m.name << ": loss gpu " << gpu_loss << " cpu " << cpu_loss);
        CHECK(rel_error(gpu_loss, cpu_loss) <= 1e-2);
        CHECK(gpu_routing.passes == cpu_routing.passes);
        CHECK(gpu_routing.dropped == cpu_routing.dropped);
        CHECK(gpu_routing.assigned == cpu_routing.assigned);
        CHECK(gpu_routing.max_load == Approx(cpu_routing.max_load).epsilon(1e-6));
        CHECK(rel_error(gpu_routing.balance_loss, cpu_routing.balance_loss) <= 1e-2);
        CHECK(rel_error(gpu_routing.z_loss, cpu_routing.z_loss) <= 1e-2);
        if (m.capacity_factor > 0) CHECK(gpu_routing.dropped > 0);  // the case reaches the drops

        const std::vector<float> g = grads_of(gpu);
        for (const ParamLayout::Segment& s : layout.segments()) {
            const double err = rel_error(g.data() + s.begin, cpu.grads() + s.begin, s.end - s.begin);
            INFO("gradient of " << layout.name(s.tensor) << " layer " << s.layer << ": rel. error " << err);
            CHECK(err <= 5e-2);
        }
        check_evaluation_matches(gpu, cpu, c, batch, B, T);
        CHECK(gpu.take_router_stats().passes == 0);
    }
}

TEST_CASE("a mixture-of-experts model: recomputation 1-3 repeats the gradients bitwise, and the memory plan "
          "equals what it allocates") {
    const int B = 2, T = 16;
    const MoeCase& m = MOE_CASES[1];
    const ModelConfig c = moe_config(m);
    const std::vector<float> weights = bf16_exact_init(c, 33);
    const Batch batch = random_batch(c, B, T, 19);
    std::vector<float> grads[4];
    for (int r = 0; r <= 3; r++) {
        const CUDAModelOptions o = moe_options(m, (Recompute)r);
        CUDAModel gpu(c, B, T, o);
        size_t planned[(int)MemoryKind::Count] = {};
        for (const BufferSpec& s : CUDAModel::memory_specs(c, B, T, o, CUDAModel::zero_plan(c, 0, 0, 1)))
            planned[(int)s.kind] += s.bytes();
        for (int k = 0; k < (int)MemoryKind::Count; k++) {
            INFO("recompute " << r << ", " << memory_kind_name((MemoryKind)k));
            CHECK(planned[k] == gpu.allocated_bytes((MemoryKind)k));
        }
        gpu.set_master_weights(weights.data());
        gpu.zero_grad();
        gpu.forward_backward(batch.inputs.data(), batch.targets.data(), B, T, 1.0f, true);
        grads[r] = grads_of(gpu);
    }
    CHECK(grads[1] == grads[2]);
    CHECK(grads[1] == grads[3]);
    CHECK(rel_error(grads[1].data(), grads[0].data(), grads[0].size()) <= 1e-2);
}

// ---- a Llama on the CUDA model (family.h): RMSNorm, RoPE, grouped kv heads, SwiGLU, an untied head ----

namespace {

// test_config's shape made a Llama: 2 heads of 64 sharing 1 kv head (the GQA expansion runs), a
// SwiGLU 256 wide, RoPE base 10000 (angles that turn a lot in 64 positions).
ModelConfig llama_test_config() {
    ModelConfig c = test_config();
    c.arch = ModelArch::Llama;
    c.kv_heads = 1;
    c.ffn_hidden = 256;
    c.rope_theta = 10000.0f;
    c.validate();
    return c;
}

}  // namespace

TEST_CASE("a Llama: a training step, evaluation and next-token logits match the CPU reference; -r 0-3 give "
          "bitwise equal gradients and allocate what the plan says") {
    const ModelConfig c = llama_test_config();
    const std::vector<float> weights = bf16_exact_init(c, 42);
    check_step_matches_cpu(c, weights, true);
    // SwiGLU is its own kernel at every setting and RMSNorm's recomputation its forward's bits: no
    // setting rounds differently, so all four agree bit for bit.
    const int B = 2, T = 50;
    const Batch batch = random_batch(c, B, T, 13);
    std::vector<float> grads[4];
    float losses[4];
    step_per_recompute(c, weights, batch, B, T, [](Recompute r) { return options(r); }, losses, grads);
    for (int r = 1; r <= 3; r++) {
        INFO("-r " << r);
        CHECK(losses[r] == losses[0]);
        CHECK(grads[r] == grads[0]);
        CUDAModel gpu(c, B, T, options((Recompute)r));
        check_plan_equals_allocation(c, B, T, options((Recompute)r), gpu);
    }
}

TEST_CASE("a Llama with FP8 products: a step nearer the CPU model's FP8 simulation than fp32; -r 0-3 bitwise "
          "equal; the memory plan equals the allocation, at ZeRO-3 with the weights' codes gathered too") {
    const ModelConfig c = llama_test_config();
    const std::vector<float> weights = bf16_exact_init(c, 42);
    check_fp8_step_nearer_simulation(c, weights);
    const int B = 2, T = 64;
    const Batch batch = random_batch(c, B, T, 13);
    auto delayed = [](Recompute r) { return fp8_options(r, Fp8Scaling::Delayed); };
    std::vector<float> grads[4];
    float losses[4];
    step_per_recompute(c, weights, batch, B, T, delayed, losses, grads);
    for (int r = 1; r <= 3; r++) {
        INFO("-r " << r);
        CHECK(grads[r] == grads[0]);  // SwiGLU is its own kernel at every setting
        CUDAModel gpu(c, B, T, delayed((Recompute)r));
        check_plan_equals_allocation(c, B, T, delayed((Recompute)r), gpu);
    }
    check_fp8_zero3_plan_equals_allocation(c, true);
}

TEST_CASE("a Llama with FP8 products: amax measured by the kernels that write the operands gives the step its "
          "own passes give") {
    // RMSNorm (forward: the qkv and MLP inputs; backward: the projections' output gradients),
    // attention (forward: the output projection's input; backward: the qkv gradient, its kv heads
    // summed over their groups and RoPE's backward applied in the kernels' stores) and SwiGLU (the
    // down projection's input) measure as they write; the gate/up gradient (SwiGLU's backward) is
    // measured by its cast: 5 passes a layer of 12 at every -r, and bitwise the same gradients.
    const ModelConfig c = llama_test_config();
    for (Recompute r : {Recompute::None, Recompute::Block}) check_fused_amax_as_measured(c, r, 5);
}

TEST_CASE("a Llama: 10 AdamW steps track the CPU reference: every loss within 2e-2") {
    check_adamw_steps_track_cpu(llama_test_config());
}

TEST_CASE("a Llama model file saved by the CUDA model loads into the CPU model exactly") {
    const ModelConfig c = llama_test_config();
    CUDAModel gpu(c, 2, 32);
    const std::vector<float> weights = bf16_exact_init(c, 5);
    gpu.set_master_weights(weights.data());
    const std::string path = "/tmp/llmc_test_llama_cuda_" + std::to_string(getpid()) + ".bin";
    gpu.save(path);
    CPUModel cpu(c, 2, 32);
    cpu.load(path);
    std::remove(path.c_str());
    CHECK(std::equal(weights.begin(), weights.end(), cpu.params()));
}
