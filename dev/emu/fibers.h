// dev/emu/fibers.h: running one block of a kernel (fibers.cpp), as runtime.cpp's launches use it.
#pragma once

#include <boost/context/detail/fcontext.hpp>
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "dev/emu/stream.h"

namespace emu {

// The order in which a block's threads run between barriers.
enum class Schedule { Forward, Reverse, Shuffle };

// What every block of one launch runs.
struct BlockTask {
    const char* name = "";
    ThreadBody body = nullptr;
    const void* closure = nullptr;
    dim3 grid_dim, block_dim;
    size_t shared_bytes = 0;
};

// Runs one block on this OS thread; returns when all its threads have finished.
void run_block(const BlockTask& task, uint3 block_idx, Schedule schedule, uint64_t seed);

// A thread's cp.async copies not yet completed: groups[i] ends at copies[group_ends[i]].
struct PendingCopy {
    void* dst;
    const void* src;
    int copy_bytes, src_bytes;
};
struct PendingCopies {
    std::vector<PendingCopy> copies;
    std::vector<size_t> group_ends;
    void clear() {
        copies.clear();
        group_ends.clear();
    }
};
PendingCopies& this_thread_copies();
// Whether cp.async copies land at issue (the earliest a GPU may land them) rather than at the
// thread's cp.async.wait_group (the latest): at issue under every schedule but the forward one, so
// the race check compares the two extremes, and a buffer refilled while another warp still reads it
// shows.
bool copies_land_at_issue();

// ---- wgmma (ptx.cpp) ----
// One wgmma.mma_async.m64nNk16.f32.bf16.bf16 of one warp, as issued: the descriptors and flags, and
// where each lane's registers are (its accumulators and, when A is in registers, its A fragment),
// read and written when the product lands.
struct WgmmaOp {
    uint64_t desc_a = 0, desc_b = 0;  // desc_a unused when A is in registers
    int n = 0;
    bool a_in_registers = false, scale_d = false, trans_a = false, trans_b = false;
    const uint32_t* a[32] = {};
    float* d[32] = {};
};
// A warp's wgmma state in the running block: whether it has executed a wgmma.fence, how many
// mma_async it has issued, and those not landed yet, in commit groups (group i ends at
// pending[group_ends[i]]; ops after the last end are not committed yet).
struct WgmmaWarp {
    int warp = 0;
    bool fenced = false;
    uint64_t issued = 0;
    std::vector<WgmmaOp> pending;
    std::vector<size_t> group_ends;
    std::vector<int> setmaxnreg;  // the warp's setmaxnreg instructions in order (+REGS: .inc, -REGS: .dec)
};
// What the warps of one warpgroup issued, from their `first`-th mma_async on (the earlier ones have
// been issued by all four): .aligned requires the four to execute the same instructions, with the
// same descriptors.
struct WgmmaIssue {
    uint64_t desc_a, desc_b;
    uint32_t shape_and_flags;
    bool operator==(const WgmmaIssue&) const = default;
};
struct WgmmaWarpgroup {
    std::deque<WgmmaIssue> issues;
    uint64_t first = 0;
};
// The running block's state of warp `warp` and of warpgroup `group` (its warps 4 group .. 4 group + 3).
WgmmaWarp& wgmma_warp(int warp);
WgmmaWarpgroup& wgmma_warpgroup(int group);
// The running block's threads and dynamic shared memory bytes (the launch's).
int block_threads();
size_t block_dynamic_shared_bytes();
// Where a block's dynamic shared memory starts in the shared arena (whose shared address is 2^31, the
// low 18 bits of which, all a wgmma descriptor holds, are 0): 16 bytes in, CUDA's only promise.
constexpr size_t DYNAMIC_SHARED_OFFSET = 16;

// ---- mbarrier and TMA (ptx.cpp) ----
// The emulator's contents of a CUtensorMap's 128 opaque bytes, as its cuTensorMapEncodeTiled
// (runtime.cpp) writes them: a 2D tiled map, no interleave, element strides 1.
struct TensorMap {
    static constexpr uint64_t MAGIC = 0x4c4c4d43544d4150ull;  // "LLMCTMAP": encoded by the emulator
    uint64_t magic;
    const unsigned char* base;
    uint64_t dims[2];        // elements: [0] the inner dimension (columns), [1] the outer (rows)
    uint64_t row_stride;     // bytes between rows
    uint32_t box[2];         // the box's elements along each dimension, inner first
    uint32_t element_bytes;
    uint32_t swizzle_bytes;  // 0 (none), 32, 64 or 128
};
static_assert(sizeof(TensorMap) <= 128, "a TensorMap must fit in a CUtensorMap");
// A cp.async.bulk.tensor not landed yet (forward schedule): its destination's shared address, the
// map as it was at issue, and the box's coordinates.
struct PendingTensorCopy {
    uint32_t dst;
    TensorMap map;
    int x, y;
};
// An mbarrier object (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier"):
// the expected arrival count, the arrivals still pending in the current phase, the tx-count, and how
// many phases have completed (the current phase's parity is phase & 1). The object's 8 bytes of
// shared memory are not used: the emulator keeps its state here, by the object's address.
struct Mbarrier {
    const void* address = nullptr;
    uint32_t expected = 0, pending = 0;
    int64_t tx = 0;
    uint64_t phase = 0;
    std::vector<PendingTensorCopy> copies;  // the forward schedule's copies, landed at a wait (ptx.cpp)
};
// The running block's mbarrier at `address` (null: none was initialised there), and a fresh one there.
Mbarrier* find_mbarrier(const void* address);
Mbarrier& new_mbarrier(const void* address);
// Whether the phase of `bar` with parity `parity` has completed; may land the barrier's pending
// copies first (ptx.cpp).
bool mbarrier_ready(Mbarrier& bar, uint32_t parity);
// Suspends the calling thread until mbarrier_ready(bar, parity); a block where nothing else can go
// on meanwhile is reported as a deadlock.
void wait_mbarrier(Mbarrier& bar, uint32_t parity, const void* address);
// When a phase of `bar` completes: every thread waiting for that phase's parity is released then,
// as a GPU wakes a suspended try_wait, even if a later phase of the same parity begins before it runs.
void release_mbarrier_waiters(const Mbarrier& bar, uint32_t parity);
// Whether [p, p + bytes) lies in the block's shared memory: its dynamic shared memory (the launch's
// bytes) or the program's static __shared__ variables (this OS thread's static TLS block).
bool in_shared_memory(const void* p, size_t bytes);

}  // namespace emu
