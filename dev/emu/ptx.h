// dev/emu/ptx.h: emulated bodies for the inline PTX that llmc's kernels use, from the PTX ISA
// (version 8.x): cp.async with zero fill, ldmatrix .x4 and .x4.trans, mma.sync m16n8k16 bf16 with
// fp32 accumulation, ex2.approx.ftz, and Hopper's wgmma (mma_async m64nNk16 f32 += bf16 x bf16 with
// shared-memory descriptors, fence, commit_group, wait_group), mbarrier (init, arrive,
// arrive.expect_tx, try_wait.parity, with phases and tx-count), TMA's cp.async.bulk.tensor.2d (tiled,
// every swizzle mode, out-of-bound zero fill) and setmaxnreg. Each wrapper in
// llmc/kernels/attention.cuh, llmc/kernels/wgmma.cuh and llmc/kernels/tma.cuh calls these under
// #ifdef LLMC_EMU.
// dev/emu/test_ptx.cu checks every lane's registers against the ISA's fragment tables and layouts,
// transcribed there independently of this file.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace emu::ptx {

// ---- cp.async: asynchronous global -> shared copies, per thread, in commit groups ----
// Under the forward schedule the copy is queued at issue and done when a cp.async.wait_group lets
// it complete (the latest a GPU may land it), so a thread (or, after a missing barrier, another
// thread) that reads the destination too early reads what was there before; under the others it
// lands at issue (the earliest), so a buffer refilled while another warp still reads it is
// overwritten under it. The race check compares the two. `src_bytes` < `copy_bytes` zero-fills the
// rest (0: nothing is read).
void cp_async(uint32_t shared_dst, const void* global_src, int copy_bytes, int src_bytes);
void cp_async_commit();
// Completes all but the `pending` most recent committed groups of this thread.
void cp_async_wait(int pending);

// ---- ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 ----
// Lanes 8i..8i+7 give the 16-byte-aligned shared addresses of rows 0..7 of matrix i. Without
// .trans, register i of lane l holds row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i (the lower
// column in the low 16 bits); with .trans, the same positions of the matrix's transpose.
void ldmatrix_x4(uint32_t (&r)[4], uint32_t shared_address, bool transpose);

// ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a b + d ----
// groupID g = lane / 4, threadID_in_group t = lane % 4:
//   a[0]: A[g][2t, 2t+1]  a[1]: A[g+8][2t, 2t+1]  a[2]: A[g][2t+8, 2t+9]  a[3]: A[g+8][2t+8, 2t+9]
//   b0:   B[2t, 2t+1][g]  b1:   B[2t+8, 2t+9][g]
//   d[0], d[1]: D[g][2t, 2t+1]   d[2], d[3]: D[g+8][2t, 2t+1]
// Products of bf16 are exact in fp32; the sum over k runs in k order from the accumulator.
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// ---- wgmma: warpgroup matrix products, sm_90a (PTX ISA 8.x, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate Instructions": wgmma.mma_async, "Register Fragments and Shared Memory Matrix
// Layouts", "Matrix Descriptor Format", wgmma.fence, wgmma.commit_group, wgmma.wait_group) ----
// Emulated: wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 for N = 8, 16, ..., 256, A from
// shared memory (a descriptor, imm-trans-a 0: K-major, 1: M-major) or from registers, B from shared
// memory (imm-trans-b 0: K-major, 1: N-major), scale-d (D = A B + D, or D = A B), imm-scale-a and
// imm-scale-b 1 (the negations are not emulated); descriptors in every swizzle mode (none, 32, 64 and
// 128 bytes) with the ISA's canonical layouts, base offset 0 (another faults, as do bits outside the
// descriptor's fields). The fragments: with g = lane / 4, t = lane % 4 and q the warp's place in its
// warpgroup (warp % 4), the warp holds rows 16 q .. 16 q + 15 of A (in registers) and of D:
//   a[0]: A[g][2t, 2t+1]  a[1]: A[g+8][2t, 2t+1]  a[2]: A[g][2t+8, 2t+9]  a[3]: A[g+8][2t+8, 2t+9]
//   d[4j], d[4j+1]: D[g][8j+2t, 8j+2t+1]  d[4j+2], d[4j+3]: D[g+8][8j+2t, 8j+2t+1]  (j < N/8)
// (rows counted from 16 q; the lower column in the low half). ptx.cpp says how a descriptor is read.
//
// .sync makes each of these a warp collective (the ISA: "wait until all threads in the warp execute
// the same instruction"); .aligned requires all four warps of the warpgroup to execute the same ones,
// with the same descriptors. Each warp's share of a product is independent of the other warps (its
// 16 rows of D from its 16 rows of A and all of B), so the emulator computes it per warp, at no
// rendezvous of the four warps (the ISA promises none), and checks .aligned instead: each mma_async
// against the other warps' same-numbered one, and at the block's end that all four issued as many.
// A warp's first mma_async must follow a wgmma.fence (checked); the other fences the ISA asks for,
// between a register access and an mma_async that uses the register, are not checked.
//
// Asynchrony, as cp.async above: under the forward schedule an mma_async lands at the wgmma.wait_group
// that retires its group (the latest a GPU may land it), reading then its shared operands, its A
// registers and its accumulators, and writing the accumulators; under every other schedule it lands
// at issue (the earliest). So under the race check a kernel that reads or writes the accumulators or
// A registers before the wait, or overwrites a shared operand before it, gives two results and is
// reported. It follows that the `d` and `a` arrays must stay alive, at the same place, until the wait
// (on a GPU too: the ISA makes touching those registers before the wait undefined).
// An operand in shared memory must lie in dynamic shared memory: a descriptor holds 18 bits of the
// address, which the emulator reads as an offset there. fence.proxy.async (the ISA's order between
// generic-proxy writes of an operand and the wgmma that reads it) is a no-op here and not checked.
void wgmma_fence();
void wgmma_commit_group();
// Lands all but the `pending` most recent committed groups of this warp.
void wgmma_wait_group(int pending);
// d: this thread's N/2 accumulators.
void wgmma_mma_async(float* d, int n, uint64_t desc_a, uint64_t desc_b, bool scale_d, bool trans_a, bool trans_b);
// a: this thread's four A registers.
void wgmma_mma_async_rs(float* d, int n, const uint32_t* a, uint64_t desc_b, bool scale_d, bool trans_b);
// For llmc's descriptor helper: faults unless `shared_address` lies in the block's dynamic shared
// memory and it and the two byte offsets are multiples of 16 below 2^18 (the fields keep bits 4-17).
void wgmma_check_descriptor(uint32_t shared_address, uint32_t lbo_bytes, uint32_t sbo_bytes);
// fence.proxy.async.shared::cta: one proxy here.
inline void fence_proxy_async() {}

// ---- mbarrier and TMA, sm_90 (PTX ISA 8.x: "Parallel Synchronization and Communication Instructions:
// mbarrier" (mbarrier.init, mbarrier.arrive, mbarrier.expect_tx, mbarrier.try_wait, "Phase Completion
// of the mbarrier object", "Tracking asynchronous operations by the mbarrier object"), "Data Movement
// and Conversion Instructions: cp.async.bulk.tensor", "Tensors" (the tiled mode, bounding box,
// out-of-bound access, "Tensor swizzling modes"), fence.mbarrier_init, setmaxnreg) ----
// An mbarrier holds an expected arrival count, the arrivals pending in the current phase, a tx-count
// and the current phase's parity. init sets both counts to `count` (1 .. 2^20 - 1), tx-count 0,
// phase 0. arrive counts one arrival; arrive.expect_tx first adds `bytes` to the tx-count (the
// expect-tx operation), then arrives; a bulk copy's complete_tx subtracts its bytes when it lands.
// The phase completes when no arrival is pending and the tx-count is 0: the phase flips and the
// pending count is reset to the expected count. try_wait.parity(p) is true once the phase with
// parity p has completed, which is the case exactly when the current phase's parity is not p (so
// on a fresh barrier parity 1 counts as complete, the "preceding phase"). Here try_wait suspends the
// thread until then (the ISA lets it suspend for a system-dependent time; a loop around it behaves
// the same) and the block reports a deadlock when nothing can complete the phase any more.
// Faults: a barrier not in shared memory or not 8-byte aligned, used before init (or in another
// block's run), an arrival while no arrival is pending (the phase only waits for transactions: the
// arrive count would underflow), a tx-count that goes below 0 with no arrival pending (more bytes
// completed than expected: the phase could never complete) or beyond the ISA's range +-(2^20 - 1),
// a parity operand other than 0 or 1.
// fence.mbarrier_init and fence.proxy.async: one proxy here, no-ops.
void mbarrier_init(void* bar, uint32_t count);
void mbarrier_arrive(void* bar);
void mbarrier_arrive_expect_tx(void* bar, uint32_t bytes);
bool mbarrier_try_wait_parity(void* bar, uint32_t parity);
inline void fence_mbarrier_init() {}

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes (the tiled mode): the
// box of the map (box rows x box columns from element (x = column, y = row)) into shared memory at
// `dst`, row after row of box-columns elements; elements outside the tensor (either coordinate below
// 0 or at/after its size) are written as zeros and count as copied. With a W-byte swizzle (W = 32, 64,
// 128) each element's shared address has its bits 4.. (the 16-byte chunk within a W-byte span) XORed
// with the bits from 7 on (the 128-byte line, modulo W / 16): the ISA's swizzle patterns, which
// repeat every 8 W bytes, the same function of the shared address that wgmma's W-byte swizzle
// descriptors read (operand_address in ptx.cpp). Then complete_tx of the whole box's bytes on `bar`.
// The ISA requires `dst` 128-byte aligned; the emulator requires a swizzled box to start on its
// pattern's 8 W-byte boundary (256, 512, 1024), so that the copy's pattern and a base-offset-0
// descriptor's agree. The box must lie in shared memory, the map be one the emulator's
// cuTensorMapEncodeTiled made (runtime.cpp), and at least one of its elements inside the tensor (a box
// wholly outside made an H200 fault, 2026-11-28), else a fault.
// Asynchrony, as cp.async's: under every schedule but the forward one the copy lands at issue (the
// earliest); under the forward one it is kept on the barrier and lands when a thread waits for the
// barrier's current phase while no arrival is pending any more, so that only the copies' bytes
// keep the phase from completing (the latest a GPU may land it). So a stage read before its wait,
// or refilled while a consumer still reads it, reads differently under the race check's schedules.
void tma_copy_2d(void* dst, const void* tensor_map, int x, int y, void* bar);
// prefetch.tensormap: nothing to prefetch.
inline void tma_prefetch(const void*) {}
// setmaxnreg.{inc,dec}.sync.aligned.u32 REGS: no registers here. Checked: REGS a multiple of 8 in
// [24, 256], the warp in a whole warpgroup, and (at the block's end) all four warps of the warpgroup
// executing the same setmaxnreg instructions.
void setmaxnreg(int regs, bool increase);

// ---- ex2.approx.ftz.f32: 2^x, subnormal inputs and results flushed to zero ----
inline float ex2_approx_ftz(float x) {
    auto flush = [](float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; };
    return flush(std::exp2(flush(x)));
}

}  // namespace emu::ptx
