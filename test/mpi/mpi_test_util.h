// What the standalone MPI test programs (test_zero.cpp, test_tp.cpp) share: failing the launch from
// any rank, a learnable token shard, a training run, comparing parameters and loss curves, and
// printing on rank 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>
#include <string>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/models/cpu_model.h"
#include "llmc/numerics/rng.h"
#include "llmc/train_loop.h"
#include "llmc/utils.h"

namespace llmc::mpi_test {

inline Launch launch;

// Any rank that finds a failure ends the whole launch with exit code 2.
inline void check(bool ok, const std::string& what) {
    if (ok) return;
    fprintf(stderr, "FAILED on rank %d: %s\n", launch.rank, what.c_str());
    fflush(stderr);
    abort_launch(launch, 2);
}

// A shard of pseudo-text: a fixed random walk over a 250-token vocabulary, learnable but not trivial.
inline void write_shard(const std::string& path, int num_tokens) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = num_tokens;
    std::vector<uint16_t> tokens(num_tokens);
    Rng rng(7);
    int t = 0;
    for (auto& token : tokens) {
        t = (t * 17 + 3 + (int)rng.below(5)) % 250;
        token = (uint16_t)t;
    }
    AtomicFile out(path);
    out.file().write(header.data(), header.size());
    out.file().write(tokens.data(), tokens.size());
    out.commit();
}

// What every MPI test's run shares: the pseudo-text shard (write_shard) and its 250-token vocabulary,
// no validation, no samples, no tokenizer, 2 warm-up steps. The caller sets the model, the batch, the
// steps and the learning rate, then resolves.
inline RunConfig base_config(const std::string& shard) {
    RunConfig cfg;
    cfg.train_data = shard;
    cfg.val_data = "";
    cfg.tokenizer = "";
    cfg.vocab_size = 250;
    cfg.warmup_steps = 2;
    cfg.val_every = 0;
    cfg.sample_every = 0;
    return cfg;
}

// Norm of the difference over the norm of b (infinite if anything is not finite).
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size(); i++) {
        diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        norm += (double)b[i] * b[i];
    }
    return std::isfinite(diff) ? std::sqrt(diff / norm) : INFINITY;
}

// The largest per-step relative difference of two loss curves (infinite if their lengths differ).
inline double worst_loss_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = a.size() == b.size() ? 0 : INFINITY;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        const double d = std::fabs((double)a[i] - b[i]) / std::fabs((double)b[i]);
        worst = std::isfinite(d) ? std::max(worst, d) : INFINITY;
    }
    return worst;
}

// A run's per-step losses and its final parameters, whole (the model.bin a run would save).
struct RunResult {
    std::vector<float> losses;
    std::vector<float> params;  // in the whole-model layout
};

// Trains `model` from its seed with `cfg` (dp: the data-parallel group; world: every rank, or null
// when dp is the world) and gathers the result on every rank.
inline RunResult train(const RunConfig& cfg, Communicator& dp, Communicator* world, CPUModel& model) {
    model.init_random(cfg.seed);
    RunResult r;
    r.losses = Trainer(cfg, model, dp, "", world).run().train_losses;
    r.params.resize(num_params(cfg.model_config));
    model.get_whole_params(r.params.data());
    return r;
}

// Checks a run against the 1-rank reference: every loss within 1e-5 relative, the final whole
// parameters within 1e-4, and the same whole parameters on every rank of `world`. Returns the
// worst loss difference and the parameters' difference, for the "ok" line.
inline std::pair<double, double> check_matches_reference(const RunResult& run, const RunResult& reference,
                                                         Communicator& world, const std::string& what) {
    const double worst = worst_loss_difference(run.losses, reference.losses);
    check(worst <= 1e-5, strformat("%s: loss differs from 1 rank by %.3g relative (limit 1e-5)", what.c_str(), worst));
    const double params_diff = relative_difference(run.params, reference.params);
    check(params_diff <= 1e-4,
          strformat("%s: final parameters differ from 1 rank by %.3g relative", what.c_str(), params_diff));
    std::vector<float> rank0 = run.params;
    world.broadcast(rank0.data(), rank0.size() * sizeof(float), 0).wait();
    check(std::memcmp(rank0.data(), run.params.data(), rank0.size() * sizeof(float)) == 0,
          what + ": ranks gathered different whole models");
    return {worst, params_diff};
}

// One "ok" line, printed by rank 0.
inline void say(const std::string& line) {
    if (launch.rank == 0) printf("ok %s\n", line.c_str());
    fflush(stdout);
}

}  // namespace llmc::mpi_test
