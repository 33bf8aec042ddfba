// dev/emu/fibers.h: running one block of a kernel (fibers.cpp), as runtime.cpp's launches use it.
#pragma once

#include <boost/context/detail/fcontext.hpp>
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
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

}  // namespace emu
