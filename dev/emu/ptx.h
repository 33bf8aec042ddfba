// dev/emu/ptx.h: emulated bodies for the inline PTX that llmc's kernels use, from the PTX ISA
// (version 8.x): cp.async with zero fill, ldmatrix .x4 and .x4.trans, mma.sync m16n8k16 bf16 with
// fp32 accumulation, and ex2.approx.ftz. Each wrapper in llmc/kernels/attention.cuh calls these
// under #ifdef LLMC_EMU. dev/emu/test_ptx.cu checks every lane's registers against the ISA's
// fragment tables, transcribed there independently of this file.
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

// ---- ex2.approx.ftz.f32: 2^x, subnormal inputs and results flushed to zero ----
inline float ex2_approx_ftz(float x) {
    auto flush = [](float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; };
    return flush(std::exp2(flush(x)));
}

}  // namespace emu::ptx
