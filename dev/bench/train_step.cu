// dev/bench/train_step.cu: tokens/s and MFU of a CUDA training step, and where its GPU time goes.
// A benchmark, not a test: it prints figures and checks nothing.
//
//   build/bench_train_step -e d12 -t 1024              largest micro-batch that fits, no recompute
//   build/bench_train_step -e d48 -t 1024 -r 3 -b 8    GPT-2 1.5B, whole-block recomputation
//   build/bench_train_step -e d12 --profile            also the per-kernel time shares of one step, and
//                                                      each matrix product's TFLOP/s, forward and backward
//   build/bench_train_step -e d12 --fp8 current        the blocks' products in FP8 (fp8_linears.cuh)
//   build/bench_train_step -e d12 --experts 8 --top-k 2  every block's MLP as 8 experts, top 2 (moe.cuh)
//   build/bench_train_step -e d12 --attention wgmma    attention on Hopper's warpgroup products
//                                                      (attention_hopper.cuh; mma: attention.cuh's; tma:
//                                                      wgmma fed by a producer warpgroup's TMA copies,
//                                                      attention_hopper_tma.cuh; auto, the default as in
//                                                      train_gpt: on an sm_90 device the tuned forward
//                                                      per T and the TMA-fed backward, else mma)
//   build/bench_train_step -e d12 --arch llama         the same depth as a Llama (models/llama/config.h)
//   build/bench_train_step -e d48 -t 1024 --best       the fastest micro-batch and recomputation: B doubling
//                                                      while it fits, each -r tried only for the batches the
//                                                      lower ones could not fit (batch_sweep.h); a row per
//                                                      try, then the winner's line: "best: model=d48 T=1024
//                                                      fp8=off B=.. recompute=.. tokens_per_s=.. mfu_pct=..
//                                                      step_ms=.. llmc_gib=.. device_gib=.."
//     --best-min-b B      the first batch tried (default 4096 / T, rounded down to a power of two)
//     --best-min-gain X   stop once a doubled batch is less than X faster (default 0.02; 0: never)
//     --best-budget-s S   no try that would end past S seconds of sweeping (the best so far wins)
//     --profile           the winner's profile
//   Each try runs one untimed step, --warmup more and --steps timed ones (1 and 5 with --best, unless
//   given). -b and -r are --best's to choose: either with it is a usage error.
//
// A step is what the trainer does: zero_grad, forward+backward of one micro-batch, the global
// gradient norm and AdamW, on random tokens (no data loading). MFU counts model_flops_per_token
// (models/gpt2/params.h: 6 N + 6 L C T, N the parameters without the position embedding, the second term
// causal attention) against the GPU's dense bf16 peak (--peak-tflops, default 989 for H100/H200 SXM);
// with --fp8 the blocks' products count against twice that, FP8's peak (mfu.h).
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dev/bench/batch_sweep.h"
#include "llmc/planning/mfu.h"
#include "llmc/models/cuda_model.cuh"
#include "llmc/models/llama/config.h"

using namespace llmc;

namespace {

struct Args {
    std::string model = "d12";
    int T = 1024;
    int B = 0;  // 0: the largest that fits
    int recompute = 0;
    int steps = 10, warmup = 3;  // --best: 5 and 1, unless given
    bool profile = false;
    bool best = false;  // sweep B and -r (batch_sweep.h)
    SweepLimits sweep;
    double peak_tflops = 989.0;
    std::string fp8 = "off";  // off, current or delayed
    int experts = 0, top_k = 2;  // a mixture of experts in every block (0: dense)
    std::string attention = "auto";  // auto, mma, wgmma or tma (set_attention_kernels), as train_gpt's
    std::string arch = "gpt2";      // the preset's family: gpt2 or llama (models/llama/config.h)
};

[[noreturn]] void usage(const char* prog, const std::string& why) {
    fprintf(stderr,
            "%s\nusage: %s [-e d4|d6|d12|d24|d36|d48] [-t T] [-b B (0: largest that fits)] [-r 0..3] [--steps N] "
            "[--warmup N] [--profile] [--peak-tflops X] [--fp8 off|current|delayed] [--experts E [--top-k K]] "
            "[--attention mma|wgmma|tma|auto] [--arch gpt2|llama]\n"
            "       %s --best [--best-budget-s S] [--best-min-b B] [--best-min-gain X] (and the flags above but "
            "-b, -r)\n",
            why.c_str(), prog, prog);
    exit(2);
}

Args parse(int argc, char** argv) {
    Args a;
    std::set<std::string> given;
    for (int i = 1; i < argc; i++) {
        const std::string f = argv[i];
        given.insert(f);
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) usage(argv[0], "missing value after " + f);
            return argv[++i];
        };
        if (f == "-e") a.model = value();
        else if (f == "-t") a.T = atoi(value());
        else if (f == "-b") a.B = atoi(value());
        else if (f == "-r") a.recompute = atoi(value());
        else if (f == "--steps") a.steps = atoi(value());
        else if (f == "--warmup") a.warmup = atoi(value());
        else if (f == "--profile") a.profile = true;
        else if (f == "--peak-tflops") a.peak_tflops = atof(value());
        else if (f == "--fp8") a.fp8 = value();
        else if (f == "--attention") a.attention = value();
        else if (f == "--arch") a.arch = value();
        else if (f == "--experts") a.experts = atoi(value());
        else if (f == "--top-k") a.top_k = atoi(value());
        else if (f == "--best") a.best = true;
        else if (f == "--best-budget-s") a.sweep.budget_s = atof(value());
        else if (f == "--best-min-b") a.sweep.min_B = atoi(value());
        else if (f == "--best-min-gain") a.sweep.min_gain = atof(value());
        else usage(argv[0], "unknown flag " + f);
    }
    for (const char* f : {"--best-budget-s", "--best-min-b", "--best-min-gain"})
        if (given.count(f) && !a.best) usage(argv[0], std::string(f) + " needs --best");
    if (!is_model_preset(a.model)) usage(argv[0], "-e must be a preset, got " + a.model);
    if (a.recompute < 0 || a.recompute > 3) usage(argv[0], "-r must be 0..3");
    if (a.fp8 != "off" && a.fp8 != "current" && a.fp8 != "delayed") usage(argv[0], "--fp8 must be off, current or delayed");
    if (a.attention != "mma" && a.attention != "wgmma" && a.attention != "tma" && a.attention != "auto")
        usage(argv[0], "--attention must be mma, wgmma, tma or auto, got " + a.attention);
    if (a.T < 1 || a.B < 0 || a.steps < 1 || a.warmup < 0) usage(argv[0], "-t, -b, --steps, --warmup out of range");
    if (a.experts < 0 || (a.experts > 0 && (a.top_k < 1 || a.top_k > a.experts)))
        usage(argv[0], "--experts must be >= 0 and --top-k in [1, experts]");
    if (a.experts > 0 && a.fp8 != "off") usage(argv[0], "--fp8 runs a dense model only");
    if (a.best) {
        for (const char* f : {"-b", "-r"})
            if (given.count(f)) usage(argv[0], std::string("--best chooses ") + f + " itself: drop " + f);
        if (!given.count("--best-min-b")) a.sweep.min_B = (int)std::bit_floor((unsigned)std::max(1, 4096 / a.T));
        if (!given.count("--steps")) a.steps = 5;
        if (!given.count("--warmup")) a.warmup = 1;
        if (a.sweep.min_B < 1 || a.sweep.min_B > a.sweep.max_B)
            usage(argv[0], strformat("--best-min-b must be in [1, %d]", a.sweep.max_B));
        if (a.sweep.budget_s < 0) usage(argv[0], "--best-budget-s must be >= 0 (0: no limit)");
        if (a.sweep.min_gain < 0) usage(argv[0], "--best-min-gain must be >= 0 (0: never stop early)");
    }
    return a;
}

struct Run {
    std::unique_ptr<CUDAModel> model;
    std::vector<int> inputs, targets;
};

void one_step(Run& run, int B, int T, int step) {
    run.model->zero_grad();
    run.model->forward_backward(run.inputs.data(), run.targets.data(), B, T, 1.0f, true);
    const double norm = std::sqrt(run.model->grad_norm_squared());
    AdamWConfig opt;
    opt.lr = 1e-4f;
    opt.weight_decay = 0.1f;
    run.model->adamw_step(opt, step, norm > 1.0 ? (float)(1.0 / norm) : 1.0f);
}

// A model and batch of B x T, or nothing when it does not fit (out of GPU memory).
bool try_make(Run& run, const ModelConfig& c, int B, int T, const CUDAModelOptions& o) {
    run.model.reset();  // the previous model's memory, before the next one asks for its own
    try {
        run.model = std::make_unique<CUDAModel>(c, B, T, o);
        run.model->init_random(1337);
        std::mt19937 rng(1);
        std::uniform_int_distribution<int> token(0, c.vocab_size - 1);
        run.inputs.resize((size_t)B * T);
        run.targets.resize((size_t)B * T);
        for (size_t i = 0; i < run.inputs.size(); i++) {
            run.inputs[i] = token(rng);
            run.targets[i] = token(rng);
        }
        one_step(run, B, T, 1);  // the first step allocates cuBLASLt's and the allocator's lazy state
        return true;
    } catch (const Error& e) {
        if (std::string(e.what()).find("out of GPU memory") == std::string::npos) throw;
        run.model.reset();
        cudaDeviceSynchronize();
        (void)cudaGetLastError();
        return false;
    }
}

// One more step, timed phase by phase (so a little slower than the timed steps): each kind of kernel's
// share, then each matrix product's rate, its FLOPs over its time. A block product of `in` x `out`
// weights runs 2 rows in out FLOPs per layer forward (twice under -r 3, which redoes the forward up
// to the fc projection) and twice that backward (input and weight gradients); the lm head once
// forward, once backward.
void print_profile(Run& run, const ModelConfig& c, int B, const Args& args) {
    run.model->enable_phase_timing(true);
    one_step(run, B, args.T, 2 + args.warmup + args.steps);
    std::map<std::string, double> phases;
    run.model->collect_phase_ms(phases);
    run.model->enable_phase_timing(false);
    double total = 0;
    for (auto& [name, ms] : phases) total += ms;
    printf("\nGPU time of one step by kind of kernel (timed phase by phase, so a little slower than above)\n");
    printf("| phase | ms | share |\n");
    for (auto& [name, ms] : phases) printf("| %s | %.2f | %.1f%% |\n", name.c_str(), ms, 100.0 * ms / total);
    printf("| total | %.2f | 100%% |\n", total);

    struct Product {
        const char* name;
        double in, out;
        bool per_layer;
    };
    // the family's widths: a Llama's qkv has its kv heads' columns only, its fc both SwiGLU halves
    const BlockWidths w(c);
    const double C = c.channels, rows = (double)B * args.T;
    const Product products[] = {{"qkv", C, (double)w.qkv, true}, {"attproj", C, C, true}, {"fc", C, (double)w.up, true},
                                {"fcproj", (double)w.hidden, C, true}, {"lm head", C, (double)c.padded_vocab_size, false}};
    printf("\nThe matrix products: FLOPs over time, against the dense bf16 peak (%.0f TFLOP/s)\n", args.peak_tflops);
    printf("| product | ms | TFLOP/s | of peak |\n");
    for (const Product& p : products)
        for (bool backward : {false, true}) {
            const std::string name = std::string("matmul ") + p.name + (backward ? " backward" : "");
            if (!phases.count(name)) continue;
            const double layers = p.per_layer ? c.num_layers : 1;
            // -r 3 recomputes every block product but the fc projection (the block's output)
            const bool recomputed = p.per_layer && args.recompute == 3 && std::string(p.name) != "fcproj";
            const double passes = backward ? 2 : (recomputed ? 2 : 1);
            const double tflops = 2 * rows * p.in * p.out * layers * passes / (phases[name] * 1e-3) / 1e12;
            printf("| %s | %.2f | %.0f | %.1f%% |\n", name.c_str() + 7, phases[name], tflops,
                   100 * tflops / args.peak_tflops);
        }
    // Causal attention, forward and backward in one phase: 2 B T^2 C FLOPs a layer forward (QK^T and
    // PV over the causal half), the backward 2.5 times that (as dev/cuda/attention_backward.cu
    // counts), the forward twice under -r 3. dev/bench/measured_topology.sh reads this row too.
    if (phases.count("attention")) {
        const double forward = 2.0 * B * (double)args.T * args.T * C * c.num_layers;
        const double flops = forward * ((args.recompute == 3 ? 2 : 1) + 2.5);
        const double tflops = flops / (phases["attention"] * 1e-3) / 1e12;
        printf("| attention (forward and backward) | %.2f | %.0f | %.1f%% |\n", phases["attention"], tflops,
               100 * tflops / args.peak_tflops);
    }
}

// The micro-batch -b 0 runs: the largest of these that fits, 0 when none does.
int largest_batch_that_fits(Run& run, const ModelConfig& c, int T, const CUDAModelOptions& o) {
    for (int B : {128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 2, 1})
        if (try_make(run, c, B, T, o)) return B;
    return 0;
}

// The warm-up steps, then the timed ones: their figures, and the memory the model holds.
TrialMeasure time_steps(Run& run, const ModelConfig& c, int B, const Args& args, bool fp8) {
    for (int s = 0; s < args.warmup; s++) one_step(run, B, args.T, 2 + s);
    cudaDeviceSynchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < args.steps; s++) one_step(run, B, args.T, 2 + args.warmup + s);
    CUDA_CHECK(cudaDeviceSynchronize());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    TrialMeasure m;
    m.fits = true;
    m.step_ms = seconds * 1e3 / args.steps;
    m.tokens_per_s = (double)B * args.T * args.steps / seconds;
    m.mfu = model_flops_utilization(model_flops_per_token(c, args.T), m.tokens_per_s, args.peak_tflops, 1,
                                    fp8 ? fp8_flops_per_token(c) : 0, 2 * args.peak_tflops);
    size_t bytes = 0;
    for (int k = 0; k < (int)MemoryKind::Count; k++) bytes += run.model->allocated_bytes((MemoryKind)k);
    m.llmc_gib = bytes / 1073741824.0;
    // llmc allocates everything when the model is built, so what the device holds now is its peak
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    m.device_gib = (total_bytes - free_bytes) / 1073741824.0;
    return m;
}

std::string model_name(const Args& args) {
    return args.experts ? strformat("%s, %d experts top %d", args.model.c_str(), args.experts, args.top_k) : args.model;
}

// One configuration: -b B, or the largest that fits (-b 0).
void run_one(const Args& args, const ModelConfig& c, const CUDAModelOptions& o, const std::string& device) {
    Run run;
    int B = args.B;
    if (B > 0) {
        if (!try_make(run, c, B, args.T, o)) fail(strformat("B %d x T %d does not fit in GPU memory", B, args.T));
    } else if ((B = largest_batch_that_fits(run, c, args.T, o)) == 0) {
        fail("not even B = 1 fits in GPU memory");
    }
    const TrialMeasure m = time_steps(run, c, B, args, o.fp8.enabled);
    printf("| device | model | B | T | recompute | fp8 | step ms | tokens/s | MFU | llmc memory |\n");
    printf("| %s | %s | %d | %d | %d | %s | %.1f | %.0f | %.1f%% | %.1f GiB |\n", device.c_str(),
           model_name(args).c_str(), B, args.T, args.recompute, args.fp8.c_str(), m.step_ms, m.tokens_per_s,
           100.0 * m.mfu, m.llmc_gib);
    if (args.profile) print_profile(run, c, B, args);
}

void print_trial(const Trial& t) {
    const TrialMeasure& m = t.measure;
    if (m.fits)
        printf("| %d | %d | ok | %.1f | %.0f | %.1f%% | %.1f GiB | %.1f GiB | %.1f |\n", t.B, t.recompute, m.step_ms,
               m.tokens_per_s, 100.0 * m.mfu, m.llmc_gib, m.device_gib, m.seconds);
    else
        printf("| %d | %d | out of memory | - | - | - | - | - | %.1f |\n", t.B, t.recompute, m.seconds);
    fflush(stdout);  // each row as its try ends: a sweep cut short still shows what it measured
}

void print_sweep_end(const SweepResult& sweep, const SweepLimits& limits) {
    const Trial& last = sweep.trials.back();
    switch (sweep.end) {
    case SweepEnd::Exhausted:
        if (last.measure.fits) printf("end: B %d is the largest --best tries\n", last.B);
        else printf("end: B %d does not fit even at -r %d\n", last.B, last.recompute);
        break;
    case SweepEnd::Saturated:
        printf("end: B %d -r %d gained less than %.0f%% over the batch before it (the card is saturated)\n",
               sweep.next.B, sweep.next.recompute, 100 * limits.min_gain);
        break;
    case SweepEnd::Budget:
        printf("end: B %d -r %d would end past the %.0f s budget\n", sweep.next.B, sweep.next.recompute,
               limits.budget_s);
        break;
    }
}

// --best: the sweep of batch_sweep.h, a row per try as it ends, then the winner's line (and its profile).
void run_best(const Args& args, const ModelConfig& c, const CUDAModelOptions& o, const std::string& device) {
    printf("bench_train_step --best on %s: %s, T %d, fp8 %s; B doubling from %d, -r 0..3 each only where the "
           "lower ones run out of memory; per try 1 untimed, %d warm-up and %d timed steps",
           device.c_str(), model_name(args).c_str(), args.T, args.fp8.c_str(), args.sweep.min_B, args.warmup,
           args.steps);
    if (args.sweep.budget_s > 0) printf("; budget %.0f s", args.sweep.budget_s);
    printf("\n\n| B | recompute | result | step ms | tokens/s | MFU | llmc memory | device memory | try s |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    Run run;
    const SweepResult sweep = sweep_batch_and_recompute(args.sweep, [&](int B, int recompute) {
        const auto start = std::chrono::steady_clock::now();
        CUDAModelOptions tried = o;
        tried.recompute = (Recompute)recompute;
        TrialMeasure m;
        if (try_make(run, c, B, args.T, tried)) m = time_steps(run, c, B, args, tried.fp8.enabled);
        run.model.reset();
        m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        print_trial({B, recompute, m});
        return m;
    });
    print_sweep_end(sweep, args.sweep);
    const std::optional<Trial> best = fastest(sweep.trials);
    if (!best) fail(strformat("not even B = %d x T %d fits in GPU memory, at any -r", args.sweep.min_B, args.T));
    const TrialMeasure& m = best->measure;
    const std::string experts = args.experts ? strformat(" experts=%d top_k=%d", args.experts, args.top_k) : "";
    printf("best: model=%s%s T=%d fp8=%s attention=%s B=%d recompute=%d tokens_per_s=%.0f mfu_pct=%.1f "
           "step_ms=%.1f llmc_gib=%.1f device_gib=%.1f\n",
           args.model.c_str(), experts.c_str(), args.T, args.fp8.c_str(), args.attention.c_str(), best->B,
           best->recompute, m.tokens_per_s, 100.0 * m.mfu, m.step_ms, m.llmc_gib, m.device_gib);
    if (args.profile) {
        Args winner = args;
        winner.recompute = best->recompute;
        CUDAModelOptions winner_options = o;
        winner_options.recompute = (Recompute)best->recompute;
        if (!try_make(run, c, best->B, args.T, winner_options)) fail("the winner no longer fits in GPU memory");
        print_profile(run, c, best->B, winner);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const Args args = parse(argc, argv);
    std::string why;
    if (!cuda_device_present(&why)) return no_gpu_exit_status("bench_train_step", why);
    try {
        const int max_T = std::max(1024, args.T);
        ModelConfig c = parse_arch(args.arch, "--arch") == ModelArch::Llama ? llama_preset(args.model, max_T)
                                                                             : model_preset(args.model, max_T);
        c.num_experts = args.experts, c.moe_top_k = args.top_k;
        CUDAModelOptions o;
        o.recompute = (Recompute)args.recompute;
        o.fp8 = {args.fp8 != "off", args.fp8 == "delayed" ? Fp8Scaling::Delayed : Fp8Scaling::Current, 16};
        set_attention_kernels(parse_attention_kernels(args.attention, "--attention"));
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        if (args.best) run_best(args, c, o, prop.name);
        else run_one(args, c, o, prop.name);
    } catch (const std::exception& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
