// dev/bench/train_step.cu: tokens/s and MFU of a CUDA training step, and where its GPU time goes.
// A benchmark, not a test: it prints figures and checks nothing.
//
//   build/bench_train_step -e d12 -t 1024              largest micro-batch that fits, no recompute
//   build/bench_train_step -e d48 -t 1024 -r 3 -b 8    GPT-2 1.5B, whole-block recomputation
//   build/bench_train_step -e d12 --profile            also the per-kernel time shares of one step, and
//                                                      each matrix product's TFLOP/s, forward and backward
//   build/bench_train_step -e d12 --fp8 current        the blocks' products in FP8 (fp8_linears.cuh)
//   build/bench_train_step -e d12 --experts 8 --top-k 2  every block's MLP as 8 experts, top 2 (moe.cuh)
//
// A step is what the trainer does: zero_grad, forward+backward of one micro-batch, the global
// gradient norm and AdamW, on random tokens (no data loading). MFU counts model_flops_per_token
// (models/gpt2/params.h: 6 N + 6 L C T, N the parameters without the position embedding, the second term
// causal attention) against the GPU's dense bf16 peak (--peak-tflops, default 989 for H100/H200 SXM);
// with --fp8 the blocks' products count against twice that, FP8's peak (mfu.h).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "llmc/mfu.h"
#include "llmc/models/gpt2/gpt2_cuda.cuh"

using namespace llmc;

namespace {

struct Args {
    std::string model = "d12";
    int T = 1024;
    int B = 0;  // 0: the largest that fits
    int recompute = 0;
    int steps = 10, warmup = 3;
    bool profile = false;
    double peak_tflops = 989.0;
    std::string fp8 = "off";  // off, current or delayed
    int experts = 0, top_k = 2;  // a mixture of experts in every block (0: dense)
};

[[noreturn]] void usage(const char* prog, const std::string& why) {
    fprintf(stderr,
            "%s\nusage: %s [-e d12|d24|d36|d48] [-t T] [-b B (0: largest that fits)] [-r 0..3] [--steps N] "
            "[--warmup N] [--profile] [--peak-tflops X] [--fp8 off|current|delayed] [--experts E [--top-k K]]\n",
            why.c_str(), prog);
    exit(2);
}

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; i++) {
        const std::string f = argv[i];
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
        else if (f == "--experts") a.experts = atoi(value());
        else if (f == "--top-k") a.top_k = atoi(value());
        else usage(argv[0], "unknown flag " + f);
    }
    if (!is_model_preset(a.model)) usage(argv[0], "-e must be a preset, got " + a.model);
    if (a.recompute < 0 || a.recompute > 3) usage(argv[0], "-r must be 0..3");
    if (a.fp8 != "off" && a.fp8 != "current" && a.fp8 != "delayed") usage(argv[0], "--fp8 must be off, current or delayed");
    if (a.T < 1 || a.B < 0 || a.steps < 1 || a.warmup < 0) usage(argv[0], "-t, -b, --steps, --warmup out of range");
    if (a.experts < 0 || (a.experts > 0 && (a.top_k < 1 || a.top_k > a.experts)))
        usage(argv[0], "--experts must be >= 0 and --top-k in [1, experts]");
    if (a.experts > 0 && a.fp8 != "off") usage(argv[0], "--fp8 runs a dense model only");
    return a;
}

struct Run {
    std::unique_ptr<GPT2CUDA> model;
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
bool try_make(Run& run, const ModelConfig& c, int B, int T, const GPT2CUDAOptions& o) {
    try {
        run.model = std::make_unique<GPT2CUDA>(c, B, T, o);
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
    const double C = c.channels, rows = (double)B * args.T;
    const Product products[] = {{"qkv", C, 3 * C, true}, {"attproj", C, C, true}, {"fc", C, 4 * C, true},
                                {"fcproj", 4 * C, C, true}, {"lm head", C, (double)c.padded_vocab_size, false}};
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

}  // namespace

int main(int argc, char** argv) {
    const Args args = parse(argc, argv);
    std::string why;
    if (!cuda_device_present(&why)) return no_gpu_exit_status("bench_train_step", why);
    try {
        ModelConfig c = model_preset(args.model, std::max(1024, args.T));
        c.num_experts = args.experts, c.moe_top_k = args.top_k;
        GPT2CUDAOptions o;
        o.recompute = (Recompute)args.recompute;
        o.fp8 = {args.fp8 != "off", args.fp8 == "delayed" ? Fp8Scaling::Delayed : Fp8Scaling::Current, 16};
        Run run;
        int B = args.B;
        if (B > 0) {
            if (!try_make(run, c, B, args.T, o)) fail(strformat("B %d x T %d does not fit in GPU memory", B, args.T));
        } else {
            for (int candidate : {128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 2, 1})
                if (try_make(run, c, candidate, args.T, o)) {
                    B = candidate;
                    break;
                }
            if (B == 0) fail("not even B = 1 fits in GPU memory");
        }
        for (int s = 0; s < args.warmup; s++) one_step(run, B, args.T, 2 + s);
        cudaDeviceSynchronize();
        const auto start = std::chrono::steady_clock::now();
        for (int s = 0; s < args.steps; s++) one_step(run, B, args.T, 2 + args.warmup + s);
        CUDA_CHECK(cudaDeviceSynchronize());
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double step_ms = seconds * 1e3 / args.steps;
        const double tokens_per_s = (double)B * args.T * args.steps / seconds;
        const double mfu = model_flops_utilization(model_flops_per_token(c, args.T), tokens_per_s, args.peak_tflops, 1,
                                                   o.fp8.enabled ? fp8_flops_per_token(c) : 0, 2 * args.peak_tflops);
        size_t bytes = 0;
        for (int k = 0; k < (int)MemoryKind::Count; k++) bytes += run.model->allocated_bytes((MemoryKind)k);
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        const std::string model =
            args.experts ? strformat("%s, %d experts top %d", args.model.c_str(), args.experts, args.top_k) : args.model;
        printf("| device | model | B | T | recompute | fp8 | step ms | tokens/s | MFU | llmc memory |\n");
        printf("| %s | %s | %d | %d | %d | %s | %.1f | %.0f | %.1f%% | %.1f GiB |\n", prop.name, model.c_str(), B,
               args.T, args.recompute, args.fp8.c_str(), step_ms, tokens_per_s, 100.0 * mfu, bytes / 1073741824.0);

        if (args.profile) print_profile(run, c, B, args);
    } catch (const std::exception& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
