// global_norm.cu: workbench for the deterministic sum of squares (llmc/global_norm.cuh) behind
// global gradient-norm clipping.
//
//   v1  fixed grid of 256 blocks x 64 threads, scalar loads, shared-memory tree per block, and one
//       thread adding the block partials in double
//   v2  llmc::global_norm_squared: fixed grid of 1024 x 256, 16-byte loads after a scalar head,
//       block_reduce_sum, and a one-block double tree over the partials
//
// Checked against llmc::sum_squares (double) on the GPT-2 124M gradient (124,475,904 floats), on the
// same buffer cut into ranges that start off a 16-byte boundary and are accumulated in sequence
// (accumulate = true), and on tiny ranges (0, 1, 2 and 7 elements). Tolerance FP32_TOLERANCE: each
// thread sums its ~120-500 squares in fp32 (relative error ~1e-6 in practice), all later sums are
// exact enough (fp32 tree, then double). Determinism: a second run must give the same bits.
// Floor: read 4 bytes per element. Emulated (dev/emu/), the 124M cases are skipped
// (bench::skip_when_emulated) and unaligned ranges over 3 * 2^20 + 6 floats checked instead.
#include "dev/cuda/common.cuh"
#include "llmc/cpu/adamw.h"
#include "llmc/kernels/global_norm.cuh"

using llmc::floatX;

// ---- v1: naive block size, scalar loads ----

constexpr int V1_BLOCKS = 256, V1_BLOCK_SIZE = 64;

__global__ void global_norm_v1_partials(float* partials, const float* x, size_t n) {
    __shared__ float sums[V1_BLOCK_SIZE];
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        sum = __fmaf_rn(x[i], x[i], sum);
    sums[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = V1_BLOCK_SIZE / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

__global__ void global_norm_v1_final(double* out, const float* partials, int num_partials, bool accumulate) {
    double sum = 0.0;
    for (int i = 0; i < num_partials; i++) sum += (double)partials[i];
    *out = accumulate ? *out + sum : sum;
}

void global_norm_v1(double* out, float* partials, const float* x, size_t n, bool accumulate, cudaStream_t stream) {
    LLMC_LAUNCH(global_norm_v1_partials, V1_BLOCKS, V1_BLOCK_SIZE, 0, stream)(partials, x, n);
    CUDA_CHECK_LAUNCH();
    LLMC_LAUNCH(global_norm_v1_final, 1, 1, 0, stream)(out, partials, V1_BLOCKS, accumulate);
    CUDA_CHECK_LAUNCH();
}

// ---- versions ----

using NormFn = void (*)(double*, float*, const float*, size_t, bool, cudaStream_t);
struct Version {
    const char* name;
    NormFn fn;
    size_t partials;
};
const Version VERSIONS[] = {
    {"v1 naive two-pass", global_norm_v1, (size_t)V1_BLOCKS},
    {"v2 llmc::global_norm_squared", llmc::global_norm_squared, llmc::global_norm_partials_count()},
};
constexpr int NUM_VERSIONS = sizeof(VERSIONS) / sizeof(VERSIONS[0]);

struct Range {
    size_t begin, end;
};
struct Case {
    const char* name;
    size_t n;                   // buffer size
    std::vector<Range> ranges;  // summed in sequence: the first with accumulate = false, then +=
    bool timed;
};

// Sums the case's ranges on the device into one double (partials and result poisoned first).
double run_on_device(const Version& version, const Case& c, const float* d_x) {
    bench::DeviceBuffer<double> d_out(1, "sum of squares");
    bench::DeviceBuffer<float> d_partials(version.partials, "partials");
    bench::poison(d_out.get(), 1);
    bench::poison(d_partials.get(), version.partials);
    for (size_t r = 0; r < c.ranges.size(); r++) {
        const Range& range = c.ranges[r];
        version.fn(d_out.get(), d_partials.get(), d_x + range.begin, range.end - range.begin, r > 0, 0);
    }
    double out = 0.0;
    CUDA_CHECK(cudaMemcpy(&out, d_out.get(), sizeof(double), cudaMemcpyDeviceToHost));
    return out;
}

void run_case(const Version& version, const Case& c, const bench::Options& opt, std::mt19937_64& rng) {
    printf("%s, %s\n", version.name, c.name);
    if (bench::skip_when_emulated("n", (double)c.n)) return;
    const std::vector<float> x = bench::random_f32(c.n, rng, 1e-3f);
    double ref = 0.0;
    for (const Range& range : c.ranges) ref += llmc::sum_squares(x.data(), range.begin, range.end);

    bench::DeviceBuffer<float> d_x = bench::to_device(x);
    const double gpu = run_on_device(version, c, d_x.get());
    bench::check("sum of squares", {(float)gpu}, {(float)ref}, bench::FP32_TOLERANCE);
    printf("       gpu %.17g, cpu %.17g, relative difference %.3e\n", gpu, ref,
           ref != 0.0 ? (gpu - ref) / ref : gpu);

    const double again = run_on_device(version, c, d_x.get());
    bench::check_same_bits("sum of squares, run twice", std::vector<double>{again}, std::vector<double>{gpu});

    if (opt.check_only || !c.timed) return;
    bench::DeviceBuffer<double> d_out(1, "sum of squares");
    bench::DeviceBuffer<float> d_partials(version.partials, "partials");
    const float ms = bench::time_ms([&] { version.fn(d_out.get(), d_partials.get(), d_x.get(), c.n, false, 0); });
    bench::report_memory_bound(c.name, ms, 4.0 * c.n);
}

int main(int argc, char** argv) {
    const bench::Options opt = bench::start(argc, argv, NUM_VERSIONS);
    return bench::run_and_finish(argv[0], [&] {
        const size_t gpt2 = 124475904;
        std::vector<Case> cases = {
            {"GPT-2 124M gradient", gpt2, {{0, gpt2}}, true},
            {"GPT-2 124M in 3 unaligned ranges", gpt2, {{0, 3}, {3, gpt2 - 2}, {gpt2 - 2, gpt2}}, false},
            {"1001 floats, 1 + 1000 unaligned", 1001, {{0, 1}, {1, 1001}}, false},
            {"tiny ranges 0, 1, 2, 7", 16, {{0, 0}, {1, 2}, {3, 5}, {9, 16}}, false},
        };
        // Emulated only, where the GPT-2 cases are skipped: unaligned ranges over several grid strides
        // (v2 reads 2^20 floats a stride, v1 2^14).
        const size_t strides = 3 * ((size_t)1 << 20) + 6;
        if (bench::EMULATED)
            cases.push_back({"3 * 2^20 + 6 floats in 3 unaligned ranges", strides,
                             {{0, 3}, {3, strides - 2}, {strides - 2, strides}}, false});
        for (int v = 1; v <= NUM_VERSIONS; v++) {
            if (!opt.runs(v)) continue;
            std::mt19937_64 rng(opt.seed);  // per version, so `global_norm 2 --seed N` sees the same inputs
            for (const Case& c : cases) run_case(VERSIONS[v - 1], c, opt, rng);
        }
    });
}
