// dev/cuda/layernorm.cu: LayerNorm forward, recompute and backward (llmc/layernorm.cuh).
//
//   version 1: one thread per row (forward, backward dinp); one thread per channel for dweight, dbias
//   version 2: llmc/layernorm.cuh: one warp per row, the row in registers; backward's dweight/dbias as
//              per-block partial rows in shared memory, then a fixed-order sum over blocks
//
// Tolerances. out and dinp are stored in bf16: BF16_TOLERANCE. mean and rstd are fp32, computed from the
// same bf16-exact inputs with the same two-pass fp32 formulas as the CPU, so only summation order
// differs: FP32_TOLERANCE. dweight and dbias are fp32 sums of products of the same bf16 dout and of norm =
// (x - mean) * rstd, computed in fp32 from the same x, mean and rstd (the GPU is given the CPU's
// statistics), so again only summation order (and FMA contraction) differs: FP32_TOLERANCE. dinp,
// dweight and dbias accumulate: they start from the same random values on both sides.
//
// Inputs. Independent N(0, 1) values would make every row mean of the computation O(1/sqrt(C)): mean 0,
// rstd 1, and in backward mean(dnorm) and mean(dnorm * norm) so small that dropping either term changes
// dinp by ~1e-2 (C = 768) or less (C = 6400), under the bf16 tolerance. So each row of inp gets its own
// offset and scale, backward's weight is near 1 (as a trained LayerNorm's), and each row of dout gets its
// own offset and multiple of norm: every term of the formulas is then O(1).
//
// Version 2 is also checked for: recompute bitwise equal to the forward's output, and forward and
// backward bitwise equal run to run.
//
// Emulated (dev/emu/), a shape over bench::EMULATED_WORK_LIMIT would be skipped; none is: the capped
// grid (N = 4099, C = 2056) needs more than 512 x 3 rows, and the GPT-2 shapes are smaller than it.
#include "dev/cuda/common.cuh"
#include "llmc/kernels/layernorm.cuh"
#include "llmc/cpu/ops.h"

using llmc::floatX;

// ---------------------------------------------------------------------------------------------
// Version 1.

__global__ void layernorm_forward_v1_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                            const floatX* weight, const floatX* bias, int N, int C) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int c = 0; c < C; c++) sum += __bfloat162float(x[c]);
    const float m = sum / C;
    float squares = 0.0f;
    for (int c = 0; c < C; c++) {
        const float centered = __bfloat162float(x[c]) - m;
        squares += centered * centered;
    }
    const float s = 1.0f / sqrtf(squares / C + llmc::LAYERNORM_EPS);
    for (int c = 0; c < C; c++) {
        const float norm = (__bfloat162float(x[c]) - m) * s;
        out[(size_t)row * C + c] = __float2bfloat16_rn(norm * __bfloat162float(weight[c]) + __bfloat162float(bias[c]));
    }
    mean[row] = m;
    rstd[row] = s;
}

void layernorm_forward_v1(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                          const floatX* bias, int N, int C) {
    LLMC_LAUNCH(layernorm_forward_v1_kernel, llmc::ceil_div(N, 128), 128, 0, 0)(out, mean, rstd, inp, weight, bias, N, C);
    CUDA_CHECK_LAUNCH();
}

__global__ void layernorm_backward_dinp_v1_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                                  const floatX* weight, const float* mean, const float* rstd, int N,
                                                  int C) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    const floatX* d = dout + (size_t)row * C;
    floatX* dx = dinp + (size_t)row * C;
    const float m = mean[row], s = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = 0; c < C; c++) {
        const float dnorm = __bfloat162float(d[c]) * __bfloat162float(weight[c]);
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * ((__bfloat162float(x[c]) - m) * s);
    }
    const float dnorm_mean = dnorm_sum / C, dnorm_norm_mean = dnorm_norm_sum / C;
    for (int c = 0; c < C; c++) {
        const float norm = (__bfloat162float(x[c]) - m) * s;
        const float dnorm = __bfloat162float(d[c]) * __bfloat162float(weight[c]);
        dx[c] = __float2bfloat16_rn(__bfloat162float(dx[c]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
}

__global__ void layernorm_backward_params_v1_kernel(float* dweight, float* dbias, const floatX* dout,
                                                    const floatX* inp, const float* mean, const float* rstd, int N,
                                                    int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = dweight[c], db = dbias[c];
    for (int row = 0; row < N; row++) {
        const float d = __bfloat162float(dout[(size_t)row * C + c]);
        dw += d * ((__bfloat162float(inp[(size_t)row * C + c]) - mean[row]) * rstd[row]);
        db += d;
    }
    dweight[c] = dw;
    dbias[c] = db;
}

void layernorm_backward_v1(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                           const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    LLMC_LAUNCH(layernorm_backward_dinp_v1_kernel, llmc::ceil_div(N, 128), 128, 0, 0)(dinp, dout, inp, weight, mean, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(layernorm_backward_params_v1_kernel, llmc::ceil_div(C, 128), 128, 0, 0)(dweight, dbias, dout, inp, mean, rstd, N, C);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Harness.

// Rows of a residual stream: each its own offset and scale. bf16-exact.
std::vector<float> random_rows(int N, int C, std::mt19937_64& rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> out((size_t)N * C);
    for (int r = 0; r < N; r++) {
        const float offset = dist(rng), scale = std::exp(dist(rng));
        for (int c = 0; c < C; c++) out[(size_t)r * C + c] = bench::bf16_round(offset + scale * dist(rng));
    }
    return out;
}

// dout = noise + u + k * norm, with u and k drawn per row, so that mean(dnorm) ~ u and mean(dnorm * norm) ~ k.
std::vector<float> random_dout(const std::vector<float>& inp, const std::vector<float>& mean,
                               const std::vector<float>& rstd, int N, int C, std::mt19937_64& rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> out((size_t)N * C);
    for (int r = 0; r < N; r++) {
        const float u = dist(rng), k = dist(rng);
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)r * C + c;
            out[i] = bench::bf16_round(dist(rng) + u + k * (inp[i] - mean[r]) * rstd[r]);
        }
    }
    return out;
}

// LayerNorm weights as training leaves them: around 1. bf16-exact.
std::vector<float> random_weight(int C, std::mt19937_64& rng) {
    std::vector<float> w = bench::random_bf16(C, rng, 0.25f);
    for (float& x : w) x = bench::bf16_round(1.0f + x);
    return w;
}

// The scratch sized for N rows must hold the partials of every call with fewer rows (CUDAModel sizes it
// once for max_B x max_T). Host arithmetic only.
void check_scratch_bound(int N, int C) {
    const size_t floats = llmc::layernorm_backward_scratch_floats(N, C);
    int worst = 0;
    for (int n = 1; n <= N; n++) {
        if ((size_t)llmc::layernorm_backward_plan(n, C).blocks * 2 * C > floats) {
            worst = n;
            break;
        }
    }
    bench::report_check("scratch(N) bounds all n <= N", worst == 0,
                        worst == 0 ? "yes" : llmc::strformat("no: n = %d overflows", worst));
}

struct Shape {
    const char* name;
    int N, C;
    bool timed;
};

void run_forward(int version, const Shape& shape, bool check_only, std::mt19937_64& rng) {
    const int N = shape.N, C = shape.C;
    const size_t NC = (size_t)N * C;
    const std::vector<float> inp = random_rows(N, C, rng), weight = bench::random_bf16(C, rng),
                             bias = bench::random_bf16(C, rng);
    std::vector<float> ref_out(NC), ref_mean(N), ref_rstd(N);
    llmc::cpu::layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), inp.data(), weight.data(),
                                 bias.data(), N, C);

    auto d_inp = bench::to_device_bf16(inp), d_weight = bench::to_device_bf16(weight),
         d_bias = bench::to_device_bf16(bias);
    bench::DeviceBuffer<floatX> d_out(NC, "out");
    bench::DeviceBuffer<float> d_mean(N, "mean"), d_rstd(N, "rstd");
    auto forward = [&]() {
        if (version == 1) {
            layernorm_forward_v1(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(), d_bias.get(),
                                 N, C);
        } else {
            llmc::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(),
                                    d_bias.get(), N, C, 0);
        }
    };
    bench::poison(d_out.get(), NC);
    bench::poison(d_mean.get(), N);
    bench::poison(d_rstd.get(), N);
    forward();
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check("forward out", bench::to_host(d_out.get(), NC), ref_out, bench::BF16_TOLERANCE);
    bench::check("forward mean", bench::to_host(d_mean.get(), N), ref_mean, bench::FP32_TOLERANCE);
    bench::check("forward rstd", bench::to_host(d_rstd.get(), N), ref_rstd, bench::FP32_TOLERANCE);

    bench::DeviceBuffer<floatX> d_recomputed;
    if (version == 2) {
        d_recomputed.allocate(NC, "recomputed out");
        const auto out_bits = bench::device_bytes(d_out.get(), NC), mean_bits = bench::device_bytes(d_mean.get(), N),
                   rstd_bits = bench::device_bytes(d_rstd.get(), N);
        bench::poison(d_recomputed.get(), NC);
        llmc::layernorm_recompute(d_recomputed.get(), d_inp.get(), d_mean.get(), d_rstd.get(), d_weight.get(),
                                  d_bias.get(), N, C, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        bench::check_same_bits("recompute == forward out", bench::device_bytes(d_recomputed.get(), NC), out_bits);

        bench::poison(d_out.get(), NC);
        bench::poison(d_mean.get(), N);
        bench::poison(d_rstd.get(), N);
        forward();
        CUDA_CHECK(cudaDeviceSynchronize());
        bench::check_same_bits("forward out, run twice", bench::device_bytes(d_out.get(), NC), out_bits);
        bench::check_same_bits("forward mean, run twice", bench::device_bytes(d_mean.get(), N), mean_bits);
        bench::check_same_bits("forward rstd, run twice", bench::device_bytes(d_rstd.get(), N), rstd_bits);
        // FP8's current scaling: given `amax`, the same output, and its largest |value| measured
        bench::check_amax("forward", bench::to_host(d_out.get(), NC), [&](float* amax) {
            bench::poison(d_out.get(), NC);
            llmc::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(),
                                    d_bias.get(), N, C, 0, amax);
            return bench::to_host(d_out.get(), NC);
        });
    }
    if (check_only || !shape.timed) return;
    // Bytes: read inp, write out, write mean and rstd, read weight and bias.
    const double bytes = 2.0 * NC * sizeof(floatX) + 2.0 * N * sizeof(float) + 2.0 * C * sizeof(floatX);
    bench::report_memory_bound("forward", bench::time_ms(forward), bytes);
    if (version == 2) {
        auto recompute = [&]() {
            llmc::layernorm_recompute(d_recomputed.get(), d_inp.get(), d_mean.get(), d_rstd.get(), d_weight.get(),
                                      d_bias.get(), N, C, 0);
        };
        // Bytes: the forward's, with mean and rstd read instead of written.
        bench::report_memory_bound("recompute", bench::time_ms(recompute), bytes);
    }
}

void run_backward(int version, const Shape& shape, bool check_only, std::mt19937_64& rng) {
    const int N = shape.N, C = shape.C;
    const size_t NC = (size_t)N * C;
    const std::vector<float> inp = random_rows(N, C, rng), weight = random_weight(C, rng),
                             bias = bench::random_bf16(C, rng);
    // Realistic statistics: the CPU forward's; both sides then use exactly these values.
    std::vector<float> out(NC), mean(N), rstd(N);
    llmc::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    const std::vector<float> dout = random_dout(inp, mean, rstd, N, C, rng);
    // Accumulators start from random values: dinp as the bf16 it is on the GPU.
    const std::vector<float> dinp_init = bench::random_bf16(NC, rng), dweight_init = bench::random_f32(C, rng),
                             dbias_init = bench::random_f32(C, rng);
    std::vector<float> ref_dinp = dinp_init, ref_dweight = dweight_init, ref_dbias = dbias_init;
    llmc::cpu::layernorm_backward(ref_dinp.data(), ref_dweight.data(), ref_dbias.data(), dout.data(), inp.data(),
                                  weight.data(), mean.data(), rstd.data(), N, C);

    auto d_inp = bench::to_device_bf16(inp), d_weight = bench::to_device_bf16(weight),
         d_dout = bench::to_device_bf16(dout);
    auto d_mean = bench::to_device(mean), d_rstd = bench::to_device(rstd);
    bench::DeviceBuffer<floatX> d_dinp(NC, "dinp");
    bench::DeviceBuffer<float> d_dweight(C, "dweight"), d_dbias(C, "dbias");
    const size_t scratch_floats = llmc::layernorm_backward_scratch_floats(N, C);
    bench::DeviceBuffer<float> d_scratch(scratch_floats, "scratch");
    auto reset = [&]() {
        bench::upload_bf16(d_dinp.get(), dinp_init);
        bench::upload(d_dweight.get(), dweight_init);
        bench::upload(d_dbias.get(), dbias_init);
        bench::poison(d_scratch.get(), scratch_floats);
    };
    auto backward = [&]() {
        if (version == 1) {
            layernorm_backward_v1(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(), d_inp.get(),
                                  d_weight.get(), d_mean.get(), d_rstd.get(), N, C);
        } else {
            llmc::layernorm_backward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_scratch.get(), d_dout.get(),
                                     d_inp.get(), d_weight.get(), d_mean.get(), d_rstd.get(), N, C, 0);
        }
    };
    reset();
    backward();
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check("backward dinp (+=)", bench::to_host(d_dinp.get(), NC), ref_dinp, bench::BF16_TOLERANCE);
    bench::check("backward dweight (+=)", bench::to_host(d_dweight.get(), C), ref_dweight, bench::FP32_TOLERANCE);
    bench::check("backward dbias (+=)", bench::to_host(d_dbias.get(), C), ref_dbias, bench::FP32_TOLERANCE);

    if (version == 2) {
        const auto dinp_bits = bench::device_bytes(d_dinp.get(), NC),
                   dweight_bits = bench::device_bytes(d_dweight.get(), C),
                   dbias_bits = bench::device_bytes(d_dbias.get(), C);
        reset();
        backward();
        CUDA_CHECK(cudaDeviceSynchronize());
        bench::check_same_bits("backward dinp, run twice", bench::device_bytes(d_dinp.get(), NC), dinp_bits);
        bench::check_same_bits("backward dweight, run twice", bench::device_bytes(d_dweight.get(), C), dweight_bits);
        bench::check_same_bits("backward dbias, run twice", bench::device_bytes(d_dbias.get(), C), dbias_bits);
        // FP8's current scaling: given `amax`, the same dinp, and its largest |value| measured
        bench::check_amax("backward dinp", bench::to_host(d_dinp.get(), NC), [&](float* amax) {
            reset();
            llmc::layernorm_backward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_scratch.get(), d_dout.get(),
                                     d_inp.get(), d_weight.get(), d_mean.get(), d_rstd.get(), N, C, 0, amax);
            return bench::to_host(d_dinp.get(), NC);
        });
    }
    if (check_only || !shape.timed) return;
    // Bytes: read dout, inp and dinp, write dinp, read mean, rstd and weight, read and write dweight and
    // dbias. The scratch partials (version 2) are not counted: they are the kernel's own overhead.
    const double bytes = 4.0 * NC * sizeof(floatX) + 2.0 * N * sizeof(float) + C * sizeof(floatX) +
                         4.0 * C * sizeof(float);
    bench::report_memory_bound("backward", bench::time_ms(backward), bytes);
}

int main(int argc, char** argv) {
    const bench::Options opts = bench::start(argc, argv, 2);
    std::mt19937_64 rng(opts.seed);
    const Shape shapes[] = {
        {"GPT-2 124M: N = 8*1024, C = 768", 8 * 1024, 768, true},
        {"GPT-2 1.5B: N = 4*1024, C = 1600", 4 * 1024, 1600, true},
        {"awkward: N = 37, C = 1600", 37, 1600, false},
        {"capped grid, streamed, 3 warps: N = 4099, C = 2056", 4099, 2056, false},
        {"tiny: N = 1, C = 8", 1, 8, false},
        {"widest in registers: N = 300, C = 2048", 300, 2048, false},
        {"streamed rows: N = 19, C = 6400", 19, 6400, false},
    };
    for (int version = 1; version <= 2; version++) {
        if (!opts.runs(version)) continue;
        for (const Shape& shape : shapes) {
            printf("version %d, %s\n", version, shape.name);
            if (bench::skip_when_emulated("N C", (double)shape.N * shape.C)) continue;
            if (version == 2) check_scratch_bound(shape.N, shape.C);
            run_forward(version, shape, opts.check_only, rng);
            run_backward(version, shape, opts.check_only, rng);
        }
    }
    return bench::finish(argv[0]);
}
