// dev/emu/test_emu.cu: the emulator's own behaviour, what a program sees of it beyond the kernels'
// arithmetic (dev/emu/test_ptx.cu checks that): launches refused where an H100 refuses them, the race
// check and deadlock reports (wgmma's registers and operands touched before its wait_group among
// them, a TMA stage read before its mbarrier wait or refilled under its reader, a phase that never
// completes), the faults of wgmma, mbarrier, TMA and setmaxnreg, the host's tensor map checks, the
// orderings of streams, events and the legacy stream, and device memory.
// For the emulation build only: on a GPU a missing stream wait is a race, not a result.
//
// The idea: what must fail is run in a child process. The test binary re-executes itself with
// LLMC_EMU_TEST_CHILD naming a scenario (and LLMC_EMU_RACECHECK as the scenario needs), and the test
// asserts how the child ended and what it wrote on stderr, where the emulator reports a fault
// ("CUDA emulator: ...") before it aborts. A fresh executable, not a fork, so that the child does
// not inherit a copy of the parent's OpenMP threads.
//
// Build and run (from the repository root; the emulator's objects as dev/emu/emu.h says):
//   g++ -std=c++20 -O2 -g -fopenmp -march=native -DLLMC_EMU -Idev/emu/include -I. -I/usr/local/cuda/include
//       -x c++ dev/emu/test_emu.cu -x none build/emu/runtime.o build/emu/fibers.o build/emu/ptx.o
//       build/test/catch_impl.o -o build/emu/test_emu -lboost_context && build/emu/test_emu
#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dev/emu/kernel_resources.h"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/tma.cuh"
#include "llmc/kernels/wgmma.cuh"
#include "test/catch_session.h"

#ifndef LLMC_EMU
#error "dev/emu/test_emu.cu tests the CUDA emulator: build it with -DLLMC_EMU (see its header)"
#endif

extern char** environ;

using namespace llmc;

namespace {

constexpr const char* CHILD_VARIABLE = "LLMC_EMU_TEST_CHILD";

// ---------------------------------------------------------------------------------------------
// Kernels

__global__ void fill_kernel(int* buffer, int value, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = value;
}
__global__ void copy_kernel(int* dst, const int* src, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Writes the last block's thread count, so a launch that ran shows.
__global__ void mark_kernel(int* out) {
    if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1 && blockIdx.z == gridDim.z - 1 &&
        threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
        out[0] = (int)(blockDim.x * blockDim.y * blockDim.z);
}

// Touches the first and last byte of `shared_bytes` of dynamic shared memory. TAG gives each test
// its own kernel, so that one test's cudaFuncSetAttribute does not raise another's limit.
template <int TAG>
__global__ void shared_kernel(int* out, int shared_bytes) {
    unsigned char* shared = dynamic_shared_memory<unsigned char>();
    shared[0] = 1;
    shared[shared_bytes - 1] = 2;
    out[0] = shared[0] + shared[shared_bytes - 1];
}

// Thread i writes slot i of dynamic shared memory, then reads slot i + 1 (mod the block), which
// its neighbour writes: without the barrier the read may come first.
template <bool BARRIER>
__global__ void neighbour_kernel(float* out, const float* in) {
    float* slots = dynamic_shared_memory<float>();
    const int i = threadIdx.x;
    slots[i] = in[i];
    if (BARRIER) __syncthreads();
    out[i] = slots[(i + 1) % blockDim.x];
}
// The same through a static __shared__ array, without the barrier.
__global__ void static_neighbour_kernel(float* out, const float* in) {
    __shared__ float slots[64];
    const int i = threadIdx.x;
    slots[i] = in[i];
    out[i] = slots[(i + 1) % blockDim.x];
}
// Within each warp: lane l reads lane l + 1's slot (mod 32); only the warp needs to synchronise.
template <bool SYNCWARP>
__global__ void warp_neighbour_kernel(float* out, const float* in) {
    float* slots = dynamic_shared_memory<float>();
    const int i = threadIdx.x, lane = i % 32;
    slots[i] = in[i];
    if (SYNCWARP) __syncwarp();
    out[i] = slots[i - lane + (lane + 1) % 32];
}

// A __syncthreads that only threads 0-15 of the block reach.
__global__ void partial_barrier_kernel(int* out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1;
}
// Threads 0-15 wait at __syncthreads, the rest of their warp at a __syncwarp that needs them.
__global__ void barrier_against_syncwarp_kernel(int* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        __syncwarp();
    }
    out[threadIdx.x] = 1;
}

// ---------------------------------------------------------------------------------------------
// Host helpers

template <typename T>
T* device_copy(const std::vector<T>& host) {
    T* p = nullptr;
    REQUIRE(cudaMalloc(&p, host.size() * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    return p;
}
template <typename T>
std::vector<T> host_copy(const T* p, size_t count) {
    std::vector<T> host(count);
    REQUIRE(cudaMemcpy(host.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
}
bool all_equal(const std::vector<int>& v, int value) {
    for (int x : v)
        if (x != value) return false;
    return true;
}

// ---------------------------------------------------------------------------------------------
// Child scenarios: each returns the child's exit status (0: it ran and its results are right) or
// ends in the emulator's abort.

[[noreturn]] void child_fail(const char* why) {
    fprintf(stderr, "child: %s\n", why);
    exit(1);
}
void child_check(bool ok, const char* why) {
    if (!ok) child_fail(why);
}

// Runs a 64-thread neighbour exchange and checks that every thread read its neighbour's value.
template <typename Kernel>
int run_neighbour_exchange(Kernel kernel, int group) {
    constexpr int N = 64;
    std::vector<float> in(N);
    for (int i = 0; i < N; i++) in[i] = 1.0f + (float)i;
    float *d_in = nullptr, *d_out = nullptr;
    child_check(cudaMalloc(&d_in, N * sizeof(float)) == cudaSuccess, "cudaMalloc");
    child_check(cudaMalloc(&d_out, N * sizeof(float)) == cudaSuccess, "cudaMalloc");
    child_check(cudaMemcpy(d_in, in.data(), N * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy");
    LLMC_LAUNCH(kernel, 1, N, N * sizeof(float), 0)(d_out, d_in);
    child_check(cudaGetLastError() == cudaSuccess, "the launch was refused");
    std::vector<float> out(N);
    child_check(cudaMemcpy(out.data(), d_out, N * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy");
    for (int i = 0; i < N; i++) {
        const int base = i - i % group;
        child_check(out[i] == in[base + (i % group + 1) % group], "a thread did not read its neighbour's value");
    }
    return 0;
}

int run_barrier_kernel(void (*kernel)(int*)) {
    int* d_out = nullptr;
    child_check(cudaMalloc(&d_out, 64 * sizeof(int)) == cudaSuccess, "cudaMalloc");
    LLMC_LAUNCH(kernel, 1, 64, 0, 0)(d_out);
    child_check(cudaGetLastError() == cudaSuccess, "the launch was refused");
    child_check(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    return 0;
}

// A table as nvcc's build would give (kernel_resources.h), with figures chosen to sit on each limit:
// mark_kernel bounded at 128 threads; fill_kernel at 128 registers, so 512 threads fill the 65536
// of an SM exactly; shared_kernel<3> with 40 KB of static shared memory. copy_kernel is left out.
int run_kernel_resources() {
    static const emu::KernelResources table[] = {
        {reinterpret_cast<const void*>(&mark_kernel), "mark_kernel", 128, 32, 0},
        {reinterpret_cast<const void*>(&fill_kernel), "fill_kernel", 0, 128, 0},
        {reinterpret_cast<const void*>(&shared_kernel<3>), "shared_kernel<3>", 0, 32, 40 * 1024}};
    emu::register_kernel_resources(table, 3);
    int* out = nullptr;
    child_check(cudaMalloc(&out, 1024 * sizeof(int)) == cudaSuccess, "cudaMalloc");
    auto launched = [](cudaError_t expected, const char* why) {
        child_check(cudaGetLastError() == expected, why);
        child_check(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    };
    LLMC_LAUNCH(mark_kernel, 1, 128, 0, 0)(out);
    launched(cudaSuccess, "128 threads within __launch_bounds__(128) were refused");
    LLMC_LAUNCH(mark_kernel, 1, dim3(64, 3), 0, 0)(out);
    launched(cudaErrorLaunchOutOfResources, "64 x 3 threads beyond __launch_bounds__(128) were not refused");
    LLMC_LAUNCH(fill_kernel, 1, 512, 0, 0)(out, 1, 1024);
    launched(cudaSuccess, "512 threads of 128 registers (65536) were refused");
    LLMC_LAUNCH(fill_kernel, 1, 513, 0, 0)(out, 1, 1024);
    launched(cudaErrorLaunchOutOfResources, "513 threads of 128 registers were not refused");
    constexpr int STATIC = 40 * 1024, OPTIN = 232448;
    LLMC_LAUNCH(shared_kernel<3>, 1, 32, 48 * 1024 - STATIC, 0)(out, 48 * 1024 - STATIC);
    launched(cudaSuccess, "48 KB of static and dynamic shared memory was refused");
    LLMC_LAUNCH(shared_kernel<3>, 1, 32, 48 * 1024 - STATIC + 1, 0)(out, 48 * 1024 - STATIC + 1);
    launched(cudaErrorInvalidValue, "48 KB + 1 of static and dynamic shared memory was not refused");
    child_check(cudaFuncSetAttribute(shared_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, OPTIN) ==
                    cudaSuccess, "cudaFuncSetAttribute");
    LLMC_LAUNCH(shared_kernel<3>, 1, 32, OPTIN - STATIC, 0)(out, OPTIN - STATIC);
    launched(cudaSuccess, "227 KB of static and dynamic shared memory was refused");
    LLMC_LAUNCH(shared_kernel<3>, 1, 32, OPTIN - STATIC + 1, 0)(out, OPTIN - STATIC + 1);
    launched(cudaErrorInvalidValue, "227 KB + 1 of static and dynamic shared memory was not refused");
    LLMC_LAUNCH(copy_kernel, 1, 32, 0, 0)(out, out + 512, 32);
    launched(cudaErrorInvalidDeviceFunction, "a kernel missing from the table was not refused");
    return 0;
}

// wgmma (llmc/kernels/wgmma.cuh): one warpgroup multiplies A (64 x 16, all ones) by B (16 x 64,
// all ones), both K-major without swizzle in dynamic shared memory (core matrices of 128 bytes: the
// next 8 K at 128 bytes, the next 8 rows at 256), into accumulators holding their own index, so each
// comes out as 16 more; what it does wrong depends on MISTAKE.
enum class WgmmaMistake {
    None,                 // correct: the accumulators are read after wgmma.wait_group
    ReadBeforeWait,       // reads the accumulators between the mma and the wait
    WriteBeforeWait,      // writes an accumulator between the mma and the wait
    OverwriteBeforeWait,  // each warp rewrites B (with twos) between the mma and the wait
    NoFence,              // no wgmma.fence before the first mma
    DescriptorPerWarp,    // warp 3 gives another B descriptor than its warpgroup's other warps
    WarpSkips,            // warp 2 issues no mma
    BaseOffset,           // B's descriptor has a base offset
    StaticShared,         // B in static shared memory
};
template <WgmmaMistake MISTAKE>
__global__ void wgmma_kernel(float* out) {
    constexpr uint32_t A_BYTES = 64 * 16 * 2;
    __shared__ __align__(128) uint16_t static_b[64 * 16];
    uint16_t* a = dynamic_shared_memory<uint16_t>();
    uint16_t* b = MISTAKE == WgmmaMistake::StaticShared ? static_b : a + A_BYTES / 2;
    const int t = threadIdx.x, warp = t / 32;
    const uint16_t one = 0x3f80, two = 0x4000;  // bf16
    for (int i = t; i < 64 * 16; i += blockDim.x) a[i] = one, b[i] = one;
    llmc::wgmma::fence_proxy_async();
    __syncthreads();
    auto desc = [](const uint16_t* p, uint64_t extra) {
        return llmc::wgmma::descriptor(llmc::attention_detail::smem_addr(p), 128, 256, llmc::wgmma::Swizzle::None) |
               extra;
    };
    uint64_t desc_b = desc(b, MISTAKE == WgmmaMistake::BaseOffset ? 1ull << 49 : 0);
    if (MISTAKE == WgmmaMistake::DescriptorPerWarp && warp == 3) desc_b += 1;  // 16 bytes on
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = (float)i;
    if (MISTAKE != WgmmaMistake::NoFence) llmc::wgmma::fence();
    if (MISTAKE != WgmmaMistake::WarpSkips || warp != 2)
        llmc::wgmma::mma_ss<64, false, false>(d, desc(a, 0), desc_b, true);
    llmc::wgmma::commit_group();
    if (MISTAKE == WgmmaMistake::ReadBeforeWait)
        for (int i = 0; i < 32; i++) out[t * 32 + i] = d[i];
    if (MISTAKE == WgmmaMistake::WriteBeforeWait) d[5] = 0.0f;
    if (MISTAKE == WgmmaMistake::OverwriteBeforeWait && t % 32 == 0)
        for (int i = 0; i < 64 * 16; i++) b[i] = two;
    llmc::wgmma::wait_group<0>();
    if (MISTAKE != WgmmaMistake::ReadBeforeWait)
        for (int i = 0; i < 32; i++) out[t * 32 + i] = d[i];
}

// Launches wgmma_kernel<MISTAKE> with `threads` threads; checks the result when `check`.
template <WgmmaMistake MISTAKE>
int run_wgmma(int threads = 128, bool check = true) {
    float* d_out = nullptr;
    child_check(cudaMalloc(&d_out, (size_t)threads * 32 * sizeof(float)) == cudaSuccess, "cudaMalloc");
    LLMC_LAUNCH(wgmma_kernel<MISTAKE>, 1, threads, 2 * 64 * 16 * 2, 0)(d_out);
    child_check(cudaGetLastError() == cudaSuccess, "the launch was refused");
    std::vector<float> out((size_t)threads * 32);
    child_check(cudaMemcpy(out.data(), d_out, out.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess,
                "cudaMemcpy");
    if (check)
        for (int t = 0; t < threads; t++)
            for (int i = 0; i < 32; i++) child_check(out[(size_t)t * 32 + i] == 16.0f + (float)i, "a wrong product");
    return 0;
}


// device_copy and host_copy for a child (no Catch2 session there).
template <typename T>
T* child_device_copy(const std::vector<T>& host) {
    T* p = nullptr;
    child_check(cudaMalloc(&p, host.size() * sizeof(T)) == cudaSuccess, "cudaMalloc");
    child_check(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess,
                "cudaMemcpy");
    return p;
}
template <typename T>
std::vector<T> child_host_copy(const T* p, size_t count) {
    std::vector<T> host(count);
    child_check(cudaMemcpy(host.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy");
    return host;
}

// mbarrier and TMA (llmc/kernels/tma.cuh): a 16 x 64 bf16 box (2048 bytes) from a 64 x 64 tensor of
// distinct values into dynamic shared memory; what goes wrong depends on MISTAKE.
enum class TmaMistake {
    None,               // correct: every thread waits for the phase, then reads the stage
    ReadBeforeWait,     // every thread reads the stage before its wait
    ExpectTooMuch,      // arrive.expect_tx announces 16 bytes more than the copy brings: never completes
    ExpectTooLittle,    // 16 bytes fewer: the copy's complete_tx underflows the tx-count
    ArriveTwice,        // thread 0 arrives a second time in the phase (count 1)
    MisalignedNone,     // unswizzled copy to a destination 64 bytes off 128
    MisalignedSwizzle,  // 128-byte-swizzled copy to a destination 128 bytes off 1024
    BadMap,             // a CUtensorMap never encoded (zeros)
    GlobalBarrier,      // the barrier in global memory
    NoInit,             // the barrier used without mbarrier.init
    BadParity,          // try_wait.parity with 2
    WhollyOutside,      // the box at column 64 of a 64-column tensor: no element inside (an H200 faults)
};
constexpr int TMA_BOX_ROWS = 16, TMA_COLS = 64, TMA_BOX_BYTES = TMA_BOX_ROWS * TMA_COLS * 2;
template <TmaMistake MISTAKE>
__global__ void tma_kernel(uint16_t* out, const __grid_constant__ CUtensorMap map, uint64_t* global_bar) {
    __shared__ __align__(8) uint64_t shared_bar;
    uint64_t* bar = MISTAKE == TmaMistake::GlobalBarrier ? global_bar : &shared_bar;
    unsigned char* dynamic = dynamic_shared_memory<unsigned char>();
    unsigned char* stage = dynamic + ((1024u - (llmc::attention_detail::smem_addr(dynamic) & 1023u)) & 1023u);
    if (MISTAKE == TmaMistake::MisalignedNone) stage += 64;
    if (MISTAKE == TmaMistake::MisalignedSwizzle) stage += 128;
    const uint16_t* tile = reinterpret_cast<const uint16_t*>(stage);
    if (threadIdx.x == 0 && MISTAKE != TmaMistake::NoInit) {
        llmc::tma::mbarrier_init(bar, 1);
        llmc::tma::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int delta = MISTAKE == TmaMistake::ExpectTooMuch ? 16 : MISTAKE == TmaMistake::ExpectTooLittle ? -16 : 0;
        llmc::tma::mbarrier_arrive_expect_tx(bar, (uint32_t)(TMA_BOX_BYTES + delta));
        if (MISTAKE == TmaMistake::ArriveTwice) llmc::tma::mbarrier_arrive(bar);
        llmc::tma::copy_2d(stage, &map, MISTAKE == TmaMistake::WhollyOutside ? TMA_COLS : 0, 8, bar);
    }
    const int i = threadIdx.x;
    if (MISTAKE == TmaMistake::ReadBeforeWait) out[i] = tile[i];
    llmc::tma::mbarrier_wait(bar, MISTAKE == TmaMistake::BadParity ? 2 : 0);
    if (MISTAKE != TmaMistake::ReadBeforeWait) out[i] = tile[i];
}
// 64 x 64 bf16, element (r, c) with bits 0x4000 + 64 r + c; `swizzle128`: the map's 128-byte swizzle.
int run_tma(TmaMistake mistake_for_map, bool swizzle128, void (*kernel)(uint16_t*, CUtensorMap, uint64_t*),
            bool check) {
    std::vector<uint16_t> tensor(TMA_COLS * TMA_COLS);
    for (int i = 0; i < TMA_COLS * TMA_COLS; i++) tensor[i] = (uint16_t)(0x4000 + i);
    uint16_t* d_tensor = child_device_copy(tensor);
    uint16_t* d_out = child_device_copy(std::vector<uint16_t>(TMA_BOX_BYTES / 2, 0));
    uint64_t* d_bar = child_device_copy(std::vector<uint64_t>{0});
    CUtensorMap map{};
    if (mistake_for_map != TmaMistake::BadMap)
        map = llmc::tma::make_tensor_map_2d(d_tensor, TMA_COLS, TMA_COLS, TMA_COLS * 2, TMA_BOX_ROWS, TMA_COLS,
                                            swizzle128 ? llmc::tma::Swizzle::Bytes128 : llmc::tma::Swizzle::None);
    LLMC_LAUNCH(kernel, 1, 128, TMA_BOX_BYTES + 2048, 0)(d_out, map, d_bar);
    child_check(cudaGetLastError() == cudaSuccess, "the launch was refused");
    const std::vector<uint16_t> out = child_host_copy(d_out, 128);
    if (check)
        for (int i = 0; i < 128; i++) child_check(out[i] == tensor[8 * TMA_COLS + i], "a wrong element");
    return 0;
}
template <TmaMistake MISTAKE>
int run_tma_kernel(bool check = false) {
    const bool swizzle128 = MISTAKE == TmaMistake::MisalignedSwizzle;
    return run_tma(MISTAKE, swizzle128, tma_kernel<MISTAKE>, check);
}

// A ring of STAGES stages fed by a producer (thread 0) to consumers in warp 1: TILES boxes of 8 x 64,
// rows 8 k .. 8 k + 7 into stage k % STAGES. With EMPTY, the consumer warp releases each stage on its
// empty barrier (32 arrivals) and the producer waits for that before refilling it; without, the
// producer only waits until its own previous copy into the stage has landed (the full barrier), so
// it may overwrite a stage that the consumer (one thread: several would see the barrier's phases
// alias, a deadlock rather than a wrong read) has not read yet.
template <bool EMPTY, int STAGES, int TILES>
__global__ void tma_ring_kernel(uint16_t* out, const __grid_constant__ CUtensorMap map) {
    constexpr int BOX = 8 * TMA_COLS;
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    // dynamic shared memory is 16-byte aligned (the emulator's is, deliberately, no more); a copy's
    // destination needs 128
    unsigned char* dynamic = dynamic_shared_memory<unsigned char>();
    uint16_t* stages = reinterpret_cast<uint16_t*>(dynamic + (128 - __cvta_generic_to_shared(dynamic) % 128) % 128);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) llmc::tma::mbarrier_init(&full[s], 1), llmc::tma::mbarrier_init(&empty[s], 32);
        llmc::tma::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 0; k < TILES; k++) {
            const int s = k % STAGES;
            const uint32_t round = (uint32_t)(k / STAGES);
            if (EMPTY)
                llmc::tma::mbarrier_wait(&empty[s], (round & 1) ^ 1);
            else if (k >= STAGES)
                llmc::tma::mbarrier_wait(&full[s], (round - 1) & 1);
            llmc::tma::mbarrier_arrive_expect_tx(&full[s], BOX * 2);
            llmc::tma::copy_2d(stages + s * BOX, &map, 0, 8 * k, &full[s]);
        }
    } else if (EMPTY ? threadIdx.x >= 32 : threadIdx.x == 32) {
        const int consumers = EMPTY ? 32 : 1;
        for (int k = 0; k < TILES; k++) {
            const int s = k % STAGES;
            llmc::tma::mbarrier_wait(&full[s], (uint32_t)(k / STAGES) & 1);
            for (int i = threadIdx.x - 32; i < BOX; i += consumers) out[k * BOX + i] = stages[s * BOX + i];
            if (EMPTY) llmc::tma::mbarrier_arrive(&empty[s]);
        }
    }
}
template <bool EMPTY, int STAGES, int TILES>
int run_tma_ring() {
    constexpr int BOX = 8 * TMA_COLS;
    std::vector<uint16_t> tensor(TILES * BOX);
    for (int i = 0; i < TILES * BOX; i++) tensor[i] = (uint16_t)(0x4000 + i);
    uint16_t* d_tensor = child_device_copy(tensor);
    uint16_t* d_out = child_device_copy(std::vector<uint16_t>(TILES * BOX, 0));
    const CUtensorMap map = llmc::tma::make_tensor_map_2d(d_tensor, 8 * TILES, TMA_COLS, TMA_COLS * 2, 8, TMA_COLS,
                                                          llmc::tma::Swizzle::None);
    LLMC_LAUNCH((tma_ring_kernel<EMPTY, STAGES, TILES>), 1, 64, STAGES * BOX * 2 + 128, 0)(d_out, map);
    child_check(cudaGetLastError() == cudaSuccess, "the launch was refused");
    const std::vector<uint16_t> out = child_host_copy(d_out, TILES * BOX);
    for (int i = 0; i < TILES * BOX; i++) child_check(out[i] == tensor[i], "a consumer read a wrong element");
    return 0;
}

// setmaxnreg (.sync.aligned): the producer warpgroup lowers its registers, the consumers raise
// theirs; with the mistake, warp 6 of the second warpgroup skips it.
template <bool SKIP>
__global__ void setmaxnreg_kernel(int* out) {
    if (threadIdx.x < 128) {
        llmc::tma::setmaxnreg_dec<40>();
    } else if (!SKIP || threadIdx.x / 32 != 6) {
        llmc::tma::setmaxnreg_inc<232>();
    }
    out[threadIdx.x] = 1;
}
int run_setmaxnreg(void (*kernel)(int*)) {
    int* d_out = nullptr;
    child_check(cudaMalloc(&d_out, 256 * sizeof(int)) == cudaSuccess, "cudaMalloc");
    LLMC_LAUNCH(kernel, 1, 256, 0, 0)(d_out);
    child_check(cudaGetLastError() == cudaSuccess, "the launch was refused");
    child_check(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    return 0;
}

struct Scenario {
    const char* name;
    int (*run)();
};
const Scenario SCENARIOS[] = {
    {"block neighbours without a barrier", [] { return run_neighbour_exchange(neighbour_kernel<false>, 64); }},
    {"block neighbours with __syncthreads", [] { return run_neighbour_exchange(neighbour_kernel<true>, 64); }},
    {"static shared neighbours without a barrier", [] { return run_neighbour_exchange(static_neighbour_kernel, 64); }},
    {"warp neighbours without __syncwarp", [] { return run_neighbour_exchange(warp_neighbour_kernel<false>, 32); }},
    {"warp neighbours with __syncwarp", [] { return run_neighbour_exchange(warp_neighbour_kernel<true>, 32); }},
    {"__syncthreads reached by threads 0-15 of 64", [] { return run_barrier_kernel(partial_barrier_kernel); }},
    {"__syncthreads against __syncwarp", [] { return run_barrier_kernel(barrier_against_syncwarp_kernel); }},
    {"kernel resources", run_kernel_resources},
    {"wgmma read after wait_group", [] { return run_wgmma<WgmmaMistake::None>(); }},
    {"wgmma accumulators read before wait_group", [] { return run_wgmma<WgmmaMistake::ReadBeforeWait>(128, false); }},
    {"wgmma accumulator written before wait_group",
     [] { return run_wgmma<WgmmaMistake::WriteBeforeWait>(128, false); }},
    {"wgmma operand overwritten before wait_group",
     [] { return run_wgmma<WgmmaMistake::OverwriteBeforeWait>(128, false); }},
    {"wgmma without wgmma.fence", [] { return run_wgmma<WgmmaMistake::NoFence>(); }},
    {"wgmma descriptors differing across the warpgroup", [] { return run_wgmma<WgmmaMistake::DescriptorPerWarp>(); }},
    {"wgmma skipped by a warp of the warpgroup", [] { return run_wgmma<WgmmaMistake::WarpSkips>(128, false); }},
    {"wgmma by a partial warpgroup", [] { return run_wgmma<WgmmaMistake::None>(96); }},
    {"wgmma descriptor with a base offset", [] { return run_wgmma<WgmmaMistake::BaseOffset>(); }},
    {"wgmma operand in static shared memory", [] { return run_wgmma<WgmmaMistake::StaticShared>(); }},
    {"TMA stage read after its wait", [] { return run_tma_kernel<TmaMistake::None>(true); }},
    {"TMA stage read before its wait", [] { return run_tma_kernel<TmaMistake::ReadBeforeWait>(); }},
    {"TMA ring with empty barriers", [] { return run_tma_ring<true, 2, 6>(); }},
    {"TMA stage with an empty barrier", [] { return run_tma_ring<true, 1, 2>(); }},
    {"TMA stage without an empty barrier", [] { return run_tma_ring<false, 1, 2>(); }},
    {"TMA expect_tx beyond the copy", [] { return run_tma_kernel<TmaMistake::ExpectTooMuch>(); }},
    {"TMA expect_tx short of the copy", [] { return run_tma_kernel<TmaMistake::ExpectTooLittle>(); }},
    {"mbarrier arrival beyond its count", [] { return run_tma_kernel<TmaMistake::ArriveTwice>(); }},
    {"TMA destination off 128 bytes", [] { return run_tma_kernel<TmaMistake::MisalignedNone>(); }},
    {"TMA swizzled destination off 1024 bytes", [] { return run_tma_kernel<TmaMistake::MisalignedSwizzle>(); }},
    {"TMA map never encoded", [] { return run_tma_kernel<TmaMistake::BadMap>(); }},
    {"mbarrier in global memory", [] { return run_tma_kernel<TmaMistake::GlobalBarrier>(); }},
    {"mbarrier without init", [] { return run_tma_kernel<TmaMistake::NoInit>(); }},
    {"mbarrier parity 2", [] { return run_tma_kernel<TmaMistake::BadParity>(); }},
    {"TMA box wholly outside the tensor", [] { return run_tma_kernel<TmaMistake::WhollyOutside>(); }},
    {"setmaxnreg by every warp", [] { return run_setmaxnreg(setmaxnreg_kernel<false>); }},
    {"setmaxnreg skipped by a warp", [] { return run_setmaxnreg(setmaxnreg_kernel<true>); }},
};

int run_scenario(const std::string& name) {
    for (const Scenario& s : SCENARIOS)
        if (name == s.name) return s.run();
    fprintf(stderr, "child: no scenario \"%s\"\n", name.c_str());
    return 2;
}

// How a child ended and what it wrote on stderr.
struct ChildResult {
    int status = 0;
    std::string stderr_text;
    bool succeeded() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

// Runs `scenario` in a fresh copy of this program, with LLMC_EMU_RACECHECK set to `racecheck`.
ChildResult run_child(const std::string& scenario, const std::string& racecheck) {
    std::vector<std::string> variables;
    for (char** e = environ; *e; e++)
        if (strncmp(*e, "LLMC_EMU_RACECHECK=", 19) != 0 && strncmp(*e, "LLMC_EMU_TEST_CHILD=", 20) != 0)
            variables.push_back(*e);
    variables.push_back(std::string(CHILD_VARIABLE) + "=" + scenario);
    variables.push_back("LLMC_EMU_RACECHECK=" + racecheck);
    std::vector<char*> envp;
    for (std::string& v : variables) envp.push_back(v.data());
    envp.push_back(nullptr);
    char program[] = "test_emu";
    char* argv[] = {program, nullptr};

    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    fflush(stdout);
    fflush(stderr);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        dup2(pipe_fds[1], STDERR_FILENO);
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        alarm(60);  // a hang ends the child (SIGALRM) instead of stalling the test
        execve("/proc/self/exe", argv, envp.data());
        _exit(127);
    }
    close(pipe_fds[1]);
    ChildResult r;
    char chunk[512];
    for (ssize_t got; (got = read(pipe_fds[0], chunk, sizeof chunk)) > 0;) r.stderr_text.append(chunk, (size_t)got);
    close(pipe_fds[0]);
    REQUIRE(waitpid(child, &r.status, 0) == child);
    return r;
}

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// The child must have failed with the emulator's report, naming `what`.
void check_reported(const ChildResult& r, const char* what) {
    INFO("child's stderr: " << r.stderr_text);
    CHECK(!r.succeeded());
    CHECK(WIFSIGNALED(r.status));
    CHECK(contains(r.stderr_text, "CUDA emulator: "));
    CHECK(contains(r.stderr_text, what));
}
void check_clean(const ChildResult& r) {
    INFO("child's stderr: " << r.stderr_text);
    CHECK(r.succeeded());
    CHECK(r.stderr_text.empty());
}

}  // namespace

// =============================================================================================
// Launch limits, as an H100 (compute capability 9.0) has them.

TEST_CASE("a launch beyond an H100's thread and grid limits is refused with cudaErrorInvalidConfiguration") {
    int* out = device_copy(std::vector<int>{-1});
    struct Refused {
        const char* what;
        dim3 grid, block;
    };
    const Refused refused[] = {{"1025 threads", dim3(1), dim3(1025)},
                               {"32 x 33 threads", dim3(1), dim3(32, 33)},
                               {"block.z 65", dim3(1), dim3(1, 1, 65)},
                               {"grid.y 65536", dim3(1, 65536), dim3(1)},
                               {"grid.z 65536", dim3(1, 1, 65536), dim3(1)},
                               {"a zero dimension", dim3(0), dim3(32)}};
    for (const Refused& r : refused) {
        INFO(r.what);
        LLMC_LAUNCH(mark_kernel, r.grid, r.block, 0, 0)(out);
        CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
        CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(host_copy(out, 1)[0] == -1);  // nothing ran

    const Refused accepted[] = {{"1024 threads", dim3(1), dim3(1024)},
                                {"32 x 32 threads", dim3(1), dim3(32, 32)},
                                {"block.z 64", dim3(1), dim3(1, 1, 64)},
                                {"grid.y 65535", dim3(1, 65535), dim3(1)}};
    for (const Refused& a : accepted) {
        INFO(a.what);
        LLMC_LAUNCH(mark_kernel, a.grid, a.block, 0, 0)(out);
        CHECK(cudaGetLastError() == cudaSuccess);
        CHECK(host_copy(out, 1)[0] == (int)(a.block.x * a.block.y * a.block.z));
    }
    REQUIRE(cudaFree(out) == cudaSuccess);
}

TEST_CASE("dynamic shared memory: 48 KB unless raised by cudaFuncSetAttribute, never beyond 227 KB") {
    int* out = device_copy(std::vector<int>{-1});
    constexpr int DEFAULT_LIMIT = 48 * 1024, OPTIN_LIMIT = 227 * 1024;
    LLMC_LAUNCH(shared_kernel<0>, 1, 32, DEFAULT_LIMIT + 1, 0)(out, DEFAULT_LIMIT + 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    LLMC_LAUNCH(shared_kernel<0>, 1, 32, DEFAULT_LIMIT, 0)(out, DEFAULT_LIMIT);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(host_copy(out, 1)[0] == 3);

    REQUIRE(cudaFuncSetAttribute(shared_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000) == cudaSuccess);
    REQUIRE(cudaMemset(out, 0xff, sizeof(int)) == cudaSuccess);
    LLMC_LAUNCH(shared_kernel<1>, 1, 32, 100000, 0)(out, 100000);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(host_copy(out, 1)[0] == 3);
    LLMC_LAUNCH(shared_kernel<1>, 1, 32, 100001, 0)(out, 100001);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    // The attribute is the kernel's own: another kernel keeps 48 KB.
    LLMC_LAUNCH(shared_kernel<0>, 1, 32, DEFAULT_LIMIT + 1, 0)(out, DEFAULT_LIMIT + 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);

    CHECK(cudaFuncSetAttribute(shared_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, OPTIN_LIMIT + 1) ==
          cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    REQUIRE(cudaFuncSetAttribute(shared_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, OPTIN_LIMIT) ==
            cudaSuccess);
    LLMC_LAUNCH(shared_kernel<2>, 1, 32, OPTIN_LIMIT + 1, 0)(out, OPTIN_LIMIT + 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    REQUIRE(cudaMemset(out, 0xff, sizeof(int)) == cudaSuccess);
    LLMC_LAUNCH(shared_kernel<2>, 1, 32, OPTIN_LIMIT, 0)(out, OPTIN_LIMIT);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(host_copy(out, 1)[0] == 3);
    REQUIRE(cudaFree(out) == cudaSuccess);
}

// A child, since the table it registers is for the rest of the process.
TEST_CASE("with nvcc's table of kernel resources, a launch beyond __launch_bounds__, the register file or "
          "227 KB of shared memory is refused, and so is a kernel the table lacks") {
    const ChildResult r = run_child("kernel resources", "0");
    INFO("child's stderr: " << r.stderr_text);
    CHECK(r.succeeded());
    CHECK(contains(r.stderr_text, "__launch_bounds__ (128)"));
    CHECK(contains(r.stderr_text, "128 registers per thread"));
}

// =============================================================================================
// Races and deadlocks, reported by a child that the emulator aborts.

TEST_CASE("LLMC_EMU_RACECHECK=1 reports a read of a neighbour's shared memory without __syncthreads") {
    check_reported(run_child("block neighbours without a barrier", "1"), "race");
    check_reported(run_child("static shared neighbours without a barrier", "1"), "race");
    check_clean(run_child("block neighbours with __syncthreads", "1"));
    check_clean(run_child("block neighbours with __syncthreads", "2"));
}

TEST_CASE("LLMC_EMU_RACECHECK=1 reports a read of another lane's shared memory without __syncwarp") {
    check_reported(run_child("warp neighbours without __syncwarp", "1"), "race");
    check_clean(run_child("warp neighbours with __syncwarp", "1"));
    check_clean(run_child("warp neighbours with __syncwarp", "2"));
}

TEST_CASE("LLMC_EMU_RACECHECK=1 reports wgmma accumulators or operands touched before wgmma.wait_group") {
    check_reported(run_child("wgmma accumulators read before wait_group", "1"), "race");
    check_reported(run_child("wgmma accumulator written before wait_group", "1"), "race");
    check_reported(run_child("wgmma operand overwritten before wait_group", "1"), "race");
    check_clean(run_child("wgmma read after wait_group", "1"));
    check_clean(run_child("wgmma read after wait_group", "2"));
}

TEST_CASE("wgmma faults without a wgmma.fence, off a whole warpgroup, or with a descriptor the emulator cannot read") {
    check_reported(run_child("wgmma without wgmma.fence", "0"), "wgmma.fence");
    check_reported(run_child("wgmma descriptors differing across the warpgroup", "0"), "differs from another warp");
    check_reported(run_child("wgmma skipped by a warp of the warpgroup", "0"), ".aligned");
    check_reported(run_child("wgmma by a partial warpgroup", "0"), "warpgroup 0");
    check_reported(run_child("wgmma descriptor with a base offset", "0"), "base offset");
    check_reported(run_child("wgmma operand in static shared memory", "0"), "dynamic shared memory");
}

TEST_CASE("LLMC_EMU_RACECHECK=1 reports a TMA stage read before its mbarrier wait, or refilled under its reader") {
    check_reported(run_child("TMA stage read before its wait", "1"), "race");
    check_reported(run_child("TMA stage without an empty barrier", "1"), "race");
    check_clean(run_child("TMA stage read after its wait", "1"));
    check_clean(run_child("TMA stage read after its wait", "2"));
    check_clean(run_child("TMA ring with empty barriers", "1"));
    check_clean(run_child("TMA ring with empty barriers", "2"));
    check_clean(run_child("TMA stage with an empty barrier", "1"));
    check_clean(run_child("TMA stage with an empty barrier", "2"));
}

TEST_CASE("an mbarrier phase that can never complete (expect_tx beyond the copies' bytes) is reported as a deadlock") {
    for (const char* racecheck : {"0", "1"}) {
        const ChildResult r = run_child("TMA expect_tx beyond the copy", racecheck);
        check_reported(r, "deadlock");
        CHECK(contains(r.stderr_text, "mbarrier.try_wait.parity"));
        CHECK(contains(r.stderr_text, "tx-count 16"));
    }
}

TEST_CASE("mbarrier and TMA fault on a misaligned, unencoded or wholly outside copy, a barrier misused, or counts "
          "that underflow") {
    check_reported(run_child("TMA destination off 128 bytes", "0"), "not 128-byte aligned");
    check_reported(run_child("TMA swizzled destination off 1024 bytes", "0"), "not 1024-byte aligned");
    check_reported(run_child("TMA map never encoded", "0"), "not made by cuTensorMapEncodeTiled");
    check_reported(run_child("mbarrier in global memory", "0"), "not in shared memory");
    check_reported(run_child("mbarrier without init", "0"), "before mbarrier.init");
    check_reported(run_child("mbarrier parity 2", "0"), "phaseParity 2");
    check_reported(run_child("TMA expect_tx short of the copy", "0"), "tx-count underflow");
    check_reported(run_child("TMA expect_tx short of the copy", "1"), "tx-count underflow");
    check_reported(run_child("mbarrier arrival beyond its count", "0"), "arrive count underflow");
    check_reported(run_child("TMA box wholly outside the tensor", "0"), "wholly outside");
}

TEST_CASE("setmaxnreg: all four warps of a warpgroup must execute it (.sync.aligned)") {
    check_clean(run_child("setmaxnreg by every warp", "0"));
    check_reported(run_child("setmaxnreg skipped by a warp", "0"), ".sync.aligned");
}

TEST_CASE("make_tensor_map_2d names the value the driver would refuse") {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, 1 << 16) == cudaSuccess);
    const char* base = static_cast<const char*>(p);
    using llmc::tma::Swizzle;
    using llmc::tma::make_tensor_map_2d;
    CHECK_THROWS_WITH(make_tensor_map_2d(base + 8, 64, 64, 128, 64, 64, Swizzle::None),
                      Catch::Contains("not 16-byte aligned"));
    CHECK_THROWS_WITH(make_tensor_map_2d(base, 64, 60, 120, 8, 8, Swizzle::None),
                      Catch::Contains("row_stride_bytes 120 is not a multiple of 16"));
    CHECK_THROWS_WITH(make_tensor_map_2d(base, 64, 64, 64, 8, 8, Swizzle::None),
                      Catch::Contains("less than a row"));
    CHECK_THROWS_WITH(make_tensor_map_2d(base, 64, 64, 128, 300, 8, Swizzle::None), Catch::Contains("box_rows 300"));
    CHECK_THROWS_WITH(make_tensor_map_2d(base, 64, 64, 128, 8, 12, Swizzle::None),
                      Catch::Contains("multiple of 16 bytes"));
    CHECK_THROWS_WITH(make_tensor_map_2d(base, 64, 128, 256, 8, 128, Swizzle::Bytes128),
                      Catch::Contains("exceeds the 128-byte swizzle's span"));
    CHECK_THROWS_WITH(make_tensor_map_2d(base, 64, 64, 128, 8, 32, Swizzle::Bytes32),
                      Catch::Contains("exceeds the 32-byte swizzle's span"));
    CHECK_NOTHROW(make_tensor_map_2d(base, 64, 64, 128, 64, 64, Swizzle::Bytes128));
    // The emulator's driver function refuses a tensor outside device memory (the driver's does not look,
    // and a copy from it would fault on the GPU).
    alignas(16) static uint16_t host[64 * 64];
    CHECK_THROWS_WITH(make_tensor_map_2d(host, 64, 64, 128, 8, 8, Swizzle::None),
                      Catch::Contains("cuTensorMapEncodeTiled failed"));
    REQUIRE(cudaFree(p) == cudaSuccess);
}

TEST_CASE("a __syncthreads that not every thread of the block reaches is reported as a deadlock") {
    check_reported(run_child("__syncthreads reached by threads 0-15 of 64", "0"), "deadlock");
}

TEST_CASE("threads at __syncthreads and the rest of their warp at __syncwarp are reported as a deadlock") {
    check_reported(run_child("__syncthreads against __syncwarp", "0"), "deadlock");
}

// =============================================================================================
// Streams run lazily (stream.h): work runs when the host or a waiting stream needs it, so what a
// missing wait would let a GPU do sometimes, the emulator does every time.

TEST_CASE("a kernel on stream B sees stream A's output when B waits for A's event, and the old data when not") {
    constexpr int N = 256, OLD = 7, NEW = 42;
    cudaStream_t a, b;
    REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
    cudaEvent_t written;
    REQUIRE(cudaEventCreateWithFlags(&written, cudaEventDisableTiming) == cudaSuccess);

    int* buffer = device_copy(std::vector<int>(N, OLD));
    int* seen = device_copy(std::vector<int>(N, 0));
    LLMC_LAUNCH(fill_kernel, 1, N, 0, a)(buffer, NEW, N);
    REQUIRE(cudaEventRecord(written, a) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(b, written, 0) == cudaSuccess);
    LLMC_LAUNCH(copy_kernel, 1, N, 0, b)(seen, buffer, N);
    REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
    CHECK(all_equal(host_copy(seen, N), NEW));

    int* unordered = device_copy(std::vector<int>(N, OLD));
    LLMC_LAUNCH(fill_kernel, 1, N, 0, a)(unordered, NEW, N);
    LLMC_LAUNCH(copy_kernel, 1, N, 0, b)(seen, unordered, N);
    REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
    CHECK(all_equal(host_copy(seen, N), OLD));       // B ran before A's kernel
    CHECK(all_equal(host_copy(unordered, N), OLD));  // which has not run yet
    REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
    CHECK(all_equal(host_copy(unordered, N), NEW));

    REQUIRE(cudaFree(buffer) == cudaSuccess);
    REQUIRE(cudaFree(seen) == cudaSuccess);
    REQUIRE(cudaFree(unordered) == cudaSuccess);
    REQUIRE(cudaEventDestroy(written) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(a) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(b) == cudaSuccess);
}

TEST_CASE("cudaMemcpyAsync into pinned memory lands only when the stream is synchronised") {
    constexpr int N = 256;
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    int* pinned = nullptr;
    REQUIRE(cudaMallocHost(&pinned, N * sizeof(int)) == cudaSuccess);
    for (int i = 0; i < N; i++) pinned[i] = -1;
    int* buffer = device_copy(std::vector<int>(N, 0));
    LLMC_LAUNCH(fill_kernel, 1, 64, 0, s)(buffer, 5, N);
    REQUIRE(cudaMemcpyAsync(pinned, buffer, N * sizeof(int), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(std::vector<int>(pinned, pinned + N) == std::vector<int>(N, -1));
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(std::vector<int>(pinned, pinned + N) == std::vector<int>(N, 5));
    REQUIRE(cudaFree(buffer) == cudaSuccess);
    REQUIRE(cudaFreeHost(pinned) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("cudaEventQuery answers cudaErrorNotReady for pending work first, then cudaSuccess with the work done") {
    constexpr int N = 256;
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    cudaEvent_t done;
    REQUIRE(cudaEventCreate(&done) == cudaSuccess);
    int* buffer = device_copy(std::vector<int>(N, 0));
    LLMC_LAUNCH(fill_kernel, 1, 64, 0, s)(buffer, 9, N);
    REQUIRE(cudaEventRecord(done, s) == cudaSuccess);
    CHECK(cudaEventQuery(done) == cudaErrorNotReady);
    int polls = 0;
    while (cudaEventQuery(done) == cudaErrorNotReady && polls < 1000) polls++;
    CHECK(polls < 1000);
    CHECK(cudaEventQuery(done) == cudaSuccess);
    CHECK(all_equal(host_copy(buffer, N), 9));  // a legacy-stream copy: it does not wait for `s`
    CHECK(cudaGetLastError() == cudaSuccess);   // "not ready" is an answer, not an error
    REQUIRE(cudaFree(buffer) == cudaSuccess);
    REQUIRE(cudaEventDestroy(done) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("a null-stream cudaMemcpy waits for a blocking stream's kernel, not for a non-blocking stream's") {
    constexpr int N = 256, OLD = 3, NEW = 4;
    cudaStream_t non_blocking, blocking;
    REQUIRE(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);

    int* buffer = device_copy(std::vector<int>(N, OLD));
    LLMC_LAUNCH(fill_kernel, 1, 64, 0, non_blocking)(buffer, NEW, N);
    CHECK(all_equal(host_copy(buffer, N), OLD));
    REQUIRE(cudaStreamSynchronize(non_blocking) == cudaSuccess);
    CHECK(all_equal(host_copy(buffer, N), NEW));

    int* other = device_copy(std::vector<int>(N, OLD));
    LLMC_LAUNCH(fill_kernel, 1, 64, 0, blocking)(other, NEW, N);
    CHECK(all_equal(host_copy(other, N), NEW));

    REQUIRE(cudaFree(buffer) == cudaSuccess);
    REQUIRE(cudaFree(other) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(non_blocking) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(blocking) == cudaSuccess);
}

// =============================================================================================
// Device memory and the device.

TEST_CASE("fresh cudaMalloc memory is 0xff bytes (NaN in bf16 and fp32), as a GPU's is garbage") {
    constexpr size_t BYTES = 1000;
    unsigned char* p = nullptr;
    REQUIRE(cudaMalloc(&p, BYTES) == cudaSuccess);
    CHECK(host_copy(p, BYTES) == std::vector<unsigned char>(BYTES, 0xff));
    REQUIRE(cudaFree(p) == cudaSuccess);
}

TEST_CASE("a copy with a device side beyond its allocation returns cudaErrorInvalidValue and copies nothing") {
    constexpr size_t BYTES = 1000;
    unsigned char* p = nullptr;
    REQUIRE(cudaMalloc(&p, BYTES) == cudaSuccess);
    std::vector<unsigned char> host(BYTES + 1, 0x11);
    CHECK(cudaMemcpy(host.data(), p, BYTES + 1, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK(host == std::vector<unsigned char>(BYTES + 1, 0x11));
    CHECK(cudaMemcpy(p + 500, host.data(), 501, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaMemcpyAsync(p + 1, host.data(), BYTES, cudaMemcpyHostToDevice, 0) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(host_copy(p, BYTES) == std::vector<unsigned char>(BYTES, 0xff));
    CHECK(cudaMemcpy(p + 500, host.data(), 500, cudaMemcpyHostToDevice) == cudaSuccess);  // up to the end
    REQUIRE(cudaFree(p) == cudaSuccess);
}

TEST_CASE("the device is an H100: compute capability 9.0, 132 SMs, about 80 GB") {
    int devices = 0;
    REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
    CHECK(devices >= 1);
    cudaDeviceProp prop;
    REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    CHECK(contains(prop.name, "H100"));
    CHECK(prop.major == 9);
    CHECK(prop.minor == 0);
    CHECK(prop.multiProcessorCount == 132);
    CHECK(prop.sharedMemPerBlockOptin == 232448);

    size_t free_bytes = 0, total_bytes = 0;
    REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
    const double total_gib = (double)total_bytes / (1 << 30);
    INFO("total " << total_bytes << " bytes (" << total_gib << " GiB)");
    CHECK(total_gib > 79.0);
    CHECK(total_gib <= 80.0);
    CHECK(free_bytes <= total_bytes);
    void* p = nullptr;
    constexpr size_t BYTES = size_t(64) << 20;
    REQUIRE(cudaMalloc(&p, BYTES) == cudaSuccess);
    size_t free_after = 0;
    REQUIRE(cudaMemGetInfo(&free_after, &total_bytes) == cudaSuccess);
    CHECK(free_bytes - free_after >= BYTES);
    REQUIRE(cudaFree(p) == cudaSuccess);
}

int main(int argc, char** argv) {
    if (const char* scenario = getenv(CHILD_VARIABLE)) return run_scenario(scenario);
    return run_catch_session(argc, argv);
}
