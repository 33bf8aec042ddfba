// staged_comm.cuh: StagedComm, a host communicator (MPI, or the local one of one rank) serving
// device buffers through pinned host memory, for ranks that share a GPU or have no NCCL.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "llmc/dist/comm.h"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/kernels/nvtx.cuh"
#include "llmc/utils.h"

namespace llmc {

// A host communicator (MPI, or the local one of a single rank) serving device buffers. Each
// collective copies its data to pinned host memory, runs there, and copies the result back before
// it returns: synchronous and without overlap (the handle reports the call's time as waited), but it
// lets several ranks share one GPU (which NCCL refuses) and runs one rank with no NCCL at all. With
// one rank an all-reduce is nothing and the other collectives are a device copy between two
// device-wide synchronisations; the CUDA model plans ZeRO-0 for one rank, so training never reaches
// those copies, and order_after need not block.
//
// Messages (send, recv) are the exception: an exchange needs both sides in flight at once, so each
// message has its own pinned buffer and stays asynchronous; a received message is on the device once
// its handle is seen done. split() splits the host communicator and serves the group it gets.
class StagedComm : public Communicator {
public:
    explicit StagedComm(Communicator& host) : host_(host) {}
    // Serves, and owns, a host communicator of its own (a split's group).
    explicit StagedComm(std::unique_ptr<Communicator> host) : owned_host_(std::move(host)), host_(*owned_host_) {}

    int rank() const override { return host_.rank(); }
    int world_size() const override { return host_.world_size(); }
    const char* backend() const override { return host_.world_size() == 1 ? "local" : "mpi, staged through host memory"; }
    bool uses_device_buffers() const override { return true; }
    // The host waits: the copies below then see everything the compute stream wrote.
    void order_after(void* cuda_event) override {
        if (world_size() > 1) CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(cuda_event)));
    }

    CommHandle all_reduce_sum(void* buf, size_t count, CommDtype dtype) override {
        check_summable("all_reduce", dtype);
        if (world_size() == 1 || count == 0) return {};
        NvtxRange range(strformat("all_reduce of %zu %s (staged)", count, comm_dtype_name(dtype)));
        const auto start = Clock::now();
        const size_t bytes = count * comm_dtype_bytes(dtype);
        char* h = staging(bytes);
        CUDA_CHECK(cudaMemcpy(h, buf, bytes, cudaMemcpyDeviceToHost));
        run(host_.all_reduce_sum(h, count, dtype));
        CUDA_CHECK(cudaMemcpy(buf, h, bytes, cudaMemcpyHostToDevice));
        return ran_since(start);
    }
    CommHandle reduce_scatter_sum(const void* send, void* recv, size_t recv_count, CommDtype dtype) override {
        check_summable("reduce_scatter", dtype);
        const size_t block = recv_count * comm_dtype_bytes(dtype);
        if (block == 0) return {};
        if (world_size() == 1) {
            if (!is_in_place("reduce_scatter", send, recv, block)) device_copy(recv, send, block);
            return {};
        }
        NvtxRange range(strformat("reduce_scatter of %zu %s per rank (staged)", recv_count, comm_dtype_name(dtype)));
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
        NvtxRange range(strformat("all_gather of %zu %s per rank (staged)", send_count, comm_dtype_name(dtype)));
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
    // The device data is copied out now (order_after made it visible), then sent from pinned memory.
    CommHandle send(const void* buf, size_t bytes, int peer) override {
        check_peer(true, bytes, peer);
        auto op = std::make_shared<StagedMessage>(bytes, nullptr);
        if (bytes) CUDA_CHECK(cudaMemcpy(op->host.get(), buf, bytes, cudaMemcpyDeviceToHost));
        op->host_op = host_.send(op->host.get(), bytes, peer);
        return CommHandle(op);
    }
    CommHandle recv(void* buf, size_t bytes, int peer) override {
        check_peer(false, bytes, peer);
        auto op = std::make_shared<StagedMessage>(bytes, buf);
        op->host_op = host_.recv(op->host.get(), bytes, peer);
        return CommHandle(op);
    }
    std::unique_ptr<Communicator> split(int color, int key) override {
        return std::make_unique<StagedComm>(host_.split(color, key));
    }

protected:
    CommHandle copy_block(void* dst, const void* src, size_t bytes) override {
        device_copy(dst, src, bytes);
        return {};
    }

private:
    using Clock = std::chrono::steady_clock;

    // One message through its own pinned buffer. Once the host message is done, a received one is
    // copied to the device (device_dst) the first time the handle is seen done.
    struct StagedMessage : CommOp {
        StagedMessage(size_t bytes, void* device_dst)
            : host(bytes, "staging a message through the host"), bytes(bytes), device_dst(device_dst) {}
        PinnedBuffer<char> host;
        size_t bytes;
        void* device_dst;  // nullptr for a send
        CommHandle host_op;
        bool landed = false;
        std::string error;
        int error_code = 0;  // the host failure's exit code (a timeout's, a dead peer's)

        bool done() override {
            if (!host_op.done()) return false;
            land();
            return true;
        }
        void wait() override {
            land();
            if (!error.empty()) fail_with(error_code, error);
        }
        void land() {
            if (landed) return;
            landed = true;
            try {
                host_op.wait();
                if (device_dst && bytes) CUDA_CHECK(cudaMemcpy(device_dst, host.get(), bytes, cudaMemcpyHostToDevice));
            } catch (const Error& e) {
                error = e.what();
                error_code = e.exit_code;
            }
        }
    };

    // The handle of a collective that ran to completion inside its call. None of it overlapped
    // compute, so it reports the whole call as time waited (the trainer's exposed communication).
    struct CompletedOp : CommOp {
        bool done() override { return true; }
        void wait() override {}
    };
    static CommHandle ran_since(Clock::time_point start) {
        auto op = std::make_shared<CompletedOp>();
        op->wait_ms = ms_since(start);
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

    std::unique_ptr<Communicator> owned_host_;  // set when this communicator is a split's group
    Communicator& host_;
    PinnedBuffer<char> staging_;
};

}  // namespace llmc
