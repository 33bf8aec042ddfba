// train_loop.h: the training loop, shared by the CPU and the CUDA trainer.
//
// Host orchestration only: it knows a Model through model.h's interface and nothing of CUDA. One
// optimizer step = grad_accum_steps micro-batches of forward+backward (gradients accumulate, each
// scaled by 1/grad_accum_steps so the sum is the mean over the whole batch), then the global
// gradient norm, clipping, and AdamW at the scheduled learning rate. Validation, HellaSwag
// (training/hellaswag.h) and samples happen between steps and never touch the training data order
// or the training RNG; -x 0 runs only the evaluations after step 0, of the model it was given.
//
// With several ranks every rank runs this same loop; each data-parallel rank on its own windows of
// the data. The loop talks only to the data-parallel communicator (process_groups.h): the data
// loader's rank and size, the gradient scale and the loss averages are data-parallel ones. The
// model's ZeRO engine does the gradient and parameter collectives. Everything collective
// (validation, sampling under ZeRO-3) runs on every rank in the same order; only rank 0 of the
// data-parallel group prints and writes files.
//
// Checkpoints (ckpt/checkpoint.h): with -n, the state after every N-th step (and the last) is saved
// in the background while training goes on; with -y 1 or --resume-from the run first continues
// from the newest complete checkpoint, exactly where it left off: the same step, learning rate,
// data position and random states, so the rest of the run is the one that would have been.
#pragma once

#include <chrono>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "llmc/ckpt/checkpoint.h"
#include "llmc/dist/comm.h"
#include "llmc/dist/flight_recorder.h"
#include "llmc/config.h"
#include "llmc/data/dataloader.h"
#include "llmc/failures/exit_codes.h"
#include "llmc/failures/faults.h"
#include "llmc/failures/guards.h"
#include "llmc/failures/health.h"
#include "llmc/training/hellaswag.h"
#include "llmc/training/metrics.h"
#include "llmc/planning/mfu.h"
#include "llmc/model.h"
#include "llmc/numerics/rng.h"
#include "llmc/text/sampler.h"
#include "llmc/text/tokenizer.h"

namespace llmc {

struct TrainSummary {
    int first_step = 0;  // the step the run started from (> 0: resumed from a checkpoint)
    int steps_run = 0;   // optimizer steps this process ran (a replayed step counts again)
    int first_val_step = -1, last_val_step = -1;  // -1: no validation ran
    float first_val_loss = NAN, last_val_loss = NAN;
    int first_hellaswag_step = -1, last_hellaswag_step = -1;  // -1: no HellaSwag evaluation ran
    double first_hellaswag_acc = NAN, last_hellaswag_acc = NAN;
    bool evaluated_only = false;  // -x 0: the run evaluated a model and trained nothing
    float last_train_loss = NAN;
    std::vector<float> train_losses;  // every step's loss, averaged over ranks
    double mean_tokens_per_s = 0;  // over the steps but the first (which warms caches up), unless it is the only one
    int skipped_steps = 0;         // updates the guards skipped
    int rollbacks = 0;             // in-process rollbacks after too many skips in a row
    int replays = 0;               // replays after a fingerprint mismatch
};

// What a run did, for its closing line, and nothing of what it did not do: where it resumed, the
// validation loss and HellaSwag accuracy from their first evaluation to their last, the last
// training loss and the throughput.
inline std::string summary_text(const TrainSummary& s) {
    std::string text;
    auto add = [&](const std::string& part) { text += (text.empty() ? "" : " | ") + part; };
    if (s.first_step > 0) add(strformat("resumed at step %d", s.first_step));
    if (s.steps_run == 0) add(s.evaluated_only ? "evaluated only" : "nothing left to train");
    if (s.first_val_step >= 0)
        add(strformat("val loss %.4f (step %d)", s.first_val_loss, s.first_val_step) +
            (s.last_val_step != s.first_val_step ? strformat(" -> %.4f (step %d)", s.last_val_loss, s.last_val_step)
                                                 : ""));
    if (s.first_hellaswag_step >= 0)
        add(strformat("hellaswag acc %.4f (step %d)", s.first_hellaswag_acc, s.first_hellaswag_step) +
            (s.last_hellaswag_step != s.first_hellaswag_step
                 ? strformat(" -> %.4f (step %d)", s.last_hellaswag_acc, s.last_hellaswag_step)
                 : ""));
    if (s.steps_run > 0) add(strformat("train loss %.4f | %.0f tok/s mean", s.last_train_loss, s.mean_tokens_per_s));
    return text;
}

// The validation loss: the mean over the first val_steps windows of B*T+1 tokens of the validation
// shards, in file order (`val` is a one-rank loader, so the windows do not depend on the mesh).
// Data-parallel rank r evaluates windows r, r + dp, ...; the losses are gathered and summed in window
// order, so every mesh reports the same number (bitwise where the windows' losses are). Evaluation
// may be collective over the data-parallel group (ZeRO-3 gathers parameters), so every rank makes as
// many passes as the busiest: a rank past the last window evaluates its batch again, unused.
inline float validation_loss(Model& model, DataLoader& val, Communicator& dp, int val_steps, int B, int T) {
    const int windows = (int)std::min<size_t>(val_steps, val.batches_per_epoch());
    const int ranks = dp.world_size(), passes = (windows + ranks - 1) / ranks;
    std::vector<double> mine(passes, 0.0);
    val.reset();
    for (int pass = 0; pass < passes; pass++) {
        const bool has_window = pass * ranks + dp.rank() < windows;
        if (has_window) {
            for (int skip = pass == 0 ? dp.rank() : ranks - 1; skip > 0; skip--) val.skip_batch();
            val.next_batch();
        }
        const float loss = model.evaluate(val.inputs(), val.targets(), B, T);
        if (has_window) mine[pass] = loss;
    }
    const std::vector<double> all = all_gather_doubles(dp, mine);  // rank r's pass p at r * passes + p
    double total = 0.0;
    for (int w = 0; w < windows; w++) total += all[(size_t)(w % ranks) * passes + w / ranks];
    return (float)(total / windows);
}

// Whether the run evaluates (validation loss, HellaSwag) after `step` steps: every -v steps from 0,
// and after the last.
inline bool evaluates_after(const RunConfig& cfg, int step) {
    return cfg.val_every > 0 && step >= 0 && step <= cfg.steps && (step % cfg.val_every == 0 || step == cfg.steps);
}
inline bool validates_after(const RunConfig& cfg, int step) { return !cfg.val_data.empty() && evaluates_after(cfg, step); }

// Why fault `f` (faults.h) cannot fire in the run `cfg` describes ("" where it can): a rank the run
// does not have; a step it does not run, or one without the validation (nan_val) or the checkpoint
// (ckpt_fail, ckpt_pause) the fault strikes; a sleep of 0 ms; slow_init from --faults, read only
// after MPI_Init, or in a run no launcher started (`launched`), which has no MPI_Init.
inline std::string why_fault_never_fires(const Fault& f, const RunConfig& cfg, bool launched) {
    if (f.rank >= cfg.world_size)
        return strformat("rank %d does not exist: the run has %d rank(s), 0 to %d", f.rank, cfg.world_size,
                         cfg.world_size - 1);
    if (f.kind == "slow" || f.kind == "slow_init") {
        if (f.step == 0) return "a sleep of 0 ms does nothing";
        if (f.kind == "slow_init" && f.source != FAULTS_ENV)
            return "slow_init acts before MPI_Init, which runs before the flags are read: give it in LLMC_FAULTS";
        if (f.kind == "slow_init" && !launched)
            return "slow_init acts before MPI_Init, and a run that mpirun or srun did not start has none";
        return "";
    }
    if (f.kind == "nan_val")
        return validates_after(cfg, f.step) ? ""
               : strformat("there is no validation after step %d (validation after step 0, every -v %d steps and "
                           "after the last, -x %d%s)", f.step, cfg.val_every, cfg.steps,
                           cfg.val_data.empty() ? "; and -j is empty" : "");
    if (f.step < 1 || f.step > cfg.steps)
        return strformat("step %d is not one of the run's steps, 1 to %d (-x; steps count from 1)", f.step, cfg.steps);
    if (f.kind != "ckpt_fail" && f.kind != "ckpt_pause") return "";
    for (const CheckpointTier& tier : checkpoint_tiers(cfg))
        if (tier.due(f.step, cfg.steps)) return "";
    return strformat("no checkpoint is written after step %d (-n %d, --local-ckpt-every %d, -x %d)", f.step,
                     cfg.checkpoint_every, cfg.local_ckpt_every, cfg.steps);
}

class Trainer {
public:
    // dp: the data-parallel communicator (ProcessGroups::dp()). metrics_path: where world rank 0
    // writes the JSONL metrics and prints ("" for none). world: every rank of the job, each of which
    // writes its own checkpoint file (null: dp is the world). replicas: the ranks that hold the same
    // parameters, whose fingerprints must agree and which share a local-tier restore: the data x
    // context group (ProcessGroups::dp_cp(); null: dp), or under expert parallelism the expert data
    // group (ProcessGroups::expert_data(): the others hold other experts), dp then sharing the
    // restore of the buckets that are not experts.
    Trainer(const RunConfig& cfg, Model& model, Communicator& dp, const std::string& metrics_path,
            Communicator* world = nullptr, Communicator* replicas = nullptr)
        : cfg_(cfg), schedule_(lr_schedule_of(cfg)), model_(model), dp_(dp), world_(world ? *world : dp),
          replicas_(replicas ? *replicas : dp),
          train_(cfg.train_data, cfg.batch_size, cfg.seq_len, dp.rank(), dp.world_size(),
                 cfg.model_config.vocab_size, cfg.shuffle, cfg.seed, cfg.grad_accum_steps),
          metrics_path_((world ? world->rank() : dp.rank()) == 0 ? metrics_path : ""),
          sample_rng_(sampling_seed(cfg.seed)) {
        if (dp.world_size() != cfg.dims.dp)
            fail(strformat("Trainer: the config was resolved for %d data-parallel rank(s) but the data-parallel "
                           "communicator has %d",
                           cfg.dims.dp, dp.world_size()));
        // The validation loader is a one-rank one: every rank sees the windows in file order, and
        // validation_loss takes each rank's share of them.
        if (!cfg.val_data.empty() && cfg.val_every > 0)
            val_ = std::make_unique<DataLoader>(cfg.val_data, cfg.batch_size, cfg.seq_len, 0, 1,
                                                cfg.model_config.vocab_size, false, cfg.seed);
        if (cfg.hellaswag == 1 && cfg.val_every > 0) hellaswag_ = open_hellaswag(cfg);
        if (!cfg.tokenizer.empty() && cfg.sample_every > 0) {
            tokenizer_ = std::make_unique<Tokenizer>(cfg.tokenizer);
            if (tokenizer_->vocab_size() != cfg.model_config.vocab_size)
                fail(strformat("tokenizer '%s' has %d tokens but the model's vocab_size is %d", cfg.tokenizer.c_str(),
                               tokenizer_->vocab_size(), cfg.model_config.vocab_size));
        }
    }

    // The dense bf16 peak of one rank's device in TFLOP/s (mfu.h), for the step line's MFU; 0: none.
    void set_peak_tflops(double peak_tflops) { peak_tflops_ = peak_tflops; }
    // The factor over the median past which --log-rank-times names a step's slowest rank (0: never;
    // health_check's answer, which is 0 where the ranks share CPUs).
    void set_straggler_factor(double factor) { straggler_factor_ = factor; }
    // Hybrid sharding (--dp-shard): the ranks that hold the same ZeRO shard (ProcessGroups::
    // zero_replicas), among which a local-tier restore shares a shard's state.
    void set_zero_replicas(Communicator* replicas) { zero_replicas_ = replicas; }

    // started: called once the state is loaded and the first step begins (main uses it to tell a
    // configuration error from a failure during training).
    TrainSummary run(const std::function<void()>& started = nullptr) {
        summary_ = TrainSummary{};
        const int first_step = resume();
        std::unique_ptr<CheckpointWriter> checkpoints;
        if (cfg_.checkpoint_every > 0 || cfg_.local_ckpt_every > 0)
            checkpoints = std::make_unique<CheckpointWriter>(cfg_, run_config_json(cfg_), model_.sharded_state(),
                                                             model_.layout(), world_);
        if (started) started();
        if (fingerprints_on() && cfg_.zero_stage == 3)
            log_.log_event("fingerprints: off under ZeRO-3 (the parameters are sharded, no rank holds a replica to compare)",
                           {{"step", first_step}, {"event", "fingerprints_off"}, {"reason", "zero_stage 3"}});
        summary_.first_step = last_verified_step_ = first_step;
        run_start_ = std::chrono::steady_clock::now();  // elapsed time and ETA count from here
        int step = first_step;
        while (step <= cfg_.steps) {
            const bool last = step == cfg_.steps;
            if (val_ && validates_after(cfg_, step)) validate(step);
            if (hellaswag_ && evaluates_after(cfg_, step)) evaluate_hellaswag(step);
            if (tokenizer_ && step > 0 && (step % cfg_.sample_every == 0 || last)) print_samples(step);
            if (last) break;
            const bool skipped = train_step(step, checkpoints.get());
            step++;
            if (went_back(checkpoints.get(), step, skipped)) continue;
            if (checkpoints && checkpoints->due(step))
                checkpoints->save(TrainState{step, train_.state(), sample_rng_.state(),
                                             !fingerprints_on() || cfg_.zero_stage == 3 || step == last_verified_step_,
                                             {}});
            if (checkpoints) log_checkpoints(checkpoints->take_finished());
        }
        if (checkpoints) {
            checkpoints->finish();
            log_checkpoints(checkpoints->take_finished());
        }
        summary_.mean_tokens_per_s = mean_tokens_per_s();
        summary_.evaluated_only = cfg_.steps == 0;
        return summary_;
    }

private:
    // What the data-parallel ranks agreed on for one step: its loss (the mean over every rank's
    // micro-batches), the gradient norm the guards judged, and why the update is skipped ("" if not).
    struct StepVerdict {
        double loss;
        float grad_norm;
        std::string skip_reason;
    };

    bool fingerprints_on() const { return cfg_.fingerprint_every > 0 && cfg_.dims.dp * cfg_.dims.cp > 1; }

    // The validation after `step` steps (collective); a non-finite loss ends the run.
    void validate(int step) {
        float loss = validation_loss(model_, *val_, dp_, cfg_.val_steps, cfg_.batch_size, cfg_.seq_len);
        if (faults().fire("nan_val", step, -1)) loss = NAN;
        log_.log_val(step, loss);
        if (!std::isfinite(loss))  // the same on every rank (summed over them)
            fail_with(EXIT_DIVERGED, strformat("validation loss is %g after step %d: the model's outputs are "
                                               "not finite (training diverged: try a lower -l)", loss, step));
        if (summary_.first_val_step < 0) {
            summary_.first_val_step = step;
            summary_.first_val_loss = loss;
        }
        summary_.last_val_step = step;
        summary_.last_val_loss = loss;
    }

    // -h 1's file, read and checked before the run touches its output directory; a missing one is
    // named with where it comes from and how to make it.
    static std::unique_ptr<EvalSet> open_hellaswag(const RunConfig& cfg) {
        const std::string& path = cfg.eval_hellaswag;
        const bool default_file = !cfg.given.count("eval_hellaswag");
        if (!std::filesystem::exists(path))
            fail(strformat("-h 1: the HellaSwag file '%s'%s does not exist: make it with `python3 "
                           "dev/data/hellaswag.py` (it downloads HellaSwag's validation split; --input FILE.jsonl "
                           "reads a local copy)%s", path.c_str(), default_file ? " (the default)" : "",
                           default_file ? ", or give another with --eval-hellaswag FILE" : ""));
        return std::make_unique<EvalSet>(path, cfg.model_config.vocab_size, cfg.seq_len,
                                         default_file ? "-h 1" : "--eval-hellaswag");
    }

    // HellaSwag's accuracy after `step` steps (collective), logged with its time beside a step's.
    void evaluate_hellaswag(int step) {
        const auto start = std::chrono::steady_clock::now();
        const HellaswagResult r = hellaswag_accuracy(model_, *hellaswag_, dp_, cfg_.batch_size, cfg_.seq_len);
        log_.log_hellaswag(step, r.correct, r.items, ms_since(start), last_step_ms_);
        if (summary_.first_hellaswag_step < 0) {
            summary_.first_hellaswag_step = step;
            summary_.first_hellaswag_acc = r.accuracy();
        }
        summary_.last_hellaswag_step = step;
        summary_.last_hellaswag_acc = r.accuracy();
    }

    // Optimizer step step + 1 (collective): the forward and backward of its micro-batches, the
    // ranks' joint decision on its update, the update, and its log. Returns whether it was skipped.
    bool train_step(int step, CheckpointWriter* checkpoints) {
        const auto start = std::chrono::steady_clock::now();
        flight_recorder().set_step(step + 1);  // dist/flight_recorder.h: reports name the step
        const DataLoaderState data_at = train_.state();  // where this step's batches come from
        model_.take_exposed_comm_ms();  // the step's own: not validation's or sampling's waits
        model_.zero_grad();
        read_step_batches();
        // Each data-parallel rank's micro-batch loss is a mean over its B*T tokens; this scale makes
        // the summed gradient the mean over the whole global batch.
        const float grad_scale = 1.0f / ((float)cfg_.grad_accum_steps * cfg_.dims.dp);
        const double loss_sum = model_.forward_backward_step(step_inputs_.data(), step_targets_.data(),
                                                             cfg_.grad_accum_steps, cfg_.batch_size, cfg_.seq_len,
                                                             grad_scale);
        inject_step_faults(step + 1, world_.rank());  // faults.h: off unless asked for
        if (faults().fire("nan_grad", step + 1, world_.rank())) {
            fprintf(stderr, "fault injection: rank %d puts a NaN into its gradient in step %d\n", world_.rank(),
                    step + 1);
            model_.sharded_state().poison_gradient();
        }
        const double compute_ms = ms_since(start);
        const float grad_norm = (float)std::sqrt(model_.grad_norm_squared());
        const StepVerdict verdict = agree_on_step(step + 1, loss_sum, grad_norm);
        // torch.nn.utils.clip_grad_norm_'s rule, so the CPU reference matches PyTorch exactly.
        const float clip_coef = cfg_.grad_clip > 0 ? cfg_.grad_clip / (grad_norm + 1e-6f) : 1.0f;
        const AdamWConfig opt{schedule_.lr_at(step), cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay};
        const bool skip = !verdict.skip_reason.empty();
        if (!skip) {
            if (checkpoints) checkpoints->before_update();
            model_.adamw_step(opt, step + 1, clip_coef < 1.0f ? clip_coef : 1.0f);
        }
        last_step_ms_ = ms_since(start);
        log_step(step + 1, verdict, opt.lr, last_step_ms_, compute_ms);
        count_skip(step + 1, verdict, data_at);
        if (faults().fire("flip_bit", step + 1, world_.rank())) {
            const std::string what = model_.sharded_state().flip_parameter_bit();
            fprintf(stderr, "fault injection: rank %d flips %s after step %d\n", world_.rank(), what.c_str(), step + 1);
        }
        return skip;
    }

    // The step's micro-batches, read first, back to back: a pipeline runs them in its own order.
    void read_step_batches() {
        const size_t BT = (size_t)cfg_.batch_size * cfg_.seq_len;
        step_inputs_.resize(BT * cfg_.grad_accum_steps);
        step_targets_.resize(BT * cfg_.grad_accum_steps);
        for (int micro = 0; micro < cfg_.grad_accum_steps; micro++) {
            train_.next_batch();
            std::copy(train_.inputs(), train_.inputs() + BT, step_inputs_.begin() + micro * BT);
            std::copy(train_.targets(), train_.targets() + BT, step_targets_.begin() + micro * BT);
        }
    }

    // One gather gives every rank every rank's loss and gradient norm: the loss is summed in rank
    // order (as sum_over_ranks does: the same bits everywhere) and the guards decide on the largest
    // norm, so every rank takes the same decision even where one rank's gradient went bad after the
    // all-reduce (ZeRO-0 computes the norm locally). Collective.
    StepVerdict agree_on_step(int step, double loss_sum, float grad_norm) {
        const std::vector<double> all = all_gather_doubles(dp_, {loss_sum, (double)grad_norm});
        double loss_total = 0.0;
        float agreed_norm = 0.0f;
        for (size_t r = 0; r < all.size(); r += 2) {
            loss_total += all[r];
            const float n = (float)all[r + 1];
            if (std::isfinite(agreed_norm) && (!std::isfinite(n) || n > agreed_norm)) agreed_norm = n;
        }
        StepVerdict v{loss_total / (cfg_.grad_accum_steps * cfg_.dims.dp), agreed_norm, ""};
        v.skip_reason = guard_reason((float)v.loss, agreed_norm);
        // Other data-parallel groups (tensor or pipeline parallel ranks) must skip together too.
        if (world_.world_size() != dp_.world_size() && !all_ranks(world_, v.skip_reason.empty()) &&
            v.skip_reason.empty())
            v.skip_reason = "another data-parallel group skips this step";
        // --max-skips 0 turns the rollback off: a non-finite value then ends the run instead of
        // being skipped for ever (and the run ending with exit 0).
        if (!v.skip_reason.empty() && cfg_.max_skips == 0 && (!std::isfinite(v.loss) || !std::isfinite(agreed_norm)))
            fail_with(EXIT_DIVERGED, strformat("training diverged: step %d has a non-finite %s (loss %g, gradient "
                                               "norm %g) and --max-skips 0 allows no rollback (try a lower -l)",
                                               step, !std::isfinite(v.loss) ? "loss" : "gradient norm", v.loss,
                                               agreed_norm));
        return v;
    }

    // The step's line and record, and its part of the summary.
    void log_step(int step, const StepVerdict& v, float lr, double step_ms, double compute_ms) {
        StepMetrics m;
        m.step = step;
        m.total_steps = cfg_.steps;
        m.train_loss = (float)v.loss;
        m.comm_ms = model_.take_exposed_comm_ms();
        m.router = model_.take_router_stats();
        m.fp8 = model_.take_fp8_stats();
        m.lr = lr;
        m.grad_norm = v.grad_norm;
        m.step_ms = step_ms;
        m.tokens_per_s = cfg_.total_batch_tokens / (step_ms / 1000.0);
        m.skipped = !v.skip_reason.empty();
        const int steps_run = ++summary_.steps_run;
        m.elapsed_s = ms_since(run_start_) / 1000.0;
        m.eta_s = m.elapsed_s / steps_run * (cfg_.steps - m.step);
        m.mfu = model_flops_utilization(model_flops_per_token(cfg_.model_config, cfg_.seq_len), m.tokens_per_s,
                                        peak_tflops_, world_.world_size());
        log_.log_step(m);
        if (cfg_.log_rank_times) log_rank_times(world_, log_, m.step, compute_ms, straggler_factor_);  // health.h
        summary_.last_train_loss = m.train_loss;
        summary_.train_losses.push_back(m.train_loss);
        (steps_run == 1 ? first_step_ms_ : later_steps_ms_) += step_ms;
    }

    // Tokens per second over this process's steps but the first, which warms caches and allocators
    // up, unless it is the only one; 0 when no step ran.
    double mean_tokens_per_s() const {
        const int n = summary_.steps_run;
        if (n == 0) return 0;
        const double ms = n > 1 ? later_steps_ms_ : first_step_ms_;
        return (n > 1 ? n - 1 : 1) * (double)cfg_.total_batch_tokens / (ms / 1000.0);
    }

    // A skipped update is counted and logged with its data position; an applied one ends a run of skips.
    void count_skip(int step, const StepVerdict& v, const DataLoaderState& data_at) {
        if (v.skip_reason.empty()) {
            consecutive_skips_ = 0;
            updated_since_rollback_ = true;
            return;
        }
        summary_.skipped_steps++;
        consecutive_skips_++;
        log_.log_event(strformat("guard: step %d update skipped: %s (loss %g, grad norm %g); data position "
                                 "epoch %d shard %zu round %zu batch %zu; %d skipped so far, %d in a row",
                                 step, v.skip_reason.c_str(), (float)v.loss, v.grad_norm, data_at.epoch,
                                 data_at.shard_index, data_at.round_index, data_at.batch_in_round,
                                 summary_.skipped_steps, consecutive_skips_),
                       {{"step", step}, {"event", "skip"}, {"reason", v.skip_reason}, {"loss", (float)v.loss},
                        {"grad_norm", v.grad_norm}, {"data", data_at}, {"skipped_total", summary_.skipped_steps},
                        {"consecutive", consecutive_skips_}});
    }

    // After `step` steps: too many skips in a row roll back to the newest checkpoint, the data
    // loader left where it is so training moves past the batches that caused them; replicas whose
    // fingerprints differ replay from a verified one. Returns whether `step` went back (collective).
    bool went_back(CheckpointWriter* checkpoints, int& step, bool skipped) {
        if (skipped && cfg_.max_skips > 0 && consecutive_skips_ >= cfg_.max_skips) {
            const std::string why = strformat("%d updates skipped in a row (steps %d-%d)", consecutive_skips_,
                                              step - consecutive_skips_ + 1, step);
            if (!updated_since_rollback_ && rollbacks_ > 0)
                fail_with(EXIT_DIVERGED, strformat("training diverged: %s right after a rollback, without one "
                                                   "update in between (try a lower -l)", why.c_str()));
            if (!rollback(checkpoints, step, false, INT32_MAX, why))
                fail_with(EXIT_DIVERGED, strformat("training diverged: %s and there is no checkpoint to roll "
                                                   "back to (use -n; or try a lower -l)", why.c_str()));
            truncate_losses(step);
            summary_.rollbacks++;
            return true;
        }
        // Silent data corruption: the replicas' parameters must be bitwise equal.
        if (fingerprints_on() && cfg_.zero_stage != 3 && step % cfg_.fingerprint_every == 0 &&
            check_fingerprints(checkpoints, step)) {
            truncate_losses(step);
            summary_.replays++;
            return true;
        }
        return false;
    }

    // Why this step's update must be skipped ("" if it need not): a non-finite loss or gradient
    // norm, or a z-score above -sl / -sg. Both values are the same on every rank, so is the answer;
    // finite values then join the windows (as in llm.c, outliers too).
    std::string guard_reason(float loss, float grad_norm) {
        std::string why;
        if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
            why = strformat("non-finite %s", !std::isfinite(loss) ? "loss" : "gradient norm");
        } else if (loss_window_.is_outlier(loss, cfg_.skip_update_lossz)) {
            why = strformat("loss z-score %.2f > -sl %g", *loss_window_.zscore(loss), cfg_.skip_update_lossz);
        } else if (norm_window_.is_outlier(grad_norm, cfg_.skip_update_gradz)) {
            why = strformat("gradient norm z-score %.2f > -sg %g", *norm_window_.zscore(grad_norm),
                            cfg_.skip_update_gradz);
        }
        loss_window_.push(loss);
        norm_window_.push(grad_norm);
        return why;
    }

    // After a rollback to step `to`, the losses of the steps undone are dropped.
    void truncate_losses(int to) {
        const size_t keep = (size_t)std::max(0, to - summary_.first_step);
        if (summary_.train_losses.size() > keep) summary_.train_losses.resize(keep);
    }

    // In-process rollback to the newest complete checkpoint at or before at_most_step (collective).
    // The checkpoint being written is finished first. restore_data: the data position goes back too
    // (a replay of the same steps); otherwise it stays, and training skips past what it read.
    // Checkpoints after the one taken (either tier) are of an abandoned history and are removed. Returns false,
    // changing nothing, where there is no checkpoint; else sets `step` to the checkpoint's.
    bool rollback(CheckpointWriter* checkpoints, int& step, bool restore_data, int at_most_step, const std::string& why) {
        if (checkpoints) {
            checkpoints->finish();
            log_checkpoints(checkpoints->take_finished());
        }
        RunConfig own = cfg_;
        own.resume_from.clear();
        std::optional<ResumePoint> point = find_resume_checkpoint(own, world_, at_most_step);
        if (!point && !cfg_.resume_from.empty()) point = find_resume_checkpoint(cfg_, world_, at_most_step);
        if (!point) return false;
        const Manifest& m = point->manifest;
        load_checkpoint(*point, model_.sharded_state(), model_.layout(), &world_, restore_group(), &replicas_,
                        zero_replicas_);
        const DataLoaderState kept = train_.state();
        if (restore_data) train_.restore(m.data);
        sample_rng_.set_state(m.sampler_rng);
        remove_checkpoints_after(m.step);
        log_.supersede_after(m.step);
        const DataLoaderState d = train_.state();
        log_.log_event(strformat("rollback: %s; rolled back from step %d to %s (step %d); data position %s "
                                 "(epoch %d shard %zu round %zu batch %zu)",
                                 why.c_str(), step, point->dir.c_str(), m.step,
                                 restore_data ? "restored, the same steps are replayed" : "kept, the batches read since are skipped",
                                 d.epoch, d.shard_index, d.round_index, d.batch_in_round),
                       {{"step", m.step}, {"event", "rollback"}, {"reason", why}, {"from_step", step},
                        {"checkpoint", point->dir}, {"data", d}, {"data_restored", restore_data},
                        {"data_before", kept}});
        step = m.step;
        rollbacks_++;
        consecutive_skips_ = 0;
        updated_since_rollback_ = false;
        return true;
    }

    // Removes every checkpoint after `step`, on both tiers, each directory by its leading rank
    // (collective: done before any rank writes again). Returns how many went.
    int remove_checkpoints_after(int step) {
        int removed = 0;
        for (const CheckpointTier& tier : checkpoint_tiers(cfg_)) {
            if (!tier.leads(world_.rank())) continue;
            for (int s : checkpoint_steps_in(tier.rank_root(world_.rank())))
                if (s > step) {
                    detail::remove_tree(tier.dir(s, world_.rank()));
                    removed++;
                }
        }
        all_ranks(world_, true);
        return removed;
    }

    // Silent data corruption that cannot be replayed here: the checkpoints written since the last
    // verified step may hold the corruption, so they go (a later -y 1 must not continue from one),
    // and the run ends with EXIT_CORRUPTION.
    [[noreturn]] void stop_corrupted(CheckpointWriter* checkpoints, const std::string& msg) {
        if (checkpoints) {
            checkpoints->finish();
            log_checkpoints(checkpoints->take_finished());
        }
        const int removed = remove_checkpoints_after(last_verified_step_);
        if (removed > 0)
            log_.log_event(strformat("fingerprint: removed %d checkpoint director%s written after step %d, the last "
                                     "whose replicas agreed (they may hold the corruption)",
                                     removed, removed == 1 ? "y" : "ies", last_verified_step_),
                           {{"step", last_verified_step_}, {"event", "unverified_removed"}, {"directories", removed}});
        fail_with(EXIT_CORRUPTION, msg);
    }

    // Compares the replicas' parameter fingerprints (data and context ranks) after `step` steps
    // (collective). A mismatch names the diverging rank(s) and replays from the newest checkpoint at or before
    // the last step whose check passed (returns true, `step` set back). A rank that diverges again
    // in the replay is faulty: the run stops with EXIT_CORRUPTION. The first check at or after the
    // step of the mismatch that passes in the replay classifies it as transient.
    bool check_fingerprints(CheckpointWriter* checkpoints, int& step) {
        const auto start = std::chrono::steady_clock::now();
        const uint32_t mine = model_.sharded_state().replica_fingerprint().value_or(0);
        const std::vector<std::string> all = all_gather_strings(replicas_, strformat("%d %08x", world_.rank(), mine));
        std::vector<uint32_t> fps;
        std::vector<int> world_ranks;
        for (const std::string& s : all) {
            int r = 0;
            unsigned f = 0;
            sscanf(s.c_str(), "%d %x", &r, &f);
            world_ranks.push_back(r);
            fps.push_back(f);
        }
        bool no_majority = false;
        std::vector<int> diverging = diverging_replicas(fps, &no_majority);
        std::string local;  // "world_rank:fingerprint ..." of this group's diverging replicas
        for (int i : diverging) local += strformat("%s%d", local.empty() ? "" : " ", world_ranks[i]);
        std::string table;
        for (size_t i = 0; i < fps.size(); i++)
            table += strformat("%srank %d %08x", i ? ", " : "", world_ranks[i], fps[i]);
        if (no_majority) local += " (no majority)";
        // Every group's verdict, so all ranks of the job take the same branch.
        std::string suspects, report;
        std::vector<int> suspect_ranks;
        if (world_.world_size() == replicas_.world_size()) {
            report = local;
        } else {
            for (const std::string& g : all_gather_strings(world_, local))
                if (!g.empty() && report.find(g) == std::string::npos) report += (report.empty() ? "" : "; ") + g;
        }
        if (report.empty()) {
            last_verified_step_ = step;
            const double ms = ms_since(start);
            log_.log_event(strformat("fingerprint: the %zu replicas agree after step %d (parameter CRC32C %08x, %.1f ms)",
                                     fps.size(), step, fps[0], ms),
                           {{"step", step}, {"event", "fingerprint_ok"}, {"replicas", fps.size()},
                            {"crc32c", fps[0]}, {"ms", ms}});
            if (sdc_replay_ && step >= sdc_detected_step_) {
                log_.log_event(strformat("fingerprint: replayed to step %d and the replicas agree: the divergence of "
                                         "rank(s) %s at step %d was transient; training goes on",
                                         step, sdc_suspects_.c_str(), sdc_detected_step_),
                               {{"step", step}, {"event", "sdc_transient"}, {"ranks", sdc_suspects_},
                                {"detected_step", sdc_detected_step_}});
                sdc_replay_ = false;
            }
            return false;
        }
        for (size_t at = 0; at < report.size();) {
            while (at < report.size() && !isdigit((unsigned char)report[at])) at++;
            if (at >= report.size()) break;
            suspect_ranks.push_back(atoi(report.c_str() + at));
            while (at < report.size() && isdigit((unsigned char)report[at])) at++;
        }
        suspects = report;
        log_.log_event(strformat("fingerprint MISMATCH after step %d: rank(s) %s diverge from their replicas "
                                 "(parameter CRC32C: %s)",
                                 step, suspects.c_str(), table.c_str()),
                       {{"step", step}, {"event", "sdc_mismatch"}, {"ranks", suspects}, {"fingerprints", table},
                        {"replay", sdc_replay_}});
        if (sdc_replay_) {
            bool again = false;
            for (int r : suspect_ranks)
                for (int q : sdc_suspect_ranks_) again |= r == q;
            if (again) {
                const std::string msg =
                    strformat("silent data corruption: rank(s) %s diverged from their replicas at step %d and again "
                              "at step %d of the replay: faulty hardware; exclude the rank's node and restart",
                              suspects.c_str(), sdc_detected_step_, step);
                log_.log_event(msg, {{"step", step}, {"event", "sdc_persistent"}, {"ranks", suspects}});
                stop_corrupted(checkpoints, msg);
            }
        }
        const int detected = step;
        if (!rollback(checkpoints, step, true, last_verified_step_,
                      strformat("replicas diverged after step %d (rank(s) %s)", detected, suspects.c_str()))) {
            const std::string msg = strformat("silent data corruption: rank(s) %s diverged from their replicas at "
                                              "step %d and there is no checkpoint (at or before step %d, the last "
                                              "verified) to replay from",
                                              suspects.c_str(), detected, last_verified_step_);
            stop_corrupted(checkpoints, msg);
        }
        sdc_replay_ = true;
        sdc_detected_step_ = detected;
        sdc_suspects_ = suspects;
        sdc_suspect_ranks_ = suspect_ranks;
        return true;
    }

    // -y 1 / --resume-from: the state of the newest complete checkpoint (collective). Returns the
    // step to continue from (0: a fresh start), and opens the metrics log accordingly.
    int resume() {
        if (!cfg_.resume && cfg_.resume_from.empty()) {
            log_.open(metrics_path_);
            return 0;
        }
        std::optional<ResumePoint> point = find_resume_checkpoint(cfg_, world_);
        if (!point && !cfg_.resume_from.empty())
            fail(strformat("--resume-from '%s': no complete checkpoint there, nor before it in its directory (the "
                           "reasons are above)",
                           cfg_.resume_from.c_str()));
        if (!point) {
            if (world_.rank() == 0)
                printf("resume: no complete checkpoint in '%s'; starting fresh\n",
                       cfg_.resume_from.empty() ? cfg_.output_dir.c_str() : cfg_.resume_from.c_str());
            log_.open(metrics_path_);
            return 0;
        }
        check_resume_compatible(*point, cfg_);
        const Manifest& m = point->manifest;
        if (m.step > cfg_.steps)
            fail(strformat("cannot resume from '%s': it is after step %d but this run has only -x %d steps",
                           point->dir.c_str(), m.step, cfg_.steps));
        load_checkpoint(*point, model_.sharded_state(), model_.layout(), &world_, restore_group(), &replicas_,
                        zero_replicas_);
        train_.restore(m.data);
        sample_rng_.set_state(m.sampler_rng);
        log_.open(metrics_path_, m.step);
        log_.log_event(strformat("resumed from %s%s: step %d, written by %d rank(s) (pp %d, tp %d) at ZeRO-%d",
                                 point->dir.c_str(), point->tier.local() ? " (local tier)" : "", m.step, m.world_size,
                                 m.pp, m.tp, m.zero_stage),
                       {{"step", m.step}, {"resumed_from", point->dir}, {"tier", point->tier.local() ? "local" : "shared"},
                        {"written_by_ranks", m.world_size}, {"written_at_tp", m.tp}, {"written_at_pp", m.pp},
                        {"written_at_zero_stage", m.zero_stage}});
        return m.step;
    }

    void log_checkpoints(const std::vector<CheckpointReport>& reports) {
        for (const CheckpointReport& r : reports) {
            if (r.ok) {
                log_.log_event(strformat("checkpoint %s%s: %.1f MB in %.0f ms (%.0f MB/s), training stalled %.1f ms%s",
                                         r.dir.c_str(), r.tier == "local" ? " (local tier)" : "", r.bytes / 1e6, r.write_ms, r.mb_per_s(), r.stall_ms,
                                         r.wait_ms > 0 ? strformat(" (%.0f ms waiting for the previous one)",
                                                                   r.wait_ms).c_str() : ""),
                               {{"step", r.step}, {"checkpoint", r.dir}, {"tier", r.tier}, {"bytes", r.bytes},
                                {"write_ms", r.write_ms},
                                {"mb_per_s", r.mb_per_s()}, {"stall_ms", r.stall_ms}, {"wait_ms", r.wait_ms}});
                continue;
            }
            if (world_.rank() == 0) fprintf(stderr, "error: checkpoint %s failed: %s\n", r.dir.c_str(), r.error.c_str());
            log_.log_event(strformat("checkpoint %s FAILED (removed; earlier checkpoints are intact)%s", r.dir.c_str(),
                                     cfg_.ckpt_fail_stop ? "" : "; training goes on"),
                           {{"step", r.step}, {"checkpoint", r.dir}, {"error", r.error}});
            if (cfg_.ckpt_fail_stop)
                fail_with(EXIT_CKPT_FAILED, strformat("checkpoint %s failed and --ckpt-fail-stop is set: %s",
                                                      r.dir.c_str(), r.error.c_str()));
        }
    }

    // One unconditional sample (from <|endoftext|>) and, when validation data exists, one continuing
    // the opening tokens of the first validation document.
    void print_samples(int step) {
        std::vector<int> tokens = {tokenizer_->eot_token()};
        generate(model_, tokens, cfg_.sample_tokens, cfg_.temperature, sample_rng_);
        log_.log_sample(step, "", tokenizer_->decode(std::vector<int>(tokens.begin() + 1, tokens.end())));
        if (!val_) return;
        std::vector<int> prompt = validation_prompt(16);
        tokens = prompt;
        generate(model_, tokens, cfg_.sample_tokens, cfg_.temperature, sample_rng_);
        bool starts_document = prompt[0] == tokenizer_->eot_token();
        log_.log_sample(step, tokenizer_->decode(std::vector<int>(prompt.begin() + starts_document, prompt.end())),
                        tokenizer_->decode(std::vector<int>(tokens.begin() + prompt.size(), tokens.end())));
    }

    // The first prompt_tokens tokens of the first validation document, starting at its <|endoftext|>.
    std::vector<int> validation_prompt(int prompt_tokens) {
        val_->reset();
        val_->next_batch();
        const int* tokens = val_->inputs();
        int n = cfg_.batch_size * cfg_.seq_len, begin = 0;
        while (begin < n && tokens[begin] != tokenizer_->eot_token()) begin++;
        if (begin + prompt_tokens > n) begin = 0;
        return std::vector<int>(tokens + begin, tokens + std::min(n, begin + prompt_tokens));
    }

    const RunConfig& cfg_;
    const LrSchedule schedule_;
    Model& model_;
    Communicator& dp_;
    Communicator& world_;
    Communicator& replicas_;
    Communicator* zero_replicas_ = nullptr;  // hybrid sharding: the replicas of this rank's ZeRO shard
    // The ranks that share a local-tier restore of the buckets that are not experts (ProcessGroups::
    // dp_cp(): dp, since experts do not run with --cp; replicas_ then holds only the same experts).
    Communicator* restore_group() { return cfg_.dims.ep > 1 ? &dp_ : &replicas_; }
    DataLoader train_;
    std::vector<int> step_inputs_, step_targets_;  // one step's micro-batches, back to back
    std::unique_ptr<DataLoader> val_;
    std::unique_ptr<EvalSet> hellaswag_;  // -h 1's items
    double last_step_ms_ = -1;            // the last step's time, beside an evaluation's (-1: none yet)
    std::unique_ptr<Tokenizer> tokenizer_;
    std::string metrics_path_;
    MetricsLog log_;
    double peak_tflops_ = 0;
    double straggler_factor_ = cfg_.straggler_factor;
    Rng sample_rng_;
    // this run()
    TrainSummary summary_;
    std::chrono::steady_clock::time_point run_start_;
    double first_step_ms_ = 0, later_steps_ms_ = 0;
    // guards
    ZScoreWindow loss_window_, norm_window_;
    int consecutive_skips_ = 0;
    int rollbacks_ = 0;
    bool updated_since_rollback_ = true;
    int last_verified_step_ = 0;  // the last step whose fingerprint check passed (or the start)
    bool sdc_replay_ = false;     // replaying after a fingerprint mismatch
    int sdc_detected_step_ = 0;
    std::string sdc_suspects_;
    std::vector<int> sdc_suspect_ranks_;
};

}  // namespace llmc
