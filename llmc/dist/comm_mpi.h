// comm_mpi.h: MpiComm, the Communicator over MPI_COMM_WORLD (or a group split from it) on host buffers.
//
// The idea: one communication thread per communicator makes its MPI calls after construction. It
// takes operations (collectives, sends and receives) from a FIFO queue, starts each with MPI's
// non-blocking call as soon as it arrives, and polls MPI_Test on all of them until each completes or
// its deadline passes; results are handed back in issue order. Open MPI makes progress on
// non-blocking operations only inside MPI calls, so without this thread nothing would move while
// the trainer computes; because the thread polls rather than blocks, a rank that never joins costs
// a clear timeout error instead of a hang; and because nothing waits for one operation before
// starting the next, ranks that each send to the other before receiving do not deadlock.
//
// split() makes a sub-group communicator (MPI_Comm_split) with its own comm thread: groups never
// wait on one another, so a stuck group cannot stall the others.
//
// Every operation is recorded in the process's flight recorder (flight_recorder.h) when issued and
// when it completes. A timeout fails with EXIT_COMM_TIMEOUT and a report: what this rank waited on,
// which ranks never issued it and what every rank completed last (from heartbeat.h's statuses, when
// a heartbeat runs), and this rank's last operations. A peer the heartbeat declared dead fails every
// operation in flight at once with EXIT_PEER_DEAD.
//
// MPI is initialised MPI_THREAD_SERIALIZED (bootstrap.h): the comm threads and the main thread
// (construction, split, abort, finalize) may all call MPI, so every call holds mpi_mutex().
#pragma once

// Only MPI's C API is used; its deprecated C++ bindings would add warnings and a link dependency.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "llmc/numerics/bf16.h"
#include "llmc/dist/comm.h"
#include "llmc/dist/flight_recorder.h"
#include "llmc/failures/exit_codes.h"
#include "llmc/utils.h"

namespace llmc {

inline void mpi_check(int code, const char* call, const char* file, int line) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = snprintf(text, sizeof text, "error %d", code);
    fail(strformat("%s failed at %s:%d: %.*s", call, file, line, length, text));
}
// Not MPI_CHECK: the MPI_ prefix belongs to the MPI standard.
#define LLMC_MPI_CHECK(call) ::llmc::mpi_check((call), #call, __FILE__, __LINE__)

// Serialises this process's MPI calls, which is what MPI_THREAD_SERIALIZED asks of the program.
inline std::mutex& mpi_mutex() {
    static std::mutex mutex;
    return mutex;
}

// MPI has no bf16 type, so BF16 travels as MPI_UINT16_T and reduces with this user-defined sum.
inline void mpi_bf16_sum(void* in, void* inout, int* count, MPI_Datatype*) {
    auto* a = (const uint16_t*)in;
    auto* b = (uint16_t*)inout;
    for (int i = 0; i < *count; i++) b[i] = float_to_bf16_bits(bf16_bits_to_float(a[i]) + bf16_bits_to_float(b[i]));
}

class MpiComm : public Communicator {
public:
    // Collective: every rank of MPI_COMM_WORLD constructs one, in the same order, after MPI_Init_thread.
    // A private duplicate keeps our collectives apart from any other MPI traffic.
    MpiComm() : MpiComm(duplicate_world()) {}
    // Finishes (or fails, each within its deadline) every operation already issued, then stops.
    ~MpiComm() override {
        {
            std::lock_guard<std::mutex> lock(queue_mutex_);
            stopping_ = true;
        }
        queue_cv_.notify_one();
        thread_.join();
        // After a failure a request may still reference the communicator and the op, so they are
        // left for process exit (the trainer aborts the launch then). Errors cannot be thrown here.
        if (!broken_.empty()) return;
        std::lock_guard<std::mutex> lock(mpi_mutex());
        MPI_Op_free(&bf16_sum_);
        MPI_Comm_free(&comm_);
    }
    MpiComm(const MpiComm&) = delete;
    MpiComm& operator=(const MpiComm&) = delete;

    int rank() const override { return rank_; }
    int world_size() const override { return world_size_; }
    const char* backend() const override { return "mpi"; }

    CommHandle all_reduce_sum(void* buf, size_t count, CommDtype dtype) override {
        check_summable("all_reduce", dtype);
        int n = mpi_count("all_reduce", count, comm_dtype_name(dtype));
        return issue(strformat("all_reduce of %zu %s", count, comm_dtype_name(dtype)), count * comm_dtype_bytes(dtype),
                     [=, this](MPI_Request* request) {
            LLMC_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(dtype), sum_op(dtype), comm_, request));
        });
    }
    CommHandle reduce_scatter_sum(const void* send, void* recv, size_t recv_count, CommDtype dtype) override {
        check_summable("reduce_scatter", dtype);
        int n = mpi_count("reduce_scatter", recv_count, comm_dtype_name(dtype));
        size_t block_bytes = recv_count * comm_dtype_bytes(dtype);
        const void* mpi_send = send;
        void* mpi_recv = recv;
        After after;
        // MPI's in-place reduce-scatter takes the whole buffer and leaves the sum in block 0, so the
        // result is moved to block [rank] afterwards.
        if (is_in_place("reduce_scatter", send, recv, block_bytes)) {
            mpi_send = MPI_IN_PLACE;
            mpi_recv = (void*)send;
            after = [=](const MPI_Status&) { memmove(recv, send, block_bytes); };
        }
        return issue(strformat("reduce_scatter of %zu %s per rank", recv_count, comm_dtype_name(dtype)),
                     block_bytes * world_size_, [=, this](MPI_Request* request) {
                         LLMC_MPI_CHECK(MPI_Ireduce_scatter_block(mpi_send, mpi_recv, n, mpi_type(dtype), sum_op(dtype),
                                                                  comm_, request));
                     },
                     std::move(after));
    }
    CommHandle all_gather(const void* send, void* recv, size_t send_count, CommDtype dtype) override {
        int n = mpi_count("all_gather", send_count, comm_dtype_name(dtype));
        if (is_in_place("all_gather", recv, send, send_count * comm_dtype_bytes(dtype))) send = MPI_IN_PLACE;
        return issue(strformat("all_gather of %zu %s per rank", send_count, comm_dtype_name(dtype)),
                     send_count * comm_dtype_bytes(dtype) * world_size_, [=, this](MPI_Request* request) {
                         LLMC_MPI_CHECK(MPI_Iallgather(send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, request));
                     });
    }
    CommHandle broadcast(void* buf, size_t bytes, int root) override {
        check_root(root, bytes);
        int n = mpi_count("broadcast", bytes, "bytes");
        return issue(strformat("broadcast of %zu bytes from root %d", bytes, root), bytes, [=, this](MPI_Request* request) {
            LLMC_MPI_CHECK(MPI_Ibcast(buf, n, MPI_BYTE, root, comm_, request));
        });
    }
    CommHandle barrier() override {
        return issue("barrier", 0, [this](MPI_Request* request) { LLMC_MPI_CHECK(MPI_Ibarrier(comm_, request)); });
    }

    // One tag for every message: MPI keeps the messages between two ranks in order.
    static constexpr int kTag = 0;
    CommHandle send(const void* buf, size_t bytes, int peer) override {
        check_peer(true, bytes, peer);
        int n = mpi_count("send", bytes, "bytes");
        return issue(p2p_name(true, bytes, peer), bytes, [=, this](MPI_Request* request) {
            LLMC_MPI_CHECK(MPI_Isend(buf, n, MPI_BYTE, peer, kTag, comm_, request));
        });
    }
    // A longer message is MPI's truncation error; a shorter one is caught by the count check.
    CommHandle recv(void* buf, size_t bytes, int peer) override {
        check_peer(false, bytes, peer);
        int n = mpi_count("recv", bytes, "bytes");
        return issue(p2p_name(false, bytes, peer), bytes,
                     [=, this](MPI_Request* request) {
                         LLMC_MPI_CHECK(MPI_Irecv(buf, n, MPI_BYTE, peer, kTag, comm_, request));
                     },
                     [n](const MPI_Status& status) {
                         int got = 0;
                         LLMC_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &got));
                         if (got != n)
                             fail(strformat("the matching send was %d bytes (a send and its recv must be the same size)", got));
                     });
    }

    // The child has its own comm thread and starts with this communicator's timeout_s.
    // MPI_Comm_split blocks, cannot time out, and must come in the same order on every rank as the
    // operations in flight here. A barrier first does both: once it is done every earlier operation
    // is done on this rank, and every rank has reached its split.
    std::unique_ptr<Communicator> split(int color, int key) override {
        check_color(color);
        try {
            barrier().wait();
        } catch (const Error& e) {
            fail(strformat("split with color %d, key %d: %s", color, key, e.what()));
        }
        MPI_Comm child = MPI_COMM_NULL;
        {
            std::lock_guard<std::mutex> lock(mpi_mutex());
            LLMC_MPI_CHECK(MPI_Comm_split(comm_, color, key, &child));
        }
        std::unique_ptr<MpiComm> group(new MpiComm(child));
        group->timeout_s = timeout_s;
        return group;
    }

private:
    using Clock = std::chrono::steady_clock;
    using After = std::function<void(const MPI_Status&)>;

    // Takes ownership of `comm`, a communicator for llmc alone, and starts its comm thread. Returning
    // errors lets MPI's failures become llmc::Errors that name the operation.
    explicit MpiComm(MPI_Comm comm) : comm_(comm) {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        LLMC_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
        LLMC_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        LLMC_MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
        LLMC_MPI_CHECK(MPI_Op_create(&mpi_bf16_sum, /*commute=*/1, &bf16_sum_));
        register_in_flight_recorder();
        thread_ = std::thread([this] { serve(); });
    }
    // Under mpi_mutex: the flight recorder learns this communicator's world ranks, for reports.
    void register_in_flight_recorder() {
        MPI_Group group, world_group;
        LLMC_MPI_CHECK(MPI_Comm_group(comm_, &group));
        LLMC_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
        std::vector<int> ranks(world_size_), world_ranks(world_size_);
        for (int r = 0; r < world_size_; r++) ranks[r] = r;
        LLMC_MPI_CHECK(MPI_Group_translate_ranks(group, world_size_, ranks.data(), world_group, world_ranks.data()));
        MPI_Group_free(&group);
        MPI_Group_free(&world_group);
        int world = 0;
        LLMC_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
        std::string name = world_size_ == world ? "the world" : "group {";
        if (world_size_ != world) {
            for (int r = 0; r < world_size_; r++) name += strformat("%s%d", r ? "," : "", world_ranks[r]);
            name += "}";
        }
        comm_id_ = flight_recorder().register_comm(strformat("communicator %d (%s)", next_comm_number()++, name.c_str()),
                                                   world_ranks);
    }
    static int& next_comm_number() {
        static int number = 0;
        return number;
    }
    static MPI_Comm duplicate_world() {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        MPI_Comm comm = MPI_COMM_NULL;
        LLMC_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
        return comm;
    }

    struct Op : CommOp {
        std::string what;                           // "all_reduce of 1024 f32", for messages
        uint64_t token = 0, seq = 0;                // the flight recorder's
        int step = 0;                               // the training step when issued
        std::function<void(MPI_Request*)> start;    // the non-blocking MPI call
        After after;                                // host work once MPI is done, or empty
        double timeout_s = 0;
        Clock::time_point deadline;

        // The comm thread's alone: the request in flight, and whether it completed or failed.
        MPI_Request request = MPI_REQUEST_NULL;
        bool complete = false;
        std::string failure;
        int failure_code = 0;  // the exit code the failure calls for (0: the caller decides)

        std::mutex mutex;
        std::condition_variable cv;
        bool finished = false;
        std::string error;  // empty on success
        int error_code = 0;

        bool done() override {
            std::lock_guard<std::mutex> lock(mutex);
            return finished;
        }
        void wait() override {
            std::unique_lock<std::mutex> lock(mutex);
            cv.wait(lock, [&] { return finished; });
            if (!error.empty()) fail_with(error_code, error);
        }
        void finish() {
            flight_recorder().end(token, !failure.empty());
            {
                std::lock_guard<std::mutex> lock(mutex);
                finished = true;
                error = failure;
                error_code = failure_code;
            }
            cv.notify_all();
        }
    };
    using InFlight = std::deque<std::shared_ptr<Op>>;  // started, in issue order, not yet handed back

    // MPI-3 counts are ints; larger operations fail here rather than being truncated.
    static int mpi_count(const char* operation, size_t count, const char* unit) {
        if (count > (size_t)INT_MAX)
            fail(strformat("%s of %zu %s exceeds MPI's per-call limit of %d; split it", operation, count, unit, INT_MAX));
        return (int)count;
    }
    static MPI_Datatype mpi_type(CommDtype dtype) {
        return dtype == CommDtype::F32 ? MPI_FLOAT : dtype == CommDtype::BF16 ? MPI_UINT16_T : MPI_UINT8_T;
    }
    MPI_Op sum_op(CommDtype dtype) const { return dtype == CommDtype::F32 ? MPI_SUM : bf16_sum_; }

    CommHandle issue(std::string what, size_t bytes, std::function<void(MPI_Request*)> start, After after = {}) {
        if (!(timeout_s > 0)) fail(strformat("%s: timeout_s must be positive, got %g", what.c_str(), timeout_s));
        auto op = std::make_shared<Op>();
        op->token = flight_recorder().begin(comm_id_, what.c_str(), bytes, &op->seq);
        op->step = flight_recorder().step();
        op->what = std::move(what);
        op->start = std::move(start);
        op->after = std::move(after);
        op->timeout_s = timeout_s;
        op->deadline = deadline_after(timeout_s);  // utils.h: inf or 1e10 s is clamped, not overflowed
        {
            std::lock_guard<std::mutex> lock(queue_mutex_);
            queue_.push_back(op);
        }
        queue_cv_.notify_one();
        return CommHandle(op);
    }

    // The comm thread, until the communicator is destroyed: starts each operation as soon as it is
    // issued (in issue order, so every rank starts the collectives in the same order), polls all of
    // them together, and hands them back in issue order. Nothing waits for one operation before
    // starting the next, so two ranks that each send before they receive do not deadlock.
    void serve() {
        InFlight in_flight;
        PollBackoff backoff;
        for (;;) {
            InFlight issued;
            {
                std::unique_lock<std::mutex> lock(queue_mutex_);
                if (in_flight.empty()) queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                if (in_flight.empty() && queue_.empty()) return;
                issued.swap(queue_);
            }
            for (auto& op : issued) start(in_flight, op);
            bool progressed = poll(in_flight) || !issued.empty();
            while (!in_flight.empty() && in_flight.front()->complete) {
                in_flight.front()->finish();
                in_flight.pop_front();
            }
            if (progressed) backoff.reset();
            else backoff.pause();
        }
    }

    // Runs one MPI call under the process's MPI lock; its failure is reported against the operation.
    void mpi_call(const Op& op, const std::function<void()>& call) {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        try {
            call();
        } catch (const Error& e) {
            fail(strformat("%s failed on rank %d of %d: %s", op.what.c_str(), rank_, world_size_, e.what()));
        }
    }

    void start(InFlight& in_flight, std::shared_ptr<Op> op) {
        in_flight.push_back(std::move(op));
        Op& started = *in_flight.back();
        if (!broken_.empty()) return fail_after_break(started);
        if (flight_recorder().peer_dead()) return break_at(in_flight, in_flight.size() - 1, peer_dead_failure(started), EXIT_PEER_DEAD);
        try {
            mpi_call(started, [&] { started.start(&started.request); });
        } catch (const Error& e) {
            break_at(in_flight, in_flight.size() - 1, e.what(), e.exit_code);
        }
    }

    // One MPI_Test of every operation still running; true when any of them completed or failed.
    bool poll(InFlight& in_flight) {
        bool progressed = false;
        if (flight_recorder().peer_dead())  // the heartbeat saw a rank die: waiting longer is pointless
            for (size_t i = 0; i < in_flight.size(); i++)
                if (!in_flight[i]->complete) {
                    break_at(in_flight, i, peer_dead_failure(*in_flight[i]), EXIT_PEER_DEAD);
                    return true;
                }
        for (size_t i = 0; i < in_flight.size(); i++) {
            Op& op = *in_flight[i];
            if (op.complete) continue;
            try {
                int complete = 0;
                MPI_Status status;
                mpi_call(op, [&] {
                    LLMC_MPI_CHECK(MPI_Test(&op.request, &complete, &status));
                    if (complete && op.after) op.after(status);
                });
                op.complete = complete;
                // MPI cannot cancel a collective, so the request stays pending; the communicator is
                // broken from here on and the launch is expected to be aborted.
                if (!complete && Clock::now() >= op.deadline) fail_with(EXIT_COMM_TIMEOUT, timeout_report(op));
            } catch (const Error& e) {
                break_at(in_flight, i, e.what(), e.exit_code);
            }
            progressed |= op.complete;
        }
        return progressed;
    }

    // Operation i failed: the communicator is broken, and it and every operation issued after it fail.
    void break_at(InFlight& in_flight, size_t i, const std::string& cause, int code) {
        if (broken_.empty()) {
            broken_ = cause;
            broken_code_ = code;
        }
        in_flight[i]->complete = true;
        in_flight[i]->failure = cause;
        in_flight[i]->failure_code = code;
        for (size_t j = i + 1; j < in_flight.size(); j++) fail_after_break(*in_flight[j]);
    }
    void fail_after_break(Op& op) {
        op.complete = true;
        op.failure = strformat("%s failed on rank %d of %d because an earlier collective failed: %s", op.what.c_str(),
                               rank_, world_size_, broken_.c_str());
        op.failure_code = broken_code_;
    }

    std::string peer_dead_failure(const Op& op) const {
        return strformat("%s (#%llu on %s) failed on rank %d of %d: %s", op.what.c_str(), (unsigned long long)op.seq,
                         flight_recorder().comm_name(comm_id_).c_str(), rank_, world_size_,
                         flight_recorder().peer_dead_message().c_str());
    }
    // The timeout's error: what this rank waited on, who never issued it and what every rank did
    // last (when a heartbeat runs), and this rank's last operations.
    std::string timeout_report(const Op& op) const {
        FlightRecorder& fr = flight_recorder();
        std::string out = strformat("%s timed out after %.1f s on rank %d of %d (a rank did not join)\n"
                                    "  this rank, at step %d, was waiting for #%llu on %s: %s, issued at step %d\n",
                                    op.what.c_str(), op.timeout_s, rank_, world_size_, fr.step(),
                                    (unsigned long long)op.seq, fr.comm_name(comm_id_).c_str(), op.what.c_str(), op.step);
        std::string peers = fr.peer_report(comm_id_, op.seq);
        out += peers.empty() ? "  (no heartbeat runs, so the other ranks' states are unknown)\n" : peers;
        out += "  this rank's last operations:\n" + fr.format(8);
        if (!out.empty() && out.back() == '\n') out.pop_back();
        return out;
    }


    MPI_Comm comm_ = MPI_COMM_NULL;
    MPI_Op bf16_sum_ = MPI_OP_NULL;
    int rank_ = 0, world_size_ = 1;

    std::mutex queue_mutex_;
    std::condition_variable queue_cv_;
    InFlight queue_;  // issued, not yet started
    bool stopping_ = false;
    int comm_id_ = -1;  // in the flight recorder
    int broken_code_ = 0;
    std::string broken_;  // the first failure's message; touched only by the comm thread, then by ~MpiComm after join
    std::thread thread_;
};

}  // namespace llmc
