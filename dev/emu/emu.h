// dev/emu/emu.h: the CUDA emulator. llmc's CUDA sources, compiled by g++, run on the CPU.
//
// What it is. The emulation build (`make train_gpt_emu`, `make test-emu`; flags in make/emu.mk)
// compiles the same .cu and .cuh files that nvcc compiles for sm_90a, as C++, with this folder's
// include/ first on the include path. The toolkit's own headers give the types and declarations of
// the CUDA runtime, cuBLASLt and NCCL; this folder defines the functions:
//   - runtime.cpp: device memory (host memory, so AddressSanitizer sees a kernel's out-of-bounds
//     access), streams and events with their ordering rules, a device that reports itself as an
//     H100 (132 SMs, 80 GB, compute capability 9.0), and kernel launches;
//   - fibers: every CUDA thread of a block is a fiber (boost.context), so __syncthreads, __syncwarp,
//     warp shuffles and votes, static and dynamic __shared__ memory and the built-in indices behave as
//     on a GPU; blocks run in parallel on OpenMP threads; dynamic shared memory starts only 16-byte
//     aligned (CUDA's promise, DYNAMIC_SHARED_OFFSET), so a kernel that assumes more is caught;
//   - ptx.h: an emulated body for each inline-PTX wrapper llmc has (cp.async, ldmatrix, mma.sync
//     m16n8k16 bf16, ex2.approx, Hopper's wgmma with shared-memory descriptors, mbarrier, TMA's
//     cp.async.bulk.tensor, setmaxnreg), written from the PTX ISA's tables and definitions; a thread
//     waiting on an mbarrier yields to the others, and a phase nothing can complete is a deadlock;
//   - cublaslt.cpp: cublasLtMatmul on a CPU GEMM with fp32 accumulation; nccl.cpp: NCCL over MPI,
//     one emulated GPU per process.
// A launch is checked against an H100's limits and fails as it would there (cudaGetLastError); where
// nvcc exists, also against the kernel's __launch_bounds__, registers and static shared memory as
// ptxas reports them for sm_90a (kernel_resources.h).
// Races: every launch can run under several schedules of its threads (LLMC_EMU_RACECHECK=1), and a
// kernel whose output depends on the schedule is reported; streams run lazily, so a missing
// cudaStreamWaitEvent or synchronisation shows as wrong results (stream.h).
//
// What it is not. It says nothing about speed, occupancy, register pressure, bank conflicts, memory
// bandwidth, cuBLASLt's choice of algorithm or NCCL's algorithms and stream deadlocks; its floating
// point is the CPU's (no FMA contraction where nvcc would fuse, ex2.approx exact), so results match
// a GPU's to bf16 tolerance, not bitwise. Built without nvcc, a program has no table of its kernels,
// and __launch_bounds__, registers and static shared memory go unchecked. dev/cuda/NOTES.md lists
// what still needs a GPU.
//
// The kernel sources change in three places only, each spelled for both compilers: LLMC_LAUNCH in
// place of <<<...>>> (cuda_common.cuh), dynamic_shared_memory<T>() in place of `extern __shared__`,
// and each inline-PTX wrapper's emulated body under #ifdef LLMC_EMU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#ifndef LLMC_EMU
#error "dev/emu/emu.h is the emulation build's (compile with -DLLMC_EMU and -Idev/emu/include)"
#endif

// ---- the device language: what nvcc's front end would give ----
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#undef __grid_constant__
#undef __managed__
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __grid_constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// All fibers of a block run on one OS thread, and one block at a time per OS thread: a thread_local
// is then exactly a block's shared variable.
#define __shared__ static thread_local

namespace emu {

// The CUDA thread running now on this OS thread (a fiber of the current block).
struct ThreadState {
    uint3 thread_idx;
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
    int lane = 0, warp = 0, linear = 0;
};
extern thread_local ThreadState* current_thread;
inline const ThreadState& current() { return *current_thread; }

// Block-wide barrier (__syncthreads); `count_in` and the results serve __syncthreads_count/and/or.
int block_barrier(int predicate);
// A warp collective: every lane in `mask` (each must be a live lane of this warp) deposits `bytes`
// (at most 64) from `mine`; when all have, every one of them gets all 32 lanes' deposits in `all`
// (lanes not in the mask: zeros). `what` names the operation in error reports ("__shfl_xor_sync").
void warp_exchange(unsigned mask, const void* mine, void* all, size_t bytes, const char* what);
// The same, for a shuffle: the lane gets only lane `source`'s deposit, in `out`.
void warp_shuffle(unsigned mask, const void* mine, void* out, size_t bytes, int source, const char* what);
// A warp collective whose result is computed once for the warp: when every lane of `mask` has
// deposited `bytes` from `mine`, combine(deposits, results) runs once (deposits[l] and results[l]
// are lane l's, 64 bytes each), and each lane gets its own result in `out` (`out_bytes`).
using WarpCombine = void (*)(const unsigned char (*deposits)[64], unsigned char (*results)[64]);
void warp_combine(unsigned mask, const void* mine, size_t bytes, void* out, size_t out_bytes, const char* what,
                  WarpCombine combine);
// For the race check: a float atomic ran in this launch (its result may differ in the last bits
// between schedules, see runtime.cpp).
void note_float_atomic();
// Base of this OS thread's dynamic shared memory arena (227 KB) and the 32-bit shared window.
unsigned char* dynamic_shared_base();
uintptr_t shared_window_base();
[[noreturn]] void device_fault(const char* what, const char* message);

}  // namespace emu

#define threadIdx (::emu::current().thread_idx)
#define blockIdx (::emu::current().block_idx)
#define blockDim (::emu::current().block_dim)
#define gridDim (::emu::current().grid_dim)
#define warpSize 32

// ---- synchronisation ----
inline void __syncthreads() { (void)emu::block_barrier(0); }
inline int __syncthreads_count(int p) { return emu::block_barrier(p ? 1 : 0); }
inline int __syncthreads_and(int p) { return emu::block_barrier(p ? 1 : 0) == (int)(blockDim.x * blockDim.y * blockDim.z); }
inline int __syncthreads_or(int p) { return emu::block_barrier(p ? 1 : 0) != 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    char none = 0, all[32];
    emu::warp_exchange(mask, &none, all, 1, "__syncwarp");
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- warp shuffles and votes, by the CUDA programming guide's rules for width and masks ----
namespace emu {
template <typename T>
T shuffle_from(unsigned mask, T var, int source_of_this_lane, const char* what) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "shuffle of a type wider than 16 bytes");
    T value;
    warp_shuffle(mask, &var, &value, sizeof(T), source_of_this_lane, what);
    return value;
}
inline void check_width(int width, const char* what) {
    if (width < 1 || width > 32 || (width & (width - 1)))
        device_fault(what, "width must be a power of 2 in [1, 32]");
}
}  // namespace emu

// Within a width-wide section of the warp: the source wraps modulo width.
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    emu::check_width(width, "__shfl_sync");
    const int lane = emu::current().lane;
    return emu::shuffle_from(mask, var, (lane & ~(width - 1)) + (src_lane & (width - 1)), "__shfl_sync");
}
// A source beyond the section's start or end gives the lane its own value.
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    emu::check_width(width, "__shfl_up_sync");
    const int lane = emu::current().lane;
    const int src = (lane & (width - 1)) >= (int)delta ? lane - (int)delta : lane;
    return emu::shuffle_from(mask, var, src, "__shfl_up_sync");
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    emu::check_width(width, "__shfl_down_sync");
    const int lane = emu::current().lane;
    const int src = (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane;
    return emu::shuffle_from(mask, var, src, "__shfl_down_sync");
}
// lane ^ lane_mask; a source in a later section gives the lane its own value.
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    emu::check_width(width, "__shfl_xor_sync");
    const int lane = emu::current().lane;
    const int src = lane ^ lane_mask;
    return emu::shuffle_from(mask, var, src >= ((lane / width) + 1) * width ? lane : src, "__shfl_xor_sync");
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    int p = predicate != 0, all[32];
    emu::warp_exchange(mask, &p, all, sizeof p, "__ballot_sync");
    unsigned bits = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && all[l]) bits |= 1u << l;
    return bits;
}
inline int __all_sync(unsigned mask, int p) { return __ballot_sync(mask, p) == mask; }
inline int __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0; }
// Every live lane of the warp counts as active: the emulator has no divergence within a warp.
unsigned __activemask();

// ---- atomics: blocks run on several OS threads at once, so these are real atomics ----
template <typename T>
T atomicAdd(T* address, T value) {
    if constexpr (std::is_floating_point_v<T>) emu::note_float_atomic();
    std::atomic_ref<T> a(*address);
    if constexpr (std::is_integral_v<T>) {
        return a.fetch_add(value);
    } else {
        T old = a.load();
        while (!a.compare_exchange_weak(old, old + value)) {
        }
        return old;
    }
}
namespace emu {
// Stores `value` while `replaces(old, value)` holds of the current contents; returns the old value.
template <typename T, typename Replaces>
T atomic_store_if(T* address, T value, Replaces replaces) {
    std::atomic_ref<T> a(*address);
    T old = a.load();
    while (replaces(old, value) && !a.compare_exchange_weak(old, value)) {
    }
    return old;
}
}  // namespace emu
template <typename T>
T atomicMax(T* address, T value) {
    return emu::atomic_store_if(address, value, [](T old, T v) { return old < v; });
}
template <typename T>
T atomicMin(T* address, T value) {
    return emu::atomic_store_if(address, value, [](T old, T v) { return v < old; });
}
template <typename T>
T atomicExch(T* address, T value) {
    return std::atomic_ref<T>(*address).exchange(value);
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
    std::atomic_ref<T>(*address).compare_exchange_strong(compare, value);
    return compare;
}

// ---- arithmetic intrinsics: IEEE round-to-nearest is the CPU's own ----
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float a) { return std::exp(a); }
inline float __logf(float a) { return std::log(a); }
inline float __tanhf(float a) { return std::tanh(a); }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : (a > 1.0f ? 1.0f : a); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// The device math library's min and max overloads (CUDA declares them for every integer and float type).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// The runtime's C++ overload that nvcc's cuda_runtime.h adds: a kernel by its own type.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// ---- cache-hinted loads and stores: plain ones here ----
template <typename T>
T __ldcs(const T* p) { return *p; }
template <typename T>
T __ldg(const T* p) { return *p; }
template <typename T>
T __ldcg(const T* p) { return *p; }
template <typename T>
void __stcs(T* p, T v) { *p = v; }
template <typename T>
void __stcg(T* p, T v) { *p = v; }

// ---- shared memory addresses: 32-bit offsets into the OS thread's shared window ----
inline size_t __cvta_generic_to_shared(const void* p) {
    const uintptr_t offset = reinterpret_cast<uintptr_t>(p) - emu::shared_window_base();
    if (offset >> 32) emu::device_fault("__cvta_generic_to_shared", "the pointer is not in shared memory");
    return offset;
}
namespace emu {
inline void* shared_pointer(uint32_t address) { return reinterpret_cast<void*>(shared_window_base() + address); }
}  // namespace emu

#include "dev/emu/launch.h"
#include "dev/emu/ptx.h"
