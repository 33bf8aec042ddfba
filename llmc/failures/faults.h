// faults.h: fault injection, compiled into the normal binary and off unless asked for, so the
// failure tests run the very code that trains.
//
// A fault list comes from the environment variable LLMC_FAULTS or the flag --faults (both may be
// given; the flag's faults are added). It is a comma-separated list of KIND@STEP or KIND@STEP:RANK
// (RANK is a world rank; without it, every rank):
//   kill@S:R        rank R ends itself with SIGKILL during step S (after its forward/backward)
//   hang@S:R        rank R stops during step S (sleeps for ever) without exiting
//   nan_grad@S:R    rank R writes a NaN into one element of its gradient at step S (after backward,
//                   before the gradient norm), so the norm turns NaN through the real path
//   flip_bit@S:R    rank R flips one mantissa bit of one parameter after step S's update
//   slow@MS:R       rank R sleeps MS milliseconds in every step (a straggler)
//   ckpt_fail@S:R   rank R's write of the step-S checkpoint fails half-way with ENOSPC
//   ckpt_pause@S    the writers stop for an hour before the step-S checkpoint's marker
//   nan_val@S       the validation loss after S steps is NaN (as a diverged model's would be)
//   slow_init@MS:R  rank R sleeps MS milliseconds before MPI_Init (a rank that starts late or never)
// Steps are 1-based, as the log prints them. A fault fires once per process (a relaunched job
// fires it again unless its step is behind the resume point). nan_grad and flip_bit, whose steps an
// in-process rollback replays, fire once per entry: list one twice to have it strike the replay too.
// A fault that cannot fire in the run (a rank it does not have, a step it does not reach, a sleep of
// 0 ms; the trainer says which: why_fault_never_fires in train_loop.h) is refused before training,
// so a test that relies on it cannot pass without it. slow_init acts before MPI_Init, which runs
// before the flags are read, so it is taken from LLMC_FAULTS only.
#pragma once

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "llmc/utils.h"

namespace llmc {

inline constexpr const char* FAULTS_ENV = "LLMC_FAULTS";

struct Fault {
    std::string kind;
    int step = 0;   // or milliseconds, for slow and slow_init
    int rank = -1;  // -1: every rank
    std::string item, source;  // as written ("nan_grad@5:1"), and where ("--faults" or LLMC_FAULTS)
};

class FaultPlan {
public:
    static constexpr const char* KINDS[] = {"kill",      "hang",       "nan_grad", "flip_bit", "slow",
                                             "ckpt_fail", "ckpt_pause", "nan_val",  "slow_init"};

    // Adds the faults of a list ("" adds none); `where` names the source in errors.
    void add(const std::string& list, const std::string& where) {
        std::lock_guard<std::mutex> lock(mutex_);
        for (size_t at = 0; at < list.size();) {
            size_t end = list.find(',', at);
            if (end == std::string::npos) end = list.size();
            const std::string item = list.substr(at, end - at);
            at = end + 1;
            if (item.empty()) continue;
            faults_.push_back(parse(item, where));
        }
    }
    // Reads LLMC_FAULTS (once; later calls do nothing).
    void add_from_environment() {
        if (env_read_) return;
        env_read_ = true;
        if (const char* v = std::getenv(FAULTS_ENV)) add(v, FAULTS_ENV);
    }
    // Refuses the first fault that cannot fire, with the reason never(fault) gives ("" where it can).
    void refuse_unreachable(const std::function<std::string(const Fault&)>& never) const {
        for (const Fault& f : faults_) {
            const std::string why = never(f);
            if (!why.empty())
                fail(strformat("%s: fault '%s' can never fire in this run: %s", f.source.c_str(), f.item.c_str(),
                               why.c_str()));
        }
    }

    bool empty() const { return faults_.empty(); }
    // Whether a fault of this kind is due at this step on this rank.
    bool at(const char* kind, int step, int rank) const {
        for (const Fault& f : faults_)
            if (f.kind == kind && f.step == step && (f.rank < 0 || f.rank == rank)) return true;
        return false;
    }
    // Like at(), but each matching entry fires once per process: true the first time only (an
    // in-process rollback that replays the step does not meet the fault again, unless it is listed twice).
    bool fire(const char* kind, int step, int rank) {
        std::lock_guard<std::mutex> lock(mutex_);
        for (size_t i = 0; i < faults_.size(); i++) {
            const Fault& f = faults_[i];
            if (f.kind != kind || f.step != step || (f.rank >= 0 && f.rank != rank)) continue;
            if (fired_.size() < faults_.size()) fired_.resize(faults_.size(), false);
            if (fired_[i]) continue;
            fired_[i] = true;
            return true;
        }
        return false;
    }
    // The value of a fault of this kind for this rank (slow's milliseconds), or 0.
    int value(const char* kind, int rank) const {
        for (const Fault& f : faults_)
            if (f.kind == kind && (f.rank < 0 || f.rank == rank)) return f.step;
        return 0;
    }

private:
    static Fault parse(const std::string& item, const std::string& where) {
        auto bad = [&](const char* why) {
            fail(strformat("%s: fault '%s' %s; expected KIND@STEP or KIND@STEP:RANK with KIND one of kill, hang, "
                           "nan_grad, flip_bit, slow, ckpt_fail, ckpt_pause, nan_val, slow_init",
                           where.c_str(), item.c_str(), why));
        };
        const size_t at = item.find('@');
        if (at == std::string::npos) bad("has no '@'");
        Fault f;
        f.item = item;
        f.source = where;
        f.kind = item.substr(0, at);
        bool known = false;
        for (const char* k : KINDS) known |= f.kind == k;
        if (!known) bad("is of an unknown kind");
        const std::string rest = item.substr(at + 1);
        const size_t colon = rest.find(':');
        auto number = [&](const std::string& text, const char* what) {
            char* end = nullptr;
            long v = std::strtol(text.c_str(), &end, 10);
            if (text.empty() || *end || v < 0 || v > 1000000000) bad(what);
            return (int)v;
        };
        f.step = number(rest.substr(0, colon), "has a bad step (a non-negative integer)");
        if (colon != std::string::npos) f.rank = number(rest.substr(colon + 1), "has a bad rank (a non-negative integer)");
        return f;
    }

    std::vector<Fault> faults_;
    std::vector<bool> fired_;  // per entry of faults_, for fire()
    bool env_read_ = false;
    std::mutex mutex_;
};

// The process's fault plan: LLMC_FAULTS, plus what --faults adds.
inline FaultPlan& faults() {
    static FaultPlan plan;
    plan.add_from_environment();
    return plan;
}

// The faults that strike a rank's process during a step: slow (every step), kill, hang. The
// trainer calls it once per step, after the forward and backward passes, before any collective of
// the update, so a killed or hung rank leaves the others waiting in that step's collectives.
inline void inject_step_faults(int step, int rank) {
    FaultPlan& plan = faults();
    if (plan.empty()) return;
    if (int ms = plan.value("slow", rank)) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    if (plan.at("kill", step, rank)) {
        fprintf(stderr, "fault injection: rank %d kills itself (SIGKILL) in step %d\n", rank, step);
        fflush(stderr);
        std::raise(SIGKILL);
    }
    if (plan.at("hang", step, rank)) {
        fprintf(stderr, "fault injection: rank %d hangs in step %d\n", rank, step);
        fflush(stderr);
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
}

}  // namespace llmc
