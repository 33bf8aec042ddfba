// dev/emu/runtime.cpp: the CUDA runtime API on the CPU (emu.h says what the emulator is).
//
// Device memory is host memory from posix_memalign, exactly the size asked (AddressSanitizer then
// sees an access past its end), filled with 0xff bytes (NaN in bf16 and fp32), as a GPU's fresh
// memory is garbage. Every copy checks that its device side lies inside one allocation.
//
// Streams are queues that run lazily (stream.h): work runs when the host needs it. Events mark a
// position in a stream; cudaStreamWaitEvent makes a stream run the other stream's work up to that
// position first. The legacy default stream (0) waits for the blocking streams' earlier work and
// they for its, as in CUDA; streams made non-blocking do not. A copy between device memory and
// pageable host memory is synchronous as in CUDA (the host side is consumed or filled before the
// call returns); one with pinned memory (cudaMallocHost) runs with the stream, so a host that
// reads it before synchronising reads stale bytes, as it may on a GPU.
//
// Launches run every block of the grid, in parallel on OpenMP threads (LLMC_EMU_THREADS, default
// the OpenMP default), each block on fibers (fibers.cpp). LLMC_EMU_SCHEDULE (forward, reverse,
// shuffle) orders the threads of every block; LLMC_EMU_RACECHECK=1 runs each launch forward and in
// reverse (2: and shuffled) from the same device memory and fails when the results differ.
#include <cuda.h>
#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dev/emu/fibers.h"
#include "dev/emu/kernel_resources.h"
#include "dev/emu/stream.h"

#undef warpSize  // emu.h's device-side name; cudaDeviceProp has a field of that name

namespace emu {

// ---------------------------------------------------------------------------------------------
// Locks, errors, settings

std::recursive_mutex& api_lock() {
    static std::recursive_mutex lock;
    return lock;
}
#define EMU_API std::lock_guard<std::recursive_mutex> emu_api_guard_(api_lock())

[[noreturn]] void fatal(const char* where, const char* message) {
    fprintf(stderr, "CUDA emulator: %s: %s\n", where, message);
    fflush(stderr);
    abort();
}

namespace {

thread_local cudaError_t last_error = cudaSuccess;
cudaError_t record(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}
// An error of the program's that a GPU reports with an error code: say why on stderr (CUDA's code
// alone rarely tells), and return the code.
cudaError_t refuse(cudaError_t e, const std::string& why) {
    fprintf(stderr, "CUDA emulator: %s\n", why.c_str());
    return record(e);
}

int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

Schedule default_schedule() {
    const char* v = getenv("LLMC_EMU_SCHEDULE");
    if (!v || !*v || !strcmp(v, "forward")) return Schedule::Forward;
    if (!strcmp(v, "reverse")) return Schedule::Reverse;
    if (!strcmp(v, "shuffle")) return Schedule::Shuffle;
    fatal("LLMC_EMU_SCHEDULE", "expected forward, reverse or shuffle");
}

// ---------------------------------------------------------------------------------------------
// The device: one H100 SXM per process (per rank); the process sees as many as the launch put
// ranks on its node, so that rank r may select GPU r as on a real node.

// What an H100 80GB HBM3 reports, or LLMC_EMU_MEMORY_MIB: a small device, to take the out-of-memory
// paths (bench_train_step --best's sweep) at sizes a CPU runs
size_t total_memory() {
    static const size_t bytes = env_int("LLMC_EMU_MEMORY_MIB", 0) > 0
                                    ? (size_t)env_int("LLMC_EMU_MEMORY_MIB", 0) << 20
                                    : 85520809984ull;
    return bytes;
}
constexpr int SHARED_OPTIN = 232448;              // 227 KB of dynamic shared memory per block
constexpr int SHARED_DEFAULT = 49152;
thread_local int current_device = 0;

int device_count() {
    int n = env_int("LLMC_EMU_DEVICES", 0);
    if (n <= 0) n = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 0);
    if (n <= 0) n = env_int("SLURM_NTASKS_PER_NODE", 0);
    return n > 0 ? n : 1;
}

// ---------------------------------------------------------------------------------------------
// Memory

enum class Kind { Device, Pinned };
struct Allocation {
    size_t bytes;
    Kind kind;
};
std::map<uintptr_t, Allocation>& allocations() {
    static std::map<uintptr_t, Allocation> map;
    return map;
}
size_t device_bytes_in_use = 0;

// The allocation holding [p, p + bytes), or null.
const std::pair<const uintptr_t, Allocation>* find_allocation(const void* p, size_t bytes) {
    auto& map = allocations();
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = map.upper_bound(a);
    if (it == map.begin()) return nullptr;
    --it;
    if (a < it->first || a + bytes > it->first + it->second.bytes) return nullptr;
    return &*it;
}
bool is_pinned(const void* p) {
    auto* a = find_allocation(p, 0);
    return a && a->second.kind == Kind::Pinned;
}
bool is_device(const void* p, size_t bytes) {
    auto* a = find_allocation(p, bytes);
    return a && a->second.kind == Kind::Device;
}

}  // namespace
}  // namespace emu

struct CUstream_st {
    std::deque<emu::StreamOp> queue;
    uint64_t enqueued = 0, completed = 0;
    uint64_t progress_until = 0;  // just past the last communication op enqueued
    bool blocking = true;
    bool running = false;
    int priority = 0;
};
struct CUevent_st {
    CUstream_st* stream = nullptr;
    uint64_t position = 0;  // complete once stream->completed reaches it
    bool timing = true;
    bool recorded = false;
    bool queried = false;  // a query has answered "not ready" for this record
    std::shared_ptr<double> time;  // seconds, set when the record runs
};

namespace emu {
namespace {

CUstream_st legacy_stream;
std::vector<std::unique_ptr<CUstream_st>>& streams() {  // never freed: events may outlive theirs
    static std::vector<std::unique_ptr<CUstream_st>> all;
    return all;
}

CUstream_st* resolve(cudaStream_t s) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &legacy_stream;
    return s;
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool run_until(CUstream_st* s, uint64_t position, bool block);

// Drives every stream's communication on, as far as it goes without blocking (stream.h).
void progress_all() {
    for (auto& s : streams())
        if (!s->running && s->completed < s->progress_until) run_until(s.get(), s->progress_until, false);
    if (!legacy_stream.running && legacy_stream.completed < legacy_stream.progress_until)
        run_until(&legacy_stream, legacy_stream.progress_until, false);
}

// Runs `s` until `position` operations have completed. block false: stops at an operation that is
// not finished yet and returns false. Waiting for a communication op keeps all others moving.
bool run_until(CUstream_st* s, uint64_t position, bool block) {
    while (s->completed < position) {
        if (s->running) {  // its front op is being driven further up the call stack
            if (!block) return false;
            fatal("stream", "an operation waits for its own stream (a cycle of stream waits)");
        }
        StreamOp& op = s->queue.front();
        // `running` stays set while this op is driven, so that progress_all leaves this stream alone.
        s->running = true;
        bool done = op.run(op.progress ? false : block);
        while (!done && block) {
            progress_all();
            std::this_thread::sleep_for(std::chrono::microseconds(20));
            done = op.run(false);
        }
        s->running = false;
        if (!done) return false;
        s->queue.pop_front();
        s->completed++;
    }
    return true;
}

void push(CUstream_st* s, StreamOp op) {
    // The legacy stream and blocking streams wait for each other's earlier work.
    if (s == &legacy_stream) {
        std::vector<std::pair<CUstream_st*, uint64_t>> before;
        for (auto& other : streams())
            if (other->blocking && other->enqueued > other->completed) before.push_back({other.get(), other->enqueued});
        if (!before.empty()) {
            auto inner = std::move(op.run);
            op.run = [before, inner](bool block) {
                for (auto [other, position] : before)
                    if (!run_until(other, position, block)) return false;
                return inner(block);
            };
        }
    } else if (s->blocking && legacy_stream.enqueued > legacy_stream.completed) {
        const uint64_t position = legacy_stream.enqueued;
        auto inner = std::move(op.run);
        op.run = [position, inner](bool block) { return run_until(&legacy_stream, position, block) && inner(block); };
    }
    const bool progress = op.progress;
    s->queue.push_back(std::move(op));
    s->enqueued++;
    static const bool eager = getenv("LLMC_EMU_EAGER") && *getenv("LLMC_EMU_EAGER") == '1';
    if (eager && !s->running) {  // every operation at once, in issue order: hides ordering bugs (a debugging aid)
        run_until(s, s->enqueued, true);
        return;
    }
    if (progress) {
        s->progress_until = s->enqueued;
        if (!s->running) run_until(s, s->enqueued, false);
    }
}

void drain_all() {
    run_until(&legacy_stream, legacy_stream.enqueued, true);
    for (auto& s : streams()) run_until(s.get(), s->enqueued, true);
}

// ---------------------------------------------------------------------------------------------
// Launches

std::map<const void*, int>& max_dynamic_shared() {
    static std::map<const void*, int> map;
    return map;
}

// The program's kernels as nvcc compiled them (kernel_resources.h): empty when built without nvcc.
std::map<const void*, KernelResources>& kernel_table() {
    static std::map<const void*, KernelResources> table;
    return table;
}

thread_local bool float_atomics_seen = false;
uint64_t launch_counter = 0;

// What an H100 checks of a kernel's own resources at launch: its __launch_bounds__ and the register
// file (65536 per SM, allocated per warp in units of 256). Empty when the block fits.
std::string check_resources(const dim3 b, const KernelResources& k) {
    const uint64_t threads = (uint64_t)b.x * b.y * b.z;
    if (k.max_threads > 0 && threads > (uint64_t)k.max_threads)
        return "more threads than its __launch_bounds__ (" + std::to_string(k.max_threads) + ")";
    const uint64_t warps = (threads + 31) / 32, registers_per_warp = ((uint64_t)k.registers * 32 + 255) / 256 * 256;
    if (warps * registers_per_warp > 65536)
        return std::to_string(k.registers) + " registers per thread (ptxas, sm_90a) for " + std::to_string(threads) +
               " threads: more than an SM's 65536";
    return "";
}

cudaError_t check_launch(const LaunchConfig& c) {
    const dim3 g = c.grid, b = c.block;
    auto bad = [&](cudaError_t e, const char* why) {
        return refuse(e, std::string("launch of ") + c.name + " refused: " + why + " (grid " + std::to_string(g.x) + "x" +
                             std::to_string(g.y) + "x" + std::to_string(g.z) + ", block " + std::to_string(b.x) + "x" +
                             std::to_string(b.y) + "x" + std::to_string(b.z) + ", " + std::to_string(c.shared_bytes) +
                             " bytes of dynamic shared memory)");
    };
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z) return bad(cudaErrorInvalidConfiguration, "a zero dimension");
    if (g.x > 2147483647u || g.y > 65535u || g.z > 65535u)
        return bad(cudaErrorInvalidConfiguration, "grid beyond 2^31-1 x 65535 x 65535");
    if (b.x > 1024u || b.y > 1024u || b.z > 64u || (uint64_t)b.x * b.y * b.z > 1024u)
        return bad(cudaErrorInvalidConfiguration, "more than 1024 threads per block (or block.z > 64)");
    int static_shared = 0;
    if (!kernel_table().empty()) {
        auto k = kernel_table().find(c.function);
        if (k == kernel_table().end())
            return bad(cudaErrorInvalidDeviceFunction, "not among the kernels nvcc compiled for this program "
                                                       "(one only g++ compiles, or of internal linkage; see "
                                                       "dev/emu/kernel_resources.h)");
        const std::string why = check_resources(b, k->second);
        if (!why.empty()) return bad(cudaErrorLaunchOutOfResources, why.c_str());
        static_shared = k->second.static_shared;
    }
    // Static and dynamic shared memory together: 48 KB, or the dynamic part up to the kernel's
    // cudaFuncSetAttribute(MaxDynamicSharedMemorySize) within 227 KB.
    auto it = max_dynamic_shared().find(c.function);
    const int optin = SHARED_OPTIN - static_shared;
    const int limit = it == max_dynamic_shared().end() ? SHARED_DEFAULT - static_shared : std::min(it->second, optin);
    if (c.shared_bytes > (size_t)limit)
        return bad(cudaErrorInvalidValue, c.shared_bytes > (size_t)optin
                                              ? "static and dynamic shared memory above the H100's 227 KB"
                                              : "shared memory above the kernel's limit (48 KB with its static "
                                                "shared memory, unless raised with cudaFuncSetAttribute("
                                                "MaxDynamicSharedMemorySize))");
    return cudaSuccess;
}

void run_grid(const BlockTask& task, Schedule schedule, uint64_t seed) {
    const dim3 g = task.grid_dim;
    const int64_t blocks = (int64_t)g.x * g.y * g.z;
    const int threads = env_int("LLMC_EMU_THREADS", omp_get_max_threads());
    bool atomics = false;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) reduction(|| : atomics) if (blocks > 1)
    for (int64_t i = 0; i < blocks; i++) {
        float_atomics_seen = false;
        const uint3 idx{(unsigned)(i % g.x), (unsigned)(i / g.x % g.y), (unsigned)(i / ((int64_t)g.x * g.y))};
        run_block(task, idx, schedule, seed ^ (uint64_t)i * 0x9e3779b97f4a7c15ull);
        atomics = atomics || float_atomics_seen;
    }
    float_atomics_seen = atomics;
}

// The race check: the device memory a launch may write, copied before it runs.
struct Snapshot {
    std::vector<std::pair<uintptr_t, std::vector<unsigned char>>> regions;
};
Snapshot snapshot(const LaunchMemory& memory) {
    std::set<uintptr_t> starts;
    for (const auto& [start, a] : allocations()) {
        if (a.kind != Kind::Device) continue;
        bool used = memory.all_memory;
        for (const void* p : memory.pointers)
            used = used || (reinterpret_cast<uintptr_t>(p) >= start && reinterpret_cast<uintptr_t>(p) < start + a.bytes);
        if (used) starts.insert(start);
    }
    Snapshot s;
    for (uintptr_t start : starts) {
        const unsigned char* p = reinterpret_cast<const unsigned char*>(start);
        s.regions.push_back({start, std::vector<unsigned char>(p, p + allocations().at(start).bytes)});
    }
    return s;
}
void restore(const Snapshot& s) {
    for (const auto& [start, bytes] : s.regions) memcpy(reinterpret_cast<void*>(start), bytes.data(), bytes.size());
}
// Where two runs' results differ. A launch that used float atomics is compared as fp32 within a
// relative 1e-5: the order of atomic additions changes the last bits (llmc's kernels use none).
std::string difference(const Snapshot& a, const Snapshot& b, bool float_atomics) {
    for (size_t r = 0; r < a.regions.size(); r++) {
        const auto& x = a.regions[r].second;
        const auto& y = b.regions[r].second;
        if (x == y) continue;
        for (size_t i = 0; i < x.size(); i++) {
            if (float_atomics && i % 4 == 0 && i + 4 <= x.size()) {
                float u, v;
                memcpy(&u, &x[i], 4), memcpy(&v, &y[i], 4);
                if (u == v || std::abs(u - v) <= 1e-5f * std::max(std::abs(u), std::abs(v))) {
                    i += 3;
                    continue;
                }
            }
            if (x[i] != y[i]) {
                char where[160];
                snprintf(where, sizeof where, "the allocation at %p (%zu bytes) differs first at byte %zu",
                         reinterpret_cast<void*>(a.regions[r].first), x.size(), i);
                return where;
            }
        }
    }
    return "";
}

void run_launch(const BlockTask& task, const LaunchMemory& memory, uint64_t seed) {
    const int racecheck = env_int("LLMC_EMU_RACECHECK", 0);
    if (racecheck <= 0) {
        run_grid(task, default_schedule(), seed);
        return;
    }
    const Snapshot before = snapshot(memory);
    run_grid(task, Schedule::Forward, seed);
    const bool atomics = float_atomics_seen;
    const Snapshot forward = snapshot(memory);
    const Schedule others[] = {Schedule::Reverse, Schedule::Shuffle};
    const char* names[] = {"reverse", "shuffled"};
    for (int i = 0; i < (racecheck >= 2 ? 2 : 1); i++) {
        restore(before);
        run_grid(task, others[i], seed);
        const std::string diff = difference(forward, snapshot(memory), atomics);
        if (!diff.empty())
            fatal(task.name, ("race: the output depends on the order of the block's threads (forward vs " +
                              std::string(names[i]) + " schedule): " + diff +
                              "; a barrier (__syncthreads, __syncwarp, cp.async.wait_group, wgmma.wait_group, an "
                              "mbarrier wait) is missing or misplaced")
                                 .c_str());
    }
}

}  // namespace

void enqueue(cudaStream_t stream, StreamOp op) {
    EMU_API;
    push(resolve(stream), std::move(op));
}
void enqueue(cudaStream_t stream, const char* what, std::function<void()> work) {
    enqueue(stream, StreamOp{what, [work = std::move(work)](bool) {
                                 work();
                                 return true;
                             }});
}
void drain(cudaStream_t stream) {
    EMU_API;
    CUstream_st* s = resolve(stream);
    run_until(s, s->enqueued, true);
}
bool is_device_range(const void* ptr, size_t bytes) {
    EMU_API;
    return is_device(ptr, bytes);
}
void note_float_atomic() { float_atomics_seen = true; }

bool register_kernel_resources(const KernelResources* table, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (table[i].function) kernel_table()[table[i].function] = table[i];
    return true;
}

void launch_kernel(const LaunchConfig& config, std::shared_ptr<const void> closure, ThreadBody body,
                   LaunchMemory memory) {
    EMU_API;
    if (record(check_launch(config)) != cudaSuccess) return;
    BlockTask task{config.name, body, nullptr, config.grid, config.block, config.shared_bytes};
    const uint64_t seed = ++launch_counter;
    push(resolve(config.stream),
         StreamOp{config.name, [task, closure = std::move(closure), memory = std::move(memory), seed](bool) mutable {
                      task.closure = closure.get();
                      run_launch(task, memory, seed);
                      return true;
                  }});
}

}  // namespace emu

// =============================================================================================
// The CUDA runtime API (the toolkit's cuda_runtime_api.h declares these).

using namespace emu;

extern "C" {

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorNoDevice: return "cudaErrorNoDevice";
        case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
        case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
        default: return "cudaErrorUnknown";
    }
}
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        default: return "unknown error";
    }
}
cudaError_t cudaGetLastError(void) {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

// ---- device ----
cudaError_t cudaGetDeviceCount(int* count) {
    *count = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count())
        return refuse(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): the process sees " +
                                                  std::to_string(device_count()) + " emulated GPU(s)");
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    *device = current_device;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    EMU_API;
    drain_all();
    return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) { return cudaDeviceSynchronize(); }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
    if (device < 0 || device >= device_count()) return record(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3");
    p->totalGlobalMem = total_memory();
    p->sharedMemPerBlock = SHARED_DEFAULT;
    p->sharedMemPerBlockOptin = SHARED_OPTIN;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->maxThreadsPerMultiProcessor = 2048;
    p->totalConstMem = 65536;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->l2CacheSize = 52428800;
    p->memoryBusWidth = 5120;
    p->unifiedAddressing = 1;
    p->concurrentKernels = 1;
    p->pciBusID = device + 1;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    if (device < 0 || device >= device_count()) return record(cudaErrorInvalidDevice);
    switch (attr) {
        case cudaDevAttrMultiProcessorCount: *value = 132; break;
        case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
        case cudaDevAttrClockRate: *value = 1980000; break;        // kHz
        case cudaDevAttrMemoryClockRate: *value = 2619000; break;  // kHz
        case cudaDevAttrGlobalMemoryBusWidth: *value = 5120; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = SHARED_OPTIN; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = SHARED_DEFAULT; break;
        case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
        case cudaDevAttrWarpSize: *value = 32; break;
        case cudaDevAttrL2CacheSize: *value = 52428800; break;
        default: return refuse(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute " + std::to_string((int)attr) +
                                                          " is not emulated");
    }
    return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    EMU_API;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // hints only
    if (value < 0 || value > SHARED_OPTIN)
        return refuse(cudaErrorInvalidValue, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " + std::to_string(value) +
                                                 "): an H100 allows at most 232448 bytes");
    max_dynamic_shared()[func] = value;
    return cudaSuccess;
}

// ---- memory ----
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    EMU_API;
    *ptr = nullptr;
    if (bytes == 0) return cudaSuccess;
    if (device_bytes_in_use + bytes > total_memory()) return record(cudaErrorMemoryAllocation);
    void* p = nullptr;
    if (posix_memalign(&p, 256, bytes) != 0) return record(cudaErrorMemoryAllocation);
    memset(p, 0xff, bytes);
    allocations()[reinterpret_cast<uintptr_t>(p)] = {bytes, Kind::Device};
    device_bytes_in_use += bytes;
    *ptr = p;
    return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
    EMU_API;
    if (!ptr) return cudaSuccess;
    drain_all();  // cudaFree waits for the device
    auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations().end() || it->second.kind != Kind::Device)
        return refuse(cudaErrorInvalidValue, "cudaFree of a pointer that cudaMalloc did not return");
    device_bytes_in_use -= it->second.bytes;
    allocations().erase(it);
    free(ptr);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
    EMU_API;
    *ptr = nullptr;
    if (bytes == 0) return cudaSuccess;
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes) != 0) return record(cudaErrorMemoryAllocation);
    allocations()[reinterpret_cast<uintptr_t>(p)] = {bytes, Kind::Pinned};
    *ptr = p;
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int) { return cudaMallocHost(ptr, bytes); }
cudaError_t cudaFreeHost(void* ptr) {
    EMU_API;
    if (!ptr) return cudaSuccess;
    drain_all();
    auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations().end() || it->second.kind != Kind::Pinned)
        return refuse(cudaErrorInvalidValue, "cudaFreeHost of a pointer that cudaMallocHost did not return");
    allocations().erase(it);
    free(ptr);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    EMU_API;
    *free_bytes = total_memory() - device_bytes_in_use;
    *total_bytes = total_memory();
    return cudaSuccess;
}

namespace {

// Checks a copy's device sides; returns the error to give, with its reason on stderr.
cudaError_t check_copy(const char* call, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (kind == cudaMemcpyDefault) return cudaSuccess;
    const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyHostToHost) return cudaSuccess;
    if (!dst_device && !src_device) return refuse(cudaErrorInvalidMemcpyDirection, std::string(call) + ": unknown kind");
    char why[200];
    if (dst_device && !is_device(dst, bytes)) {
        snprintf(why, sizeof why, "%s: destination %p + %zu bytes is not inside one device allocation", call, dst, bytes);
        return refuse(cudaErrorInvalidValue, why);
    }
    if (src_device && !is_device(src, bytes)) {
        snprintf(why, sizeof why, "%s: source %p + %zu bytes is not inside one device allocation", call, src, bytes);
        return refuse(cudaErrorInvalidValue, why);
    }
    return cudaSuccess;
}

cudaError_t copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                       const char* call) {
    if (cudaError_t e = check_copy(call, dst, src, bytes, kind); e != cudaSuccess) return e;
    if (bytes == 0) return cudaSuccess;
    CUstream_st* s = resolve(stream);
    if (kind == cudaMemcpyHostToDevice && !is_pinned(src)) {
        // Pageable memory is staged at the call: the caller may reuse it as soon as it returns.
        auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                                   static_cast<const unsigned char*>(src) + bytes);
        push(s, StreamOp{call, [dst, staged](bool) {
                             memcpy(dst, staged->data(), staged->size());
                             return true;
                         }});
        return cudaSuccess;
    }
    push(s, StreamOp{call, [dst, src, bytes](bool) {
                         memmove(dst, src, bytes);
                         return true;
                     }});
    // Into pageable memory the copy is complete when the call returns.
    if (kind == cudaMemcpyDeviceToHost && !is_pinned(dst)) run_until(s, s->enqueued, true);
    return cudaSuccess;
}

}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    EMU_API;
    const cudaError_t e = copy_async(dst, src, bytes, kind, nullptr, "cudaMemcpy");
    if (e == cudaSuccess) run_until(&legacy_stream, legacy_stream.enqueued, true);
    return record(e);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    EMU_API;
    return record(copy_async(dst, src, bytes, kind, stream, "cudaMemcpyAsync"));
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
    EMU_API;
    if (bytes && !is_device(ptr, bytes)) {
        char why[160];
        snprintf(why, sizeof why, "cudaMemset: %p + %zu bytes is not inside one device allocation", ptr, bytes);
        return refuse(cudaErrorInvalidValue, why);
    }
    push(resolve(stream), StreamOp{"cudaMemset", [ptr, value, bytes](bool) {
                                       memset(ptr, value, bytes);
                                       return true;
                                   }});
    return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
    EMU_API;
    const cudaError_t e = cudaMemsetAsync(ptr, value, bytes, nullptr);
    if (e == cudaSuccess) run_until(&legacy_stream, legacy_stream.enqueued, true);
    return e;
}

// ---- streams ----
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
    EMU_API;
    auto s = std::make_unique<CUstream_st>();
    s->blocking = !(flags & cudaStreamNonBlocking);
    s->priority = priority;
    *stream = s.get();
    streams().push_back(std::move(s));
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
    return cudaStreamCreateWithPriority(stream, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithPriority(stream, cudaStreamDefault, 0); }
// A destroyed stream's work still runs (CUDA finishes it); the object stays for its events.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    EMU_API;
    CUstream_st* s = resolve(stream);
    run_until(s, s->enqueued, true);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    EMU_API;
    CUstream_st* s = resolve(stream);
    run_until(s, s->enqueued, true);
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    EMU_API;
    CUstream_st* s = resolve(stream);
    progress_all();
    return run_until(s, s->enqueued, false) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
    EMU_API;
    if (!event) return record(cudaErrorInvalidResourceHandle);
    if (!event->recorded) return cudaSuccess;  // waiting for a never-recorded event does nothing
    CUstream_st* other = event->stream;
    const uint64_t position = event->position;
    push(resolve(stream), StreamOp{"cudaStreamWaitEvent", [other, position](bool block) {
                                       return run_until(other, position, block);
                                   }});
    return cudaSuccess;
}

// ---- events ----
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    auto* e = new CUevent_st();
    e->timing = !(flags & cudaEventDisableTiming);
    *event = e;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    EMU_API;
    delete event;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    EMU_API;
    if (!event) return record(cudaErrorInvalidResourceHandle);
    CUstream_st* s = resolve(stream);
    auto time = std::make_shared<double>(0.0);
    push(s, StreamOp{"cudaEventRecord", [time](bool) {
                         *time = now_s();
                         return true;
                     }});
    event->stream = s;
    event->position = s->enqueued;
    event->recorded = true;
    event->queried = false;
    event->time = time;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    EMU_API;
    if (!event) return record(cudaErrorInvalidResourceHandle);
    if (event->recorded) run_until(event->stream, event->position, true);
    return cudaSuccess;
}
// The first query of a record that has not run answers "not ready", as a GPU usually would, so
// that polling code runs its waiting path; each query lets the stream go on without blocking.
cudaError_t cudaEventQuery(cudaEvent_t event) {
    EMU_API;
    if (!event) return record(cudaErrorInvalidResourceHandle);
    if (!event->recorded || event->stream->completed >= event->position) return cudaSuccess;
    const bool first = !event->queried;
    event->queried = true;
    progress_all();
    const bool done = run_until(event->stream, event->position, false);
    return done && !first ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    EMU_API;
    if (!start || !end || !start->timing || !end->timing) return record(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded) return record(cudaErrorInvalidResourceHandle);
    if (start->stream->completed < start->position || end->stream->completed < end->position)
        return record(cudaErrorNotReady);
    *ms = (float)((*end->time - *start->time) * 1e3);
    return cudaSuccess;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// The driver's cuTensorMapEncodeTiled, reached as a program reaches the driver's without linking it:
// through cudaGetDriverEntryPoint. It checks the parameters as the driver API's reference states
// them, and writes into the opaque CUtensorMap what ptx.cpp's cp.async.bulk.tensor reads (TensorMap,
// fibers.h). Emulated: rank 2, no interleave, element strides 1, swizzle none, 32, 64 or 128 bytes;
// an invalid value gives CUDA_ERROR_INVALID_VALUE, a valid one not emulated a fault, and either
// says why on stderr.

namespace {

CUresult tensor_map_refused(const char* why, long long value) {
    fprintf(stderr, "CUDA emulator: cuTensorMapEncodeTiled: ");
    fprintf(stderr, why, value);
    fprintf(stderr, "\n");
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI encode_tensor_map_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                         const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                         const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                         CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
    EMU_API;
    static const int ELEMENT_BYTES[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};  // UINT8 .. TFLOAT32_FTZ
    if (!map || reinterpret_cast<uintptr_t>(map) % 64) return tensor_map_refused("the map is not 64-byte aligned", 0);
    if ((int)type < 0 || (int)type >= (int)(sizeof ELEMENT_BYTES / sizeof *ELEMENT_BYTES))
        return tensor_map_refused("data type %lld: not emulated (the packed 4- and 6-bit types) or invalid", type);
    if (rank < 1 || rank > 5) return tensor_map_refused("rank %lld outside 1 .. 5", rank);
    if (rank != 2) fatal("cuTensorMapEncodeTiled", "only rank 2 is emulated");
    if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) fatal("cuTensorMapEncodeTiled", "interleave is not emulated");
    if (reinterpret_cast<uintptr_t>(address) % 16)
        return tensor_map_refused("globalAddress 0x%llx is not 16-byte aligned", (long long)(uintptr_t)address);
    const int eb = ELEMENT_BYTES[type];
    for (int i = 0; i < 2; i++) {
        if (dims[i] < 1 || dims[i] > (1ull << 32))
            return tensor_map_refused("globalDim %lld outside 1 .. 2^32", (long long)dims[i]);
        if (box[i] < 1 || box[i] > 256) return tensor_map_refused("boxDim %lld outside 1 .. 256", box[i]);
        if (element_strides[i] < 1 || element_strides[i] > 8)
            return tensor_map_refused("elementStrides %lld outside 1 .. 8", element_strides[i]);
        if (element_strides[i] != 1) fatal("cuTensorMapEncodeTiled", "element strides other than 1 are not emulated");
    }
    if (strides[0] % 16 || strides[0] >= (1ull << 40))
        return tensor_map_refused("globalStrides[0] %lld is not a multiple of 16 below 2^40", (long long)strides[0]);
    if (strides[0] < dims[0] * eb)
        return tensor_map_refused("globalStrides[0] %lld is less than a row's bytes", (long long)strides[0]);
    if (box[0] * eb % 16) return tensor_map_refused("boxDim[0] * element size (%lld bytes) is not a multiple of 16",
                                                   box[0] * eb);
    static const int SWIZZLE_BYTES[] = {0, 32, 64, 128};
    if ((int)swizzle < 0 || (int)swizzle > 3)
        fatal("cuTensorMapEncodeTiled", "only the swizzles none, 32B, 64B and 128B are emulated");
    const int sw = SWIZZLE_BYTES[swizzle];
    if (sw && box[0] * eb > (cuuint32_t)sw)
        return tensor_map_refused("the box's inner dimension (%lld bytes) exceeds the swizzle's span", box[0] * eb);
    const uint64_t extent = (dims[1] - 1) * strides[0] + dims[0] * eb;
    if (!is_device(address, extent))
        return tensor_map_refused(
            "the tensor (%lld bytes from globalAddress) is not inside one cudaMalloc'd allocation", (long long)extent);
    TensorMap m{};
    m.magic = TensorMap::MAGIC;
    m.base = static_cast<const unsigned char*>(address);
    m.dims[0] = dims[0], m.dims[1] = dims[1], m.row_stride = strides[0];
    m.box[0] = box[0], m.box[1] = box[1], m.element_bytes = (uint32_t)eb, m.swizzle_bytes = (uint32_t)sw;
    memset(map, 0, sizeof *map);
    memcpy(map, &m, sizeof m);
    return CUDA_SUCCESS;
}

void* driver_entry_point(const char* symbol, cudaDriverEntryPointQueryResult* status) {
    void* f = symbol && !strcmp(symbol, "cuTensorMapEncodeTiled") ? reinterpret_cast<void*>(&encode_tensor_map_tiled)
                                                                  : nullptr;
    if (status) *status = f ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return f;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** function, unsigned long long,
                                    cudaDriverEntryPointQueryResult* status) {
    if (!function) return record(cudaErrorInvalidValue);
    *function = driver_entry_point(symbol, status);
    return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
    if (!function) return record(cudaErrorInvalidValue);
    *function = driver_entry_point(symbol, status);
    return cudaSuccess;
}

}  // extern "C"
