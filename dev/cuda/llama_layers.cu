// dev/cuda/llama_layers.cu: the Llama family's elementwise layers, one workbench for the three
// (every workbench is compiled for the emulator in CI, so one file costs one compile, not three):
//
//   rmsnorm  llmc/kernels/rmsnorm.cuh: forward, recompute and backward (cpu::rmsnorm_forward/_backward)
//   rope     llmc/kernels/rope.cuh: the cos/sin table, forward and backward in place on qkv
//            (cpu::rope_table, cpu::rope_forward/_backward)
//   swiglu   llmc/kernels/swiglu.cuh: forward and backward (cpu::swiglu_forward/_backward)
//
//   version 1: the simplest correct kernels: one thread per row (RMSNorm; one per column for dweight),
//              per channel pair with its own angle in double (RoPE), per element (SwiGLU)
//   version 2: llmc/kernels/: one warp per row, the row in registers, dweight through per-block partial
//              rows summed in block order (RMSNorm); the table, then 16-byte vectors (RoPE, SwiGLU)
//
//   ./llama_layers [version 1..2] [--layer rmsnorm|rope|swiglu|all] [--check] [--seed N]
//
// Tolerances, as every workbench's: outputs stored in bf16 within BF16_TOLERANCE, fp32 outputs
// (RMSNorm's rstd and dweight, RoPE's table) within FP32_TOLERANCE, where only the order of sums
// differs (the backward is given the CPU's rstd), NaN or inf never passes. Outputs are poisoned
// (0xFF bytes) before each run, so an element a kernel forgets fails.
//
// Inputs. RMSNorm: each row its own offset and a scale from 2^-5 to 2^2, so the mean squares span
// 1e-3..16 and eps (1e-5) moves rstd by up to 1e-2 relative (a kernel without it fails the fp32
// check); the weights near 1, as training leaves them; each row of dout is noise plus its own multiple
// of norm, so the backward's second term (norm * mean(dout * weight * norm)) is O(1), not O(1/sqrt(C)).
// RoPE: positions 0..T-1, or a context-parallel rank's global positions (rank 1 of 4096 over a
// sequence of 131072: 16..31 and 131040..131055), where an fp32 angle would be off. It works in
// place, so a skipped element would keep its input: besides the per-tensor error, every q and k
// element is checked on its own (within a bf16 rounding of its reference, plus 1e-4 of the tensor's
// rms for cancellation), and v must come back bit for bit. SwiGLU: gate from N(0, 2^2) with some
// entries at 20 and -100, so both tails of the sigmoid and its saturation (to 1, and to 0 through
// exp's overflow) are reached.
//
// Version 2 is also checked for: bitwise equal outputs run to run; RMSNorm's recompute bitwise its
// forward's output; SwiGLU's backward in place (dgate_up = gate_up) bitwise the out-of-place one;
// the outputs given an amax (FP8's current scaling: RMSNorm's out and dinp, SwiGLU's out and
// dgate_up) bitwise the same, and the amax their largest |value|; RMSNorm's scratch bound.
//
// Shapes: small and odd ones (1 row; C not a multiple of 256; the widest rows held in registers;
// streamed rows; 64 KiB of shared memory a block; a capped grid with several rows a warp; HS 16 to
// 128, grouped and plain multi-head attention), which the emulator checks in a few seconds, and
// Llama 3's (C 2048 and 4096; NH 32, KVH 8, HS 64 and 128; H 5632 and 14336), over
// bench::EMULATED_WORK_LIMIT: skipped emulated, checked and timed on a GPU (against DRAM bandwidth).
#include <cstring>
#include <string>
#include <vector>

#include "dev/cuda/common.cuh"
#include "llmc/cpu/llama_ops.h"
#include "llmc/dist/context_parallel.h"
#include "llmc/kernels/rmsnorm.cuh"
#include "llmc/kernels/rope.cuh"
#include "llmc/kernels/swiglu.cuh"

using bench::DeviceBuffer;
using llmc::ceil_div;
using llmc::floatX;
using llmc::strformat;

static_assert(llmc::RMSNORM_EPS == llmc::cpu::RMSNORM_EPS, "the CUDA RMSNorm must use the CPU reference's eps");

constexpr int NUM_VERSIONS = 2;
const char* const VERSION_NAMES[NUM_VERSIONS + 1] = {"", "scalar: a thread per row, pair or element",
                                                     "llmc/kernels/: rmsnorm.cuh, rope.cuh, swiglu.cuh"};

// Every element of `gpu` within a bf16 rounding (2^-7 relative, two roundings' worth) of `ref`, plus
// 1e-4 of ref's rms (fp32 differences where the reference cancels to near 0). For in-place kernels,
// where an element left alone keeps a plausible value and a few of them move a per-tensor error by
// less than its tolerance.
bool check_each(const char* what, const std::vector<float>& gpu, const std::vector<float>& ref) {
    double squares = 0.0;
    for (float r : ref) squares += (double)r * r;
    const double floor = 1e-4 * std::sqrt(squares / std::max<size_t>(ref.size(), 1));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double diff = std::fabs((double)gpu[i] - ref[i]);
        if (!(diff <= std::ldexp(std::fabs(ref[i]), -7) + floor)) {  // NaN fails
            if (bad++ == 0) first = i;
        }
    }
    if (bad == 0) return bench::report_check(what, true, strformat("every element of %zu", ref.size()));
    return bench::report_check(what, false, strformat("%zu of %zu elements off; element %zu: %.6g, reference %.6g",
                                                      bad, ref.size(), first, gpu[first], ref[first]));
}

// =============================================================================================
// RMSNorm.

// ---- version 1 ----

__global__ void rmsnorm_forward_v1_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N,
                                          int C) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    float squares = 0.0f;
    for (int c = 0; c < C; c++) squares += __bfloat162float(x[c]) * __bfloat162float(x[c]);
    const float s = 1.0f / sqrtf(squares / C + llmc::RMSNORM_EPS);
    for (int c = 0; c < C; c++)
        out[(size_t)row * C + c] = __float2bfloat16_rn(__bfloat162float(x[c]) * s * __bfloat162float(weight[c]));
    rstd[row] = s;
}

__global__ void rmsnorm_backward_dinp_v1_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                                const floatX* weight, const float* rstd, int N, int C) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    const floatX* d = dout + (size_t)row * C;
    floatX* dx = dinp + (size_t)row * C;
    const float s = rstd[row];
    float dnorm_norm_sum = 0.0f;
    for (int c = 0; c < C; c++)
        dnorm_norm_sum += __bfloat162float(d[c]) * __bfloat162float(weight[c]) * (__bfloat162float(x[c]) * s);
    const float dnorm_norm_mean = dnorm_norm_sum / C;
    for (int c = 0; c < C; c++) {
        const float dnorm = __bfloat162float(d[c]) * __bfloat162float(weight[c]);
        const float norm = __bfloat162float(x[c]) * s;
        dx[c] = __float2bfloat16_rn(__bfloat162float(dx[c]) + (dnorm - norm * dnorm_norm_mean) * s);
    }
}

__global__ void rmsnorm_backward_dweight_v1_kernel(float* dweight, const floatX* dout, const floatX* inp,
                                                   const float* rstd, int N, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = dweight[c];
    for (int row = 0; row < N; row++)
        dw += __bfloat162float(dout[(size_t)row * C + c]) * (__bfloat162float(inp[(size_t)row * C + c]) * rstd[row]);
    dweight[c] = dw;
}

void rmsnorm_forward_v1(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C) {
    LLMC_LAUNCH(rmsnorm_forward_v1_kernel, ceil_div(N, 128), 128, 0, 0)(out, rstd, inp, weight, N, C);
    CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward_v1(floatX* dinp, float* dweight, const floatX* dout, const floatX* inp, const floatX* weight,
                         const float* rstd, int N, int C) {
    LLMC_LAUNCH(rmsnorm_backward_dinp_v1_kernel, ceil_div(N, 128), 128, 0, 0)(dinp, dout, inp, weight, rstd, N, C);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(rmsnorm_backward_dweight_v1_kernel, ceil_div(C, 128), 128, 0, 0)(dweight, dout, inp, rstd, N, C);
    CUDA_CHECK_LAUNCH();
}

// ---- harness ----

struct RMSNormShape {
    const char* name;
    int N, C;
    bool timed;
};
const RMSNormShape RMSNORM_SHAPES[] = {
    {"tiny: N = 1, C = 8", 1, 8, false},
    {"awkward: N = 37, C = 1000", 37, 1000, false},
    {"backward's widest in registers: N = 50, C = 2048", 50, 2048, false},
    {"forward's widest in registers: N = 64, C = 4096", 64, 4096, false},
    {"streamed rows: N = 9, C = 4104", 9, 4104, false},
    {"64 KiB of shared memory, 1 warp a block: N = 5, C = 16384", 5, 16384, false},
    {"capped grid, several rows a warp: N = 4100, C = 64", 4100, 64, false},
    {"Llama 3.2 1B: N = 16384, C = 2048", 16384, 2048, true},
    {"Llama 3 8B: N = 8192, C = 4096", 8192, 4096, true},
};

// Rows of a residual stream: each its own offset and a scale 2^-5..2^2. bf16-exact.
std::vector<float> rmsnorm_random_rows(int N, int C, std::mt19937_64& rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<float> log2_scale(-5.0f, 2.0f);
    std::vector<float> out((size_t)N * C);
    for (int r = 0; r < N; r++) {
        const float scale = std::exp2(log2_scale(rng)), offset = 0.5f * scale * dist(rng);
        for (int c = 0; c < C; c++) out[(size_t)r * C + c] = bench::bf16_round(offset + scale * dist(rng));
    }
    return out;
}

// Weights as training leaves them: around 1. bf16-exact.
std::vector<float> rmsnorm_random_weight(int C, std::mt19937_64& rng) {
    std::vector<float> w = bench::random_bf16(C, rng, 0.25f);
    for (float& x : w) x = bench::bf16_round(1.0f + x);
    return w;
}

// The scratch sized for N rows must hold the partials of every call with fewer rows. Host arithmetic.
void rmsnorm_check_scratch_bound(int N, int C) {
    const size_t floats = llmc::rmsnorm_backward_scratch_floats(N, C);
    int worst = 0;
    for (int n = 1; n <= N && worst == 0; n++)
        if ((size_t)llmc::rmsnorm_backward_plan(n, C).blocks * C > floats) worst = n;
    bench::report_check("scratch(N) bounds all n <= N", worst == 0,
                        worst == 0 ? "yes" : strformat("no: n = %d overflows", worst));
}

void rmsnorm_forward_case(int version, const RMSNormShape& shape, bool check_only, std::mt19937_64& rng) {
    const int N = shape.N, C = shape.C;
    const size_t NC = (size_t)N * C;
    const std::vector<float> inp = rmsnorm_random_rows(N, C, rng), weight = rmsnorm_random_weight(C, rng);
    std::vector<float> ref_out(NC), ref_rstd(N);
    llmc::cpu::rmsnorm_forward(ref_out.data(), ref_rstd.data(), inp.data(), weight.data(), N, C);

    auto d_inp = bench::to_device_bf16(inp), d_weight = bench::to_device_bf16(weight);
    DeviceBuffer<floatX> d_out(NC, "out");
    DeviceBuffer<float> d_rstd(N, "rstd");
    auto forward = [&](float* amax) {
        if (version == 1) rmsnorm_forward_v1(d_out.get(), d_rstd.get(), d_inp.get(), d_weight.get(), N, C);
        else llmc::rmsnorm_forward(d_out.get(), d_rstd.get(), d_inp.get(), d_weight.get(), N, C, 0, amax);
    };
    auto run = [&](float* amax) {
        bench::poison(d_out.get(), NC);
        bench::poison(d_rstd.get(), N);
        forward(amax);
        CUDA_CHECK(cudaDeviceSynchronize());
        return bench::to_host(d_out.get(), NC);
    };
    const std::vector<float> out = run(nullptr);
    const std::vector<float> rstd = bench::to_host(d_rstd.get(), N);
    bench::check("rmsnorm forward out", out, ref_out, bench::BF16_TOLERANCE);
    bench::check("rmsnorm forward rstd", rstd, ref_rstd, bench::FP32_TOLERANCE);

    DeviceBuffer<floatX> d_recomputed;
    if (version == 2) {
        d_recomputed.allocate(NC, "recomputed out");
        bench::poison(d_recomputed.get(), NC);
        llmc::rmsnorm_recompute(d_recomputed.get(), d_inp.get(), d_rstd.get(), d_weight.get(), N, C, 0);
        bench::check_same_bits("rmsnorm recompute == forward", bench::to_host(d_recomputed.get(), NC), out);
        bench::check_same_bits("rmsnorm forward out, run twice", run(nullptr), out);
        bench::check_same_bits("rmsnorm forward rstd, run twice", bench::to_host(d_rstd.get(), N), rstd);
        bench::check_amax("rmsnorm forward", out, run);
    }
    if (check_only || !shape.timed) return;
    // Bytes: read inp, write out and rstd, read weight.
    const double bytes = 2.0 * NC * sizeof(floatX) + N * sizeof(float) + C * sizeof(floatX);
    bench::report_memory_bound("rmsnorm forward", bench::time_ms([&] { forward(nullptr); }), bytes);
    if (version == 2) {
        bench::report_memory_bound("rmsnorm recompute", bench::time_ms([&] {
            llmc::rmsnorm_recompute(d_recomputed.get(), d_inp.get(), d_rstd.get(), d_weight.get(), N, C, 0);
        }), bytes);
    }
}

void rmsnorm_backward_case(int version, const RMSNormShape& shape, bool check_only, std::mt19937_64& rng) {
    const int N = shape.N, C = shape.C;
    const size_t NC = (size_t)N * C;
    const std::vector<float> inp = rmsnorm_random_rows(N, C, rng), weight = rmsnorm_random_weight(C, rng);
    // Realistic statistics: the CPU forward's; both sides then use exactly these values.
    std::vector<float> out(NC), rstd(N);
    llmc::cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), N, C);
    // dout = noise + k * norm, k drawn per row, so that mean(dout * weight * norm) ~ k
    std::vector<float> dout(NC);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int r = 0; r < N; r++) {
        const float k = dist(rng);
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)r * C + c;
            dout[i] = bench::bf16_round(dist(rng) + k * inp[i] * rstd[r]);
        }
    }
    // Accumulators start from random values: dinp as the bf16 it is on the GPU.
    const std::vector<float> dinp_init = bench::random_bf16(NC, rng), dweight_init = bench::random_f32(C, rng);
    std::vector<float> ref_dinp = dinp_init, ref_dweight = dweight_init;
    llmc::cpu::rmsnorm_backward(ref_dinp.data(), ref_dweight.data(), dout.data(), inp.data(), weight.data(),
                                rstd.data(), N, C);

    auto d_inp = bench::to_device_bf16(inp), d_weight = bench::to_device_bf16(weight),
         d_dout = bench::to_device_bf16(dout);
    auto d_rstd = bench::to_device(rstd);
    DeviceBuffer<floatX> d_dinp(NC, "dinp");
    DeviceBuffer<float> d_dweight(C, "dweight");
    const size_t scratch_floats = llmc::rmsnorm_backward_scratch_floats(N, C);
    DeviceBuffer<float> d_scratch(scratch_floats, "scratch");
    auto backward = [&](float* amax) {
        if (version == 1) {
            rmsnorm_backward_v1(d_dinp.get(), d_dweight.get(), d_dout.get(), d_inp.get(), d_weight.get(),
                                d_rstd.get(), N, C);
        } else {
            llmc::rmsnorm_backward(d_dinp.get(), d_dweight.get(), d_scratch.get(), d_dout.get(), d_inp.get(),
                                   d_weight.get(), d_rstd.get(), N, C, 0, amax);
        }
    };
    auto run = [&](float* amax) {  // from the accumulators' start values, the scratch poisoned
        bench::upload_bf16(d_dinp.get(), dinp_init);
        bench::upload(d_dweight.get(), dweight_init);
        bench::poison(d_scratch.get(), scratch_floats);
        backward(amax);
        CUDA_CHECK(cudaDeviceSynchronize());
        return bench::to_host(d_dinp.get(), NC);
    };
    const std::vector<float> dinp = run(nullptr);
    const std::vector<float> dweight = bench::to_host(d_dweight.get(), C);
    bench::check("rmsnorm backward dinp (+=)", dinp, ref_dinp, bench::BF16_TOLERANCE);
    bench::check("rmsnorm backward dweight (+=)", dweight, ref_dweight, bench::FP32_TOLERANCE);
    if (version == 2) {
        bench::check_same_bits("rmsnorm backward dinp, run twice", run(nullptr), dinp);
        bench::check_same_bits("rmsnorm backward dweight, run twice", bench::to_host(d_dweight.get(), C), dweight);
        bench::check_amax("rmsnorm backward dinp", dinp, run);
    }
    if (check_only || !shape.timed) return;
    // Bytes: read dout, inp and dinp, write dinp, read rstd and weight, read and write dweight. The
    // scratch partials (version 2) are not counted: they are the kernel's own overhead.
    const double bytes = 4.0 * NC * sizeof(floatX) + N * sizeof(float) + C * sizeof(floatX) + 2.0 * C * sizeof(float);
    bench::report_memory_bound("rmsnorm backward", bench::time_ms([&] { backward(nullptr); }), bytes);
}

void run_rmsnorm(int version, bool check_only, std::mt19937_64& rng) {
    for (const RMSNormShape& shape : RMSNORM_SHAPES) {
        printf(" rmsnorm, %s\n", shape.name);
        if (bench::skip_when_emulated("N C", (double)shape.N * shape.C)) continue;
        if (version == 2) rmsnorm_check_scratch_bound(shape.N, shape.C);
        rmsnorm_forward_case(version, shape, check_only, rng);
        rmsnorm_backward_case(version, shape, check_only, rng);
    }
}

// =============================================================================================
// RoPE.

// ---- version 1: a thread per channel pair, its angle computed on the spot ----

__global__ void rope_v1_kernel(floatX* qkv, int BT, int T, int NH, int KVH, int HS, float theta,
                               const int* positions, float sign) {
    const int half = HS / 2, heads = NH + KVH;
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)BT * heads * half) return;
    const int i = (int)(index % half), h = (int)(index / half % heads), bt = (int)(index / half / heads);
    const int t = bt % T;
    const double angle = (positions ? positions[t] : t) * pow((double)theta, -2.0 * i / HS);
    const float c = (float)cos(angle), s = sign * (float)sin(angle);
    floatX* x = qkv + (size_t)bt * (NH + 2 * KVH) * HS + (size_t)h * HS;
    const float x0 = __bfloat162float(x[i]), x1 = __bfloat162float(x[i + half]);
    x[i] = __float2bfloat16_rn(x0 * c - x1 * s);
    x[i + half] = __float2bfloat16_rn(x1 * c + x0 * s);
}

void rope_v1(floatX* qkv, int B, int T, int NH, int KVH, int HS, float theta, const int* positions, float sign) {
    const size_t pairs = (size_t)B * T * (NH + KVH) * (HS / 2);
    LLMC_LAUNCH(rope_v1_kernel, (unsigned)ceil_div(pairs, (size_t)256), 256, 0, 0)(qkv, B * T, T, NH, KVH, HS, theta,
                                                                                   positions, sign);
    CUDA_CHECK_LAUNCH();
}

// ---- harness ----

struct RopeShape {
    const char* name;
    int B, T, NH, KVH, HS;
    bool context_rank;  // positions: a context-parallel rank's global ones (else 0..T-1)
    bool timed;
};
const RopeShape ROPE_SHAPES[] = {
    {"tiny: B 1, T 1, NH 1, KVH 1, HS 16", 1, 1, 1, 1, 16, false, false},
    {"grouped 4:1, HS 64, a context rank's positions: B 2, T 32, NH 8, KVH 2", 2, 32, 8, 2, 64, true, false},
    {"grouped 2:1, HS 128: B 3, T 17, NH 4, KVH 2", 3, 17, 4, 2, 128, false, false},
    {"multi-head (KVH = NH), HS 32: B 2, T 9, NH 3, KVH 3", 2, 9, 3, 3, 32, false, false},
    {"Llama 3.2 1B: B 4, T 2048, NH 32, KVH 8, HS 64", 4, 2048, 32, 8, 64, false, true},
    {"Llama 3 8B: B 4, T 2048, NH 32, KVH 8, HS 128", 4, 2048, 32, 8, 128, false, true},
};

// The q and k channels of every row (what RoPE rotates), or the v channels (what it must not touch).
std::vector<float> rope_part(const std::vector<float>& qkv, const RopeShape& s, bool v_part) {
    const size_t row = (size_t)(s.NH + 2 * s.KVH) * s.HS, qk = (size_t)(s.NH + s.KVH) * s.HS;
    std::vector<float> out;
    for (size_t r = 0; r < (size_t)s.B * s.T; r++) {
        const float* x = qkv.data() + r * row;
        if (v_part) out.insert(out.end(), x + qk, x + row);
        else out.insert(out.end(), x, x + qk);
    }
    return out;
}

void run_rope_shape(int version, const RopeShape& shape, bool check_only, std::mt19937_64& rng) {
    const int B = shape.B, T = shape.T, NH = shape.NH, KVH = shape.KVH, HS = shape.HS;
    const float theta = llmc::cpu::LLAMA3_ROPE_THETA;
    const size_t n = (size_t)B * T * (NH + 2 * KVH) * HS;
    std::vector<int> positions;
    if (shape.context_rank) {
        // rank 1 of a 4096-way context group over one sequence of 131072: chunks 1 and 8190 of 16
        const llmc::ContextSplit split{4096, 1, 131072};
        if (split.local_len() != T) llmc::fail("rope: the context rank's shape needs T = 32");
        for (int j = 0; j < T; j++) positions.push_back(split.global_position(j));
    }
    const int* host_positions = positions.empty() ? nullptr : positions.data();
    DeviceBuffer<int> d_positions;
    if (!positions.empty()) d_positions = bench::to_device(positions);

    // v2's table, checked against the CPU's: its angles in double, both sides
    DeviceBuffer<float> d_table((size_t)T * HS, "rope table");
    if (version == 2) {
        std::vector<float> ref_table((size_t)T * HS);
        llmc::cpu::rope_table(ref_table.data(), T, HS, theta, host_positions);
        bench::poison(d_table.get(), (size_t)T * HS);
        llmc::rope_table(d_table.get(), T, HS, theta, d_positions.get(), 0);
        bench::check("rope table (cos | sin)", bench::to_host(d_table.get(), (size_t)T * HS), ref_table,
                     bench::FP32_TOLERANCE);
    }
    auto rotate = [&](floatX* x, bool backward) {
        if (version == 1) rope_v1(x, B, T, NH, KVH, HS, theta, d_positions.get(), backward ? -1.0f : 1.0f);
        else if (backward) llmc::rope_backward(x, d_table.get(), B, T, NH, KVH, HS, 0);
        else llmc::rope_forward(x, d_table.get(), B, T, NH, KVH, HS, 0);
    };

    // Forward on qkv and backward on dqkv, each in place from a fresh copy of its input.
    const std::vector<float> inputs[2] = {bench::random_bf16(n, rng), bench::random_bf16(n, rng)};
    DeviceBuffer<floatX> d_x(n, "qkv");
    for (int backward = 0; backward <= 1; backward++) {
        const std::vector<float>& input = inputs[backward];
        std::vector<float> ref = input;
        if (backward) llmc::cpu::rope_backward(ref.data(), B, T, NH, KVH, HS, theta, host_positions);
        else llmc::cpu::rope_forward(ref.data(), B, T, NH, KVH, HS, theta, host_positions);
        auto run = [&] {
            bench::upload_bf16(d_x.get(), input);
            rotate(d_x.get(), backward);
            CUDA_CHECK(cudaDeviceSynchronize());
            return bench::to_host(d_x.get(), n);
        };
        const std::vector<float> got = run();
        const char* dir = backward ? "rope backward" : "rope forward";
        const std::vector<float> got_qk = rope_part(got, shape, false), ref_qk = rope_part(ref, shape, false);
        bench::check(strformat("%s q, k", dir).c_str(), got_qk, ref_qk, bench::BF16_TOLERANCE);
        check_each(strformat("%s q, k, each", dir).c_str(), got_qk, ref_qk);
        bench::check_same_bits(strformat("%s v untouched", dir).c_str(), rope_part(got, shape, true),
                               rope_part(input, shape, true));
        if (version == 2) bench::check_same_bits(strformat("%s, run twice", dir).c_str(), run(), got);
    }
    if (check_only || !shape.timed) return;
    // Bytes: the q and k heads read and written (v is not touched), the table read once.
    const double bytes = 2.0 * B * T * (NH + KVH) * HS * sizeof(floatX) + (double)T * HS * sizeof(float);
    bench::report_memory_bound("rope forward (in place)", bench::time_ms([&] { rotate(d_x.get(), false); }), bytes);
    bench::report_memory_bound("rope backward (in place)", bench::time_ms([&] { rotate(d_x.get(), true); }), bytes);
    if (version == 2) {  // once per step (or per run): not part of each layer's cost
        bench::report_memory_bound("rope table", bench::time_ms([&] {
            llmc::rope_table(d_table.get(), T, HS, theta, d_positions.get(), 0);
        }), (double)T * HS * sizeof(float));
    }
}

void run_rope(int version, bool check_only, std::mt19937_64& rng) {
    for (const RopeShape& shape : ROPE_SHAPES) {
        printf(" rope, %s\n", shape.name);
        const double elements = (double)shape.B * shape.T * (shape.NH + 2 * shape.KVH) * shape.HS;
        if (bench::skip_when_emulated("B T (NH + 2 KVH) HS", elements)) continue;
        run_rope_shape(version, shape, check_only, rng);
    }
}

// =============================================================================================
// SwiGLU.

// ---- version 1: a thread per output element ----

__global__ void swiglu_forward_v1_kernel(floatX* out, const floatX* gate_up, int N, int H) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * H) return;
    const size_t row = index / H, j = index % H;
    const float g = __bfloat162float(gate_up[row * 2 * H + j]), u = __bfloat162float(gate_up[row * 2 * H + H + j]);
    out[index] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
}

__global__ void swiglu_backward_v1_kernel(floatX* dgate_up, const floatX* dout, const floatX* gate_up, int N,
                                          int H) {
    const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (size_t)N * H) return;
    const size_t row = index / H, j = index % H;
    const float g = __bfloat162float(gate_up[row * 2 * H + j]), u = __bfloat162float(gate_up[row * 2 * H + H + j]);
    const float d = __bfloat162float(dout[index]), s = 1.0f / (1.0f + expf(-g));
    dgate_up[row * 2 * H + j] = __float2bfloat16_rn(d * u * s * (1.0f + g * (1.0f - s)));
    dgate_up[row * 2 * H + H + j] = __float2bfloat16_rn(d * g * s);
}

void swiglu_forward_v1(floatX* out, const floatX* gate_up, int N, int H) {
    const unsigned blocks = (unsigned)ceil_div((size_t)N * H, (size_t)256);
    LLMC_LAUNCH(swiglu_forward_v1_kernel, blocks, 256, 0, 0)(out, gate_up, N, H);
    CUDA_CHECK_LAUNCH();
}

void swiglu_backward_v1(floatX* dgate_up, const floatX* dout, const floatX* gate_up, int N, int H) {
    const unsigned blocks = (unsigned)ceil_div((size_t)N * H, (size_t)256);
    LLMC_LAUNCH(swiglu_backward_v1_kernel, blocks, 256, 0, 0)(dgate_up, dout, gate_up, N, H);
    CUDA_CHECK_LAUNCH();
}

// ---- harness ----

struct SwiGLUShape {
    const char* name;
    int N, H;
    bool timed;
};
const SwiGLUShape SWIGLU_SHAPES[] = {
    {"tiny: N 1, H 8", 1, 8, false},
    {"awkward: N 37, H 1000", 37, 1000, false},
    {"Llama-wide rows: N 16, H 5632", 16, 5632, false},
    {"TinyLlama 1.1B: N 8192, H 5632", 8192, 5632, true},
    {"Llama 3 8B: N 8192, H 14336", 8192, 14336, true},
};

// The [gate | up] halves of rows of 2H.
std::vector<float> swiglu_half(const std::vector<float>& rows, int N, int H, int half) {
    std::vector<float> out;
    out.reserve((size_t)N * H);
    for (size_t r = 0; r < (size_t)N; r++) {
        const float* x = rows.data() + r * 2 * H + (size_t)half * H;
        out.insert(out.end(), x, x + H);
    }
    return out;
}

void run_swiglu_shape(int version, const SwiGLUShape& shape, bool check_only, std::mt19937_64& rng) {
    const int N = shape.N, H = shape.H;
    const size_t NH = (size_t)N * H;
    // gate N(0, 2^2), up N(0, 1); every 97th gate saturates the sigmoid: at 20 (s = 1 in fp32) or
    // at -100 (exp(100) overflows, s = 0, out = -0). Not +100: outputs of 100 |up| would outweigh
    // every other element in the per-tensor error.
    std::vector<float> gate_up = bench::random_bf16(2 * NH, rng);
    for (int r = 0; r < N; r++) {
        for (int j = 0; j < H; j++) {
            float& g = gate_up[(size_t)r * 2 * H + j];
            g = bench::bf16_round(2.0f * g);
            if ((r * H + j) % 97 == 13) g = (j % 2) ? 20.0f : -100.0f;
        }
    }
    const std::vector<float> dout = bench::random_bf16(NH, rng);
    std::vector<float> ref_out(NH), ref_dgate_up(2 * NH);
    llmc::cpu::swiglu_forward(ref_out.data(), gate_up.data(), N, H);
    llmc::cpu::swiglu_backward(ref_dgate_up.data(), dout.data(), gate_up.data(), N, H);

    auto d_gate_up = bench::to_device_bf16(gate_up), d_dout = bench::to_device_bf16(dout);
    DeviceBuffer<floatX> d_out(NH, "out"), d_dgate_up(2 * NH, "dgate_up");
    auto forward = [&](float* amax) {
        if (version == 1) swiglu_forward_v1(d_out.get(), d_gate_up.get(), N, H);
        else llmc::swiglu_forward(d_out.get(), d_gate_up.get(), N, H, 0, amax);
    };
    auto backward = [&](floatX* dgate_up, float* amax) {
        if (version == 1) swiglu_backward_v1(dgate_up, d_dout.get(), d_gate_up.get(), N, H);
        else llmc::swiglu_backward(dgate_up, d_dout.get(), d_gate_up.get(), N, H, 0, amax);
    };
    auto run_forward = [&](float* amax) {
        bench::poison(d_out.get(), NH);
        forward(amax);
        CUDA_CHECK(cudaDeviceSynchronize());
        return bench::to_host(d_out.get(), NH);
    };
    auto run_backward = [&](float* amax) {
        bench::poison(d_dgate_up.get(), 2 * NH);
        backward(d_dgate_up.get(), amax);
        CUDA_CHECK(cudaDeviceSynchronize());
        return bench::to_host(d_dgate_up.get(), 2 * NH);
    };
    const std::vector<float> out = run_forward(nullptr);
    bench::check("swiglu forward", out, ref_out, bench::BF16_TOLERANCE);
    const std::vector<float> dgate_up = run_backward(nullptr);
    bench::check("swiglu backward dgate", swiglu_half(dgate_up, N, H, 0), swiglu_half(ref_dgate_up, N, H, 0),
                 bench::BF16_TOLERANCE);
    bench::check("swiglu backward dup", swiglu_half(dgate_up, N, H, 1), swiglu_half(ref_dgate_up, N, H, 1),
                 bench::BF16_TOLERANCE);
    if (version == 2) {
        bench::check_same_bits("swiglu forward, run twice", run_forward(nullptr), out);
        bench::check_same_bits("swiglu backward, run twice", run_backward(nullptr), dgate_up);
        // in place: the gradient over a copy of gate_up
        DeviceBuffer<floatX> d_in_place = bench::to_device_bf16(gate_up);
        llmc::swiglu_backward(d_in_place.get(), d_dout.get(), d_in_place.get(), N, H, 0);
        bench::check_same_bits("swiglu backward in place", bench::to_host(d_in_place.get(), 2 * NH), dgate_up);
        bench::check_amax("swiglu forward", out, run_forward);
        bench::check_amax("swiglu backward", dgate_up, run_backward);
    }
    if (check_only || !shape.timed) return;
    // Bytes: forward reads gate and up and writes out (6 NH); backward reads gate, up and dout and
    // writes dgate and dup (10 NH).
    bench::report_memory_bound("swiglu forward", bench::time_ms([&] { forward(nullptr); }), 6.0 * NH);
    bench::report_memory_bound("swiglu backward", bench::time_ms([&] { backward(d_dgate_up.get(), nullptr); }),
                               10.0 * NH);
}

void run_swiglu(int version, bool check_only, std::mt19937_64& rng) {
    for (const SwiGLUShape& shape : SWIGLU_SHAPES) {
        printf(" swiglu, %s\n", shape.name);
        if (bench::skip_when_emulated("N H", (double)shape.N * shape.H)) continue;
        run_swiglu_shape(version, shape, check_only, rng);
    }
}

// =============================================================================================

struct Layer {
    const char* name;
    void (*run)(int version, bool check_only, std::mt19937_64& rng);
};
const Layer LAYERS[] = {{"rmsnorm", run_rmsnorm}, {"rope", run_rope}, {"swiglu", run_swiglu}};
constexpr int NUM_LAYERS = sizeof(LAYERS) / sizeof(LAYERS[0]);

int main(int argc, char** argv) {
    // --layer NAME is this workbench's own option; the rest go to bench::start as every workbench's.
    std::string layer = "all";
    std::vector<char*> rest = {argv[0]};
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--layer") == 0 && i + 1 < argc) layer = argv[++i];
        else rest.push_back(argv[i]);
    }
    bool known = layer == "all";
    for (const Layer& l : LAYERS) known = known || layer == l.name;
    if (!known) {
        fprintf(stderr, "%s: --layer takes rmsnorm, rope, swiglu or all; got '%s'\n", argv[0], layer.c_str());
        return 2;
    }
    const bench::Options opts = bench::start((int)rest.size(), rest.data(), NUM_VERSIONS);
    return bench::run_and_finish(argv[0], [&] {
        for (int version = 1; version <= NUM_VERSIONS; version++) {
            if (!opts.runs(version)) continue;
            printf("version %d: %s\n", version, VERSION_NAMES[version]);
            for (int l = 0; l < NUM_LAYERS; l++) {
                if (layer != "all" && layer != LAYERS[l].name) continue;
                // one stream of inputs per (version, layer): `./llama_layers 2 --layer rope --seed N`
                // repeats that part of a full run
                std::mt19937_64 rng(opts.seed + 16 * version + l);
                LAYERS[l].run(version, opts.check_only, rng);
            }
        }
    });
}
