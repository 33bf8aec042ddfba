// host_memory.h: HostMemory, the ZeRO engine's (zero.h) memory policy for the CPU model: host
// vectors, and fp32 parameters that are their own master weights.
#pragma once

#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <future>
#include <mutex>
#include <vector>

#include "llmc/ckpt/crc32c.h"
#include "llmc/cpu/adamw.h"
#include "llmc/dist/comm.h"
#include "llmc/dist/zero.h"

namespace llmc {

// The CPU model's memory: host vectors, fp32 parameters that are their own master weights.
class HostMemory {
public:
    using Param = float;
    static constexpr ParamPrecision precision = FP32_PARAMETERS;
    static constexpr CommDtype param_dtype = CommDtype::F32;

    // A zeroed buffer for the spec, owned by this object.
    void* allocate(const BufferSpec& spec) { return buffers_.emplace_back(spec.count, 0.0f).data(); }
    void copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
    void zero(void* dst, size_t bytes) { std::memset(dst, 0, bytes); }
    void add(float* dst, const float* src, size_t n) {
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
    }
    double sum_squares(const float* x, size_t n) { return llmc::sum_squares(x, 0, n); }
    // AdamW on n elements of one tensor. `master` is `params` here; first_index (the elements' flat
    // index in ParamLayout) matters only where the update rounds randomly.
    void adamw(Param* params, float* master, const float* grads, float* m, float* v, size_t n, float decay,
               const AdamWConfig& opt, int step, float grad_multiplier, size_t first_index) {
        (void)master;
        (void)first_index;
        adamw_contiguous(params, grads, m, v, n, decay, opt, step, grad_multiplier);
    }
    // Parameters, or any other fp32 state, from n host floats; master weights (here the parameters)
    // back to host floats.
    void upload_params(Param* params, const float* host, size_t n) { upload(params, host, n); }
    void upload(float* dst, const float* host, size_t n) { std::memcpy(dst, host, n * sizeof(float)); }
    void download(float* host, const float* master, size_t n) { std::memcpy(host, master, n * sizeof(float)); }

    // Raw bytes to and from host memory, done when they return (guards and fault injection), and
    // the CRC32C of a buffer.
    void read_bytes(void* host, const void* src, size_t bytes) { std::memcpy(host, src, bytes); }
    void write_bytes(void* dst, const void* host, size_t bytes) { std::memcpy(dst, host, bytes); }
    uint32_t crc32c(uint32_t crc, const void* src, size_t bytes) { return llmc::crc32c(crc, src, bytes); }

    // Checkpoint snapshots. The copies run on a thread of their own, as a GPU's run on a side
    // stream, so the trainer goes on with forward and backward (which only read the state) while
    // they run; the next optimizer update waits for them (before_update).
    // 4 KiB aligned, so the checkpoint writer can send it to the disk with O_DIRECT.
    void* snapshot_memory(size_t bytes) {
        if (snapshot_bytes_ < bytes) {
            const size_t rounded = (bytes + 4095) / 4096 * 4096;
            snapshot_.reset(static_cast<char*>(std::aligned_alloc(4096, rounded)));
            if (!snapshot_) fail(strformat("cannot allocate %zu bytes of host memory for checkpoint snapshots", rounded));
            std::memset(snapshot_.get(), 0, rounded);  // touched now, not during the first save
            snapshot_bytes_ = rounded;
        }
        return snapshot_.get();
    }
    void start_host_copies(const std::vector<HostCopy>& copies) {
        wait_host_copies();
        std::shared_future<void> copying = std::async(std::launch::async, [copies] {
                                               for (const HostCopy& c : copies) std::memcpy(c.host, c.src, c.bytes);
                                           }).share();
        std::lock_guard<std::mutex> lock(copying_mutex_);
        copying_ = copying;
    }
    // Thread-safe: the checkpoint writer and the trainer may both wait.
    void wait_host_copies() {
        std::shared_future<void> copying;
        {
            std::lock_guard<std::mutex> lock(copying_mutex_);
            copying = copying_;
        }
        if (copying.valid()) copying.wait();
    }
    void before_update() { wait_host_copies(); }
    // Host buffers are written before a collective is issued: nothing to order.
    void before_collective(Communicator&) {}
    // The communicator for host scalars: the engine's own, which works on host memory.
    Communicator& host_comm(Communicator& engine_comm) { return engine_comm; }

private:
    std::deque<std::vector<float>> buffers_;
    struct FreeDeleter {
        void operator()(char* p) const { std::free(p); }
    };
    std::unique_ptr<char, FreeDeleter> snapshot_;
    size_t snapshot_bytes_ = 0;
    std::shared_future<void> copying_;
    std::mutex copying_mutex_;
};

}  // namespace llmc
