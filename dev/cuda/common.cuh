// dev/cuda/common.cuh: the harness every kernel workbench file shares.
//
// A workbench file holds numbered versions of one kernel (version 1 the simplest correct one, the
// highest the one llmc/ uses). For each version it fills fresh random inputs, poisons the outputs
// (every byte 0xFF, which is NaN in both bf16 and fp32, so an element the kernel forgot to write
// fails), runs it, compares against the CPU reference of llmc/models/cpu_model.h, and times it with CUDA
// events against a floor: bytes moved / memory bandwidth, or FLOPs / the dense bf16 peak.
//
//   ./layernorm            check and time every version
//   ./layernorm 2          check and time version 2 only
//   ./layernorm --check    check every version, no timing; exit 1 on any failure (make test-gpu)
//   --seed N               reuse the inputs of an earlier run (the seed is printed)
// Built for the emulator (dev/emu/, -DLLMC_EMU), the GPT-2-sized shapes are skipped: see
// skip_when_emulated.
//
// Determinism: run twice, the llmc version must give the same bits (check_same_bits, on device_bytes
// or on to_host copies: widening bf16 to float keeps every bit).
//
// Relative error is per tensor, ||gpu - ref|| / ||ref||, +inf when the GPU output holds a NaN or an
// inf. Inputs are generated as bf16 values, and the CPU reference reads exactly those values widened
// to fp32, so what remains is accumulation order and the rounding of the outputs.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "llmc/kernels/cuda_common.cuh"
#include "test/rel_error.h"

namespace bench {

using llmc::floatX;

// bf16 tolerance for outputs stored in bf16, fp32 tolerance for fp32 paths (the guide's limits).
constexpr double BF16_TOLERANCE = 1e-2;
constexpr double FP32_TOLERANCE = 1e-5;

struct Options {
    int version = 0;     // 0: every version
    bool check_only = false;
    uint64_t seed = 0;
    std::string tune_path;  // --tune FILE: sweep the tunable launches, write their table to FILE

    // Whether version v is to run: every one, or the one asked for.
    bool runs(int v) const { return version == 0 || version == v; }
};

// `tunable`: the workbench has a --tune sweep (others refuse the flag).
inline Options parse_options(int argc, char** argv, int num_versions, bool tunable = false) {
    Options o;
    o.seed = (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--check") o.check_only = true;
        else if (a == "--seed" && i + 1 < argc) o.seed = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--tune" && tunable && i + 1 < argc) o.tune_path = argv[++i];
        else {
            char* end = nullptr;
            long v = std::strtol(a.c_str(), &end, 10);
            if (*end != '\0' || v < 1 || v > num_versions) {
                fprintf(stderr, "usage: %s [version 1..%d] [--check] [--seed N]%s; got '%s'\n", argv[0], num_versions,
                        tunable ? " [--tune FILE]" : "", a.c_str());
                exit(2);
            }
            o.version = (int)v;
        }
    }
    return o;
}

// Exits with a message where there is no GPU: 0 (skipped, so `make test-gpu` passes there), or 3 in
// a GPU session (llmc::no_gpu_exit_status).
inline void require_gpu_or_skip(const char* program) {
    std::string why;
    if (!llmc::cuda_device_present(&why)) exit(llmc::no_gpu_exit_status(program, why));
}

// The standard start of a workbench main(): the options, the skip where there is no GPU, and the
// seed line (what --seed takes to repeat this run's inputs).
inline Options start(int argc, char** argv, int num_versions, bool tunable = false) {
    const Options o = parse_options(argc, argv, num_versions, tunable);
    require_gpu_or_skip(argv[0]);
    printf("seed %llu\n", (unsigned long long)o.seed);
    return o;
}

// ---- under the emulator ----
//
// Built with -DLLMC_EMU (dev/emu/emu.h), a workbench runs on the CPU, each CUDA thread a fiber: of
// the order of 10^7 scalar operations a second on a 2-core CI machine, kernels and CPU reference
// together. The GPT-2-sized shapes would take minutes to hours there (attention_forward at B 8,
// T 1024, NH 12: 8 minutes), so a shape whose work passes EMULATED_WORK_LIMIT is skipped, with a
// line saying so. The small and odd shapes, the ones with partial tiles, ragged tails and
// boundaries, stay under it and are checked for every version; where a skipped shape was the only
// one to reach a code path (several grid strides, several row blocks), the workbench adds a
// smaller shape that reaches it, emulated only. Built by nvcc, nothing is skipped or added.
#ifdef LLMC_EMU
constexpr bool EMULATED = true;
#else
constexpr bool EMULATED = false;
#endif
// Work: roughly the scalar operations of one version's check of a shape, as the workbench counts
// it (elements for a memory-bound kernel, multiply-adds for a product). 2^24: about a second.
constexpr double EMULATED_WORK_LIMIT = 16777216.0;

// True (skip the shape) under the emulator when `work` passes EMULATED_WORK_LIMIT, after printing
// why; `what` says what was counted ("B NH T^2 HS"). Always false when built by nvcc.
inline bool skip_when_emulated(const char* what, double work) {
    if (!EMULATED || work <= EMULATED_WORK_LIMIT) return false;
    printf("  skipped: emulated on the CPU, too large (%s = %.3g, limit %.3g); a GPU session checks it\n", what, work,
           EMULATED_WORK_LIMIT);
    return true;
}

// ---- host data ----

inline float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// n values from N(0, scale^2), each exactly representable in bf16.
inline std::vector<float> random_bf16(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> out(n);
    for (auto& x : out) x = bf16_round(dist(rng));
    return out;
}
inline std::vector<float> random_f32(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> out(n);
    for (auto& x : out) x = dist(rng);
    return out;
}
inline std::vector<int> random_tokens(size_t n, int vocab, std::mt19937_64& rng) {
    std::uniform_int_distribution<int> dist(0, vocab - 1);
    std::vector<int> out(n);
    for (auto& x : out) x = dist(rng);
    return out;
}

// ---- device data ----

template <typename T>
using DeviceBuffer = llmc::DeviceBuffer<T>;

// Overwrites the first host.size() elements of a device tensor (an accumulator's start values).
template <typename T>
inline void upload(T* d, const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
}
// The same from floats, rounded to bf16 (exact for values from random_bf16).
inline void upload_bf16(floatX* d, const std::vector<float>& host) {
    std::vector<floatX> tmp(host.size());
    for (size_t i = 0; i < host.size(); i++) tmp[i] = __float2bfloat16_rn(host[i]);
    upload(d, tmp);
}
inline DeviceBuffer<floatX> to_device_bf16(const std::vector<float>& host) {
    DeviceBuffer<floatX> d(host.size(), "workbench input");
    upload_bf16(d.get(), host);
    return d;
}
template <typename T>
inline DeviceBuffer<T> to_device(const std::vector<T>& host) {
    DeviceBuffer<T> d(host.size(), "workbench input");
    upload(d.get(), host);
    return d;
}
// Copies a device tensor back as floats (bf16 widened).
inline std::vector<float> to_host(const floatX* d, size_t n) {
    std::vector<floatX> tmp(n);
    CUDA_CHECK(cudaMemcpy(tmp.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(tmp[i]);
    return out;
}
inline std::vector<float> to_host(const float* d, size_t n) {
    std::vector<float> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}
// The bytes of a device tensor of n elements as they are, for check_same_bits.
template <typename T>
inline std::vector<unsigned char> device_bytes(const T* d, size_t n) {
    std::vector<unsigned char> out(n * sizeof(T));
    CUDA_CHECK(cudaMemcpy(out.data(), d, out.size(), cudaMemcpyDeviceToHost));
    return out;
}
// Every byte 0xFF: NaN as bf16 and as fp32.
template <typename T>
inline void poison(T* d, size_t n) {
    CUDA_CHECK(cudaMemset(d, 0xFF, n * sizeof(T)));
}

// ---- comparison ----

using llmc::rel_error;  // test/rel_error.h: ||a - b|| / ||b||, +inf on NaN or inf

// Records pass/fail for the whole run; main() returns failures() != 0.
inline int& failure_count() {
    static int n = 0;
    return n;
}
// One check's line, "  ok   <what> <detail>" or "  FAIL <what> <detail>"; a failure is counted.
inline bool report_check(const char* what, bool ok, const std::string& detail) {
    printf("  %s %-28s %s\n", ok ? "ok  " : "FAIL", what, detail.c_str());
    if (!ok) failure_count()++;
    return ok;
}
inline bool check(const char* what, const std::vector<float>& gpu, const std::vector<float>& ref, double tolerance) {
    if (gpu.size() != ref.size())
        return report_check(what, false, llmc::strformat("size %zu, reference %zu", gpu.size(), ref.size()));
    const double err = rel_error(gpu.data(), ref.data(), gpu.size());
    std::string detail = llmc::strformat("rel. error %.3e (limit %.0e)", err, tolerance);
    if (!(err < tolerance)) {  // where: the first element that is not finite, else the largest difference
        size_t worst = 0;
        for (size_t i = 0; i < gpu.size(); i++) {
            if (!std::isfinite(gpu[i])) { worst = i; break; }
            if (std::fabs(gpu[i] - ref[i]) > std::fabs(gpu[worst] - ref[worst])) worst = i;
        }
        if (!gpu.empty())
            detail += llmc::strformat("; element %zu of %zu: %.6g, reference %.6g", worst, gpu.size(), gpu[worst],
                                      ref[worst]);
    }
    return report_check(what, err < tolerance, detail);
}

// How many of the first min(a.size(), b.size()) elements differ in their bits (not their values: a
// NaN matches the same NaN, 0 does not match -0).
template <typename T>
inline size_t count_different_bits(const std::vector<T>& a, const std::vector<T>& b) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t n = std::min(a.size(), b.size());
    if (n == 0 || std::memcmp(a.data(), b.data(), n * sizeof(T)) == 0) return 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
    return count;
}
// "Same bits": a and b must be bitwise identical, as a deterministic kernel's second run must repeat
// its first. Compare device_bytes() of device tensors, or to_host() copies.
template <typename T>
inline bool check_same_bits(const char* what, const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size())
        return report_check(what, false, llmc::strformat("NOT bitwise equal: size %zu, other %zu", a.size(), b.size()));
    const size_t different = count_different_bits(a, b);
    if (different == 0) return report_check(what, true, "bitwise equal");
    return report_check(what, false, llmc::strformat("NOT bitwise equal: %zu of %zu %s differ", different, a.size(),
                                                     sizeof(T) == 1 ? "bytes" : "elements"));
}

// A kernel run with an amax output (`run`, given where to put it): its outputs bitwise those of the
// run without one (`without`), and the amax their largest |value|.
template <typename Run>
inline void check_amax(const char* what, const std::vector<float>& without, Run run) {
    DeviceBuffer<float> amax(1, "amax");
    CUDA_CHECK(cudaMemset(amax.get(), 0, sizeof(float)));
    const std::vector<float> got = run(amax.get());
    check_same_bits(llmc::strformat("%s with amax: the same outputs", what).c_str(), got, without);
    float want = 0.0f;
    for (float v : got) want = std::max(want, std::fabs(v));
    const float measured = to_host(amax.get(), 1)[0];
    report_check(llmc::strformat("%s: amax", what).c_str(), measured == want,
                 llmc::strformat("%g, host %g", measured, want));
}

// ---- timing and floors ----

// Median milliseconds of `repeats` runs of fn (after warm-ups), timed with CUDA events.
inline float time_ms(const std::function<void()>& fn, int repeats = 20) {
    for (int i = 0; i < 3; i++) fn();
    std::vector<float> times;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < repeats; i++) {
        CUDA_CHECK(cudaEventRecord(start));
        fn();
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

struct DeviceCeilings {
    char name[256];
    double bandwidth_gbs;   // peak DRAM bytes/s / 1e9, from memory clock x bus width (x2 for DDR)
    double bf16_tflops;     // dense bf16 tensor-core peak
};

inline DeviceCeilings device_ceilings() {
    DeviceCeilings c{};
    int dev = 0, mem_khz = 0, bus_bits = 0, sm_khz = 0, sms = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    snprintf(c.name, sizeof(c.name), "%s", prop.name);
    CUDA_CHECK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    c.bandwidth_gbs = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    // dense bf16 FLOPs per SM per clock: 4096 on Hopper, 2048 on Ampere/Ada
    const double per_sm_clock = major >= 9 ? 4096.0 : 2048.0;
    c.bf16_tflops = per_sm_clock * sms * sm_khz * 1e3 / 1e12;
    return c;
}

// One timing line: the time, the achieved rate, and the fraction of the floor it reaches.
inline void report_memory_bound(const char* what, float ms, double bytes) {
    static DeviceCeilings ceil = device_ceilings();
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("  time %-28s %8.4f ms  %7.1f GB/s  (floor %.4f ms at %.0f GB/s: %4.1f%%)\n", what, ms, gbs,
           bytes / (ceil.bandwidth_gbs * 1e9) * 1e3, ceil.bandwidth_gbs, 100.0 * gbs / ceil.bandwidth_gbs);
}
inline void report_compute_bound(const char* what, float ms, double flops) {
    static DeviceCeilings ceil = device_ceilings();
    const double tflops = flops / (ms * 1e-3) / 1e12;
    printf("  time %-28s %8.4f ms  %7.1f TFLOP/s  (floor %.4f ms at %.0f TFLOP/s: %4.1f%%)\n", what, ms, tflops,
           flops / (ceil.bf16_tflops * 1e12) * 1e3, ceil.bf16_tflops, 100.0 * tflops / ceil.bf16_tflops);
}

// A --tune table (a header the launchers include) written whole or not at all: beside `path`, then
// renamed over it.
inline void write_tuned_table(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f) llmc::fail(llmc::strformat("--tune: cannot write %s", tmp.c_str()));
    const bool written = fwrite(text.data(), 1, text.size(), f) == text.size();
    if (fclose(f) != 0 || !written || rename(tmp.c_str(), path.c_str()) != 0) {
        remove(tmp.c_str());
        llmc::fail(llmc::strformat("--tune: writing %s failed", path.c_str()));
    }
    printf("tuned table written to %s\n", path.c_str());
}

// The standard end of a workbench main().
inline int finish(const char* program) {
    if (failure_count()) printf("%s: %d check(s) FAILED\n", program, failure_count());
    else printf("%s: all checks passed\n", program);
    return failure_count() ? 1 : 0;
}
// Runs a workbench main()'s checks and timings, then ends as finish() does; an llmc::Error (a failed
// CUDA call, a rejected shape) ends the run instead with its message and exit status 1.
inline int run_and_finish(const char* program, const std::function<void()>& body) {
    try {
        body();
    } catch (const llmc::Error& e) {
        fprintf(stderr, "%s: %s\n", program, e.what());
        return 1;
    }
    return finish(program);
}

}  // namespace bench
