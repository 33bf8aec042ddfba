// comm.h: the collective-communication interface the trainer talks to, and LocalComm (one rank).
//
// Every collective is asynchronous: it returns a CommHandle at once and the caller waits on it when
// it needs the result, so communication overlaps compute. The trainer's one thread issues
// collectives in the same order on every rank and each backend completes them in that order, so a
// handle's wait() also vouches for every collective issued before it. A collective that cannot
// finish within timeout_s (a rank died or diverged) fails with an llmc::Error instead of hanging,
// and breaks the communicator: every later collective fails at once with the same cause.
//
// Point-to-point send and recv are operations like the collectives (same handles, timeouts and
// breaking), between this rank and one peer. Every operation issued is in flight at once, so two
// ranks may each send to the other and then receive: issue both sides before waiting on either.
//
// A communicator splits into sub-groups (split), each a communicator of its own with ranks
// 0..n-1 in it; process_groups.h builds the mesh's groups that way. world_size() and rank() are
// always this communicator's, not the launch's.
//
// Backends: LocalComm (here, one rank, no launcher), MpiComm (comm_mpi.h, host buffers) and
// NcclComm (comm_nccl.cuh, device buffers). bootstrap.h picks the host one for a launch.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "llmc/utils.h"

namespace llmc {

// Element type of a collective. BF16 travels as raw 16-bit words; sums add in float and round to
// nearest even, as the GPU's bf16 gradients will need. U8: bytes (packed FP8 weights), gathered, never
// summed.
enum class CommDtype { F32, BF16, U8 };

inline size_t comm_dtype_bytes(CommDtype dtype) {
    return dtype == CommDtype::F32 ? 4 : dtype == CommDtype::BF16 ? 2 : 1;
}
inline const char* comm_dtype_name(CommDtype dtype) {
    return dtype == CommDtype::F32 ? "f32" : dtype == CommDtype::BF16 ? "bf16" : "u8";
}
// Every backend's sums call this first: bytes have no sum.
inline void check_summable(const char* collective, CommDtype dtype) {
    if (dtype == CommDtype::U8) fail(strformat("%s of u8: bytes are gathered, not summed", collective));
}

// The backend's side of one asynchronous collective. Shared by the handle and the backend, so either
// may go first; wait_ms accumulates here so copies of a handle report the same total.
class CommOp {
public:
    virtual ~CommOp() = default;
    virtual bool done() = 0;  // non-blocking; true also when the collective failed
    virtual void wait() = 0;  // blocks until done; throws llmc::Error when it failed or timed out
    double wait_ms = 0;
};

// Completion handle of an asynchronous collective. A default-constructed handle is already complete
// (LocalComm's collectives finish inside the call).
class CommHandle {
public:
    CommHandle() = default;
    explicit CommHandle(std::shared_ptr<CommOp> op) : op_(std::move(op)) {}

    // Blocks until the collective is done; throws llmc::Error naming the collective, its size, the
    // rank and the timeout when it failed. Time spent here is the communication the caller did not
    // hide behind compute, so it is added to wait_ms() even when wait() throws.
    void wait() {
        if (!op_) return;
        auto start = std::chrono::steady_clock::now();
        struct AddElapsed {
            CommOp& op;
            std::chrono::steady_clock::time_point start;
            ~AddElapsed() {
                op.wait_ms += ms_since(start);
            }
        } add_elapsed{*op_, start};
        op_->wait();
    }
    bool done() const { return !op_ || op_->done(); }
    double wait_ms() const { return op_ ? op_->wait_ms : 0.0; }

private:
    std::shared_ptr<CommOp> op_;
};

// Several operations as one: done when all are; wait() waits for each in turn (the first failure
// throws).
class CommOpGroup : public CommOp {
public:
    explicit CommOpGroup(std::vector<CommHandle> handles) : handles_(std::move(handles)) {}
    bool done() override {
        for (const CommHandle& h : handles_)
            if (!h.done()) return false;
        return true;
    }
    void wait() override {
        for (CommHandle& h : handles_) h.wait();
    }

private:
    std::vector<CommHandle> handles_;
};

// A group of ranks that run collectives together. All buffers live in the backend's memory (host for
// local and mpi, device for nccl) and must stay valid until the collective's handle is done.
// Operations in flight together may run concurrently, so a buffer one of them writes must not be
// used by another until the first one's handle is done. Reductions are sums.
class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int world_size() const = 0;
    virtual const char* backend() const = 0;  // "local", "mpi", "nccl"

    double timeout_s = 600;  // per collective, from issue to completion; read when a collective is issued

    // Whether the buffers are device memory (NCCL) rather than host memory.
    virtual bool uses_device_buffers() const { return false; }
    // Device communicators only: collectives issued after this call start once `cuda_event` (a
    // cudaEvent_t recorded on the producer's stream after it wrote the buffers) has completed. Typed
    // void* so that host code needs no CUDA header.
    virtual void order_after(void* cuda_event) {
        (void)cuda_event;
        fail(strformat("order_after: the %s communicator works on host buffers and has no stream", backend()));
    }

    // In place: every rank's buf ends up holding the element-wise sum over ranks.
    virtual CommHandle all_reduce_sum(void* buf, size_t count, CommDtype dtype) = 0;
    // send holds world_size * recv_count elements; recv gets block [rank] of their sum over ranks.
    // In place when recv == send + rank * recv_count; the other blocks of send are then clobbered.
    virtual CommHandle reduce_scatter_sum(const void* send, void* recv, size_t recv_count, CommDtype dtype) = 0;
    // recv gets every rank's send_count elements, rank r's at block r. In place when
    // send == recv + rank * send_count.
    virtual CommHandle all_gather(const void* send, void* recv, size_t send_count, CommDtype dtype) = 0;
    // Every rank's buf gets root's bytes.
    virtual CommHandle broadcast(void* buf, size_t bytes, int root) = 0;
    // Done once every rank has issued it.
    virtual CommHandle barrier() = 0;

    // Point to point with rank `peer` of this communicator (another rank: a rank does not message
    // itself). A send is matched by the peer's recv of the same size; messages between two ranks
    // arrive in the order they were sent.
    virtual CommHandle send(const void* buf, size_t bytes, int peer) = 0;
    virtual CommHandle recv(void* buf, size_t bytes, int peer) = 0;

    // All to all, of uneven sizes (expert parallelism's token exchange): every rank sends
    // send_counts[r] elements to each rank r and receives recv_counts[r] from each, the blocks back
    // to back in rank order in `send` and in `recv` (not in place); the counts must agree pairwise
    // (mine to r is r's from me), as a first exchange of the counts makes them. The count arrays may
    // be reused once the call returns. Every backend runs it as messages to and from every other
    // rank, issued together (NCCL groups them), and a copy of the rank's own block.
    CommHandle all_to_all_v(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                            CommDtype dtype) {
        const size_t unit = comm_dtype_bytes(dtype);
        std::vector<CommHandle> handles;
        size_t sent = 0, received = 0;
        for (int r = 0; r < world_size(); r++) {
            const char* from = static_cast<const char*>(send) + sent * unit;
            char* into = static_cast<char*>(recv) + received * unit;
            if (r == rank()) {
                if (send_counts[r] != recv_counts[r])
                    fail(strformat("all_to_all_v on rank %d: %zu elements to itself but %zu from itself", rank(),
                                   send_counts[r], recv_counts[r]));
                if (send_counts[r]) handles.push_back(copy_block(into, from, send_counts[r] * unit));
            } else {
                if (send_counts[r]) handles.push_back(this->send(from, send_counts[r] * unit, r));
                if (recv_counts[r]) handles.push_back(this->recv(into, recv_counts[r] * unit, r));
            }
            sent += send_counts[r], received += recv_counts[r];
        }
        return CommHandle(std::make_shared<CommOpGroup>(std::move(handles)));
    }

    // A new communicator of the ranks that pass the same color (>= 0), ranked by key (ties by their
    // rank here). Collective over this communicator: every rank calls it, in the same order relative
    // to the other collectives. The parent may be destroyed first; the child of a device
    // communicator is a device communicator.
    virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

protected:
    // all_to_all_v's own block: a copy in the backend's memory (host memory here).
    virtual CommHandle copy_block(void* dst, const void* src, size_t bytes) {
        std::memcpy(dst, src, bytes);
        return {};
    }
    // "send of 64 bytes to rank 1", "recv of 64 bytes from rank 3": how errors name a message.
    static std::string p2p_name(bool is_send, size_t bytes, int peer) {
        return strformat("%s of %zu bytes %s rank %d", is_send ? "send" : "recv", bytes, is_send ? "to" : "from", peer);
    }
    // Fails unless peer is another rank of this communicator.
    void check_peer(bool is_send, size_t bytes, int peer) const {
        if (peer < 0 || peer >= world_size() || peer == rank())
            fail(strformat("%s on rank %d of %d: the peer must be another rank in [0, %d)",
                           p2p_name(is_send, bytes, peer).c_str(), rank(), world_size(), world_size()));
    }
    void check_color(int color) const {
        if (color < 0)
            fail(strformat("split on rank %d of %d: the color must be >= 0, got %d", rank(), world_size(), color));
    }
    void check_root(int root, size_t bytes) const {
        if (root < 0 || root >= world_size())
            fail(strformat("broadcast of %zu bytes from root %d: the root must be a rank in [0, %d)", bytes, root,
                           world_size()));
    }
    // Whether `block` is this rank's block of the world-sized buffer `whole` (an in-place collective).
    // A block that lies outside `whole` is a separate buffer; any other overlap is a caller bug that
    // would corrupt data silently, so it fails here.
    bool is_in_place(const char* collective, const void* whole, const void* block, size_t block_bytes) const {
        auto w = (uintptr_t)whole, b = (uintptr_t)block, whole_bytes = (uintptr_t)(block_bytes * world_size());
        if (block_bytes == 0 || b + block_bytes <= w || b >= w + whole_bytes) return false;
        if (b == w + rank() * block_bytes) return true;
        fail(strformat("%s of %zu bytes per rank: the rank's block overlaps the world-sized buffer but is not "
                       "block %d of it (in place needs exactly that block)", collective, block_bytes, rank()));
    }
};

// World of one: every collective is complete when the call returns.
class LocalComm : public Communicator {
public:
    int rank() const override { return 0; }
    int world_size() const override { return 1; }
    const char* backend() const override { return "local"; }

    CommHandle all_reduce_sum(void*, size_t, CommDtype dtype) override {
        check_summable("all_reduce", dtype);
        return {};
    }
    // With one rank the world-sized buffer is the rank's block, so both collectives are a copy.
    CommHandle reduce_scatter_sum(const void* send, void* recv, size_t recv_count, CommDtype dtype) override {
        check_summable("reduce_scatter", dtype);
        size_t bytes = recv_count * comm_dtype_bytes(dtype);
        if (!is_in_place("reduce_scatter", send, recv, bytes) && bytes) memcpy(recv, send, bytes);
        return {};
    }
    CommHandle all_gather(const void* send, void* recv, size_t send_count, CommDtype dtype) override {
        size_t bytes = send_count * comm_dtype_bytes(dtype);
        if (!is_in_place("all_gather", recv, send, bytes) && bytes) memcpy(recv, send, bytes);
        return {};
    }
    CommHandle broadcast(void*, size_t bytes, int root) override {
        check_root(root, bytes);
        return {};
    }
    CommHandle barrier() override { return {}; }
    // There is no other rank to message, so these only fail with check_peer's message.
    CommHandle send(const void*, size_t bytes, int peer) override {
        check_peer(true, bytes, peer);
        return {};
    }
    CommHandle recv(void*, size_t bytes, int peer) override {
        check_peer(false, bytes, peer);
        return {};
    }
    std::unique_ptr<Communicator> split(int color, int) override {
        check_color(color);
        return std::make_unique<LocalComm>();
    }
};

// How a thread waiting on communication polls: back to back at first (most waits are short), then
// sleeping a little between polls so that a long wait does not take a core from compute.
class PollBackoff {
public:
    void pause() {
        if (polls_++ < 100) {
            std::this_thread::yield();
            return;
        }
        std::this_thread::sleep_for(sleep_);
        sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(200));
    }
    void reset() { *this = PollBackoff(); }

private:
    int polls_ = 0;
    std::chrono::microseconds sleep_{10};
};

// The world of one that models use when no launcher gave them a communicator.
inline LocalComm& local_communicator() {
    static LocalComm comm;
    return comm;
}

// Every rank's values, rank after rank (host communicators; every rank passes as many). Each
// double travels as two raw words, so every rank gets the same bits.
inline std::vector<double> all_gather_doubles(Communicator& comm, const std::vector<double>& local) {
    const size_t n = local.size();
    std::vector<double> all(n * comm.world_size());
    std::copy(local.begin(), local.end(), all.begin() + n * comm.rank());
    comm.all_gather(&all[n * comm.rank()], all.data(), 2 * n, CommDtype::F32).wait();
    return all;
}

// Sums one value per rank in rank order, so every rank gets the same bits, and exactly (a float
// all-reduce would round and may differ by algorithm): each rank's double travels as two raw words.
inline double sum_over_ranks(Communicator& comm, double local) {
    double total = 0.0;
    for (double x : all_gather_doubles(comm, {local})) total += x;
    return total;
}

// Every rank's string, in rank order (host communicators). Lengths first, then the strings padded to
// the longest, as raw 4-byte words (an all-gather moves bits, it adds nothing).
inline std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& local) {
    const int n = comm.world_size();
    std::vector<uint64_t> lengths(n);
    lengths[comm.rank()] = local.size();
    comm.all_gather(&lengths[comm.rank()], lengths.data(), 2, CommDtype::F32).wait();
    const size_t words = (*std::max_element(lengths.begin(), lengths.end()) + 3) / 4;
    if (words == 0) return std::vector<std::string>(n);
    std::vector<uint32_t> all(words * n, 0);
    std::memcpy(&all[words * comm.rank()], local.data(), local.size());
    comm.all_gather(&all[words * comm.rank()], all.data(), words, CommDtype::F32).wait();
    std::vector<std::string> out(n);
    for (int r = 0; r < n; r++) out[r].assign(reinterpret_cast<const char*>(&all[words * r]), lengths[r]);
    return out;
}

// Whether `ok` holds on every rank: the same answer everywhere, so ranks take the same branch.
inline bool all_ranks(Communicator& comm, bool ok) { return sum_over_ranks(comm, ok ? 0.0 : 1.0) == 0.0; }

}  // namespace llmc
