// device_memory.cuh: DeviceMemory, the ZeRO engine's (zero.h) memory policy on a GPU: bf16
// parameters with separate fp32 master weights, every copy and update on the model's compute
// stream, and each collective ordered after the compute work issued before it.
//
// Ordering is the one subtle part. A collective reads or writes buffers that kernels on the compute
// stream also use, so before each collective the engine calls before_collective(): an event is
// recorded on the compute stream and the communicator starts the collective only once it has
// completed (NCCL: its stream waits on the event; StagedComm: the host waits). The other direction
// needs nothing: the engine waits on a collective's handle on the host before it issues the
// kernels that read the result.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "llmc/ckpt/crc32c.h"
#include "llmc/kernels/adamw.cuh"
#include "llmc/dist/comm.h"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/global_norm.cuh"
#include "llmc/dist/zero.h"

namespace llmc {

// dst[i] += src[i]: stage 2 adds each reduce-scattered gradient slice into the rank's shard.
__global__ void add_into_kernel(float* dst, const float* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}
inline void add_into(float* dst, const float* src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    const int grid = (int)std::min<size_t>(ceil_div(n, (size_t)block), 4096);
    LLMC_LAUNCH(add_into_kernel, grid, block, 0, stream)(dst, src, n);
    CUDA_CHECK_LAUNCH();
}

class DeviceMemory {
public:
    using Param = floatX;
    static constexpr ParamPrecision precision = BF16_PARAMETERS_FP32_MASTER;
    static constexpr CommDtype param_dtype = CommDtype::BF16;
    // Device bytes this policy allocates for itself (the gradient norm's partial sums and result).
    static size_t scratch_bytes() { return global_norm_partials_count() * sizeof(float) + sizeof(double); }

    // stream: the model's compute stream. host: the communicator for host scalars (the gradient
    // norm), which must outlive this object.
    DeviceMemory(cudaStream_t stream, Communicator& host)
        : stream_(stream), host_(host), norm_partials_(global_norm_partials_count(), "gradient norm partial sums"),
          norm_(1, "gradient norm"), pinned_norm_(1, "gradient norm download") {}

    // Seeds the stochastic rounding of the bf16 parameters (set by the model at init and load).
    uint32_t sr_seed = 0;

    void* allocate(const BufferSpec& spec) {
        if (spec.bytes() == 0) return nullptr;
        DeviceBuffer<char>& b = buffers_.emplace_back(spec.bytes(), spec.name.c_str());
        CUDA_CHECK(cudaMemsetAsync(b.get(), 0, b.bytes(), stream_));
        return b.get();
    }
    // Raw bytes between device and host memory, in order after the compute stream's work and done
    // when they return (guards and fault injection); the CRC32C of a device buffer, copied to the
    // host in chunks (slow, but only every --fingerprint-every steps).
    void read_bytes(void* host, const void* src, size_t bytes) {
        CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void write_bytes(void* dst, const void* host, size_t bytes) {
        CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    uint32_t crc32c(uint32_t crc, const void* src, size_t bytes) {
        std::vector<char> chunk(std::min<size_t>(bytes, 64u << 20));
        for (size_t at = 0; at < bytes; at += chunk.size()) {
            const size_t n = std::min(chunk.size(), bytes - at);
            read_bytes(chunk.data(), static_cast<const char*>(src) + at, n);
            crc = llmc::crc32c(crc, chunk.data(), n);
        }
        return crc;
    }
    void copy(void* dst, const void* src, size_t bytes) {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    }
    void zero(void* dst, size_t bytes) { CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_)); }
    void add(float* dst, const float* src, size_t n) { add_into(dst, src, n, stream_); }
    double sum_squares(const float* x, size_t n) {
        global_norm_squared(norm_.get(), norm_partials_.get(), x, n, false, stream_);
        CUDA_CHECK(cudaMemcpyAsync(pinned_norm_.get(), norm_.get(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        return *pinned_norm_.get();
    }
    // AdamW on the fp32 master weights, then the bf16 parameters stochastically rounded from them.
    // The random bits depend on (seed, step, flat element index) only, so they are the same for any
    // world size, stage or launch configuration.
    void adamw(Param* params, float* master, const float* grads, float* m, float* v, size_t n, float decay,
               const AdamWConfig& opt, int step, float grad_multiplier, size_t first_index) {
        const uint32_t seed = hash_u32(sr_seed ^ hash_u32((uint32_t)step));
        adamw_update(params, master, grads, m, v, n, opt.lr, opt.beta1, opt.beta2, opt.eps, decay, step, grad_multiplier,
                     seed, first_index, stream_);
    }
    // bf16 parameters from host floats, rounded to nearest (through a transient fp32 buffer).
    void upload_params(Param* params, const float* host, size_t n) {
        float* staged = transient(n);
        CUDA_CHECK(cudaMemcpyAsync(staged, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        copy_master_to_params(params, staged, n, stream_);
        CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` belongs to the caller; `staged` is reused
    }
    // fp32 state (master weights, AdamW moments) from n host floats.
    void upload(float* dst, const float* host, size_t n) {
        CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void download(float* host, const float* master, size_t n) {
        CUDA_CHECK(cudaMemcpyAsync(host, master, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void before_collective(Communicator& comm) {
        CUDA_CHECK(cudaEventRecord(compute_done_.get(), stream_));
        comm.order_after(compute_done_.get());
    }
    Communicator& host_comm(Communicator&) { return host_; }

    // Checkpoint snapshots: device-to-host copies into pinned memory on a side stream, after the
    // compute work issued so far, so the trainer goes on at once; the next optimizer update's
    // kernels wait for the copies on the device (before_update), never the host.
    void* snapshot_memory(size_t bytes) {
        if (snapshot_.count() < bytes) snapshot_ = PinnedBuffer<char>(bytes, "checkpoint snapshot");
        return snapshot_.get();
    }
    void start_host_copies(const std::vector<HostCopy>& copies) {
        CUDA_CHECK(cudaEventRecord(snapshot_ready_.get(), stream_));
        CUDA_CHECK(cudaStreamWaitEvent(copy_stream_.get(), snapshot_ready_.get(), 0));
        for (const HostCopy& c : copies)
            CUDA_CHECK(cudaMemcpyAsync(c.host, c.src, c.bytes, cudaMemcpyDeviceToHost, copy_stream_.get()));
        CUDA_CHECK(cudaEventRecord(snapshot_copied_.get(), copy_stream_.get()));
    }
    void wait_host_copies() { CUDA_CHECK(cudaEventSynchronize(snapshot_copied_.get())); }
    void before_update() { CUDA_CHECK(cudaStreamWaitEvent(stream_, snapshot_copied_.get(), 0)); }
    // A device buffer of at least n floats for short-lived use (loading, saving); not planned memory.
    float* transient(size_t n) {
        if (transient_.count() < n) {
            CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffer may still be in use
            transient_.allocate(n, "transient buffer for loading or saving parameters");
        }
        return transient_.get();
    }
    // Frees the transient buffer once a load or save is done: it is not planned memory, so it must
    // not stay allocated through training (it is as large as the embedding bucket in fp32).
    void release_transient() {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        transient_.release();
    }

private:
    cudaStream_t stream_;
    Communicator& host_;
    std::deque<DeviceBuffer<char>> buffers_;
    DeviceBuffer<float> norm_partials_;
    DeviceBuffer<double> norm_;
    PinnedBuffer<double> pinned_norm_;
    DeviceBuffer<float> transient_;
    CudaEvent compute_done_;
    CudaStream copy_stream_;  // checkpoint snapshots
    CudaEvent snapshot_ready_, snapshot_copied_;
    PinnedBuffer<char> snapshot_;
};

}  // namespace llmc
