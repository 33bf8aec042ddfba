// dev/emu/test_stream_stub_nccl.cpp: a stand-in for the emulated CUDA runtime, just enough for
// test_nccl until the real one (behind stream.h) lands; then test_nccl links that instead.
//
// Device memory is malloc'd and remembered, so is_device_range can tell it from host memory. A
// stream is a FIFO of StreamOps: cudaStreamSynchronize runs them in order (run(true)), and
// cudaStreamQuery runs them as far as they complete without waiting (run(false)), which is how the
// real runtime answers cudaEventQuery. Nothing here waits for other streams.
#include "dev/emu/stream.h"

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>

namespace {

std::map<const char*, size_t>& allocations() {  // start -> bytes
    static std::map<const char*, size_t> all;
    return all;
}

std::map<cudaStream_t, std::deque<emu::StreamOp>>& queues() {
    static std::map<cudaStream_t, std::deque<emu::StreamOp>> all;
    return all;
}

// The legacy default stream (0) and cudaStreamLegacy are one stream.
cudaStream_t canonical(cudaStream_t stream) { return stream == cudaStreamLegacy ? nullptr : stream; }

// Runs the stream's operations in order while they complete; false when one is still running.
bool run_queue(cudaStream_t stream, bool block) {
    std::lock_guard<std::recursive_mutex> lock(emu::api_lock());
    auto& queue = queues()[canonical(stream)];
    while (!queue.empty()) {
        if (!queue.front().run(block)) return false;
        queue.pop_front();
    }
    return true;
}

}  // namespace

namespace emu {

std::recursive_mutex& api_lock() {
    static std::recursive_mutex lock;
    return lock;
}

void enqueue(cudaStream_t stream, StreamOp op) {
    std::lock_guard<std::recursive_mutex> lock(api_lock());
    queues()[canonical(stream)].push_back(std::move(op));
}

void enqueue(cudaStream_t stream, const char* what, std::function<void()> work) {
    enqueue(stream, StreamOp{what, [work = std::move(work)](bool) {
                                 work();
                                 return true;
                             }});
}

void drain(cudaStream_t stream) { run_queue(stream, true); }

bool is_device_range(const void* ptr, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(api_lock());
    const char* p = (const char*)ptr;
    auto it = allocations().upper_bound(p);
    if (it == allocations().begin()) return false;
    --it;
    return p >= it->first && bytes <= it->second && (size_t)(p - it->first) <= it->second - bytes;
}

void fatal(const char* where, const char* message) {
    fprintf(stderr, "emulated GPU fault in %s: %s\n", where, message);
    fflush(stderr);
    abort();
}

}  // namespace emu

extern "C" {

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(emu::api_lock());
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr) return cudaErrorMemoryAllocation;
    allocations()[(const char*)*ptr] = bytes;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    std::lock_guard<std::recursive_mutex> lock(emu::api_lock());
    if (ptr && !allocations().erase((const char*)ptr)) return cudaErrorInvalidValue;
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    std::lock_guard<std::recursive_mutex> lock(emu::api_lock());
    *stream = (cudaStream_t) new char;  // only its address matters
    queues()[*stream];
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(emu::api_lock());
    run_queue(stream, true);  // CUDA finishes a destroyed stream's work
    queues().erase(stream);
    delete (char*)stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    run_queue(stream, true);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) { return run_queue(stream, false) ? cudaSuccess : cudaErrorNotReady; }

}  // extern "C"
