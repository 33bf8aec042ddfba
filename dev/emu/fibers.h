// dev/emu/fibers.h: running one block of a kernel (fibers.cpp), as runtime.cpp's launches use it.
#pragma once

#include <boost/context/detail/fcontext.hpp>
#include <cuda_runtime.h>

#include <cstdint>
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

}  // namespace emu
