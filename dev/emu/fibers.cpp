// dev/emu/fibers.cpp: one block of a kernel on one OS thread, every CUDA thread a fiber.
//
// A block runs one warp at a time, in the schedule's order of warps (forward, reverse or a seeded
// shuffle): a warp's lanes run, in the schedule's order of lanes, each until it reaches a barrier, a
// warp collective or its end (a fiber switch is all that costs: boost.context's fcontext, a few
// nanoseconds); a collective is released as soon as every lane of its mask is there, and the warp
// goes on, until all its lanes wait at __syncthreads (or are done). Then the next warp. When every
// live thread is at __syncthreads, the barrier is released and the next phase starts. If nothing
// can be released while threads still wait, the block would hang on a GPU: the emulator reports
// who waits where and aborts.
//
// So a warp's work between two barriers runs at once, before or after another warp's, and a lane's
// between two warp collectives before or after another lane's: a missing __syncthreads or
// __syncwarp shows as a different result under another schedule (runtime.cpp's race check).
#include "dev/emu/fibers.h"

#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

namespace emu {

thread_local ThreadState* current_thread = nullptr;

namespace {

namespace bctx = boost::context::detail;

#ifdef EMU_ASAN
constexpr size_t STACK_BYTES = size_t(512) << 10;  // ASan's instrumented frames are larger
#else
constexpr size_t STACK_BYTES = size_t(128) << 10;
#endif
constexpr int MAX_THREADS = 1024;
constexpr size_t EXCHANGE_BYTES = 64;

// Dynamic shared memory, 227 KB, and the 32-bit window that shared addresses are offsets in. It is
// thread_local like the kernels' static __shared__ variables, so both lie in this OS thread's TLS
// block, well inside a 4 GB window centred on the arena. Aligned to 1024 bytes so that a static
// __shared__ variable's shared address (an offset from the arena) has the alignment of its pointer,
// as the swizzled layouts of TMA and wgmma need (their patterns repeat every 1024 bytes). A block's
// dynamic shared memory starts DYNAMIC_SHARED_OFFSET bytes in: CUDA promises it 16-byte alignment
// only, so a kernel that needs more (a 1024-byte swizzle pattern) must round its base up itself, and
// one that forgets, or does not count the rounding in its size, fails here.
thread_local unsigned char shared_arena[232448 + 1024] __attribute__((aligned(1024)));

struct Fiber;

// A CUDA thread: its state, its stack and where it waits.
struct Fiber {
    enum class Wait { Runnable, Block, Warp, Mbarrier, Done };
    ThreadState state;
    bctx::fcontext_t context = nullptr;  // where to resume it
    bctx::fcontext_t caller = nullptr;   // the scheduler, while it runs
    Wait wait = Wait::Runnable;
    int predicate = 0;                   // at a block barrier
    unsigned mask = 0;                   // at a warp collective
    const char* what = "";
    size_t bytes = 0;
    WarpCombine combine = nullptr;       // at a warp_combine
    int parity = 0;                      // which half of the warp's exchange slots it writes next
    int deposit_parity = 0;              // and the half it wrote at its current collective
    uint32_t peer_parities = 0;          // bit l: the half lane l wrote, when the collective released
    PendingCopies copies;
    Mbarrier* mbarrier = nullptr;        // at an mbarrier wait: the barrier, its address and the parity
    const void* mbarrier_address = nullptr;
    uint32_t mbarrier_parity = 0;
    void* stack = nullptr;
#ifdef EMU_ASAN
    void* fake_stack = nullptr;
    const void* caller_stack = nullptr;
    size_t caller_stack_bytes = 0;
#endif
};

struct Worker {
    Fiber fibers[MAX_THREADS];
    // [warp][parity][lane]: a lane's deposit for a warp collective.
    unsigned char slots[MAX_THREADS / 32][2][32][EXCHANGE_BYTES];
    // [warp][lane]: a lane's result of the warp's last warp_combine (read before its next collective).
    unsigned char results[MAX_THREADS / 32][32][EXCHANGE_BYTES];
    // Each warp's and warpgroup's wgmma state (ptx.cpp), reset at each block's start.
    WgmmaWarp wgmma[MAX_THREADS / 32];
    WgmmaWarpgroup warpgroups[MAX_THREADS / 128];
    // The block's mbarrier objects by address (ptx.cpp), reset at each block's start.
    std::map<const void*, Mbarrier> mbarriers;
    const BlockTask* task = nullptr;
    Schedule schedule = Schedule::Forward;
    int block_result = 0;  // the sum of predicates at the last block barrier
    int threads = 0;
    Fiber* running = nullptr;
    ~Worker() {
        for (Fiber& f : fibers)
            if (f.stack) munmap(f.stack, STACK_BYTES + (size_t)getpagesize());
    }
};
thread_local Worker* worker = nullptr;

Worker& this_worker() {
    if (!worker) worker = new Worker();  // per OS thread, for the life of the process
    return *worker;
}

// A stack with a guard page below it, so an overflow faults instead of corrupting a neighbour.
void* stack_top(Fiber& f) {
    const size_t page = (size_t)getpagesize();
    if (!f.stack) {
        f.stack = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (f.stack == MAP_FAILED) fatal("emulator", "cannot map a fiber stack");
        mprotect(f.stack, page, PROT_NONE);
    }
    return static_cast<char*>(f.stack) + page + STACK_BYTES;
}

void switch_to_scheduler(Fiber& f, bool dying) {
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &f.fake_stack, f.caller_stack, f.caller_stack_bytes);
#else
    (void)dying;
#endif
    f.caller = bctx::jump_fcontext(f.caller, nullptr).fctx;
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &f.caller_stack, &f.caller_stack_bytes);
#endif
}

void fiber_main(bctx::transfer_t from) {
    Fiber& f = *static_cast<Fiber*>(from.data);
    f.caller = from.fctx;
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &f.caller_stack, &f.caller_stack_bytes);
#endif
    Worker& w = this_worker();
    w.task->body(w.task->closure);
    f.wait = Fiber::Wait::Done;
    f.copies.clear();
    switch_to_scheduler(f, true);
    fatal("emulator", "a finished fiber was resumed");
}

void resume(Worker& w, Fiber& f) {
    current_thread = &f.state;
    w.running = &f;
#ifdef EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, static_cast<char*>(f.stack) + getpagesize(), STACK_BYTES);
#endif
    f.context = bctx::jump_fcontext(f.context, &f).fctx;
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    w.running = nullptr;
    current_thread = nullptr;
}

Fiber& running_fiber(const char* what) {
    Worker* w = worker;
    if (!w || !w->running) fatal(what, "called outside a kernel");
    return *w->running;
}

std::string describe_waits(const Worker& w) {
    std::string s;
    int shown = 0;
    for (int i = 0; i < w.threads && shown < 8; i++) {
        const Fiber& f = w.fibers[i];
        if (f.wait == Fiber::Wait::Done) continue;
        s += "\n  thread " + std::to_string(i) + " (warp " + std::to_string(f.state.warp) + ", lane " +
             std::to_string(f.state.lane) + "): " +
             (f.wait == Fiber::Wait::Block ? std::string("__syncthreads") : std::string(f.what));
        if (f.wait == Fiber::Wait::Mbarrier) {
            const Mbarrier& b = *f.mbarrier;
            char state[200];
            snprintf(state, sizeof state,
                     " (parity %u) on the mbarrier at %p: phase %llu, %u of %u arrivals pending, tx-count %lld",
                     f.mbarrier_parity, f.mbarrier_address, (unsigned long long)b.phase, b.pending, b.expected,
                     (long long)b.tx);
            s += state;
        }
        shown++;
    }
    return s;
}

[[noreturn]] void block_fault(const Worker& w, const std::string& message) {
    const ThreadState& s = w.fibers[0].state;
    fatal(w.task->name, (message + " in block (" + std::to_string(s.block_idx.x) + ", " + std::to_string(s.block_idx.y) +
                         ", " + std::to_string(s.block_idx.z) + ")" + describe_waits(w))
                            .c_str());
}

// Releases the block barrier when every live thread of the block has arrived.
bool release_block(Worker& w) {
    int live = 0, at_block = 0, sum = 0;
    for (int i = 0; i < w.threads; i++) {
        const Fiber& f = w.fibers[i];
        if (f.wait == Fiber::Wait::Done) continue;
        live++;
        if (f.wait == Fiber::Wait::Block) at_block++, sum += f.predicate;
    }
    if (live == 0 || at_block < live) return false;
    // A thread that exited never arrives: __syncthreads must be reached by the whole block.
    if (live < w.threads)
        block_fault(w, "deadlock: __syncthreads reached by " + std::to_string(at_block) + " of the block's " +
                           std::to_string(w.threads) + " threads, the others have exited (a __syncthreads that "
                           "not every thread reaches hangs or misbehaves on a GPU)");
    w.block_result = sum;
    for (int i = 0; i < w.threads; i++) w.fibers[i].wait = Fiber::Wait::Runnable;
    return true;
}

// Releases warp `warp`'s collective when every lane of its mask has arrived (and runs its combine).
bool release_warp(Worker& w, int warp) {
    Fiber* first = nullptr;
    for (int lane = 0; lane < 32 && warp * 32 + lane < w.threads && !first; lane++)
        if (w.fibers[warp * 32 + lane].wait == Fiber::Wait::Warp) first = &w.fibers[warp * 32 + lane];
    if (!first) return false;
    for (int lane = 0; lane < 32; lane++) {
        if (!(first->mask >> lane & 1u)) continue;
        const int t = warp * 32 + lane;
        if (t >= w.threads) block_fault(w, std::string(first->what) + ": the mask names a lane beyond the block");
        const Fiber& f = w.fibers[t];
        if (f.wait == Fiber::Wait::Done)
            block_fault(w, std::string(first->what) + ": lane " + std::to_string(lane) +
                               " of the mask has exited (undefined on a GPU)");
        if (f.wait != Fiber::Wait::Warp) return false;
        if (f.mask != first->mask || f.what != first->what)
            block_fault(w, std::string("lanes of warp ") + std::to_string(warp) + " wait at different warp "
                               "collectives (" + first->what + " and " + f.what + ") or with different masks");
    }
    // A lane may run on to its next collective (and write the other half) before another reads
    // this one's deposits: each reader keeps where this collective's deposits are.
    uint32_t parities = 0;
    for (int lane = 0; lane < 32; lane++)
        if (first->mask >> lane & 1u) parities |= (uint32_t)w.fibers[warp * 32 + lane].deposit_parity << lane;
    if (first->combine) {
        unsigned char deposits[32][EXCHANGE_BYTES] = {};
        for (int lane = 0; lane < 32; lane++)
            if (first->mask >> lane & 1u) memcpy(deposits[lane], w.slots[warp][parities >> lane & 1u][lane], first->bytes);
        first->combine(deposits, w.results[warp]);
    }
    const unsigned mask = first->mask;
    for (int lane = 0; lane < 32; lane++)
        if (mask >> lane & 1u) {
            w.fibers[warp * 32 + lane].wait = Fiber::Wait::Runnable;
            w.fibers[warp * 32 + lane].peer_parities = parities;
        }
    return true;
}

// Runs warp `warp` as far as it goes without the rest of the block: its lanes in `lanes` order
// (each to its next barrier, warp collective or mbarrier wait), its collectives released as soon as
// complete, a lane at an mbarrier wait as soon as the phase has completed, until every lane is done,
// at __syncthreads, at a collective still missing a lane or at a wait for a phase still incomplete.
// Returns whether any lane ran.
bool run_warp(Worker& w, int warp, const std::vector<int>& lanes) {
    bool any = false;
    for (;;) {
        bool ran = false;
        for (int lane : lanes) {
            const int t = warp * 32 + lane;
            if (t >= w.threads) continue;
            Fiber& f = w.fibers[t];
            if (f.wait == Fiber::Wait::Mbarrier && mbarrier_ready(*f.mbarrier, f.mbarrier_parity))
                f.wait = Fiber::Wait::Runnable;
            if (f.wait == Fiber::Wait::Runnable) {
                resume(w, f);
                ran = true;
            }
        }
        any = any || ran;
        if (!ran || !release_warp(w, warp)) return any;
    }
}

std::vector<int> schedule_order(int threads, Schedule schedule, uint64_t seed) {
    std::vector<int> order(threads);
    std::iota(order.begin(), order.end(), 0);
    if (schedule == Schedule::Reverse) std::reverse(order.begin(), order.end());
    if (schedule == Schedule::Shuffle) {
        std::mt19937_64 rng(seed);
        std::shuffle(order.begin(), order.end(), rng);
    }
    return order;
}

}  // namespace

void run_block(const BlockTask& task, uint3 block_idx, Schedule schedule, uint64_t seed) {
    Worker& w = this_worker();
    const dim3 bd = task.block_dim;
    const int threads = (int)(bd.x * bd.y * bd.z);
    w.task = &task;
    w.schedule = schedule;
    w.threads = threads;
    // Shared memory starts as garbage on a GPU: NaN bytes here, so a read before a write shows.
    memset(dynamic_shared_base(), 0xff, block_dynamic_shared_bytes());
    for (int i = 0; i < threads; i++) {
        Fiber& f = w.fibers[i];
        f.state.thread_idx = uint3{(unsigned)i % bd.x, (unsigned)i / bd.x % bd.y, (unsigned)i / (bd.x * bd.y)};
        f.state.block_idx = block_idx;
        f.state.block_dim = bd;
        f.state.grid_dim = task.grid_dim;
        f.state.linear = i;
        f.state.lane = i % 32;
        f.state.warp = i / 32;
        f.wait = Fiber::Wait::Runnable;
        f.parity = 0;
        f.copies.clear();
        f.mbarrier = nullptr;
        f.context = bctx::make_fcontext(stack_top(f), STACK_BYTES, fiber_main);
    }
    const int warps = (threads + 31) / 32;
    for (int warp = 0; warp < warps; warp++) {
        WgmmaWarp& g = w.wgmma[warp];
        g.warp = warp, g.fenced = false, g.issued = 0;
        g.pending.clear(), g.group_ends.clear(), g.setmaxnreg.clear();
    }
    w.mbarriers.clear();
    for (int group = 0; group < (warps + 3) / 4; group++)
        w.warpgroups[group].issues.clear(), w.warpgroups[group].first = 0;
    // Warps run one after another, each to the block's next __syncthreads: between two barriers a
    // warp's work is never interleaved with another's, so any order of warps is one a GPU may take,
    // and a schedule that reverses them exposes a missing barrier. A warp stopped at an mbarrier wait
    // goes on in a later round, once another warp (or a copy) has completed the phase.
    const std::vector<int> warp_order = schedule_order(warps, schedule, seed);
    const std::vector<int> lane_order = schedule_order(32, schedule, seed * 31 + 7);
    for (;;) {
        bool ran = false;
        for (int warp : warp_order) ran = run_warp(w, warp, lane_order) || ran;
        if (ran) continue;
        if (release_block(w)) continue;
        bool all_done = true;
        for (int i = 0; i < threads; i++) all_done = all_done && w.fibers[i].wait == Fiber::Wait::Done;
        if (all_done) break;
        block_fault(w, "deadlock: no thread can go on");
    }
    // wgmma is .aligned: every warp of a warpgroup executes the same wgmma.mma_async instructions
    // (ptx.cpp compares them as they are issued; here, that none of the four stopped short).
    for (int group = 0; 4 * group + 3 < warps; group++) {
        const WgmmaWarp* g = &w.wgmma[4 * group];
        if (g[0].issued == g[1].issued && g[0].issued == g[2].issued && g[0].issued == g[3].issued) continue;
        block_fault(w, "wgmma.mma_async: the warps of warpgroup " + std::to_string(group) + " issued " +
                           std::to_string(g[0].issued) + ", " + std::to_string(g[1].issued) + ", " +
                           std::to_string(g[2].issued) + " and " + std::to_string(g[3].issued) +
                           " (.aligned: all four must execute the same wgmma instructions)");
    }
    // setmaxnreg is .sync.aligned too: the same instructions in all four warps of a warpgroup.
    for (int group = 0; 4 * group + 3 < warps; group++) {
        const WgmmaWarp* g = &w.wgmma[4 * group];
        if (g[0].setmaxnreg == g[1].setmaxnreg && g[0].setmaxnreg == g[2].setmaxnreg &&
            g[0].setmaxnreg == g[3].setmaxnreg)
            continue;
        block_fault(w, "setmaxnreg: the warps of warpgroup " + std::to_string(group) + " executed " +
                           std::to_string(g[0].setmaxnreg.size()) + ", " + std::to_string(g[1].setmaxnreg.size()) +
                           ", " + std::to_string(g[2].setmaxnreg.size()) + " and " +
                           std::to_string(g[3].setmaxnreg.size()) +
                           " setmaxnreg instructions, or different ones (.sync.aligned: all four must execute the "
                           "same)");
    }
    for (int warp = 0; warp < warps; warp++) w.wgmma[warp].pending.clear();  // never waited for: dropped
    w.mbarriers.clear();  // copies never waited for: dropped
    w.task = nullptr;
}

int block_barrier(int predicate) {
    Fiber& f = running_fiber("__syncthreads");
    f.wait = Fiber::Wait::Block;
    f.predicate = predicate;
    switch_to_scheduler(f, false);
    current_thread = &f.state;
    return worker->block_result;
}

namespace {

// A lane arrives at a warp collective with its deposit and waits until the warp's lanes in `mask`
// are all there; returns its fiber, resumed.
Fiber& arrive(unsigned mask, const void* mine, size_t bytes, const char* what, WarpCombine combine) {
    Fiber& f = running_fiber(what);
    Worker& w = *worker;
    if (bytes > EXCHANGE_BYTES) fatal(what, "warp collective wider than 64 bytes");
    if (!(mask >> f.state.lane & 1u)) block_fault(w, std::string(what) + ": the calling lane is not in its own mask");
    memcpy(w.slots[f.state.warp][f.parity][f.state.lane], mine, bytes);
    f.deposit_parity = f.parity;
    f.parity ^= 1;
    f.wait = Fiber::Wait::Warp;
    f.mask = mask;
    f.what = what;
    f.bytes = bytes;
    f.combine = combine;
    switch_to_scheduler(f, false);
    f.combine = nullptr;
    current_thread = &f.state;
    return f;
}

// Lane `lane`'s deposit at the collective `f` was released from.
const unsigned char* deposit_of(const Fiber& f, int lane) {
    return worker->slots[f.state.warp][f.peer_parities >> lane & 1u][lane];
}

}  // namespace

void warp_exchange(unsigned mask, const void* mine, void* all, size_t bytes, const char* what) {
    const Fiber& f = arrive(mask, mine, bytes, what, nullptr);
    unsigned char* out = static_cast<unsigned char*>(all);
    for (int lane = 0; lane < 32; lane++) {
        if (mask >> lane & 1u) memcpy(out + lane * bytes, deposit_of(f, lane), bytes);
        else memset(out + lane * bytes, 0, bytes);
    }
}

void warp_shuffle(unsigned mask, const void* mine, void* out, size_t bytes, int source, const char* what) {
    const Fiber& f = arrive(mask, mine, bytes, what, nullptr);
    if (!(mask >> source & 1u))
        device_fault(what, "reads a lane that is not in the mask (its value is undefined on a GPU)");
    memcpy(out, deposit_of(f, source), bytes);
}

void warp_combine(unsigned mask, const void* mine, size_t bytes, void* out, size_t out_bytes, const char* what,
                  WarpCombine combine) {
    if (out_bytes > EXCHANGE_BYTES) fatal(what, "warp collective wider than 64 bytes");
    const Fiber& f = arrive(mask, mine, bytes, what, combine);
    memcpy(out, worker->results[f.state.warp][f.state.lane], out_bytes);
}

void wait_mbarrier(Mbarrier& bar, uint32_t parity, const void* address) {
    Fiber& f = running_fiber("mbarrier.try_wait");
    f.wait = Fiber::Wait::Mbarrier;
    f.what = "mbarrier.try_wait.parity";
    f.mbarrier = &bar;
    f.mbarrier_address = address;
    f.mbarrier_parity = parity;
    switch_to_scheduler(f, false);
    f.mbarrier = nullptr;
    current_thread = &f.state;
}

void release_mbarrier_waiters(const Mbarrier& bar, uint32_t parity) {
    Worker& w = this_worker();
    for (int i = 0; i < w.threads; i++) {
        Fiber& f = w.fibers[i];
        if (f.wait == Fiber::Wait::Mbarrier && f.mbarrier == &bar && f.mbarrier_parity == parity)
            f.wait = Fiber::Wait::Runnable;
    }
}

Mbarrier* find_mbarrier(const void* address) {
    auto& table = this_worker().mbarriers;
    auto it = table.find(address);
    return it == table.end() ? nullptr : &it->second;
}
Mbarrier& new_mbarrier(const void* address) {
    Mbarrier& b = this_worker().mbarriers[address];  // a waiting thread keeps its pointer: reused in place
    b = Mbarrier();
    b.address = address;
    return b;
}

namespace {

// The program's static TLS block (its thread_local variables, the kernels' static __shared__ ones
// among them), for x86-64's TLS layout (variant II): it ends at the thread pointer and spans the
// program's PT_TLS segment, rounded up to its alignment. 0: not known here.
size_t program_tls_bytes() {
    size_t bytes = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
            for (int i = 0; i < info->dlpi_phnum; i++)
                if (info->dlpi_phdr[i].p_type == PT_TLS) {
                    const size_t align = std::max<size_t>(info->dlpi_phdr[i].p_align, 1);
                    *static_cast<size_t*>(out) = (info->dlpi_phdr[i].p_memsz + align - 1) / align * align + align;
                }
            return 1;  // the first object is the program itself
        },
        &bytes);
    return bytes;
}

}  // namespace

bool in_shared_memory(const void* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), arena = reinterpret_cast<uintptr_t>(shared_arena);
    if (a >= arena && a < arena + sizeof shared_arena)
        return a >= arena + DYNAMIC_SHARED_OFFSET &&
               a + bytes <= arena + DYNAMIC_SHARED_OFFSET + block_dynamic_shared_bytes();
#if defined(__x86_64__)
    static const size_t tls_bytes = program_tls_bytes();
    uintptr_t tp;
    asm("mov %%fs:0, %0" : "=r"(tp));
    if (tls_bytes) return a >= tp - tls_bytes && a + bytes <= tp;
#endif
    return ((a - shared_window_base()) >> 32) == 0;  // elsewhere: only the shared window is known
}

unsigned char* dynamic_shared_base() { return shared_arena + DYNAMIC_SHARED_OFFSET; }
uintptr_t shared_window_base() {
    uintptr_t arena = reinterpret_cast<uintptr_t>(shared_arena);
    asm("" : "+r"(arena));  // else g++ folds the offset into a 32-bit TLS relocation, which it overflows
    return arena - (uintptr_t(1) << 31);
}

PendingCopies& this_thread_copies() { return running_fiber("cp.async").copies; }
WgmmaWarp& wgmma_warp(int warp) { return this_worker().wgmma[warp]; }
WgmmaWarpgroup& wgmma_warpgroup(int group) { return this_worker().warpgroups[group]; }
int block_threads() { return this_worker().threads; }
size_t block_dynamic_shared_bytes() {
    return std::min(this_worker().task->shared_bytes, sizeof shared_arena - DYNAMIC_SHARED_OFFSET);
}
bool copies_land_at_issue() { return worker && worker->schedule != Schedule::Forward; }

[[noreturn]] void device_fault(const char* what, const char* message) {
    Worker* w = worker;
    if (w && w->task && !current_thread) {  // a warp collective's combine: no thread runs, the block is known
        const ThreadState& s = w->fibers[0].state;
        fatal(w->task->name, (std::string(what) + ": " + message + " (block (" + std::to_string(s.block_idx.x) + ", " +
                              std::to_string(s.block_idx.y) + ", " + std::to_string(s.block_idx.z) + "))")
                                 .c_str());
    }
    if (w && w->task && current_thread) {
        const ThreadState& s = *current_thread;
        fatal(w->task->name, (std::string(what) + ": " + message + " (block (" + std::to_string(s.block_idx.x) + ", " +
                              std::to_string(s.block_idx.y) + ", " + std::to_string(s.block_idx.z) + "), thread (" +
                              std::to_string(s.thread_idx.x) + ", " + std::to_string(s.thread_idx.y) + ", " +
                              std::to_string(s.thread_idx.z) + "))")
                                 .c_str());
    }
    fatal(what, message);
}

}  // namespace emu

unsigned __activemask() {
    emu::Worker* w = emu::worker;
    const emu::ThreadState& s = emu::current();
    unsigned mask = 0;
    for (int lane = 0; lane < 32; lane++) {
        const int t = s.warp * 32 + lane;
        if (t < w->threads && w->fibers[t].wait != emu::Fiber::Wait::Done) mask |= 1u << lane;
    }
    return mask;
}
