// health.h: stragglers. A job runs at the speed of its slowest rank, so one slow node (a throttled
// CPU or GPU, a noisy neighbour, a bad link) slows all of them; this finds it.
//
// At start (health_check): before training, every rank times a fixed matrix product (compute) and
// an all-reduce of 4 MB over the world communicator (communication), each the fastest of three
// tries, and the timings are gathered. A rank slower than the median by more than
// --straggler-factor (and by more than STRAGGLER_FLOOR_MS, below which differences are timer noise)
// is named as a straggler on every rank's behalf; --straggler-action warn prints a warning and trains,
// refuse stops the job with EXIT_STRAGGLER (8) before the first step. --straggler-factor 0 skips the
// check; one rank has nothing to compare with and skips it too. The median of an even number of
// ranks is the lower of the middle two, so with 2 ranks the slower one is compared with the faster.
// Where a node runs more ranks than the CPUs they may run on (mpirun --oversubscribe), the ranks take
// turns on the CPUs and their timings measure the sharing, not the hardware: the check says so
// once, and names no straggler, at start or during training.
//
// The matrix product is a plain host loop, the same on the CPU and the CUDA trainer (it times each
// rank's host, not its GPU; on the GPU a slow device shows in the per-step times). The fault
// slow@MS:R (faults.h) makes rank R sleep MS ms inside the timed product, as it does in every
// training step: a rank slowed down is slow at everything, so the check sees it as a real one would.
//
// During training (--log-rank-times 1, log_rank_times): every step, each rank's compute time (from
// the step's start to the end of its forward and backward passes, before the update's collectives;
// it includes the communication waits that happen inside backward under ZeRO-2/3) is gathered, and
// world rank 0 adds a record to metrics.jsonl: {"step", "rank_ms": [...], "slowest_rank",
// "slowest_ms", "median_ms"}. A step whose slowest rank exceeds --straggler-factor times the median
// also prints a line naming it.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "llmc/config/run_config.h"
#include "llmc/dist/comm.h"
#include "llmc/failures/exit_codes.h"
#include "llmc/failures/faults.h"
#include "llmc/training/metrics.h"
#include "llmc/utils.h"

namespace llmc {

constexpr double STRAGGLER_FLOOR_MS = 2.0;  // a rank must also be this much slower than the median

// The lower median (the lower of the middle two for an even count).
inline double lower_median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[(v.size() - 1) / 2];
}

// The ranks whose value exceeds factor * median and median + STRAGGLER_FLOOR_MS.
inline std::vector<int> find_stragglers(const std::vector<double>& ms, double factor) {
    std::vector<int> out;
    if (factor <= 0 || ms.size() < 2) return out;
    const double median = lower_median(ms);
    for (size_t r = 0; r < ms.size(); r++)
        if (ms[r] > factor * median && ms[r] > median + STRAGGLER_FLOOR_MS) out.push_back((int)r);
    return out;
}

// This process's host and the CPUs it may run on: "host 0,1,5".
inline std::string host_and_cpus() {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    std::string cpus;
    cpu_set_t set;
    CPU_ZERO(&set);
    const bool known = sched_getaffinity(0, sizeof set, &set) == 0;
    for (int c = 0; c < (known ? CPU_SETSIZE : (int)std::thread::hardware_concurrency()); c++)
        if (!known || CPU_ISSET(c, &set)) cpus += strformat("%s%d", cpus.empty() ? "" : ",", c);
    return std::string(host) + " " + cpus;
}

// Of every rank's host_and_cpus(), the hosts with more ranks than CPUs among them, as
// "host: 3 ranks on 2 CPU(s)" ("" for none).
inline std::string crowded_hosts(const std::vector<std::string>& ranks) {
    std::map<std::string, std::pair<int, std::set<std::string>>> hosts;  // host -> ranks, CPUs
    for (const std::string& r : ranks) {
        const size_t space = r.find(' ');
        auto& [count, cpus] = hosts[r.substr(0, space)];
        count++;
        std::istringstream list(space == std::string::npos ? "" : r.substr(space + 1));
        for (std::string cpu; std::getline(list, cpu, ',');) cpus.insert(cpu);
    }
    std::string out;
    for (const auto& [host, node] : hosts)
        if (node.first > (int)node.second.size())
            out += strformat("%s%s: %d ranks on %zu CPU(s)", out.empty() ? "" : "; ", host.c_str(), node.first,
                             node.second.size());
    return out;
}

// Milliseconds of a fixed product C = A B of n x n matrices (a plain loop, i-k-j order so it
// vectorises), plus the slow fault's sleep for this rank. The result is kept so it is not optimised away.
inline double time_matmul_ms(int world_rank, int n = 384) {
    std::vector<float> a((size_t)n * n), b((size_t)n * n), c((size_t)n * n, 0.0f);
    for (size_t i = 0; i < a.size(); i++) {
        a[i] = (float)((i * 7) % 13) * 0.01f;
        b[i] = (float)((i * 5) % 11) * 0.01f;
    }
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n; k++) {
            const float aik = a[(size_t)i * n + k];
            const float* brow = &b[(size_t)k * n];
            float* crow = &c[(size_t)i * n];
            for (int j = 0; j < n; j++) crow[j] += aik * brow[j];
        }
    if (int ms = faults().value("slow", world_rank)) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    double elapsed = ms_since(start);
    volatile float sink = c[(size_t)n * n / 2];
    (void)sink;
    return elapsed;
}

// Milliseconds of an all-reduce of `floats` floats over comm, after a barrier (host communicators).
inline double time_all_reduce_ms(Communicator& comm, size_t floats = 1 << 20) {
    std::vector<float> buf(floats, 1.0f);
    comm.barrier().wait();
    auto start = std::chrono::steady_clock::now();
    comm.all_reduce_sum(buf.data(), buf.size(), CommDtype::F32).wait();
    return ms_since(start);
}

// The start-up check (collective over world; every rank calls it). Prints the timings on rank 0,
// names the stragglers, and under --straggler-action refuse fails on every rank with EXIT_STRAGGLER.
// Returns the factor for the per-step check (log_rank_times): --straggler-factor, or 0 (no check)
// where ranks share CPUs, which is said once instead.
inline double health_check(const RunConfig& cfg, Communicator& world) {
    if (cfg.straggler_factor <= 0 || world.world_size() < 2) return cfg.straggler_factor;
    const std::string crowded = crowded_hosts(all_gather_strings(world, host_and_cpus()));
    if (!crowded.empty()) {
        if (world.rank() == 0) {
            printf("health check: skipped, and no straggler is named during training: %s (oversubscribed: the ranks "
                   "take turns on the CPUs, so their timings measure the sharing, not the hardware)\n",
                   crowded.c_str());
            fflush(stdout);
        }
        return 0;
    }
    double matmul = 1e30, comm_ms = 1e30;
    for (int i = 0; i < 3; i++) {
        world.barrier().wait();
        matmul = std::min(matmul, time_matmul_ms(world.rank()));
        comm_ms = std::min(comm_ms, time_all_reduce_ms(world));
    }
    const std::vector<double> matmuls = all_gather_doubles(world, {matmul}), comms = all_gather_doubles(world, {comm_ms});
    const double matmul_median = lower_median(matmuls), comm_median = lower_median(comms);
    auto slowest = [](const std::vector<double>& v) { return (int)(std::max_element(v.begin(), v.end()) - v.begin()); };
    if (world.rank() == 0) {
        const int sm = slowest(matmuls), sc = slowest(comms);
        printf("health check: %d ranks | matmul 384^3: median %.2f ms, slowest rank %d %.2f ms | all-reduce 4 MB: "
               "median %.2f ms, slowest rank %d %.2f ms\n",
               world.world_size(), matmul_median, sm, matmuls[sm], comm_median, sc, comms[sc]);
        fflush(stdout);
    }
    std::string named;
    auto name = [&](const std::vector<double>& ms, double median, const char* what) {
        for (int r : find_stragglers(ms, cfg.straggler_factor))
            named += strformat("%srank %d is a straggler: %s %.2f ms, %.1fx the median %.2f ms (--straggler-factor %g)",
                               named.empty() ? "" : "; ", r, what, ms[r], ms[r] / std::max(median, 1e-9), median,
                               cfg.straggler_factor);
    };
    name(matmuls, matmul_median, "matmul");
    name(comms, comm_median, "all-reduce");
    if (named.empty()) return cfg.straggler_factor;
    if (cfg.straggler_action == "refuse")
        fail_with(EXIT_STRAGGLER, "health check: " + named + "; --straggler-action refuse: not training (exclude the "
                                  "rank's node, or --straggler-action warn to train anyway)");
    if (world.rank() == 0) {
        fprintf(stderr, "warning: health check: %s; training anyway (--straggler-action warn)\n", named.c_str());
        fflush(stderr);
    }
    return cfg.straggler_factor;
}

// --log-rank-times 1: every rank's compute time of one step, gathered over world; world rank 0 adds
// the record to metrics.jsonl (and prints a line when the slowest rank is a straggler).
inline void log_rank_times(Communicator& world, MetricsLog& log, int step, double compute_ms, double factor) {
    const std::vector<double> ms = all_gather_doubles(world, {compute_ms});
    if (world.rank() != 0) return;
    const int slowest = (int)(std::max_element(ms.begin(), ms.end()) - ms.begin());
    const double median = lower_median(ms);
    log.log_record({{"step", step}, {"rank_ms", ms}, {"slowest_rank", slowest}, {"slowest_ms", ms[slowest]},
                    {"median_ms", median}});
    if (!find_stragglers(ms, factor).empty()) {
        printf("straggler: rank %d took %.1f ms in step %d, %.1fx the median %.1f ms\n", slowest, ms[slowest], step,
               ms[slowest] / std::max(median, 1e-9), median);
        fflush(stdout);
    }
}

}  // namespace llmc
