// zero_cuda.cuh: what the ZeRO engine (zero.h) needs to run on a GPU. DeviceMemory is its memory
// policy there: bf16 parameters with separate fp32 master weights, every copy and update on the
// model's compute stream, and each collective ordered after the compute work issued before it.
// StagedComm lets a host communicator serve device buffers, through pinned host memory.
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

#include "adamw.cuh"
#include "comm.h"
#include "cuda_common.h"
#include "global_norm.cuh"
#include "zero.h"

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
    add_into_kernel<<<grid, block, 0, stream>>>(dst, src, n);
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
        DeviceBuffer<char>& b = buffers_.emplace_back(spec.bytes(), spec.name);
        CUDA_CHECK(cudaMemsetAsync(b.get(), 0, b.bytes(), stream_));
        return b.get();
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
    void upload_master(float* master, const float* host, size_t n) {
        CUDA_CHECK(cudaMemcpyAsync(master, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
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
};

// A host communicator (MPI, or the local one of a single rank) serving device buffers. Each
// collective copies its data to pinned host memory, runs there, and copies the result back before
// it returns: synchronous and without overlap (the handle reports the call's time as waited), but it
// lets several ranks share one GPU (which NCCL refuses) and runs one rank with no NCCL at all. With
// one rank an all-reduce is nothing and the other collectives are a device copy between two
// device-wide synchronisations; the CUDA model plans ZeRO-0 for one rank, so training never reaches
// those copies, and order_after need not block.
class StagedComm : public Communicator {
public:
    explicit StagedComm(Communicator& host) : host_(host) {}

    int rank() const override { return host_.rank(); }
    int world_size() const override { return host_.world_size(); }
    const char* backend() const override { return host_.world_size() == 1 ? "local" : "mpi, staged through host memory"; }
    bool uses_device_buffers() const override { return true; }
    // The host waits: the copies below then see everything the compute stream wrote.
    void order_after(void* cuda_event) override {
        if (world_size() > 1) CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(cuda_event)));
    }

    CommHandle all_reduce_sum(void* buf, size_t count, CommDtype dtype) override {
        if (world_size() == 1 || count == 0) return {};
        const auto start = Clock::now();
        const size_t bytes = count * comm_dtype_bytes(dtype);
        char* h = staging(bytes);
        CUDA_CHECK(cudaMemcpy(h, buf, bytes, cudaMemcpyDeviceToHost));
        run(host_.all_reduce_sum(h, count, dtype));
        CUDA_CHECK(cudaMemcpy(buf, h, bytes, cudaMemcpyHostToDevice));
        return ran_since(start);
    }
    CommHandle reduce_scatter_sum(const void* send, void* recv, size_t recv_count, CommDtype dtype) override {
        const size_t block = recv_count * comm_dtype_bytes(dtype);
        if (block == 0) return {};
        if (world_size() == 1) {
            if (!is_in_place("reduce_scatter", send, recv, block)) device_copy(recv, send, block);
            return {};
        }
        const auto start = Clock::now();
        char* h = staging(block * world_size());
        CUDA_CHECK(cudaMemcpy(h, send, block * world_size(), cudaMemcpyDeviceToHost));
        char* own = h + (size_t)rank() * block;
        run(host_.reduce_scatter_sum(h, own, recv_count, dtype));
        CUDA_CHECK(cudaMemcpy(recv, own, block, cudaMemcpyHostToDevice));
        return ran_since(start);
    }
    CommHandle all_gather(const void* send, void* recv, size_t send_count, CommDtype dtype) override {
        const size_t block = send_count * comm_dtype_bytes(dtype);
        if (block == 0) return {};
        if (world_size() == 1) {
            if (!is_in_place("all_gather", recv, send, block)) device_copy(recv, send, block);
            return {};
        }
        const auto start = Clock::now();
        char* h = staging(block * world_size());
        char* own = h + (size_t)rank() * block;
        CUDA_CHECK(cudaMemcpy(own, send, block, cudaMemcpyDeviceToHost));
        run(host_.all_gather(own, h, send_count, dtype));
        CUDA_CHECK(cudaMemcpy(recv, h, block * world_size(), cudaMemcpyHostToDevice));
        return ran_since(start);
    }
    CommHandle broadcast(void* buf, size_t bytes, int root) override {
        check_root(root, bytes);
        if (world_size() == 1 || bytes == 0) return {};
        const auto start = Clock::now();
        char* h = staging(bytes);
        CUDA_CHECK(cudaMemcpy(h, buf, bytes, cudaMemcpyDeviceToHost));
        run(host_.broadcast(h, bytes, root));
        CUDA_CHECK(cudaMemcpy(buf, h, bytes, cudaMemcpyHostToDevice));
        return ran_since(start);
    }
    CommHandle barrier() override {
        const auto start = Clock::now();
        run(host_.barrier());
        return ran_since(start);
    }

private:
    using Clock = std::chrono::steady_clock;

    // The handle of a collective that ran to completion inside its call. None of it overlapped
    // compute, so it reports the whole call as time waited (the trainer's exposed communication).
    struct CompletedOp : CommOp {
        bool done() override { return true; }
        void wait() override {}
    };
    static CommHandle ran_since(Clock::time_point start) {
        auto op = std::make_shared<CompletedOp>();
        op->wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        return CommHandle(op);
    }
    char* staging(size_t bytes) {
        if (staging_.count() < bytes) staging_ = PinnedBuffer<char>(bytes, "staging device collectives through the host");
        return staging_.get();
    }
    // Runs a host collective to completion (under the host communicator's timeout).
    static void run(CommHandle h) { h.wait(); }
    // One rank: the copy waits for all work on the device, whatever stream wrote the source, and
    // is complete on return: a device-to-device cudaMemcpy does not block the host, and the compute
    // stream (non-blocking) would not wait for it on the legacy default stream.
    static void device_copy(void* dst, const void* src, size_t bytes) {
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaDeviceSynchronize());
    }

    Communicator& host_;
    PinnedBuffer<char> staging_;
};

}  // namespace llmc
