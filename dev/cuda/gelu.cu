// dev/cuda/gelu.cu: GELU (tanh form) forward and backward on bf16 tensors, two ways:
//
//   1  one element per thread, 2-byte loads and stores
//   2  llmc/gelu.cuh: eight elements per thread through 16-byte loads and stores, a scalar tail;
//      optionally measuring the output's amax for FP8's current scaling (then a grid of at most 16384
//      blocks, each thread taking a vector a grid apart: timed both ways)
//
//   ./gelu [version] [--check] [--seed N]
//
// Checked against cpu::gelu_forward / cpu::gelu_backward (bf16 outputs: BF16_TOLERANCE) on the
// GPT-2 124M and 1.5B fc activations (BT 8192 x 4C: 25.2M and 52.4M elements) and an odd length
// (7403: three elements past the last 8-wide group, which hold the largest output); version 2 runs
// twice and must repeat its bits, and with an amax output gives the same bits and their exact amax.
// Inputs are N(0, 2^2), so both tails of GELU are exercised. Timed on the 124M shape against DRAM bandwidth:
// the forward reads and writes n bf16 values (4n bytes), the backward reads the gradient and the
// pre-activation and writes the gradient back (6n bytes). Emulated (dev/emu/), the fc shapes are
// skipped (bench::skip_when_emulated).
#include <algorithm>
#include <vector>

#include "dev/cuda/common.cuh"
#include "llmc/kernels/gelu.cuh"
#include "llmc/cpu/ops.h"

using bench::DeviceBuffer;
using llmc::ceil_div;
using llmc::floatX;
using llmc::strformat;

constexpr int NUM_VERSIONS = 2;
const char* const VERSION_NAMES[NUM_VERSIONS + 1] = {"", "scalar, one element per thread",
                                                     "llmc/gelu.cuh: 16-byte vectors, eight elements per thread"};

// ---------------------------------------------------------------------------------------------
// Version 1.

__global__ void gelu_forward_scalar_kernel(floatX* out, const floatX* inp, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(llmc::gelu_value(__bfloat162float(inp[i])));
}

__global__ void gelu_backward_scalar_kernel(floatX* d_in_out, const floatX* pre_gelu, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float d = __bfloat162float(d_in_out[i]);
        d_in_out[i] = __float2bfloat16_rn(d * llmc::gelu_derivative(__bfloat162float(pre_gelu[i])));
    }
}

constexpr int SCALAR_BLOCK = 256;

void gelu_forward_v1(floatX* out, const floatX* inp, size_t n) {
    LLMC_LAUNCH(gelu_forward_scalar_kernel, (unsigned)ceil_div(n, (size_t)SCALAR_BLOCK), SCALAR_BLOCK, 0, 0)(out, inp, n);
    CUDA_CHECK_LAUNCH();
}

void gelu_backward_v1(floatX* d_in_out, const floatX* pre_gelu, size_t n) {
    LLMC_LAUNCH(gelu_backward_scalar_kernel, (unsigned)ceil_div(n, (size_t)SCALAR_BLOCK), SCALAR_BLOCK, 0, 0)(d_in_out, pre_gelu, n);
    CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------

void forward(int version, floatX* out, const floatX* inp, size_t n) {
    if (version == 1) gelu_forward_v1(out, inp, n);
    else llmc::gelu_forward(out, inp, n, 0);
}

void backward(int version, floatX* d_in_out, const floatX* pre_gelu, size_t n) {
    if (version == 1) gelu_backward_v1(d_in_out, pre_gelu, n);
    else llmc::gelu_backward_inplace(d_in_out, pre_gelu, n, 0);
}

struct Shape {
    const char* name;
    size_t n;
};
// 1.5B's fc is the one past 16384 blocks of 2048 elements, where measuring an amax makes each thread
// take several vectors (not emulated: too large)
const Shape CHECK_SHAPES[] = {
    {"odd", 7403}, {"124M fc", (size_t)8 * 1024 * 4 * 768}, {"1.5B fc", (size_t)8 * 1024 * 4 * 1600}};
constexpr size_t TIMING_N = (size_t)8 * 1024 * 4 * 768;

void check_shape(int version, const Shape& s, std::mt19937_64& rng) {
    const size_t n = s.n;
    printf(" %s: n %zu\n", s.name, n);
    if (bench::skip_when_emulated("n", (double)n)) return;
    std::vector<float> x = bench::random_bf16(n, rng, 2.0f);
    std::vector<float> d = bench::random_bf16(n, rng);
    x.back() = 7.5f, d.back() = 9.0f;  // the largest output, forward and backward, in the ragged tail
    x[0] = -3.0f, d[0] = 12.0f;         // the largest incoming gradient, whose result is small (GELU'(-3) ~ -0.01)
    std::vector<float> ref_out(n), ref_d = d;
    llmc::cpu::gelu_forward(ref_out.data(), x.data(), n);
    llmc::cpu::gelu_backward(ref_d.data(), x.data(), n);

    DeviceBuffer<floatX> d_x = bench::to_device_bf16(x), d_out(n, "out");
    auto run_forward = [&] {
        bench::poison(d_out.get(), n);
        forward(version, d_out.get(), d_x.get(), n);
        return bench::to_host(d_out.get(), n);
    };
    // The backward works in place: each run starts from a fresh copy of the incoming gradient.
    DeviceBuffer<floatX> d_incoming = bench::to_device_bf16(d), d_grad(n, "gradient");
    auto run_backward = [&] {
        CUDA_CHECK(cudaMemcpy(d_grad.get(), d_incoming.get(), n * sizeof(floatX), cudaMemcpyDeviceToDevice));
        backward(version, d_grad.get(), d_x.get(), n);
        return bench::to_host(d_grad.get(), n);
    };
    const std::vector<float> out = run_forward();
    bench::check("forward", out, ref_out, bench::BF16_TOLERANCE);
    const std::vector<float> grad = run_backward();
    bench::check("backward", grad, ref_d, bench::BF16_TOLERANCE);
    // In place, a skipped element keeps its incoming value instead of a poison, and a few of them
    // among n move the whole-tensor error by less than the tolerance: the last full vector and the
    // ragged tail are checked on their own.
    const size_t last = std::min(n, (size_t)llmc::x128::size + n % llmc::x128::size);
    bench::check("backward, last elements", std::vector<float>(grad.end() - last, grad.end()),
                 std::vector<float>(ref_d.end() - last, ref_d.end()), bench::BF16_TOLERANCE);
    if (version == NUM_VERSIONS) {
        // The widened copies compare the bf16 bits: widening keeps every bit.
        bench::check_same_bits("forward, run twice", out, run_forward());
        bench::check_same_bits("backward, run twice", grad, run_backward());
        // FP8's current scaling: given `amax`, the same outputs, and their largest |value| measured
        bench::check_amax("forward", out, [&](float* amax) {
            bench::poison(d_out.get(), n);
            llmc::gelu_forward(d_out.get(), d_x.get(), n, 0, amax);
            return bench::to_host(d_out.get(), n);
        });
        bench::check_amax("backward", grad, [&](float* amax) {
            CUDA_CHECK(cudaMemcpy(d_grad.get(), d_incoming.get(), n * sizeof(floatX), cudaMemcpyDeviceToDevice));
            llmc::gelu_backward_inplace(d_grad.get(), d_x.get(), n, 0, amax);
            return bench::to_host(d_grad.get(), n);
        });
    }
}

void time_version(int version, std::mt19937_64& rng) {
    const size_t n = TIMING_N;
    printf(" 124M fc: n %zu\n", n);
    DeviceBuffer<floatX> x = bench::to_device_bf16(bench::random_bf16(n, rng, 2.0f));
    DeviceBuffer<floatX> grad = bench::to_device_bf16(bench::random_bf16(n, rng));
    DeviceBuffer<floatX> out(n, "out");
    const float forward_ms = bench::time_ms([&] { forward(version, out.get(), x.get(), n); });
    bench::report_memory_bound("forward", forward_ms, 4.0 * n);
    // Repeated in place, the gradient shrinks or grows by GELU' each run; the timing does not care.
    const float backward_ms = bench::time_ms([&] { backward(version, grad.get(), x.get(), n); });
    bench::report_memory_bound("backward (in place)", backward_ms, 6.0 * n);
    if (version != NUM_VERSIONS) return;
    // FP8's current scaling: the same with the output's amax measured (a grid of at most 16384 blocks)
    DeviceBuffer<float> amax(1, "amax");
    bench::report_memory_bound("forward, measuring amax", bench::time_ms([&] {
        llmc::gelu_forward(out.get(), x.get(), n, 0, amax.get());
    }), 4.0 * n);
    bench::report_memory_bound("backward (in place), measuring amax", bench::time_ms([&] {
        llmc::gelu_backward_inplace(grad.get(), x.get(), n, 0, amax.get());
    }), 6.0 * n);
}

int main(int argc, char** argv) {
    const bench::Options opts = bench::start(argc, argv, NUM_VERSIONS);
    return bench::run_and_finish(argv[0], [&] {
        for (int version = 1; version <= NUM_VERSIONS; version++) {
            if (!opts.runs(version)) continue;
            std::mt19937_64 rng(opts.seed + version);  // `./gelu 2 --seed N` repeats version 2 of a full run
            printf("version %d: %s\n", version, VERSION_NAMES[version]);
            for (const Shape& s : CHECK_SHAPES) check_shape(version, s, rng);
            if (!opts.check_only) time_version(version, rng);
        }
    });
}
