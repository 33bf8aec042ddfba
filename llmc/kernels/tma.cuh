// tma.cuh: Hopper's mbarrier and TMA bulk tensor copies as small device wrappers, and the host's
// tensor map, for an sm_90a kernel in the FlashAttention-3 style (a producer warp loading K/V tiles
// into a ring of shared-memory stages, consumer warpgroups on wgmma; issue 37). Written in
// wgmma.cuh's way: under LLMC_EMU each wrapper calls the emulator's body (dev/emu/ptx.h says what is
// emulated, from which sections of the PTX ISA); otherwise inline PTX, which exists for sm_90a only:
// in a pass for another architecture (the compute_80 PTX of make/flags.mk's list) a wrapper traps,
// so the file compiles everywhere and a kernel must not call it off Hopper.
//
// The protocol of one stage (PTX ISA, mbarrier and cp.async.bulk.tensor):
//   one thread:  mbarrier_init(&full, 1) (and &empty, consumers), fence_barrier_init(), then the
//                block's __syncthreads before any other thread uses the barriers;
//   producer:    mbarrier_wait(&empty, phase ^ 1); mbarrier_arrive_expect_tx(&full, box bytes);
//                copy_2d(stage, &map, x, y, &full)   (one thread)
//   consumers:   mbarrier_wait(&full, phase); read the stage (wgmma); mbarrier_arrive(&empty)
// A barrier's phases alternate in parity: the k-th wait on a barrier (from 0) waits for parity k & 1.
// A fresh barrier's phase 0 is incomplete and parity 1 counts as complete (the "preceding phase"),
// so a producer's first wait on an empty barrier, for parity 1, returns at once.
//
// The tensor map: make_tensor_map_2d (host) encodes a row-major bf16 matrix and a box of box_rows x
// box_cols; copy_2d(dst, &map, x, y, bar) copies the box whose top-left element is column x, row y
// into shared memory, row after row (box_cols * 2 bytes each), out-of-bound elements as zeros, and
// counts the box's bytes (all of them, zeros included) as the barrier's transactions. With a
// W-byte swizzle the 16-byte chunks of each W-byte span are permuted by the address's 128-byte line
// (the pattern repeats every 8 W bytes); box_cols * 2 = 128 with Swizzle::Bytes128 gives wgmma's
// K-major 128-byte-swizzled tile (rows of 128 bytes, SBO 1024) when `dst` is 1024-byte aligned.
// The kernel takes the map as `const __grid_constant__ CUtensorMap map` and passes &map.
#pragma once

#include <cuda.h>  // CUtensorMap and the driver's types only: nothing links -lcuda
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "llmc/utils.h"

namespace llmc::tma {

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMC_TMA_TRAP 1  // a device pass for an architecture without TMA
#endif

#if !defined(LLMC_EMU) && !defined(LLMC_TMA_TRAP)
namespace detail {
__device__ inline uint32_t shared_address(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
}  // namespace detail
#endif

// mbarrier.init.shared::cta.b64: expected arrival count `arrivals` (1 .. 2^20 - 1), phase 0. `bar`
// must be 8-byte aligned in shared memory.
__device__ inline void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#if defined(LLMC_EMU)
    emu::ptx::mbarrier_init(bar, arrivals);
#elif defined(LLMC_TMA_TRAP)
    (void)bar, (void)arrivals;
    __trap();
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(detail::shared_address(bar)), "r"(arrivals)
                 : "memory");
#endif
}
// After the inits, before the block's barrier that publishes them: fence.mbarrier_init.release.cluster
// (the ISA's fence for mbarrier.init) and fence.proxy.async.shared::cta (the CUDA programming guide's
// TMA example makes the initialised barrier visible to the async proxy, where complete_tx acts, with
// it). Both: once per block, and either reading of the ISA is covered.
__device__ inline void fence_barrier_init() {
#if defined(LLMC_EMU)
    emu::ptx::fence_mbarrier_init();
#elif defined(LLMC_TMA_TRAP)
    __trap();
#else
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// mbarrier.arrive.shared::cta.b64: one arrival (release semantics, CTA scope).
__device__ inline void mbarrier_arrive(uint64_t* bar) {
#if defined(LLMC_EMU)
    emu::ptx::mbarrier_arrive(bar);
#elif defined(LLMC_TMA_TRAP)
    (void)bar;
    __trap();
#else
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(detail::shared_address(bar)) : "memory");
#endif
}
// mbarrier.arrive.expect_tx.shared::cta.b64: adds `bytes` to the phase's tx-count, then arrives.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(LLMC_EMU)
    emu::ptx::mbarrier_arrive_expect_tx(bar, bytes);
#elif defined(LLMC_TMA_TRAP)
    (void)bar, (void)bytes;
    __trap();
#else
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(detail::shared_address(bar)),
                 "r"(bytes)
                 : "memory");
#endif
}
// mbarrier.try_wait.parity.shared::cta.b64: whether the phase of parity `parity` (0 or 1) has
// completed; may suspend the thread a while first (acquire semantics when true).
__device__ inline bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
#if defined(LLMC_EMU)
    return emu::ptx::mbarrier_try_wait_parity(bar, parity);
#elif defined(LLMC_TMA_TRAP)
    (void)bar, (void)parity;
    __trap();
    return false;
#else
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(detail::shared_address(bar)), "r"(parity)
        : "memory");
    return done != 0;
#endif
}
// Waits until the phase of parity `parity` has completed.
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {
    }
}

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes: the box at column x,
// row y (in elements; either may be negative or run past the tensor: those elements are zeros, but
// some element must lie inside it: a box wholly outside faulted on an H200, "illegal instruction") into
// `shared_dst` (128-byte aligned; the swizzle's repeat, 256, 512 or 1024 bytes, for a swizzled map),
// complete_tx of the box's bytes on `bar` when it lands. Issued by one thread.
__device__ inline void copy_2d(void* shared_dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
#if defined(LLMC_EMU)
    emu::ptx::tma_copy_2d(shared_dst, map, x, y, bar);
#elif defined(LLMC_TMA_TRAP)
    (void)shared_dst, (void)map, (void)x, (void)y, (void)bar;
    __trap();
#else
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
            "r"(detail::shared_address(shared_dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(detail::shared_address(bar))
        : "memory");
#endif
}
// prefetch.tensormap: the map's 128 bytes into the cache ahead of the first copy.
__device__ inline void prefetch_tensor_map(const CUtensorMap* map) {
#if defined(LLMC_EMU)
    emu::ptx::tma_prefetch(map);
#elif defined(LLMC_TMA_TRAP)
    (void)map;
    __trap();
#else
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 REGS: raises (consumers) or lowers (the producer) the
// per-thread register limit of the executing warpgroup; all four of its warps execute the same one.
template <int REGS>
__device__ inline void setmaxnreg_inc() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if defined(LLMC_EMU)
    emu::ptx::setmaxnreg(REGS, true);
#elif defined(LLMC_TMA_TRAP)
    __trap();
#else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ inline void setmaxnreg_dec() {
    static_assert(REGS >= 24 && REGS <= 256 && REGS % 8 == 0, "setmaxnreg takes a multiple of 8 in [24, 256]");
#if defined(LLMC_EMU)
    emu::ptx::setmaxnreg(REGS, false);
#elif defined(LLMC_TMA_TRAP)
    __trap();
#else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

// ---------------------------------------------------------------------------------------------
// Host: the tensor map.

enum class Swizzle { None, Bytes32, Bytes64, Bytes128 };

// A bf16 matrix of rows x cols at `base` (device memory), rows `row_stride_bytes` apart, copied in
// boxes of box_rows x box_cols. The requirements are the driver's (cuTensorMapEncodeTiled's reference),
// checked here first so that a failure names the value: base 16-byte aligned, the stride a multiple of
// 16 below 2^40 and at least a row, dimensions 1 .. 2^32, box sizes 1 .. 256, a box row a multiple of
// 16 bytes, and within the swizzle's span when swizzled. The driver's function comes through
// cudaGetDriverEntryPointByVersion (cudaGetDriverEntryPoint with the version pinned, since CUDA 13
// deprecates the unversioned one), so nothing links -lcuda; the emulator answers with its own.
inline CUtensorMap make_tensor_map_2d(const void* base, uint64_t rows, uint64_t cols, uint64_t row_stride_bytes,
                                      uint32_t box_rows, uint32_t box_cols, Swizzle swizzle) {
    constexpr uint64_t ELEMENT = 2;  // bf16
    const int swizzle_bytes[] = {0, 32, 64, 128};
    const int span = swizzle_bytes[(int)swizzle];
    const std::string where = "make_tensor_map_2d: ";
    if (reinterpret_cast<uintptr_t>(base) % 16)
        fail(where + strformat("base %p is not 16-byte aligned", base));
    if (rows < 1 || rows > (1ull << 32) || cols < 1 || cols > (1ull << 32))
        fail(where + strformat("rows %llu and cols %llu must be in 1 .. 2^32", (unsigned long long)rows,
                               (unsigned long long)cols));
    if (row_stride_bytes % 16 || row_stride_bytes >= (1ull << 40))
        fail(where + strformat("row_stride_bytes %llu is not a multiple of 16 below 2^40",
                               (unsigned long long)row_stride_bytes));
    if (row_stride_bytes < cols * ELEMENT)
        fail(where + strformat("row_stride_bytes %llu is less than a row of %llu bf16 elements",
                               (unsigned long long)row_stride_bytes, (unsigned long long)cols));
    if (box_rows < 1 || box_rows > 256 || box_cols < 1 || box_cols > 256)
        fail(where + strformat("box_rows %u and box_cols %u must be in 1 .. 256", box_rows, box_cols));
    if (box_cols * ELEMENT % 16)
        fail(where + strformat("box_cols %u: a box row (%llu bytes) must be a multiple of 16 bytes", box_cols,
                               (unsigned long long)(box_cols * ELEMENT)));
    if (span && box_cols * ELEMENT > (uint64_t)span)
        fail(where + strformat("box_cols %u: a box row (%llu bytes) exceeds the %d-byte swizzle's span", box_cols,
                               (unsigned long long)(box_cols * ELEMENT), span));
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || !function)
        fail(where + strformat("the driver has no cuTensorMapEncodeTiled (%s)", cudaGetErrorString(err)));
    using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    const cuuint64_t dims[2] = {cols, rows}, strides[1] = {row_stride_bytes};
    const cuuint32_t box[2] = {box_cols, box_rows}, element_strides[2] = {1, 1};
    const CUtensorMapSwizzle modes[] = {CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_SWIZZLE_32B,
                                        CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_SWIZZLE_128B};
    CUtensorMap map;
    const CUresult result = reinterpret_cast<Encode>(function)(
        &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE, modes[(int)swizzle], CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS)
        fail(where + strformat("cuTensorMapEncodeTiled failed (CUresult %d) for base %p, %llu x %llu, stride %llu, "
                               "box %u x %u, swizzle %d bytes",
                               (int)result, base, (unsigned long long)rows, (unsigned long long)cols,
                               (unsigned long long)row_stride_bytes, box_rows, box_cols, span));
    return map;
}

}  // namespace llmc::tma

#undef LLMC_TMA_TRAP
