// adamw.cu: workbench for the AdamW step (llmc/adamw.cuh): fp32 master weights, m and v updated as
// the CPU reference does, bf16 params stochastically rounded from the new master weights.
//
//   v1  one thread per element, scalar loads and stores (the baseline)
//   v2  llmc::adamw_update: 16-byte vectors for the fp32 arrays, 8-byte stores of 4 bf16 params,
//       scalar head (up to the first 16-byte boundary) and tail
//
// Checked against llmc::adamw_contiguous on the GPT-2 124M token embedding (50304 x 768, the largest
// tensor), on a range cut into segments that start off a 16-byte boundary (with their own weight
// decay and index offset, as the model calls it per tensor), and on pointers whose alignments
// disagree (all-scalar fallback). master, m and v use FP32_TOLERANCE, and the number of elements
// that are not bitwise equal is printed: the GPU spells out every IEEE operation in the CPU's order,
// so it should be 0. params are checked structurally: each is one of the two bf16 neighbours of its
// master value, the same seed gives the same bits, another seed other bits, and over 2^22 equal
// master values the mean of the params is within 5 standard errors of the master value.
// Floor: per element, read grad, master, m, v (16 bytes) and write master, m, v (12) and param (2).
// Emulated (dev/emu/), the 124M case is skipped (bench::skip_when_emulated); the segments, the
// misaligned pointers and the 2^22 unbiasedness draws still run.
#include <bit>

#include "dev/cuda/common.cuh"
#include "llmc/kernels/adamw.cuh"
#include "llmc/cpu/adamw.h"

using llmc::floatX;

// ---- v1: one thread per element ----

__global__ void adamw_v1_kernel(floatX* params, float* master, const float* grads, float* m, float* v, size_t n,
                                llmc::AdamWStep s) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float mi = m[i], vi = v[i];
    const float p = llmc::adamw_element(master[i], grads[i], mi, vi, s);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    params[i] = llmc::stochastic_round_bf16(p, llmc::random_bits(s.seed, s.index_offset + i));
}

void adamw_v1(floatX* params, float* master, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
              float beta2, float eps, float weight_decay, int step, float grad_multiplier, uint32_t seed,
              uint64_t index_offset, cudaStream_t stream) {
    const llmc::AdamWStep s =
        llmc::make_adamw_step(lr, beta1, beta2, eps, weight_decay, step, grad_multiplier, seed, index_offset);
    if (n == 0) return;
    const int block_size = 256;
    LLMC_LAUNCH(adamw_v1_kernel, (unsigned)llmc::ceil_div(n, (size_t)block_size), block_size, 0, stream)(params, master, grads,
                                                                                                 m, v, n, s);
    CUDA_CHECK_LAUNCH();
}

// ---- versions ----

using AdamWFn = void (*)(floatX*, float*, const float*, float*, float*, size_t, float, float, float, float, float, int,
                         float, uint32_t, uint64_t, cudaStream_t);
struct Version {
    const char* name;
    AdamWFn fn;
};
const Version VERSIONS[] = {
    {"v1 one thread per element", adamw_v1},
    {"v2 llmc::adamw_update", llmc::adamw_update},
};
constexpr int NUM_VERSIONS = sizeof(VERSIONS) / sizeof(VERSIONS[0]);

// The hyperparameters of every call: step 7 makes the bias corrections nontrivial, the multiplier
// stands for gradient clipping.
const llmc::AdamWConfig CONFIG{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
constexpr int STEP = 7;
constexpr float GRAD_MULTIPLIER = 0.75f;

struct Segment {
    size_t begin, end;
    bool decayed;
};
struct Case {
    const char* name;
    size_t n;
    std::vector<Segment> segments;  // cover [0, n) in order
    size_t param_shift;             // params start this many elements after the fp32 arrays' phase
    bool timed;
};

struct State {
    std::vector<float> params, master, m, v;  // params: bf16 values widened
};

// Runs every segment of the case on the device from `initial` with `seed`; returns the new state.
State run_on_device(const Version& version, const Case& c, const State& initial, const std::vector<float>& grads,
                    uint32_t seed) {
    bench::DeviceBuffer<float> d_master = bench::to_device(initial.master), d_grads = bench::to_device(grads);
    bench::DeviceBuffer<float> d_m = bench::to_device(initial.m), d_v = bench::to_device(initial.v);
    bench::DeviceBuffer<floatX> d_params(c.n + c.param_shift, "params");
    bench::poison(d_params.get(), c.n + c.param_shift);
    floatX* params = d_params.get() + c.param_shift;
    for (const Segment& s : c.segments) {
        const float decay = s.decayed ? CONFIG.weight_decay : 0.0f;
        version.fn(params + s.begin, d_master.get() + s.begin, d_grads.get() + s.begin, d_m.get() + s.begin,
                   d_v.get() + s.begin, s.end - s.begin, CONFIG.lr, CONFIG.beta1, CONFIG.beta2, CONFIG.eps, decay,
                   STEP, GRAD_MULTIPLIER, seed, s.begin, 0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return {bench::to_host(params, c.n), bench::to_host(d_master.get(), c.n), bench::to_host(d_m.get(), c.n),
            bench::to_host(d_v.get(), c.n)};
}

// The opposite of bench::check_same_bits: another seed must round some params the other way.
void check_some_bits_differ(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
    const size_t different = bench::count_different_bits(a, b);
    bench::report_check(what, different > 0,
                        llmc::strformat("%zu of %zu elements differ (want some)", different, a.size()));
}

// Each param must be the master value with its low 16 bits dropped (rounded toward zero), or that
// plus one bf16 ulp when something was dropped.
void check_stochastic_neighbours(const std::vector<float>& params, const std::vector<float>& master) {
    size_t bad = 0;
    for (size_t i = 0; i < params.size(); i++) {
        const uint32_t exact = std::bit_cast<uint32_t>(master[i]), p = std::bit_cast<uint32_t>(params[i]);
        const uint32_t down = exact & 0xffff0000U, up = down + 0x10000U;
        if (p != down && !(exact != down && p == up)) bad++;
    }
    bench::report_check("params are neighbours", bad == 0,
                        llmc::strformat("%zu of %zu are not a bf16 neighbour of the master value", bad, params.size()));
}

void run_case(const Version& version, const Case& c, const bench::Options& opt, std::mt19937_64& rng) {
    printf("%s, %s\n", version.name, c.name);
    if (bench::skip_when_emulated("n", (double)c.n)) return;
    State initial;
    initial.master = bench::random_f32(c.n, rng, 0.02f);
    initial.m = bench::random_f32(c.n, rng, 1e-3f);
    initial.v = bench::random_f32(c.n, rng, 1e-3f);
    for (float& x : initial.v) x *= x;
    const std::vector<float> grads = bench::random_f32(c.n, rng, 1e-2f);
    const uint32_t seed = (uint32_t)rng();

    State ref = initial;
    for (const Segment& s : c.segments)
        llmc::adamw_contiguous(ref.master.data() + s.begin, grads.data() + s.begin, ref.m.data() + s.begin,
                               ref.v.data() + s.begin, s.end - s.begin, s.decayed ? CONFIG.weight_decay : 0.0f,
                               CONFIG, STEP, GRAD_MULTIPLIER);

    const State gpu = run_on_device(version, c, initial, grads, seed);
    bench::check("master", gpu.master, ref.master, bench::FP32_TOLERANCE);
    bench::check("m", gpu.m, ref.m, bench::FP32_TOLERANCE);
    bench::check("v", gpu.v, ref.v, bench::FP32_TOLERANCE);
    printf("       bitwise differences from the CPU: master %zu, m %zu, v %zu of %zu (expected 0)\n",
           bench::count_different_bits(gpu.master, ref.master), bench::count_different_bits(gpu.m, ref.m),
           bench::count_different_bits(gpu.v, ref.v), c.n);
    bench::check("params vs master", gpu.params, gpu.master, bench::BF16_TOLERANCE);
    check_stochastic_neighbours(gpu.params, gpu.master);

    const State again = run_on_device(version, c, initial, grads, seed);
    bench::check_same_bits("params, same seed", again.params, gpu.params);
    bench::check_same_bits("master, same seed", again.master, gpu.master);
    const State reseeded = run_on_device(version, c, initial, grads, seed + 1);
    check_some_bits_differ("params, another seed", reseeded.params, gpu.params);
    bench::check_same_bits("master, another seed", reseeded.master, gpu.master);

    if (opt.check_only || !c.timed) return;
    bench::DeviceBuffer<float> d_master = bench::to_device(initial.master), d_grads = bench::to_device(grads);
    bench::DeviceBuffer<float> d_m = bench::to_device(initial.m), d_v = bench::to_device(initial.v);
    bench::DeviceBuffer<floatX> d_params(c.n, "params");
    const float ms = bench::time_ms([&] {
        version.fn(d_params.get(), d_master.get(), d_grads.get(), d_m.get(), d_v.get(), c.n, CONFIG.lr, CONFIG.beta1,
                   CONFIG.beta2, CONFIG.eps, CONFIG.weight_decay, STEP, GRAD_MULTIPLIER, seed, 0, 0);
    });
    bench::report_memory_bound(c.name, ms, 30.0 * c.n);
}

// Many copies of one master value that lies between two bf16 values (positive, then negative): the
// mean of the rounded params must be the master value. lr = 0 and zero moments keep master as is.
void check_unbiased(const Version& version, std::mt19937_64& rng) {
    printf("%s, stochastic rounding is unbiased\n", version.name);
    const size_t n = (size_t)1 << 22, half = n / 2;
    const float value = 1.0f + 0.3f / 128.0f;  // bf16 neighbours 1 and 1 + 2^-7, 30% of the way up
    std::vector<float> master(n, value), zeros(n, 0.0f);
    std::fill(master.begin() + half, master.end(), -value);
    bench::DeviceBuffer<float> d_master = bench::to_device(master), d_grads = bench::to_device(zeros);
    bench::DeviceBuffer<float> d_m = bench::to_device(zeros), d_v = bench::to_device(zeros);
    bench::DeviceBuffer<floatX> d_params(n, "params");
    bench::poison(d_params.get(), n);
    version.fn(d_params.get(), d_master.get(), d_grads.get(), d_m.get(), d_v.get(), n, 0.0f, CONFIG.beta1,
               CONFIG.beta2, CONFIG.eps, 0.0f, STEP, 1.0f, (uint32_t)rng(), 0, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> params = bench::to_host(d_params.get(), n);
    bench::check_same_bits("master unchanged (lr 0)", bench::to_host(d_master.get(), n), master);
    const double down = 1.0, ulp = 1.0 / 128.0, fraction = (value - down) / ulp;
    const double standard_error = ulp * std::sqrt(fraction * (1.0 - fraction) / half);
    for (int sign : {1, -1}) {
        const size_t begin = sign > 0 ? 0 : half;
        double sum = 0.0;
        for (size_t i = begin; i < begin + half; i++) sum += params[i];
        const double mean = sum / half, target = sign * (double)value;
        const double z = (mean - target) / standard_error;
        const bool ok = std::isfinite(z) && std::fabs(z) < 5.0;
        printf("  %s mean of %zu params %+.8f, master %+.8f: %+.2f standard errors (limit 5)\n", ok ? "ok  " : "FAIL",
               half, mean, target, z);
        if (!ok) bench::failure_count()++;
    }
}

// copy_master_to_params rounds to nearest even, as the host conversion does.
void check_copy_master_to_params(std::mt19937_64& rng) {
    printf("llmc::copy_master_to_params\n");
    const size_t n = 100003;
    const std::vector<float> master = bench::random_f32(n, rng, 0.02f);
    std::vector<float> expected(n);
    for (size_t i = 0; i < n; i++) expected[i] = bench::bf16_round(master[i]);
    bench::DeviceBuffer<float> d_master = bench::to_device(master);
    bench::DeviceBuffer<floatX> d_params(n, "params");
    bench::poison(d_params.get(), n);
    llmc::copy_master_to_params(d_params.get(), d_master.get(), n, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    bench::check_same_bits("params = bf16_rn(master)", bench::to_host(d_params.get(), n), expected);
}

int main(int argc, char** argv) {
    const bench::Options opt = bench::start(argc, argv, NUM_VERSIONS);
    return bench::run_and_finish(argv[0], [&] {
        const size_t wte = (size_t)50304 * 768;
        const std::vector<Case> cases = {
            {"GPT-2 124M wte, 38.6M elements", wte, {{0, wte, true}}, 0, true},
            {"1003 elements in 4 unaligned segments", 1003, {{0, 3, false}, {3, 10, true}, {10, 11, false},
                                                             {11, 1003, true}}, 0, false},
            {"1001 elements, params misaligned", 1001, {{0, 1001, true}}, 1, false},
        };
        for (int v = 1; v <= NUM_VERSIONS; v++) {
            if (!opt.runs(v)) continue;
            std::mt19937_64 rng(opt.seed);  // per version, so `adamw 2 --seed N` sees the same inputs
            for (const Case& c : cases) run_case(VERSIONS[v - 1], c, opt, rng);
            check_unbiased(VERSIONS[v - 1], rng);
        }
        if (opt.runs(NUM_VERSIONS)) {
            std::mt19937_64 rng(opt.seed);
            check_copy_master_to_params(rng);
        }
    });
}
