// wgmma.cuh: Hopper's warpgroup matrix product (wgmma.mma_async m64nNk16, fp32 += bf16 x bf16) as
// small device wrappers, for an sm_90a kernel (a FlashAttention-3-style attention, issue 37). Under
// LLMC_EMU each calls the emulator's body (dev/emu/ptx.h, which says what is emulated and from which
// sections of the PTX ISA); otherwise inline PTX, which exists for sm_90a only: in a pass for another
// architecture (the compute_80 PTX of make/flags.mk's list) a wrapper traps, so the file compiles
// everywhere and a kernel must not call it off Hopper.
//
// One product, by a warpgroup (4 consecutive warps from a multiple of 4, 128 threads):
//   D (64 x N, fp32 registers) = A (64 x 16, bf16) B (16 x N, bf16) [+ D]
// A comes from shared memory through a matrix descriptor, or from registers; B from shared memory.
// The registers, with g = lane / 4, t = lane % 4 and q = warp % 4 (rows counted from 16 q):
//   d[4j], d[4j+1]: row g, columns 8j+2t, 8j+2t+1; d[4j+2], d[4j+3]: row g+8, same columns (j < N/8)
//   a[0]: row g, K 2t, 2t+1; a[1]: row g+8, same; a[2]: row g, K 2t+8, 2t+9; a[3]: row g+8, same
// so a warp holds its 16 rows as mma.sync m16n8k16 would (attention.cuh), N/8 tiles side by side.
//
// A shared operand is described by `descriptor` (below): its start, two byte offsets between its
// 8 x 16-byte core matrices or swizzle atoms, and the swizzle. TRANS = false reads it K-major (16 K of
// an A row or a B column contiguous), true MN-major. The byte offsets, by the PTX ISA's canonical
// layouts (bf16; W = the swizzle's width, 32, 64 or 128 bytes):
//   K-major, no swizzle:   core matrices of 8 rows x 16 bytes; LBO: the next 8 K, SBO: the next 8 rows
//   K-major, W swizzle:    rows of W bytes; SBO: the next 8 rows (LBO unused)
//   MN-major, no swizzle:  core matrices of 8 K x 16 bytes; LBO: the next 8 K, SBO: the next 8 MN
//   MN-major, W swizzle:   K rows of W bytes (W/2 MN); LBO: the next W/2 MN, SBO: the next 8 K
// A swizzled pattern (8 rows of W bytes) must start on a multiple of 8 W bytes of the shared address
// space; within it, the start may move along K (K-major: + 32 bytes for the next 16 K).
//
// The protocol (PTX ISA): fence() before the first mma and between a thread's own access to the
// accumulators or A registers and the next mma that uses them; fence_proxy_async() between threads'
// ordinary stores to an operand and the mma that reads it (with the block's barrier); then the
// mma's, commit_group(), and wait_group<N>() before reading the accumulators: until then neither
// they nor the A registers may be touched, and the shared operands must stay as they are.
// fence_operands() keeps the compiler from moving an access to the accumulators across the
// asynchronous instructions (it knows nothing of them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace llmc::wgmma {

// The descriptor's swizzle field (bits 62-63).
enum class Swizzle : uint64_t { None = 0, Bytes128 = 1, Bytes64 = 2, Bytes32 = 3 };

// The PTX ISA's matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4.
__host__ __device__ constexpr uint64_t descriptor_field(uint32_t bytes) { return (bytes & 0x3ffffu) >> 4; }

// The 64-bit matrix descriptor: start address (bits 0-13), leading dimension byte offset (16-29),
// stride dimension byte offset (32-45), base offset 0 (49-51), swizzle (62-63). All three byte values
// must be multiples of 16 (the emulator checks, and that the operand lies in dynamic shared memory).
__device__ inline uint64_t descriptor(uint32_t shared_address, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                      Swizzle swizzle) {
#ifdef LLMC_EMU
    emu::ptx::wgmma_check_descriptor(shared_address, lbo_bytes, sbo_bytes);
#endif
    return descriptor_field(shared_address) | descriptor_field(lbo_bytes) << 16 | descriptor_field(sbo_bytes) << 32 |
           (uint64_t)swizzle << 62;
}

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMC_WGMMA_TRAP 1  // a device pass for an architecture without wgmma
#endif

__device__ inline void fence() {
#if defined(LLMC_EMU)
    emu::ptx::wgmma_fence();
#elif defined(LLMC_WGMMA_TRAP)
    __trap();
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void commit_group() {
#if defined(LLMC_EMU)
    emu::ptx::wgmma_commit_group();
#elif defined(LLMC_WGMMA_TRAP)
    __trap();
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N of this warp's committed groups are still in flight.
template <int N>
__device__ inline void wait_group() {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes an integer constant; llmc uses 0-7");
#if defined(LLMC_EMU)
    emu::ptx::wgmma_wait_group(N);
#elif defined(LLMC_WGMMA_TRAP)
    __trap();
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Orders the block's earlier generic-proxy writes to shared memory before later async-proxy reads
// (a wgmma's operands): fence.proxy.async.shared::cta.
__device__ inline void fence_proxy_async() {
#if defined(LLMC_EMU)
    emu::ptx::fence_proxy_async();
#elif defined(LLMC_WGMMA_TRAP)
    __trap();
#else
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Pins the accumulators in place around the asynchronous instructions (a no-op instruction-wise).
template <int R>
__device__ inline void fence_operands(float (&d)[R]) {
#ifndef LLMC_EMU
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
#else
    (void)d;
#endif
}

#if !defined(LLMC_EMU) && !defined(LLMC_WGMMA_TRAP)
namespace detail {

#define LLMC_WGMMA_D8(d, i)                                                                                     \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define LLMC_WGMMA_D32(d, i) \
    LLMC_WGMMA_D8(d, i), LLMC_WGMMA_D8(d, i + 8), LLMC_WGMMA_D8(d, i + 16), LLMC_WGMMA_D8(d, i + 24)
// The accumulator registers of an m64nNk16 product: %0 .. %(N/2 - 1).
#define LLMC_WGMMA_D_REGS_64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"

#define LLMC_WGMMA_D_REGS_128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

#define LLMC_WGMMA_D_REGS_256 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// The instruction for each N that llmc's wrappers spell (the emulator takes any multiple of 8 up to 256).
template <int N>
struct Mma;
template <>
struct Mma<64> {
    template <bool TRANS_A, bool TRANS_B>
    __device__ static void ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" LLMC_WGMMA_D_REGS_64 "}, %32, %33, p, 1, 1, "
            "%35, %36;\n}\n"
            : LLMC_WGMMA_D32(d, 0)
            : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"((int)TRANS_A), "n"((int)TRANS_B));
    }
    template <bool TRANS_B>
    __device__ static void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" LLMC_WGMMA_D_REGS_64 "}, "
            "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
            : LLMC_WGMMA_D32(d, 0)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"((int)TRANS_B));
    }
};
template <>
struct Mma<128> {
    template <bool TRANS_A, bool TRANS_B>
    __device__ static void ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LLMC_WGMMA_D_REGS_128 "}, %64, %65, p, 1, 1, "
            "%67, %68;\n}\n"
            : LLMC_WGMMA_D32(d, 0), LLMC_WGMMA_D32(d, 32)
            : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"((int)TRANS_A), "n"((int)TRANS_B));
    }
    template <bool TRANS_B>
    __device__ static void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LLMC_WGMMA_D_REGS_128 "}, "
            "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
            : LLMC_WGMMA_D32(d, 0), LLMC_WGMMA_D32(d, 32)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"((int)TRANS_B));
    }
};
template <>
struct Mma<256> {
    template <bool TRANS_A, bool TRANS_B>
    __device__ static void ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" LLMC_WGMMA_D_REGS_256 "}, %128, %129, p, 1, 1, "
            "%131, %132;\n}\n"
            : LLMC_WGMMA_D32(d, 0), LLMC_WGMMA_D32(d, 32), LLMC_WGMMA_D32(d, 64), LLMC_WGMMA_D32(d, 96)
            : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"((int)TRANS_A), "n"((int)TRANS_B));
    }
    template <bool TRANS_B>
    __device__ static void rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" LLMC_WGMMA_D_REGS_256 "}, "
            "{%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
            : LLMC_WGMMA_D32(d, 0), LLMC_WGMMA_D32(d, 32), LLMC_WGMMA_D32(d, 64), LLMC_WGMMA_D32(d, 96)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"((int)TRANS_B));
    }
};

#undef LLMC_WGMMA_D8
#undef LLMC_WGMMA_D32
#undef LLMC_WGMMA_D_REGS_64
#undef LLMC_WGMMA_D_REGS_128
#undef LLMC_WGMMA_D_REGS_256

}  // namespace detail
#endif

// d (= or +=) A B, A and B in shared memory ("SS"): wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16
// d, desc_a, desc_b, scale_d, 1, 1, TRANS_A, TRANS_B. scale_d false: d = A B (d's values unread).
template <int N, bool TRANS_A, bool TRANS_B>
__device__ inline void mma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "llmc spells wgmma for N = 64, 128 and 256");
#if defined(LLMC_EMU)
    emu::ptx::wgmma_mma_async(d, N, desc_a, desc_b, scale_d, TRANS_A, TRANS_B);
#elif defined(LLMC_WGMMA_TRAP)
    (void)d, (void)desc_a, (void)desc_b, (void)scale_d;
    __trap();
#else
    detail::Mma<N>::template ss<TRANS_A, TRANS_B>(d, desc_a, desc_b, scale_d ? 1 : 0);
#endif
}
// The same with A in registers ("RS"; the fragment above): d, {a0, a1, a2, a3}, desc_b, scale_d, 1, 1,
// TRANS_B.
template <int N, bool TRANS_B>
__device__ inline void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "llmc spells wgmma for N = 64, 128 and 256");
#if defined(LLMC_EMU)
    emu::ptx::wgmma_mma_async_rs(d, N, a, desc_b, scale_d, TRANS_B);
#elif defined(LLMC_WGMMA_TRAP)
    (void)d, (void)a, (void)desc_b, (void)scale_d;
    __trap();
#else
    detail::Mma<N>::template rs<TRANS_B>(d, a, desc_b, scale_d ? 1 : 0);
#endif
}

}  // namespace llmc::wgmma

#undef LLMC_WGMMA_TRAP
