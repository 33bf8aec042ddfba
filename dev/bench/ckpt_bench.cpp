// ckpt_bench: what a checkpoint costs the trainer, on a synthetic training state (issue 10's
// checkpoint benchmark; dev/bench/ckpt_bench.sh runs it with dd and the real trainer).
//
// The state is one rank's share of a preset's fp32 training state, as the CPU model keeps it:
// params, adam_m and adam_v over exactly the ranges rank R of N owns under ZeRO
// (ZeroPlan(layout, 1, R, N), as ZeroEngine::owned_ranges), filled with random (incompressible)
// floats. So `--model d48 --rank 0 --ranks 8` writes the file rank 0 of an 8-rank GPT-2 1.5B run
// writes, without the 18.7 GB of the whole state. Snapshots are copied on a thread by HostMemory,
// the CPU model's own memory policy, and written by the real CheckpointWriter (single process,
// LocalComm, so the file is rank_00000.bin and the manifest says one rank).
//
// Training is simulated with the trainer's own sequence (train_loop.h), one step at a time:
//   forward/backward  a fixed amount of CPU work (calibrated once to --step-ms when nothing else
//                     runs) touching a --work-mb working set; it does not touch the state
//   before_update()   the wait for the snapshot copy (counted as stall by the writer)
//   update            an AdamW-like pass over params, m and v (--update 1), memory-bound as AdamW is
//   save()            after every --every-th step (starts the snapshot, or writes it: --sync 1)
// --warmup steps without checkpoints come first (their median iteration time is the baseline),
// then --checkpoints checkpoints every --every steps, then --every more steps so the last write
// overlaps training like the others.
//
// Per checkpoint it prints the writer's report (stall, of which waiting for the previous one,
// write time from the snapshot to the marker, MB/s) and the training time lost: the iterations'
// wall time over the baseline from this save to the next, which also counts the slowdown of the
// work while the copy and the write share the machine with it (the writer cannot see that).
// Then one summary line per configuration, and the same as "RESULT {json}" for scripts.
//
// Build and run from the repository root:
//   make build/ckpt_bench
//   build/ckpt_bench --model d12 --out /work/ckpt_out --checkpoints 3 --every 2 --step-ms 2000 [--sync 1]
//   build/ckpt_bench --model d48 --rank 0 --ranks 8 --out /work/ckpt_out ...
// Memory: twice the share (state + snapshot), plus --work-mb; --verify 1 adds two more copies.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llmc/ckpt/checkpoint.h"
#include "llmc/config.h"
#include "llmc/dist/host_memory.h"
#include "llmc/dist/zero_plan.h"
#include "llmc/models/gpt2/params.h"

using namespace llmc;
using Clock = std::chrono::steady_clock;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// One rank's fp32 training state over its owned ranges, stored compactly (the ranges back to back,
// as ZeroEngine's shard buffers are), with HostMemory's threaded snapshot copies.
class SyntheticState : public ShardedState {
public:
    SyntheticState(const ParamLayout& layout, int rank, int ranks) {
        const ZeroPlan plan(layout, 1, rank, ranks);
        for (const auto& k : plan.buckets)
            if (k.owned_end > k.owned_begin) owned_.push_back({k.begin + k.owned_begin, k.begin + k.owned_end});
        for (const FlatRange& r : owned_) elements_ += r.size();
        for (auto& b : buffers_) b.resize(elements_);
    }

    size_t elements() const { return elements_; }
    std::vector<float>& buffer(int b) { return buffers_[b]; }

    // Random floats in about [-0.05, 0.05) (params), [-1e-3, 1e-3) (m) and [0, 1e-6) (v).
    void fill(uint64_t seed) {
        const float scale[3] = {0.1f, 2e-3f, 1e-6f}, shift[3] = {-0.5f, -0.5f, 0.0f};
        for (int b = 0; b < 3; b++) {
            float* x = buffers_[b].data();
            const uint64_t salt = splitmix64(seed * 3 + b);
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < elements_; i++) {
                const uint32_t bits = (uint32_t)(splitmix64(salt ^ i) >> 40);  // 24 random bits
                x[i] = ((float)bits * (1.0f / 16777216.0f) + shift[b]) * scale[b];
            }
        }
    }

    // An AdamW-like update of every element (a memory-bound pass, as AdamW's), on `threads` threads.
    void update(int step, int threads) {
        float *p = buffers_[0].data(), *m = buffers_[1].data(), *v = buffers_[2].data();
        const float g = 1e-3f * (float)((step % 7) - 3);
#pragma omp parallel for schedule(static) num_threads(threads)
        for (size_t i = 0; i < elements_; i++) {
            m[i] = 0.9f * m[i] + 0.1f * g;
            v[i] = 0.95f * v[i] + 0.05f * g * g;
            p[i] -= 1e-3f * (m[i] / (std::sqrt(v[i]) + 1e-8f) + 0.1f * p[i]);
        }
    }

    // ---- ShardedState ----
    std::vector<StateBuffer> state_buffers() const override {
        return {{STATE_PARAMS, StateDtype::F32}, {STATE_ADAM_M, StateDtype::F32}, {STATE_ADAM_V, StateDtype::F32}};
    }
    std::vector<FlatRange> owned_ranges() const override { return owned_; }
    void* snapshot_memory(size_t bytes) override { return mem_.snapshot_memory(bytes); }
    void start_snapshot(void* host) override {
        std::vector<HostCopy> copies;
        char* at = static_cast<char*>(host);
        for (auto& b : buffers_) {
            copies.push_back({at, b.data(), b.size() * sizeof(float)});
            at += b.size() * sizeof(float);
        }
        mem_.start_host_copies(copies);
    }
    void wait_snapshot() override { mem_.wait_host_copies(); }
    std::vector<FlatRange> held_ranges(int) const override { return owned_; }
    void restore(int buffer, const std::function<void(FlatRange, float*)>& read) override {
        size_t at = 0;
        for (const FlatRange& r : owned_) {
            read(r, buffers_[buffer].data() + at);
            at += r.size();
        }
    }

private:
    std::vector<FlatRange> owned_;
    size_t elements_ = 0;
    std::vector<float> buffers_[3];
    HostMemory mem_;
};

// The stand-in for forward and backward: passes of a few multiply-adds per element over a working
// set, on `threads` threads. It never touches the training state.
class Work {
public:
    Work(size_t mb, int threads) : x_(std::max<size_t>(mb, 1) * (1u << 20) / sizeof(float), 1.0f), threads_(threads) {}
    void passes(long n) {
        float* x = x_.data();
        const size_t count = x_.size();
        for (long k = 0; k < n; k++) {
#pragma omp parallel for schedule(static) num_threads(threads_)
            for (size_t i = 0; i < count; i++) {
                float y = x[i];
                for (int j = 0; j < 16; j++) y = y * 0.999f + 0.001f;
                x[i] = y;
            }
        }
    }
    // Passes that take about `ms` on the machine as it is now (the median of a few timings).
    long calibrate(double ms) {
        passes(2);  // warm: page faults, thread pool
        std::vector<double> per_pass;
        for (int i = 0; i < 5; i++) {
            const auto t0 = Clock::now();
            passes(2);
            per_pass.push_back(ms_between(t0, Clock::now()) / 2);
        }
        pass_ms_ = median(per_pass);
        return std::max(1L, std::lround(ms / pass_ms_));
    }
    double pass_ms() const { return pass_ms_; }

private:
    std::vector<float> x_;
    int threads_;
    double pass_ms_ = 0;
};

struct Options {
    std::string model = "d12";
    int rank = 0, ranks = 1;
    std::string out = "out_ckpt_bench";
    int checkpoints = 3, every = 1, warmup = 3;
    double step_ms = 2000;
    bool sync = false, update = true, verify = false, clean = true, trace = false, bytes_only = false;
    int threads = 1;
    size_t work_mb = 64;
    int keep = 1;
    std::string label;
};

[[noreturn]] void usage(const char* why) {
    fprintf(stderr,
            "%s\nusage: ckpt_bench [--model d4|d6|d12|d24|d36|d48] [--rank R --ranks N] [--out DIR]\n"
            "                  [--checkpoints K] [--every E] [--warmup W] [--step-ms MS] [--sync 0|1]\n"
            "                  [--threads T] [--work-mb MB] [--update 0|1] [--keep K] [--verify 0|1]\n"
            "                  [--clean 0|1] [--trace 0|1] [--bytes-only 1] [--label NAME]\n"
            "  --model     preset whose ParamLayout the state follows (default d12)\n"
            "  --rank/--ranks  the share: rank R's owned ranges of N under ZeRO (default 0 of 1: all)\n"
            "  --out       checkpoint directory's parent; ckpt_* in it are removed first (default out_ckpt_bench)\n"
            "  --checkpoints  checkpoints measured (default 3); --every: steps between them (default 1)\n"
            "  --warmup    steps without checkpoints first, the baseline (default 3)\n"
            "  --step-ms   forward/backward stand-in per step, calibrated to this when idle (default 2000)\n"
            "  --sync 1    --ckpt-sync: write on the training thread\n"
            "  --threads   threads of the stand-in work and the update (default 1; the trainer uses all cores)\n"
            "  --work-mb   working set of the stand-in work (default 64)\n"
            "  --update 0  skip the AdamW-like pass over the state after before_update()\n"
            "  --keep      -nk: checkpoints kept on disk (default 1)\n"
            "  --verify 1  read the last checkpoint back (find_resume_checkpoint, load_checkpoint) and\n"
            "              compare it bitwise with the state it saved (two more copies of the state)\n"
            "  --clean 0   leave the checkpoints on disk at the end (default: removed)\n"
            "  --trace 1   print every step's time (work, before_update, update, save)\n"
            "  --bytes-only 1  print the checkpoint file's size in bytes (the snapshot) and exit\n",
            why);
    exit(2);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") usage("ckpt_bench: CheckpointWriter on a synthetic training state");
        if (i + 1 >= argc) usage(strformat("flag %s needs a value", flag.c_str()).c_str());
        const std::string v = argv[++i];
        auto num = [&]() {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end) usage(strformat("%s: '%s' is not a number", flag.c_str(), v.c_str()).c_str());
            return x;
        };
        if (flag == "--model") o.model = v;
        else if (flag == "--rank") o.rank = (int)num();
        else if (flag == "--ranks") o.ranks = (int)num();
        else if (flag == "--out") o.out = v;
        else if (flag == "--checkpoints") o.checkpoints = (int)num();
        else if (flag == "--every") o.every = (int)num();
        else if (flag == "--warmup") o.warmup = (int)num();
        else if (flag == "--step-ms") o.step_ms = num();
        else if (flag == "--sync") o.sync = num() != 0;
        else if (flag == "--threads") o.threads = (int)num();
        else if (flag == "--work-mb") o.work_mb = (size_t)num();
        else if (flag == "--update") o.update = num() != 0;
        else if (flag == "--keep") o.keep = (int)num();
        else if (flag == "--verify") o.verify = num() != 0;
        else if (flag == "--clean") o.clean = num() != 0;
        else if (flag == "--label") o.label = v;
        else if (flag == "--trace") o.trace = num() != 0;
        else if (flag == "--bytes-only") o.bytes_only = num() != 0;
        else usage(strformat("unknown flag %s", flag.c_str()).c_str());
    }
    if (o.ranks < 1 || o.rank < 0 || o.rank >= o.ranks) usage("--rank must be in [0, --ranks)");
    if (o.checkpoints < 1 || o.every < 1 || o.warmup < 1) usage("--checkpoints, --every and --warmup must be >= 1");
    if (o.step_ms < 0 || o.threads < 1 || o.keep < 0) usage("--step-ms >= 0, --threads >= 1, --keep >= 0");
    if (o.label.empty())
        o.label = strformat("%s r%d/%d %s", o.model.c_str(), o.rank, o.ranks, o.sync ? "sync" : "async");
    return o;
}

void remove_checkpoints(const std::string& dir) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (checkpoint_step_of(e.path().filename().string()) >= 0) std::filesystem::remove_all(e.path());
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = parse(argc, argv);
        RunConfig cfg;
        cfg.model = o.model;
        cfg.model_config = model_preset(o.model);
        cfg.output_dir = o.out;
        cfg.ckpt_sync = o.sync;
        cfg.checkpoint_keep = o.keep;
        cfg.zero_stage = o.ranks > 1 ? 1 : 0;
        const int total_steps = o.warmup + (o.checkpoints + 1) * o.every;
        cfg.steps = total_steps;
        cfg.checkpoint_every = o.every;
        const ParamLayout layout = GPT2Params::layout(cfg.model_config);
        if (o.bytes_only) {
            const ZeroPlan plan(layout, 1, o.rank, o.ranks);
            size_t elements = 0;
            for (const auto& k : plan.buckets) elements += k.owned_end - k.owned_begin;
            printf("%zu\n", elements * 3 * sizeof(float));
            return 0;
        }
        make_dirs(o.out);
        remove_checkpoints(o.out);
        SyntheticState state(layout, o.rank, o.ranks);
        const auto t_fill = Clock::now();
        state.fill(1234 + o.rank);
        const double bytes = (double)state.snapshot_bytes();
        printf("ckpt_bench %s: %s (%zu params), rank %d of %d owns %zu elements: %.1f MB of params + adam_m + adam_v "
               "(filled in %.0f ms)\n",
               o.label.c_str(), o.model.c_str(), layout.num_params, o.rank, o.ranks, state.elements(), bytes / 1e6,
               ms_between(t_fill, Clock::now()));

        Work work(o.work_mb, o.threads);
        const long passes = o.step_ms > 0 ? work.calibrate(o.step_ms) : 0;
        printf("  step: %ld passes of %.1f ms over %zu MB on %d thread(s) (--step-ms %.0f), update %s; "
               "%d warmup steps, then a checkpoint every %d step(s), %s\n",
               passes, work.pass_ms(), o.work_mb, o.threads, o.step_ms, o.update ? "on" : "off", o.warmup, o.every,
               o.sync ? "--ckpt-sync" : "asynchronous");
        fflush(stdout);

        LocalComm world;
        // One tier whose every step is due: this loop decides when to save (after the warmup steps).
        CheckpointWriter writer(cfg, run_config_json(cfg), state, layout, world,
                                {CheckpointTier{"shared", o.out, 1, o.keep, 0, 0}});  // allocates the snapshot
        std::vector<double> iter_ms(total_steps, 0);
        std::vector<int> save_at;  // the step index after which each checkpoint was saved
        std::vector<CheckpointReport> reports;
        std::vector<float> expect[3];  // --verify: the state the last checkpoint saved
        int last_saved = -1;

        for (int s = 0; s < total_steps; s++) {
            const auto t0 = Clock::now();
            work.passes(passes);         // forward + backward
            const auto t1 = Clock::now();
            writer.before_update();      // the snapshot copy must be done before the state changes
            const auto t2 = Clock::now();
            if (o.update) state.update(s + 1, o.threads);
            const auto t3 = Clock::now();
            const int done = s + 1;
            const bool save = done > o.warmup && (done - o.warmup) % o.every == 0 &&
                              (int)save_at.size() < o.checkpoints;
            if (save) {
                writer.save(TrainState{done, {}, {}});
                save_at.push_back(s);
                last_saved = done;
                if (o.verify && (int)save_at.size() == o.checkpoints)
                    for (int b = 0; b < 3; b++) expect[b] = state.buffer(b);
            }
            for (CheckpointReport& r : writer.take_finished()) reports.push_back(r);
            iter_ms[s] = ms_between(t0, Clock::now());
            if (o.trace)
                printf("  step %3d: %8.1f ms = work %7.1f + before_update %6.1f + update %6.1f + save %7.1f%s\n", done,
                       iter_ms[s], ms_between(t0, t1), ms_between(t1, t2), ms_between(t2, t3),
                       ms_between(t3, Clock::now()), save ? " (checkpoint)" : "");
        }
        writer.finish();
        for (CheckpointReport& r : writer.take_finished()) reports.push_back(r);

        const double base_ms = median(std::vector<double>(iter_ms.begin() + (o.warmup > 1 ? 1 : 0),
                                                          iter_ms.begin() + o.warmup));
        std::vector<double> stall, wait, write_ms, mbps, lost;
        bool all_ok = true;
        for (size_t i = 0; i < reports.size(); i++) {
            const CheckpointReport& r = reports[i];
            if (!r.ok) {
                all_ok = false;
                printf("  checkpoint step %d FAILED: %s\n", r.step, r.error.c_str());
                continue;
            }
            // Lost training time: every iteration from the save (inclusive: its save() call) to the next
            // save (exclusive), over the baseline iteration.
            double lost_ms = 0;
            if (i < save_at.size()) {
                const int from = save_at[i], to = i + 1 < save_at.size() ? save_at[i + 1] : total_steps - 1;
                lost_ms = iter_ms[from] - base_ms;  // the save() at the end of this iteration
                for (int s = from + 1; s <= to; s++) lost_ms += iter_ms[s] - base_ms;
            }
            stall.push_back(r.stall_ms);
            wait.push_back(r.wait_ms);
            write_ms.push_back(r.write_ms);
            mbps.push_back(r.mb_per_s());
            lost.push_back(lost_ms);
            printf("  checkpoint step %3d: %.1f MB, stall %8.1f ms (waiting for the previous %.1f ms), "
                   "write %7.0f ms, %6.0f MB/s, training time lost %8.1f ms\n",
                   r.step, r.bytes / 1e6, r.stall_ms, r.wait_ms, r.write_ms, r.mb_per_s(), lost_ms);
        }

        bool verified = false;
        if (o.verify && all_ok) {
            // Back into a fresh state, through the resume path, and compared bitwise.
            SyntheticState back(layout, o.rank, o.ranks);
            std::optional<ResumePoint> p = find_resume_checkpoint(cfg, world);
            if (!p || p->manifest.step != last_saved)
                fail(strformat("--verify: the newest complete checkpoint is not step %d", last_saved));
            load_checkpoint(*p, back, layout);
            for (int b = 0; b < 3; b++)
                if (std::memcmp(back.buffer(b).data(), expect[b].data(), expect[b].size() * sizeof(float)) != 0)
                    fail(strformat("--verify: buffer %d of %s differs from the state saved at step %d", b,
                                   p->dir.c_str(), last_saved));
            verified = true;
            printf("  verify: %s read back bitwise equal to the state it saved\n", p->dir.c_str());
        }
        if (o.clean) remove_checkpoints(o.out);

        const double med_stall = median(stall), med_write = median(write_ms), med_mbps = median(mbps);
        printf("%-24s %10.1f MB | stall %8.1f ms (max %.1f) | lost %8.1f ms | write %7.0f ms | %6.0f MB/s | "
               "step %.0f ms\n",
               o.label.c_str(), bytes / 1e6, med_stall, stall.empty() ? 0 : *std::max_element(stall.begin(), stall.end()),
               median(lost), med_write, med_mbps, base_ms);
        nlohmann::json result = {{"label", o.label},       {"model", o.model},         {"rank", o.rank},
                                 {"ranks", o.ranks},       {"sync", o.sync},           {"bytes", (uint64_t)bytes},
                                 {"checkpoints", stall.size()}, {"ok", all_ok},        {"verified", verified},
                                 {"step_ms", base_ms},     {"every", o.every},         {"threads", o.threads},
                                 {"stall_ms", med_stall},  {"stall_ms_max", stall.empty() ? 0.0 : *std::max_element(stall.begin(), stall.end())},
                                 {"wait_ms", median(wait)}, {"lost_ms", median(lost)}, {"write_ms", med_write},
                                 {"mb_per_s", med_mbps},   {"stall_ms_all", stall},    {"lost_ms_all", lost},
                                 {"mb_per_s_all", mbps}};
        printf("RESULT %s\n", result.dump().c_str());
        return all_ok ? 0 : 1;
    } catch (const std::exception& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
