// flight_recorder.h: what this rank's communicators were doing, kept for the moment something goes
// wrong (a collective times out, a peer dies, the launcher kills the job).
//
// The idea: every operation a communicator issues (collective or message) is one entry in a
// process-wide ring of the last kRingSize: the communicator, its sequence number there (1, 2, ... in
// issue order, the same numbers on every rank of that communicator, since every rank issues the same
// operations in the same order), what it is, its bytes, the training step (the train loop publishes
// it with set_step), and when it was issued and finished. Backends call begin() when an operation is
// issued and end() when it completes or fails; one mutex-protected slot write each, far below the
// cost of any collective.
//
// Per communicator the recorder also counts operations issued and completed. A small fixed-size
// RankStatus (the current step, those counts, the oldest operation still in flight, the last one
// completed) is what heartbeat.h sends to the other ranks every interval, so a rank that times out
// can say which ranks never issued the collective it waits on (their issued count is below its
// sequence number) and what each rank completed last.
//
// A launcher that ends a job (mpirun kills every rank when one dies, with SIGTERM and a second later
// SIGKILL) leaves no time for an orderly report, so install_termination_report() prints a text
// prepared in advance (refresh_termination_text(), called by the heartbeat thread every interval)
// from a SIGTERM handler with write(2), the one thing a signal handler can safely do.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "llmc/utils.h"

namespace llmc {

// Seconds since the Unix epoch: comparable across the ranks' logs (steady clocks are not).
inline double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// "07:12:03.481" (UTC): how the reports print a wall_seconds() time.
inline std::string clock_text(double t) {
    if (t <= 0) return "-";
    time_t whole = (time_t)t;
    struct tm tm_utc;
    gmtime_r(&whole, &tm_utc);
    return strformat("%02d:%02d:%02d.%03d", tm_utc.tm_hour, tm_utc.tm_min, tm_utc.tm_sec,
                     (int)((t - (double)whole) * 1000));
}

struct FlightEntry {
    uint64_t id = 0;   // process-wide, 1-based; 0: an empty slot
    uint64_t seq = 0;  // on its communicator, 1-based
    int comm = -1;     // communicator id (FlightRecorder::register_comm)
    int step = 0;      // the training step when it was issued (0: before training)
    uint64_t bytes = 0;
    double start = 0, end = 0;  // wall_seconds(); end == 0 while in flight
    bool failed = false;
    char op[64] = {};  // "all_reduce of 1024 f32"
};

// An operation as the status record carries it (fixed size, sent as raw bytes).
struct OpRef {
    int32_t comm = -1;  // -1: none
    int32_t step = 0;
    uint64_t seq = 0;
    double time = 0;  // issued (an operation in flight) or finished (a completed one)
    char op[48] = {};
};

// What one rank tells the others every heartbeat.
struct RankStatus {
    static constexpr int kMaxComms = 16;  // communicators beyond these are recorded but not counted
    enum State : int32_t { UNKNOWN = 0, RUNNING = 1, LEAVING = 2, FAILED = 3 };
    int32_t rank = -1;
    int32_t state = UNKNOWN;
    int32_t step = 0;
    int32_t comms = 0;
    double sent = 0;  // wall_seconds() when sent
    uint64_t issued[kMaxComms] = {};
    uint64_t completed[kMaxComms] = {};
    OpRef waiting;  // the oldest operation in flight
    OpRef last_done;
};

class FlightRecorder {
public:
    static constexpr size_t kRingSize = 256;

    // A communicator's id (0, 1, ... in creation order: the same on every rank, since communicators
    // are made collectively) and the world ranks in it, for reports.
    int register_comm(const std::string& name, const std::vector<int>& world_ranks) {
        std::lock_guard<std::mutex> lock(mutex_);
        comms_.push_back({name, world_ranks});
        return (int)comms_.size() - 1;
    }
    std::string comm_name(int comm) const {
        std::lock_guard<std::mutex> lock(mutex_);
        return comm >= 0 && comm < (int)comms_.size() ? comms_[comm].name : strformat("communicator %d", comm);
    }
    // World ranks of a communicator (empty when unknown).
    std::vector<int> comm_ranks(int comm) const {
        std::lock_guard<std::mutex> lock(mutex_);
        return comm >= 0 && comm < (int)comms_.size() ? comms_[comm].world_ranks : std::vector<int>{};
    }

    // The train loop's current step (1-based, as the log prints it).
    void set_step(int step) { step_.store(step, std::memory_order_relaxed); }
    int step() const { return step_.load(std::memory_order_relaxed); }

    // An operation was issued; returns its token for end() and writes its sequence number to *seq.
    uint64_t begin(int comm, const char* op, uint64_t bytes, uint64_t* seq = nullptr) {
        std::lock_guard<std::mutex> lock(mutex_);
        FlightEntry& e = ring_[next_id_ % kRingSize];
        e = FlightEntry{};
        e.id = ++next_id_;
        if (comm >= 0 && comm < RankStatus::kMaxComms) e.seq = ++issued_[comm];
        else e.seq = ++other_issued_;
        e.comm = comm;
        e.step = step();
        e.bytes = bytes;
        e.start = wall_seconds();
        snprintf(e.op, sizeof e.op, "%s", op);
        if (seq) *seq = e.seq;
        return e.id;
    }
    // The operation of `token` completed (failed: it failed or timed out).
    void end(uint64_t token, bool failed) {
        std::lock_guard<std::mutex> lock(mutex_);
        FlightEntry& e = ring_[(token - 1) % kRingSize];
        if (e.id != token) return;  // overwritten: more than kRingSize operations since
        e.end = wall_seconds();
        e.failed = failed;
        if (!failed && e.comm >= 0 && e.comm < RankStatus::kMaxComms) {
            completed_[e.comm] = std::max(completed_[e.comm], e.seq);
            last_done_ = ref(e, e.end);
        }
    }

    // This rank's status, for the heartbeat.
    RankStatus status(int rank, int32_t state) const {
        std::lock_guard<std::mutex> lock(mutex_);
        RankStatus s;
        s.rank = rank;
        s.state = state;
        s.step = step();
        s.comms = (int32_t)std::min<size_t>(comms_.size(), RankStatus::kMaxComms);
        s.sent = wall_seconds();
        std::copy(std::begin(issued_), std::end(issued_), s.issued);
        std::copy(std::begin(completed_), std::end(completed_), s.completed);
        if (const FlightEntry* e = oldest_in_flight()) s.waiting = ref(*e, e->start);
        s.last_done = last_done_;
        return s;
    }

    // The newest `count` entries, oldest first, one line each.
    std::string format(size_t count) const {
        std::vector<FlightEntry> entries;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            for (uint64_t id = next_id_ > count ? next_id_ - count + 1 : 1; id <= next_id_; id++) {
                const FlightEntry& e = ring_[(id - 1) % kRingSize];
                if (e.id == id) entries.push_back(e);
            }
        }
        const double now = wall_seconds();
        std::string out;
        for (const FlightEntry& e : entries) {
            std::string state = e.end == 0 ? strformat("IN FLIGHT for %.1f s", now - e.start)
                                : e.failed ? strformat("FAILED after %.3f s", e.end - e.start)
                                           : strformat("done in %.3f s", e.end - e.start);
            out += strformat("    #%llu on %s, step %d: %s (%llu bytes), issued %s, %s\n", (unsigned long long)e.seq,
                             comm_name(e.comm).c_str(), e.step, e.op, (unsigned long long)e.bytes,
                             clock_text(e.start).c_str(), state.c_str());
        }
        return out;
    }

    // Reports on peers, supplied by the heartbeat while it runs (empty text without one).
    // peer_report(comm, seq): who has not issued operation `seq` of `comm`, and every rank's state.
    using PeerReport = std::function<std::string(int comm, uint64_t seq)>;
    void set_peer_report(PeerReport report) {
        std::lock_guard<std::mutex> lock(report_mutex_);
        peer_report_ = std::move(report);
    }
    std::string peer_report(int comm, uint64_t seq) {
        std::lock_guard<std::mutex> lock(report_mutex_);
        return peer_report_ ? peer_report_(comm, seq) : std::string();
    }

    // Set by the heartbeat when a peer is declared dead: communicators then fail what is in flight
    // at once with EXIT_PEER_DEAD and this message, instead of waiting out the timeout.
    void set_peer_dead(const std::string& message) {
        std::lock_guard<std::mutex> lock(report_mutex_);
        if (peer_dead_message_.empty()) peer_dead_message_ = message;
        peer_dead_.store(true, std::memory_order_release);
    }
    bool peer_dead() const { return peer_dead_.load(std::memory_order_acquire); }
    std::string peer_dead_message() {
        std::lock_guard<std::mutex> lock(report_mutex_);
        return peer_dead_message_;
    }

    // The text the SIGTERM handler prints; refreshed every heartbeat. Two buffers: the handler reads
    // the one last completed while the next is written.
    void set_termination_text(const std::string& text) {
        std::lock_guard<std::mutex> lock(term_mutex_);
        int next = 1 - term_ready_.load(std::memory_order_acquire);
        size_t n = std::min(text.size(), sizeof term_text_[next] - 1);
        memcpy(term_text_[next], text.data(), n);
        term_len_[next] = n;
        term_ready_.store(next, std::memory_order_release);
    }
    // A rank that has printed its own error and is ending the launch says nothing more when the
    // launcher's SIGTERM reaches it: its error is the cause, and the report would bury it.
    void silence_termination_report() { term_silenced_.store(true, std::memory_order_release); }
    // Async-signal-safe.
    void write_termination_text(int fd) const {
        if (term_silenced_.load(std::memory_order_acquire)) return;
        int ready = term_ready_.load(std::memory_order_acquire);
        size_t n = term_len_[ready], at = 0;
        while (at < n) {
            ssize_t w = ::write(fd, term_text_[ready] + at, n - at);
            if (w <= 0) break;
            at += (size_t)w;
        }
    }

private:
    struct CommInfo {
        std::string name;
        std::vector<int> world_ranks;
    };
    static OpRef ref(const FlightEntry& e, double time) {
        OpRef r;
        r.comm = e.comm;
        r.step = e.step;
        r.seq = e.seq;
        r.time = time;
        snprintf(r.op, sizeof r.op, "%.47s", e.op);
        return r;
    }
    const FlightEntry* oldest_in_flight() const {  // under mutex_
        const FlightEntry* oldest = nullptr;
        for (const FlightEntry& e : ring_)
            if (e.id && e.end == 0 && (!oldest || e.id < oldest->id)) oldest = &e;
        return oldest;
    }

    mutable std::mutex mutex_;
    std::array<FlightEntry, kRingSize> ring_{};
    uint64_t next_id_ = 0;
    uint64_t issued_[RankStatus::kMaxComms] = {}, completed_[RankStatus::kMaxComms] = {}, other_issued_ = 0;
    OpRef last_done_;
    std::vector<CommInfo> comms_;
    std::atomic<int> step_{0};

    std::mutex report_mutex_;
    PeerReport peer_report_;
    std::atomic<bool> peer_dead_{false};
    std::string peer_dead_message_;

    std::mutex term_mutex_;
    char term_text_[2][16384] = {};
    size_t term_len_[2] = {0, 0};
    std::atomic<int> term_ready_{0};
    std::atomic<bool> term_silenced_{false};
};

// The process's recorder.
inline FlightRecorder& flight_recorder() {
    static FlightRecorder recorder;
    return recorder;
}

// "rank 1: step 5, in all_gather of 2 f32 per rank (#12 on world) for 3.0 s; last completed #11 ..."
inline std::string describe_op(const OpRef& op, double now, bool in_flight) {
    if (op.comm < 0) return in_flight ? "in no collective" : "none yet";
    std::string what = strformat("#%llu %s on %s at step %d", (unsigned long long)op.seq, op.op,
                                 flight_recorder().comm_name(op.comm).c_str(), op.step);
    return in_flight ? strformat("waiting in %s for %.1f s", what.c_str(), now - op.time)
                     : strformat("%s, finished %s (%.1f s ago)", what.c_str(), clock_text(op.time).c_str(), now - op.time);
}

// SIGTERM (how mpirun and srun end the surviving ranks of a job) prints this rank's prepared
// report to stderr, then terminates as SIGTERM would have.
inline void install_termination_report() {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = [](int sig) {
        flight_recorder().write_termination_text(STDERR_FILENO);
        signal(sig, SIG_DFL);
        raise(sig);
    };
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, nullptr);
}

}  // namespace llmc
