// comm_nccl.cuh: NcclComm, the Communicator over NCCL on device buffers (compiled by nvcc only).
//
// The idea: nothing here ever blocks inside CUDA or NCCL. The communicator is created non-blocking
// and its initialisation polled; each collective goes onto the communicator's own stream followed by
// an event; and waiting polls that event together with NCCL's asynchronous error state against the
// collective's deadline. So a rank that dies or never joins costs a timeout error and an aborted
// communicator (which also stops the stuck kernels) instead of a hung GPU and a hung trainer.
//
// The compute stream hands data to the communicator with an event (wait_for); results come back
// through CommHandle::wait or an event the caller records on stream(). Waiting through handles is
// what keeps the timeout: a cudaStreamSynchronize on a stuck collective would hang.
//
// On one stream an ncclSend blocks everything behind it until the peer receives, so two ranks that
// each send then receive would deadlock. Messages therefore wait in a pending list until something
// needs them on the stream (a collective, order_after, split, or a look at one of their handles) and
// then go as one NCCL group, which runs them concurrently: issue both sides of an exchange before
// waiting on either. split() is ncclCommSplit; the group gets its own stream.
//
// NcclComm and its handles are used from one thread, the trainer's.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "llmc/dist/comm.h"
#include "llmc/dist/flight_recorder.h"
#include "llmc/failures/exit_codes.h"
#include "llmc/kernels/cuda_common.cuh"  // CUDA_CHECK
#include "llmc/kernels/nvtx.cuh"
#include "llmc/utils.h"

namespace llmc {

// On a non-blocking communicator any NCCL call may answer ncclInProgress (the work goes on in the
// background); that is not a failure, so it is returned for the caller to poll on.
inline ncclResult_t nccl_check(ncclResult_t code, const char* call, const char* file, int line) {
    if (code == ncclSuccess || code == ncclInProgress) return code;
    fail(strformat("%s failed at %s:%d: %s (%s)", call, file, line, ncclGetErrorString(code), ncclGetLastError(nullptr)));
}
#define NCCL_CHECK(call) ::llmc::nccl_check((call), #call, __FILE__, __LINE__)

class NcclComm : public Communicator {
public:
    // Collective over the ranks of `host` (LocalComm or MpiComm), which carries NCCL's unique id from
    // rank 0 to the others; `device` is this rank's GPU (the launch's local_rank). timeout_s bounds
    // the initialisation and becomes the collectives' timeout.
    NcclComm(Communicator& host, int device, double timeout_s = 600) : state_(std::make_shared<State>()) {
        this->timeout_s = timeout_s;
        state_->rank = host.rank();
        state_->world_size = host.world_size();
        state_->register_in_flight_recorder();
        state_->device = device;
        int devices = 0;
        CUDA_CHECK(cudaGetDeviceCount(&devices));
        if (device < 0 || device >= devices)
            fail(strformat("rank %d was given GPU %d but this node has %d; NCCL needs one GPU per rank on the node",
                           state_->rank, device, devices));
        CUDA_CHECK(cudaSetDevice(device));

        ncclUniqueId id{};
        if (state_->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        host.broadcast(&id, sizeof id, 0).wait();

        auto deadline = deadline_after(timeout_s);
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        try {
            NCCL_CHECK(ncclCommInitRankConfig(&state_->comm, state_->world_size, id, state_->rank, &config));
            state_->settle(deadline);
        } catch (const Error& e) {
            state_->abort();
            fail(strformat("creating the NCCL communicator on rank %d of %d (GPU %d) failed: %s", state_->rank,
                           state_->world_size, device, e.what()));
        }
        if (!state_->comm)
            fail(strformat("creating the NCCL communicator timed out after %.1f s on rank %d of %d (GPU %d): a rank did "
                           "not join or the ranks could not connect (NCCL_DEBUG=INFO tells which)",
                           timeout_s, state_->rank, state_->world_size, device));
        state_->create_stream();
    }
    // Messages still pending go onto the stream: they were issued, so the peers expect them.
    ~NcclComm() override { state_->flush(); }
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    int rank() const override { return state_->rank; }
    int world_size() const override { return state_->world_size; }
    const char* backend() const override { return "nccl"; }

    // Collectives issued after this call start once `compute_done` (recorded on the compute
    // stream after the buffers were written) has completed.
    void wait_for(cudaEvent_t compute_done) {
        state_->flush();
        CUDA_CHECK(cudaStreamWaitEvent(state_->stream, compute_done, 0));
    }
    bool uses_device_buffers() const override { return true; }
    void order_after(void* cuda_event) override { wait_for(static_cast<cudaEvent_t>(cuda_event)); }
    cudaStream_t stream() const {
        state_->flush();
        return state_->stream;
    }

    CommHandle all_reduce_sum(void* buf, size_t count, CommDtype dtype) override {
        check_summable("all_reduce", dtype);
        return enqueue(strformat("all_reduce of %zu %s", count, comm_dtype_name(dtype)), [&](ncclComm_t comm, cudaStream_t s) {
            return NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, comm, s));
        });
    }
    // NCCL's in-place forms are exactly ours (the rank's block of the world-sized buffer), so
    // is_in_place only rejects overlaps that are not.
    CommHandle reduce_scatter_sum(const void* send, void* recv, size_t recv_count, CommDtype dtype) override {
        check_summable("reduce_scatter", dtype);
        is_in_place("reduce_scatter", send, recv, recv_count * comm_dtype_bytes(dtype));
        return enqueue(strformat("reduce_scatter of %zu %s per rank", recv_count, comm_dtype_name(dtype)),
                       [&](ncclComm_t comm, cudaStream_t s) {
                           return NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), ncclSum, comm, s));
                       });
    }
    CommHandle all_gather(const void* send, void* recv, size_t send_count, CommDtype dtype) override {
        is_in_place("all_gather", recv, send, send_count * comm_dtype_bytes(dtype));
        return enqueue(strformat("all_gather of %zu %s per rank", send_count, comm_dtype_name(dtype)),
                       [&](ncclComm_t comm, cudaStream_t s) {
                           return NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(dtype), comm, s));
                       });
    }
    CommHandle broadcast(void* buf, size_t bytes, int root) override {
        check_root(root, bytes);
        return enqueue(strformat("broadcast of %zu bytes from root %d", bytes, root), [&](ncclComm_t comm, cudaStream_t s) {
            return NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm, s));
        });
    }
    // NCCL has no barrier; an all-reduce of one word cannot complete before every rank has joined.
    CommHandle barrier() override {
        return enqueue("barrier", [&](ncclComm_t comm, cudaStream_t s) {
            return NCCL_CHECK(ncclAllReduce(state_->barrier_word, state_->barrier_word, 1, ncclFloat32, ncclSum, comm, s));
        });
    }
    CommHandle send(const void* buf, size_t bytes, int peer) override {
        check_peer(true, bytes, peer);
        return defer(p2p_name(true, bytes, peer), [=](ncclComm_t comm, cudaStream_t s) {
            return NCCL_CHECK(ncclSend(buf, bytes, ncclUint8, peer, comm, s));
        });
    }
    CommHandle recv(void* buf, size_t bytes, int peer) override {
        check_peer(false, bytes, peer);
        return defer(p2p_name(false, bytes, peer), [=](ncclComm_t comm, cudaStream_t s) {
            return NCCL_CHECK(ncclRecv(buf, bytes, ncclUint8, peer, comm, s));
        });
    }

protected:
    // On the communicator's stream, with the messages issued beside it.
    CommHandle copy_block(void* dst, const void* src, size_t bytes) override {
        return defer(strformat("all_to_all_v's own block of %zu bytes", bytes), [=](ncclComm_t, cudaStream_t s) {
            CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
            return ncclSuccess;
        });
    }

public:

    // The group starts with this communicator's timeout_s, which also bounds the split.
    std::unique_ptr<Communicator> split(int color, int key) override {
        check_color(color);
        state_->flush();
        auto where = [&] { return strformat("split with color %d, key %d on rank %d of %d", color, key, rank(), world_size()); };
        if (!state_->broken.empty())
            fail(strformat("%s failed because an earlier collective failed: %s", where().c_str(), state_->broken.c_str()));
        CUDA_CHECK(cudaSetDevice(state_->device));
        auto child = std::make_shared<State>();
        child->device = state_->device;
        auto deadline = deadline_after(timeout_s);
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        try {
            NCCL_CHECK(ncclCommSplit(state_->comm, color, key, &child->comm, &config));
            state_->settle(deadline);
            if (state_->comm) child->settle(deadline);
        } catch (const Error& e) {
            child->abort();
            state_->break_with(strformat("%s failed: %s", where().c_str(), e.what()));
            fail(state_->broken);
        }
        if (!state_->comm || !child->comm) {
            child->abort();
            state_->break_with(strformat("%s timed out after %.1f s (a rank did not join); the communicator was aborted",
                                         where().c_str(), timeout_s));
            fail(state_->broken);
        }
        NCCL_CHECK(ncclCommUserRank(child->comm, &child->rank));
        NCCL_CHECK(ncclCommCount(child->comm, &child->world_size));
        child->create_stream();
        return std::unique_ptr<Communicator>(new NcclComm(std::move(child), timeout_s));
    }

private:
    using Clock = std::chrono::steady_clock;
    using Call = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;
    struct State;
    struct Op;

    // A communicator made by split, on its own initialised state.
    NcclComm(std::shared_ptr<State> state, double timeout_s) : state_(std::move(state)) {
        this->timeout_s = timeout_s;
        state_->register_in_flight_recorder();
    }

    static ncclDataType_t nccl_type(CommDtype dtype) {
        return dtype == CommDtype::F32 ? ncclFloat32 : dtype == CommDtype::BF16 ? ncclBfloat16 : ncclUint8;
    }

    // The communicator's resources, shared with the handles so that either may outlive the other.
    struct State {
        int rank = 0, world_size = 1, device = 0;
        ncclComm_t comm = nullptr;  // null once aborted
        cudaStream_t stream = nullptr;
        float* barrier_word = nullptr;
        std::string broken;  // the first failure; once set, every collective not yet seen complete fails
        int broken_code = 0;  // its exit code (EXIT_COMM_TIMEOUT, EXIT_PEER_DEAD; 0: the caller decides)
        int comm_id = -1;     // in the flight recorder (its members are not known here: no world ranks)
        void register_in_flight_recorder() {
            comm_id = flight_recorder().register_comm(strformat("NCCL communicator of %d ranks", world_size), {});
        }
        // Messages issued but not yet on the stream, with their ops (which hold this state: the
        // cycle lasts until flush).
        std::vector<Call> pending_calls;
        std::vector<std::shared_ptr<Op>> pending_ops;

        // Its own high-priority stream lets communication run beside compute and go first when both wait.
        void create_stream() {
            int least_priority = 0, greatest_priority = 0;
            CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority));
            CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest_priority));
            CUDA_CHECK(cudaMalloc(&barrier_word, sizeof(float)));
        }

        // Puts calls on the stream (as one NCCL group when there are several), each op's completion
        // event after them. A failure breaks the communicator and finishes the ops with it, so it
        // surfaces from their handles' wait(), like any other. Ops issued after a failure are left
        // unlaunched: their poll reports the earlier failure.
        void launch(const std::vector<Call>& calls, const std::vector<std::shared_ptr<Op>>& ops) {
            if (!broken.empty()) return;
            std::string what = ops.front()->what;
            for (size_t i = 1; i < ops.size(); i++) what += " + " + ops[i]->what;
            const bool grouped = calls.size() > 1;
            try {
                if (grouped) NCCL_CHECK(ncclGroupStart());
                ncclResult_t result = ncclSuccess;
                for (const Call& call : calls) result = call(comm, stream);
                if (grouped) result = NCCL_CHECK(ncclGroupEnd());
                // Until NCCL has finished enqueueing, nothing else may go onto its stream.
                if (result == ncclInProgress) settle(ops.front()->deadline);
                if (comm) {
                    for (const auto& op : ops) CUDA_CHECK(cudaEventRecord(op->event, stream));
                    for (const auto& op : ops) op->launched = true;
                    return;
                }
                break_with(strformat("enqueueing %s timed out after %.1f s on rank %d of %d", what.c_str(),
                                     ops.front()->timeout_s, rank, world_size));
            } catch (const Error& e) {
                break_with(strformat("%s failed on rank %d of %d: %s", what.c_str(), rank, world_size, e.what()));
            }
            for (const auto& op : ops) op->finish(broken);
        }
        // The pending messages go onto the stream, as one group.
        void flush() {
            if (pending_ops.empty()) return;
            std::vector<Call> calls = std::move(pending_calls);
            std::vector<std::shared_ptr<Op>> ops = std::move(pending_ops);
            pending_calls.clear();
            pending_ops.clear();
            launch(calls, ops);
        }

        // Polls until NCCL's background work on the communicator (initialisation, or enqueueing a
        // collective) is finished; throws on an NCCL error; aborts on the deadline, leaving comm null.
        void settle(Clock::time_point deadline) {
            PollBackoff backoff;
            for (;;) {
                ncclResult_t state = ncclInProgress;
                NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
                if (state == ncclSuccess) return;
                if (state != ncclInProgress)
                    fail(strformat("NCCL reports %s (%s)", ncclGetErrorString(state), ncclGetLastError(comm)));
                if (Clock::now() >= deadline) {
                    abort();
                    return;
                }
                backoff.pause();
            }
        }
        // Tears the communicator down without its peers; NCCL's kernels still running on it exit.
        void abort() {
            if (comm) ncclCommAbort(comm);
            comm = nullptr;
        }
        void break_with(std::string cause, int code = 0) {
            if (broken.empty()) {
                broken = std::move(cause);
                broken_code = code;
            }
            abort();
        }
        // Finalizing flushes outstanding work with the peers. It is polled, and a communicator that
        // does not finish within finalize_timeout_s (a peer is gone) is aborted: exit must not hang.
        // Errors cannot be thrown from a destructor.
        static constexpr double finalize_timeout_s = 60;
        ~State() {
            if (comm) {
                ncclResult_t state = ncclCommFinalize(comm);
                auto deadline = deadline_after(finalize_timeout_s);
                while (state == ncclInProgress && Clock::now() < deadline) {
                    std::this_thread::sleep_for(std::chrono::microseconds(100));
                    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
                }
                if (state == ncclSuccess) ncclCommDestroy(comm);
                else ncclCommAbort(comm);
            }
            if (barrier_word) cudaFree(barrier_word);
            if (stream) cudaStreamDestroy(stream);
        }
    };

    struct Op : CommOp {
        std::shared_ptr<State> state;
        std::string what;  // "all_reduce of 1024 bf16", for messages
        double timeout_s = 0;
        Clock::time_point deadline;
        cudaEvent_t event = nullptr;
        bool launched = false;  // on the stream (a message waits in the pending list until flushed)
        bool finished = false;
        std::string error;  // empty on success
        uint64_t token = 0;  // the flight recorder's (its end is when a poll first sees the op done)

        ~Op() override {
            if (event) cudaEventDestroy(event);
        }
        bool done() override { return poll(); }
        void wait() override {
            PollBackoff backoff;
            while (!poll()) backoff.pause();
            if (!error.empty()) fail_with(state->broken_code, error);
        }
        // One non-blocking look: complete, failed (an NCCL error, the deadline, or an earlier
        // failure), or still running.
        bool poll() {
            if (finished) return true;
            if (!launched) state->flush();  // a pending message: a failed launch finishes it
            if (finished) return true;
            auto where = [&] { return strformat("%s on rank %d of %d", what.c_str(), state->rank, state->world_size); };
            if (!state->broken.empty()) return finish(strformat("%s failed because an earlier collective failed: %s",
                                                                where().c_str(), state->broken.c_str()));
            cudaError_t query = cudaEventQuery(event);
            if (query == cudaSuccess) return finish("");
            if (query != cudaErrorNotReady) {
                state->break_with(strformat("%s failed: cudaEventQuery: %s", where().c_str(), cudaGetErrorString(query)));
                return finish(state->broken);
            }
            ncclResult_t async = ncclSuccess;
            ncclResult_t asked = ncclCommGetAsyncError(state->comm, &async);
            if (asked != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
                ncclResult_t code = asked != ncclSuccess ? asked : async;
                state->break_with(strformat("%s failed: NCCL reports %s (%s); the communicator was aborted", where().c_str(),
                                            ncclGetErrorString(code), ncclGetLastError(state->comm)));
                return finish(state->broken);
            }
            if (flight_recorder().peer_dead()) {
                state->break_with(strformat("%s failed: %s; the communicator was aborted", where().c_str(),
                                            flight_recorder().peer_dead_message().c_str()), EXIT_PEER_DEAD);
                return finish(state->broken);
            }
            if (Clock::now() >= deadline) {
                state->break_with(strformat("%s timed out after %.1f s (a rank did not join); the communicator was "
                                            "aborted\n%s  this rank's last operations:\n%s",
                                            where().c_str(), timeout_s, flight_recorder().peer_report(-1, 0).c_str(),
                                            flight_recorder().format(8).c_str()),
                                  EXIT_COMM_TIMEOUT);
                return finish(state->broken);
            }
            return false;
        }
        bool finish(std::string failure) {
            flight_recorder().end(token, !failure.empty());
            finished = true;
            error = std::move(failure);
            return true;
        }
    };

    // A new op named `what` under the current timeout, with its completion event.
    std::shared_ptr<Op> make_op(std::string what) {
        if (!(timeout_s > 0)) fail(strformat("%s: timeout_s must be positive, got %g", what.c_str(), timeout_s));
        auto op = std::make_shared<Op>();
        op->state = state_;
        op->what = std::move(what);
        op->timeout_s = timeout_s;
        op->deadline = deadline_after(timeout_s);
        op->token = flight_recorder().begin(state_->comm_id, op->what.c_str(), 0);
        CUDA_CHECK(cudaEventCreateWithFlags(&op->event, cudaEventDisableTiming));
        return op;
    }
    // A collective goes onto the stream at once, after any pending messages (issue order).
    CommHandle enqueue(std::string what, const Call& call) {
        NvtxRange range(what);
        auto op = make_op(std::move(what));
        state_->flush();
        state_->launch({call}, {op});
        return CommHandle(op);
    }
    // A message waits for the next flush, to go in one group with the messages issued beside it.
    CommHandle defer(std::string what, Call call) {
        auto op = make_op(std::move(what));
        state_->pending_calls.push_back(std::move(call));
        state_->pending_ops.push_back(op);
        return CommHandle(op);
    }

    std::shared_ptr<State> state_;
};

}  // namespace llmc
