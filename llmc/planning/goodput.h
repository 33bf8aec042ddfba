// goodput.h: what share of a long run's wall-clock time trains (its "effective training time"),
// given how often the cluster fails and what checkpoints and restarts cost, and the checkpoint
// intervals that make it largest. --plan prints it with the recommended -n and --local-ckpt-every.
//
// The run: steps of step_s; every `local_every` steps a checkpoint into node-local memory (the
// local tier), every `shared_every` steps (a multiple) one to shared storage. Each checkpoint stalls
// training for its snapshot copy to host memory, and for whatever of the previous write of its tier
// is still running. Failures arrive at random (exponential, `rate` per GPU-hour times the GPUs); a
// share of them (`local_recovers`) restart from the newest local checkpoint, the others from the
// newest shared one, each after the restart time plus that tier's restore.
//
// expected_goodput is the model of Young (1974) and Daly (2006): per unit of work a checkpoint costs
// its stall over its interval, and each failure, on average, half an interval of lost work (first
// order in the interval over the mean time between failures) and a restart, which itself may fail
// (exact for exponential failures). simulate_goodput runs the same process failure by failure, so a
// test can check one against the other; best_intervals searches the intervals.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "llmc/planning/failure_rates.h"

namespace llmc {

struct FailureModel {
    double failures_per_gpu_hour = kLlama3FailuresPerGpuHour;
    long long gpus = 1;
    double restart_s = 600;       // detect, relaunch, rebuild the communicators (restores are extra)
    double local_recovers = 0.9;  // share of failures the local tier restarts from (with a local tier)
    double rate_per_s() const { return failures_per_gpu_hour * gpus / 3600.0; }
    double mtbf_s() const { return 1 / rate_per_s(); }
};

// What checkpoints cost one rank (the busiest), in seconds.
struct CheckpointCosts {
    double step_s = 0;
    double copy_s = 0;          // the snapshot's copy to host memory, counted as stall
    double local_write_s = 0;   // into node-local memory, with the replica sent to the next node
    double shared_write_s = 0;  // to shared storage, all of a node's ranks at once
    double local_restore_s = 0, shared_restore_s = 0;
};

struct Intervals {
    long long local_every = 0;   // steps; 0: no local tier
    long long shared_every = 0;  // steps; a multiple of local_every
};

// Shares of the wall-clock time, adding up to 1.
struct Goodput {
    double effective = 0;   // training that is kept
    double checkpoint = 0;  // stalls for checkpoints
    double rework = 0;      // training lost to failures, done again
    double restart = 0;     // restarts and restores
};

namespace detail {

// The run as the simulation and the model both see it: segments of `work_s` ending in a checkpoint
// that stalls `stall_s`; every `k`-th also commits to shared storage, stalling `shared_stall_s` more.
struct CheckpointCycle {
    double work_s, stall_s, shared_stall_s;
    long long k;
    double local_share;  // of failures, those that restart from the newest segment's checkpoint
    double local_restart_s, shared_restart_s;
};

// One writer saves every tier, a checkpoint at a time: a snapshot waits for the previous write to end.
inline CheckpointCycle checkpoint_cycle(const FailureModel& f, const CheckpointCosts& c, Intervals iv) {
    const double gap = (iv.local_every ? iv.local_every : iv.shared_every) * c.step_s;  // between snapshots
    auto wait = [&](double writing_s) { return std::max(0.0, writing_s - gap); };
    const double shared_restart_s = f.restart_s + c.shared_restore_s;
    if (iv.local_every == 0)  // shared checkpoints only: every segment is one, every failure goes back to one
        return {gap, c.copy_s + wait(c.shared_write_s), 0, 1, 0, 0, shared_restart_s};
    const double local_wait = wait(c.local_write_s);
    return {gap, c.copy_s + local_wait, wait(c.local_write_s + c.shared_write_s) - local_wait,
            iv.shared_every / iv.local_every, f.local_recovers, f.restart_s + c.local_restore_s, shared_restart_s};
}

}  // namespace detail

inline Goodput expected_goodput(const FailureModel& f, const CheckpointCosts& c, Intervals iv) {
    const detail::CheckpointCycle y = detail::checkpoint_cycle(f, c, iv);
    const double shared_work = y.k * y.work_s;
    const double a = 1 + y.stall_s / y.work_s + y.shared_stall_s / shared_work;  // wall time per unit of work
    const double rate = f.rate_per_s();
    // Between failures the run trains for 1 / rate on average, and loses half an interval of it,
    // its tier's, to the failure; a restart lasts until it gets through restart_s without failing,
    // so the restarts' share of the wall time is 1 - exp(-rate x restart_s).
    const double lost = std::min(1.0, rate * a / 2 * (y.local_share * y.work_s + (1 - y.local_share) * shared_work));
    const double surviving = std::exp(-rate * (y.local_share * y.local_restart_s + (1 - y.local_share) * y.shared_restart_s));
    Goodput g;
    g.restart = 1 - surviving;
    g.rework = surviving * lost;
    g.effective = surviving * (1 - lost) / a;
    g.checkpoint = surviving * (1 - lost) - g.effective;
    return g;
}

// Runs the process until `failures` failures have struck; returns the kept work over the wall time.
inline double simulate_goodput(const FailureModel& f, const CheckpointCosts& c, Intervals iv, int failures,
                               uint64_t seed) {
    const detail::CheckpointCycle y = detail::checkpoint_cycle(f, c, iv);
    std::mt19937_64 rng(seed);
    std::exponential_distribution<double> next_failure(f.rate_per_s());
    std::uniform_real_distribution<double> uniform(0, 1);
    const double segment = y.work_s + y.stall_s, cycle = y.k * segment + y.shared_stall_s;
    long long done = 0;  // segments behind the newest checkpoint
    double wall = 0;
    // Segments completed within `t` seconds of running from `done` (a checkpoint): a segment counts
    // once its checkpoint's stall is over.
    auto advance = [&](double t) {
        const long long to_shared = y.k - done % y.k;  // segments up to and including the next shared one
        if (t < (to_shared - 1) * segment + segment + y.shared_stall_s) {
            done += std::min(to_shared - 1, (long long)(t / segment));
            return;
        }
        t -= (to_shared - 1) * segment + segment + y.shared_stall_s;
        done += to_shared;
        const long long cycles = (long long)(t / cycle);
        done += cycles * y.k + std::min(y.k - 1, (long long)((t - cycles * cycle) / segment));
    };
    for (int struck = 0; struck < failures;) {
        const double t = next_failure(rng);
        wall += t;
        advance(t);
        // a failure: back to the newest checkpoint of the tier it leaves, then restart (a failure
        // during the restart is one more, and may send the run further back)
        for (;;) {
            struck++;
            const bool local = uniform(rng) < y.local_share;
            if (!local) done -= done % y.k;
            const double restart = local ? y.local_restart_s : y.shared_restart_s, during = next_failure(rng);
            if (during >= restart) {
                wall += restart;
                break;
            }
            wall += during;
        }
    }
    return done * y.work_s / wall;
}

namespace detail {

// 1, 2, 3, ... then about 4% apart, up to `most`.
inline std::vector<long long> interval_candidates(long long most) {
    std::vector<long long> out;
    for (long long n = 1; n <= most; n = std::max(n + 1, (long long)(n * 1.04))) out.push_back(n);
    return out;
}

}  // namespace detail

// Checkpoints that do not pay for themselves are not worth writing: best_intervals takes the longest
// intervals whose expected goodput is within this of the best.
constexpr double kGoodputTolerance = 5e-4;

// The recommended intervals, the local tier's with `local_tier`: the longest shared interval, then
// the longest local one, within kGoodputTolerance of the largest expected goodput. Intervals reach
// up to a few mean times between failures, past which waiting never pays.
inline Intervals best_intervals(const FailureModel& f, const CheckpointCosts& c, bool local_tier) {
    const long long most = std::max(1LL, (long long)std::min(1e9, 4 * f.mtbf_s() / c.step_s));
    std::vector<std::pair<Intervals, double>> tried;
    double best = 0;
    for (long long n : detail::interval_candidates(most))
        for (long long k : local_tier ? detail::interval_candidates(std::max(1LL, most / n)) : std::vector<long long>{1}) {
            const Intervals iv = local_tier ? Intervals{n, k * n} : Intervals{0, n};
            tried.push_back({iv, expected_goodput(f, c, iv).effective});
            best = std::max(best, tried.back().second);
        }
    Intervals pick{0, 0};
    for (const auto& [iv, goodput] : tried)
        if (goodput >= best - kGoodputTolerance &&
            std::make_pair(iv.shared_every, iv.local_every) > std::make_pair(pick.shared_every, pick.local_every))
            pick = iv;
    return pick;
}

}  // namespace llmc
