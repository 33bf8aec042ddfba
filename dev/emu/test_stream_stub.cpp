// dev/emu/test_stream_stub.cpp: a stand-in for the emulator's runtime, so that test_cublaslt.cpp
// links before runtime.cpp is ready: stream.h's functions and the few CUDA runtime calls the test
// makes. Work runs the moment it is enqueued; device memory is host memory that cudaMalloc records,
// so is_device_range tells it apart from the test's host buffers as the real runtime does.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "dev/emu/stream.h"

namespace {

std::map<const char*, size_t>& allocations() {  // start -> bytes
    static std::map<const char*, size_t> all;
    return all;
}

}  // namespace

namespace emu {

std::recursive_mutex& api_lock() {
    static std::recursive_mutex lock;
    return lock;
}

void enqueue(cudaStream_t, StreamOp op) {
    while (!op.run(true)) {
    }
}

void enqueue(cudaStream_t, const char*, std::function<void()> work) { work(); }

void drain(cudaStream_t) {}

bool is_device_range(const void* ptr, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(api_lock());
    const char* p = static_cast<const char*>(ptr);
    auto it = allocations().upper_bound(p);
    if (it == allocations().begin()) return false;
    --it;
    return p >= it->first && p + bytes <= it->first + it->second;
}

[[noreturn]] void fatal(const char* where, const char* message) {
    std::fprintf(stderr, "%s: %s\n", where, message);
    std::abort();
}

}  // namespace emu

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(emu::api_lock());
    const size_t rounded = (bytes + 255) / 256 * 256;  // cudaMalloc's 256-byte alignment
    void* p = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
    if (!p) return cudaErrorMemoryAllocation;
    allocations()[static_cast<const char*>(p)] = bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    std::lock_guard<std::recursive_mutex> lock(emu::api_lock());
    if (!ptr) return cudaSuccess;
    if (allocations().erase(static_cast<const char*>(ptr)) == 0) return cudaErrorInvalidValue;
    std::free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
    std::memcpy(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
