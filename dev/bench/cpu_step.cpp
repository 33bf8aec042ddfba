// cpu_step: training throughput of the CPU model (CPUModel): forward + backward + AdamW per step,
// and the packed GEMM alone on the model's own matmul shapes.
//
// Build and run from the repository root:
//   g++ -std=c++20 -O3 -march=native -fopenmp -I. dev/bench/cpu_step.cpp -o build/cpu_step
//   build/cpu_step [preset B T steps]        (default: d4 at B=8 T=64 and at B=4 T=256)
// Tokens are random; only the time matters. "matmul GFLOP/s" counts the 6 * tokens * weights
// multiply-adds of the projections and lm head (attention excluded) over the whole step time.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/models/cpu_model.h"

using namespace llmc;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

static void bench_step(const std::string& preset, int B, int T, int steps) {
    const ModelConfig config = model_preset(preset);
    CPUModel model(config, B, T);
    model.init_random(1);
    Rng rng(2);
    std::vector<int> inputs(B * T), targets(B * T);
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int)rng.below(config.vocab_size);
        targets[i] = (int)rng.below(config.vocab_size);
    }
    const size_t n = model.num_params();
    AdamWConfig opt;
    double best_s = 1e30, fb_s = 0.0, adam_s = 0.0;
    for (int step = 0; step <= steps; step++) {  // step 0 warms up (page faults, packing buffers)
        const auto t0 = Clock::now();
        model.zero_grad();
        model.forward_backward(inputs.data(), targets.data(), B, T, 1.0f, true);
        const double t_fb = seconds_since(t0);
        const auto t1 = Clock::now();
        model.adamw_step(opt, step + 1, 1.0f);
        const double t_adam = seconds_since(t1), total = seconds_since(t0);
        if (step > 0 && total < best_s) best_s = total, fb_s = t_fb, adam_s = t_adam;
    }
    const double C = config.channels, L = config.num_layers, Vp = config.padded_vocab_size;
    const double matmul_flops = 6.0 * B * T * (L * 12.0 * C * C + Vp * C);
    std::printf("%s B=%d T=%d: %.1f ms/step (fwd+bwd %.1f, adamw %.1f), %.0f tokens/s, matmul %.0f GFLOP/s\n",
                preset.c_str(), B, T, best_s * 1e3, fb_s * 1e3, adam_s * 1e3, B * T / best_s,
                matmul_flops / best_s / 1e9);
}

// Times C = A B (or C += A B when `accumulate`, as for weight gradients) for one shape; best of
// several runs.
static void bench_gemm(const char* what, int M, int N, int K, bool a_t, bool b_t, bool accumulate) {
    std::vector<float> a((size_t)M * K, 0.5f), b((size_t)K * N, 0.25f), c((size_t)M * N, 0.0f);
    const cpu::MatRef ar{a.data(), (size_t)(a_t ? M : K), a_t}, br{b.data(), (size_t)(b_t ? K : N), b_t};
    const int reps = std::max(3, (int)(2e10 / (2.0 * M * N * K)));
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const auto t0 = Clock::now();
        cpu::gemm(M, N, K, ar, br, c.data(), N, accumulate);
        best = std::min(best, seconds_since(t0));
    }
    std::printf("  gemm %-22s M=%-6d N=%-6d K=%-6d %6.0f GFLOP/s\n", what, M, N, K, 2.0 * M * N * K / best / 1e9);
}

int main(int argc, char** argv) {
    try {
        if (argc == 5) {
            bench_step(argv[1], std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]));
            return 0;
        }
        if (argc != 1) fail("usage: cpu_step [preset B T steps]");
        std::printf("threads: %d, SIMD floats: %d, micro-tile %dx%d\n", omp_get_max_threads(), cpu::VEC_FLOATS,
                    cpu::GEMM_MR, cpu::GEMM_NR);
        bench_step("d4", 8, 64, 5);
        bench_step("d4", 4, 256, 5);
        const int BT = 1024, C = 256, Vp = 50304;
        bench_gemm("fc forward", BT, 4 * C, C, false, true, true);
        bench_gemm("fcproj dinp", BT, 4 * C, C, false, false, false);
        bench_gemm("fc dweight", 4 * C, C, BT, true, false, true);
        bench_gemm("lm head forward", BT, Vp, C, false, true, false);
        bench_gemm("lm head dinp", BT, C, Vp, false, false, false);
        bench_gemm("lm head dweight", Vp, C, BT, true, false, true);
    } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
