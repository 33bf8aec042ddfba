// heartbeat.h: every rank tells every other rank, every interval, that it is alive and what it is
// doing, so that a dead rank is seen within seconds and a timed-out collective can name who is missing.
//
// The idea: a thread of its own with a communicator of its own (a duplicate of MPI_COMM_WORLD, so its
// messages never mix with the training's), which every interval_s sends this rank's RankStatus
// (flight_recorder.h: step, operations issued and completed per communicator, what it waits on, what
// it completed last) to every other rank with MPI_Isend, and takes in theirs with MPI_Irecv that are
// always posted. Nothing blocks: a peer that stops answering only stops updating its entry. A peer
// not heard from for dead_after_s (and that did not say it was leaving) is declared dead: the
// report goes to stderr, the communicators fail whatever is in flight at once with EXIT_PEER_DEAD
// (MpiComm checks the recorder's flag), and if the process is still alive grace_s later (its main
// thread was not waiting on a collective), this thread ends the launch with MPI_Abort itself.
//
// A hung rank (alive, but stuck outside communication) keeps its heartbeat: it is not dead, and the
// others' collectives time out after --comm-timeout-s; their report then shows it alive, at its step,
// in no collective, and the last operation it completed.
//
// Every rank sends to every other rank: N^2 messages of ~0.5 KB per interval, fine to some hundreds
// of ranks; a larger job would send along a tree.
//
// The thread also refreshes, every interval, the text the SIGTERM handler prints (the flight record
// and the peers as last heard), for launchers that kill the job before anyone can report.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "llmc/dist/comm_mpi.h"
#include "llmc/dist/flight_recorder.h"
#include "llmc/failures/exit_codes.h"
#include "llmc/utils.h"

namespace llmc {

class Heartbeat {
public:
    // Collective over MPI_COMM_WORLD (call on every rank, after MPI_Init_thread).
    Heartbeat(double interval_s, double dead_after_s) : interval_s_(interval_s), dead_after_s_(dead_after_s) {
        if (!(interval_s > 0) || !(dead_after_s > interval_s))
            fail(strformat("heartbeat: the interval (%g s) must be positive and below the time after which a silent "
                           "rank is dead (%g s)", interval_s, dead_after_s));
        {
            std::lock_guard<std::mutex> lock(mpi_mutex());
            LLMC_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
            LLMC_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
            LLMC_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
            LLMC_MPI_CHECK(MPI_Comm_size(comm_, &size_));
        }
        peers_.resize(size_);
        const double now = wall_seconds();
        for (Peer& p : peers_) p.heard = now;
        flight_recorder().set_peer_report([this](int comm, uint64_t seq) { return report(comm, seq); });
        refresh_termination_text();
        thread_ = std::thread([this] { run(); });
    }
    // Tells the others this rank is leaving (so its silence is not death), then stops.
    ~Heartbeat() {
        {
            std::lock_guard<std::mutex> lock(stop_mutex_);
            stopping_ = true;
        }
        stop_cv_.notify_all();
        thread_.join();
        flight_recorder().set_peer_report(nullptr);
        // Unwinding from an error: the launch is about to be aborted, so only say so (a send to a dead
        // peer may never complete, and nothing must delay the abort).
        if (std::uncaught_exceptions() > 0) {
            exchange(RankStatus::FAILED);
            return;
        }
        exchange(RankStatus::LEAVING);
        // Wait (briefly) for the goodbyes to go out, then cancel the receives. The communicator is
        // left to MPI_Finalize: a peer may still be sending to it.
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        for (bool pending = true; pending && std::chrono::steady_clock::now() < deadline;) {
            pending = false;
            std::lock_guard<std::mutex> lock(mpi_mutex());
            for (Peer& p : peers_) {
                int done = 1;
                if (p.send != MPI_REQUEST_NULL) MPI_Test(&p.send, &done, MPI_STATUS_IGNORE);
                pending |= !done;
            }
        }
        std::lock_guard<std::mutex> lock(mpi_mutex());
        for (Peer& p : peers_) {
            if (p.recv == MPI_REQUEST_NULL) continue;
            MPI_Cancel(&p.recv);
            MPI_Wait(&p.recv, MPI_STATUS_IGNORE);
        }
    }
    Heartbeat(const Heartbeat&) = delete;
    Heartbeat& operator=(const Heartbeat&) = delete;

    // The report for a rank waiting on operation `seq` of communicator `comm` (-1: none): the ranks
    // that have not issued it, and every rank's state as last heard.
    std::string report(int comm, uint64_t seq) {
        const double now = wall_seconds();
        std::vector<Peer> peers;
        {
            std::lock_guard<std::mutex> lock(status_mutex_);
            peers = peers_;
        }
        peers[rank_].status = flight_recorder().status(rank_, RankStatus::RUNNING);
        peers[rank_].heard = now;
        std::string out;
        if (comm >= 0) {
            std::vector<int> members = flight_recorder().comm_ranks(comm);
            std::string missing;
            for (int r : members) {
                if (r < 0 || r >= size_) continue;
                const RankStatus& s = peers[r].status;
                bool arrived = s.state != RankStatus::UNKNOWN && comm < RankStatus::kMaxComms && s.issued[comm] >= seq;
                if (!arrived) missing += strformat("%s%d", missing.empty() ? "" : ", ", r);
            }
            out += strformat("  not arrived at #%llu on %s: %s\n", (unsigned long long)seq,
                             flight_recorder().comm_name(comm).c_str(),
                             missing.empty() ? "none (every rank issued it; it is stuck inside MPI)"
                                             : ("rank " + missing).c_str());
        }
        out += strformat("  every rank as last heard (heartbeat every %.1f s; silent for %.1f s = dead):\n",
                         interval_s_, dead_after_s_);
        for (int r = 0; r < size_; r++) out += "    " + describe(r, peers[r], now) + "\n";
        return out;
    }

private:
    struct Peer {
        RankStatus status;  // as last received (this rank's own: filled in when reporting)
        RankStatus inbox;   // the receive buffer
        RankStatus outbox;  // the send buffer
        MPI_Request recv = MPI_REQUEST_NULL, send = MPI_REQUEST_NULL;
        double heard = 0;  // wall_seconds() of the last status received
        bool dead = false;
        std::string error;  // an MPI error on this peer's messages
    };

    std::string describe(int r, const Peer& p, double now) const {
        const RankStatus& s = p.status;
        std::string who = strformat("rank %d%s: ", r, r == rank_ ? " (this rank)" : "");
        if (s.state == RankStatus::UNKNOWN) return who + strformat("no heartbeat received yet (%.1f s since start)", now - p.heard);
        std::string life = r == rank_ ? "alive"
                           : p.dead   ? strformat("DEAD (no heartbeat since %s, %.1f s; below: its last status)",
                                                  clock_text(p.heard).c_str(), now - p.heard)
                           : s.state == RankStatus::LEAVING ? "finished and leaving"
                           : s.state == RankStatus::FAILED  ? "failed with an error (ending the job)"
                           : now - p.heard > 2 * interval_s_ ? strformat("silent for %.1f s", now - p.heard)
                                                             : strformat("alive (heard %.1f s ago)", now - p.heard);
        return who + strformat("%s, at step %d, %s; last completed: %s", life.c_str(), s.step,
                               describe_op(s.waiting, now, true).c_str(), describe_op(s.last_done, now, false).c_str());
    }

    void run() {
        std::unique_lock<std::mutex> lock(stop_mutex_);
        while (!stopping_) {
            lock.unlock();
            exchange(RankStatus::RUNNING);
            check_peers();
            refresh_termination_text();
            lock.lock();
            stop_cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [&] { return stopping_; });
        }
    }

    // Takes in every status that arrived and sends this rank's to every peer still listening.
    void exchange(int32_t state) {
        RankStatus mine = flight_recorder().status(rank_, state);
        std::lock_guard<std::mutex> lock(mpi_mutex());
        std::lock_guard<std::mutex> status_lock(status_mutex_);  // after mpi_mutex, always
        const double now = wall_seconds();
        for (int r = 0; r < size_; r++) {
            if (r == rank_) continue;
            Peer& p = peers_[r];
            for (int drained = 0; drained < 64; drained++) {  // every status that arrived, newest last
                if (p.recv == MPI_REQUEST_NULL) {
                    if (!p.error.empty()) break;
                    int rc = MPI_Irecv(&p.inbox, sizeof p.inbox, MPI_BYTE, r, 0, comm_, &p.recv);
                    if (rc != MPI_SUCCESS) {
                        p.error = "MPI_Irecv failed";
                        break;
                    }
                }
                int done = 0;
                if (MPI_Test(&p.recv, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                    p.error = "MPI_Test of its heartbeat failed";
                    break;
                }
                if (!done) break;
                p.status = p.inbox;
                p.heard = now;
            }
            if (p.status.state == RankStatus::LEAVING || p.status.state == RankStatus::FAILED) continue;  // not listening
            int sent = 1;
            if (p.send != MPI_REQUEST_NULL && MPI_Test(&p.send, &sent, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                p.error = "MPI_Test of a heartbeat to it failed";
            if (!sent) continue;  // still going out: skip a beat rather than pile up
            p.outbox = mine;
            if (MPI_Isend(&p.outbox, sizeof p.outbox, MPI_BYTE, r, 0, comm_, &p.send) != MPI_SUCCESS)
                p.error = "MPI_Isend of a heartbeat to it failed";
        }
    }

    void check_peers() {
        const double now = wall_seconds();
        std::string dead;
        {
            std::lock_guard<std::mutex> lock(status_mutex_);
            for (int r = 0; r < size_; r++) {
                Peer& p = peers_[r];
                if (r == rank_ || p.dead || p.status.state == RankStatus::LEAVING || p.status.state == RankStatus::FAILED)
                    continue;
                if (now - p.heard > dead_after_s_ || !p.error.empty()) {
                    p.dead = true;
                    dead += strformat("%srank %d (%s)", dead.empty() ? "" : ", ", r,
                                      p.error.empty() ? strformat("no heartbeat for %.1f s", now - p.heard).c_str()
                                                      : p.error.c_str());
                }
            }
        }
        if (dead.empty()) {
            if (declared_at_ > 0 && now - declared_at_ > grace_s_) abort_now();
            return;
        }
        RankStatus mine = flight_recorder().status(rank_, RankStatus::RUNNING);
        std::string message = strformat("peer dead: %s is gone (its process ended, was stopped, or its node is "
                                        "unreachable); rank %d was %s",
                                        dead.c_str(), rank_, describe_op(mine.waiting, now, true).c_str());
        std::string text = message + "\n" + report(mine.waiting.comm, mine.waiting.seq);
        fprintf(stderr, "rank %d: %s", rank_, text.c_str());
        fflush(stderr);
        flight_recorder().set_peer_dead(message);
        if (declared_at_ == 0) declared_at_ = now;
    }

    // The main thread did not end the launch after a peer died (it was not waiting on a collective).
    [[noreturn]] void abort_now() {
        fprintf(stderr, "rank %d: ending the launch (exit code %d) after a peer died\n", rank_, EXIT_PEER_DEAD);
        fflush(stderr);
        fflush(stdout);
        std::lock_guard<std::mutex> lock(mpi_mutex());
        MPI_Abort(MPI_COMM_WORLD, EXIT_PEER_DEAD);
        std::_Exit(EXIT_PEER_DEAD);
    }

    void refresh_termination_text() {
        FlightRecorder& fr = flight_recorder();
        std::string text = strformat("rank %d was terminated by a signal (the launcher ended the job); as of %s it was "
                                     "at step %d, and its last operations were:\n",
                                     rank_, clock_text(wall_seconds()).c_str(), fr.step());
        text += fr.format(12);
        text += report(-1, 0);
        fr.set_termination_text(text);
    }

    double interval_s_, dead_after_s_, grace_s_ = 2.0;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
    std::vector<Peer> peers_;
    std::mutex status_mutex_;  // peers_ (taken after mpi_mutex when both are held)
    double declared_at_ = 0;
    std::mutex stop_mutex_;
    std::condition_variable stop_cv_;
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace llmc
