// train_loop.h: the training loop, shared by the CPU and the CUDA trainer.
//
// Host orchestration only: it knows a Model through model.h's interface and nothing of CUDA. One
// optimizer step = grad_accum_steps micro-batches of forward+backward (gradients accumulate, each
// scaled by 1/grad_accum_steps so the sum is the mean over the whole batch), then the global
// gradient norm, clipping, and AdamW at the scheduled learning rate. Validation and samples happen
// between steps and never touch the training data order or the training RNG.
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
#include <functional>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "llmc/ckpt/checkpoint.h"
#include "llmc/dist/comm.h"
#include "llmc/dist/flight_recorder.h"
#include "llmc/config.h"
#include "llmc/dataloader.h"
#include "llmc/exit_codes.h"
#include "llmc/faults.h"
#include "llmc/health.h"
#include "llmc/metrics.h"
#include "llmc/model.h"
#include "llmc/rng.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"

namespace llmc {

struct TrainSummary {
    float first_val_loss = NAN, last_val_loss = NAN;
    float last_train_loss = NAN;
    std::vector<float> train_losses;  // every step's loss, averaged over ranks
    double mean_tokens_per_s = 0;  // over all steps but the first (warm-up of caches and allocators)
};

// Mean loss over the first val_steps batches of every data-parallel rank's validation windows (the
// same batches every time); dp is the data-parallel communicator.
inline float validation_loss(Model& model, DataLoader& val, Communicator& dp, int val_steps, int B, int T) {
    val.reset();
    int batches = (int)std::min<size_t>(val_steps, val.batches_per_epoch());
    double total = 0.0;
    for (int i = 0; i < batches; i++) {
        val.next_batch();
        total += model.evaluate(val.inputs(), val.targets(), B, T);
    }
    return (float)(sum_over_ranks(dp, total / batches) / dp.world_size());
}

class Trainer {
public:
    // dp: the data-parallel communicator (ProcessGroups::dp()). metrics_path: where its rank 0
    // writes the JSONL metrics ("" for none). world: every rank of the job, each of which writes
    // its own checkpoint file (null: dp is the world).
    Trainer(const RunConfig& cfg, Model& model, Communicator& dp, const std::string& metrics_path,
            Communicator* world = nullptr)
        : cfg_(cfg), model_(model), dp_(dp), world_(world ? *world : dp),
          train_(cfg.train_data, cfg.batch_size, cfg.seq_len, dp.rank(), dp.world_size(),
                 cfg.model_config.vocab_size, cfg.shuffle, cfg.seed, cfg.grad_accum_steps),
          metrics_path_(dp.rank() == 0 ? metrics_path : ""),
          sample_rng_(cfg.seed ^ 0x5A4D504C45ull) {
        if (dp.world_size() != cfg.dims.dp)
            fail(strformat("Trainer: the config was resolved for %d data-parallel rank(s) but the data-parallel "
                           "communicator has %d",
                           cfg.dims.dp, dp.world_size()));
        if (!cfg.val_data.empty() && cfg.val_every > 0)
            val_ = std::make_unique<DataLoader>(cfg.val_data, cfg.batch_size, cfg.seq_len, dp.rank(), dp.world_size(),
                                                cfg.model_config.vocab_size, false, cfg.seed);
        if (!cfg.tokenizer.empty() && cfg.sample_every > 0) {
            tokenizer_ = std::make_unique<Tokenizer>(cfg.tokenizer);
            if (tokenizer_->vocab_size() != cfg.model_config.vocab_size)
                fail(strformat("tokenizer '%s' has %d tokens but the model's vocab_size is %d", cfg.tokenizer.c_str(),
                               tokenizer_->vocab_size(), cfg.model_config.vocab_size));
        }
    }

    // started: called once the state is loaded and the first step begins (main uses it to tell a
    // configuration error from a failure during training).
    TrainSummary run(const std::function<void()>& started = nullptr) {
        TrainSummary summary;
        LrSchedule schedule = lr_schedule_of(cfg_);
        AdamWConfig opt{cfg_.lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay};
        const int B = cfg_.batch_size, T = cfg_.seq_len;
        // Each data-parallel rank's micro-batch loss is a mean over its B*T tokens; this scale makes
        // the summed gradient the mean over the whole global batch.
        const float grad_scale = 1.0f / ((float)cfg_.grad_accum_steps * cfg_.dims.dp);
        double timed_ms = 0;
        long long timed_tokens = 0;

        const int first_step = resume();
        std::unique_ptr<CheckpointWriter> checkpoints;
        if (cfg_.checkpoint_every > 0 || cfg_.local_ckpt_every > 0)
            checkpoints = std::make_unique<CheckpointWriter>(cfg_, run_config_json(cfg_), model_.sharded_state(),
                                                             model_.layout(), world_);

        if (started) started();
        for (int step = first_step; step <= cfg_.steps; step++) {
            bool last = step == cfg_.steps;
            if (val_ && (step % cfg_.val_every == 0 || last)) {
                float loss = validation_loss(model_, *val_, dp_, cfg_.val_steps, B, T);
                log_.log_val(step, loss);
                if (std::isnan(summary.first_val_loss)) summary.first_val_loss = loss;
                summary.last_val_loss = loss;
            }
            if (tokenizer_ && step > 0 && (step % cfg_.sample_every == 0 || last)) print_samples(step);
            if (last) break;

            auto start = std::chrono::steady_clock::now();
            flight_recorder().set_step(step + 1);  // dist/flight_recorder.h: reports name the step
            model_.zero_grad();
            double loss_sum = 0.0;
            for (int micro = 0; micro < cfg_.grad_accum_steps; micro++) {
                train_.next_batch();
                loss_sum += model_.forward_backward(train_.inputs(), train_.targets(), B, T, grad_scale,
                                                    micro == cfg_.grad_accum_steps - 1);
            }
            inject_step_faults(step + 1, world_.rank());  // faults.h: off unless asked for
            const double compute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
            const double step_loss = sum_over_ranks(dp_, loss_sum) / (cfg_.grad_accum_steps * cfg_.dims.dp);
            float grad_norm = (float)std::sqrt(model_.grad_norm_squared());
            // torch.nn.utils.clip_grad_norm_'s rule, so the CPU reference matches PyTorch exactly.
            float clip_coef = cfg_.grad_clip > 0 ? cfg_.grad_clip / (grad_norm + 1e-6f) : 1.0f;
            float grad_multiplier = clip_coef < 1.0f ? clip_coef : 1.0f;
            opt.lr = schedule.lr_at(step);
            if (checkpoints) checkpoints->before_update();
            model_.adamw_step(opt, step + 1, grad_multiplier);
            double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

            StepMetrics m;
            m.step = step + 1;
            m.total_steps = cfg_.steps;
            m.train_loss = (float)step_loss;
            m.comm_ms = model_.take_exposed_comm_ms();
            m.lr = opt.lr;
            m.grad_norm = grad_norm;
            m.step_ms = step_ms;
            m.tokens_per_s = cfg_.total_batch_tokens / (step_ms / 1000.0);
            log_.log_step(m);
            if (cfg_.log_rank_times) log_rank_times(world_, log_, m.step, compute_ms, cfg_.straggler_factor);  // health.h
            if (!std::isfinite(m.train_loss))
                fail_with(EXIT_DIVERGED,
                          strformat("training diverged: loss is %f at step %d (try a lower -l)", m.train_loss, m.step));
            summary.last_train_loss = m.train_loss;
            summary.train_losses.push_back(m.train_loss);
            if (step > first_step) {
                timed_ms += step_ms;
                timed_tokens += cfg_.total_batch_tokens;
            }
            if (checkpoints && checkpoints->due(step + 1))
                checkpoints->save(TrainState{step + 1, train_.state(), sample_rng_.state()});
            if (checkpoints) log_checkpoints(checkpoints->take_finished());
        }
        if (checkpoints) {
            checkpoints->finish();
            log_checkpoints(checkpoints->take_finished());
        }
        if (timed_ms > 0) summary.mean_tokens_per_s = timed_tokens / (timed_ms / 1000.0);
        return summary;
    }

private:
    // -y 1 / --resume-from: the state of the newest complete checkpoint (collective). Returns the
    // step to continue from (0: a fresh start), and opens the metrics log accordingly.
    int resume() {
        if (!cfg_.resume && cfg_.resume_from.empty()) {
            log_.open(metrics_path_);
            return 0;
        }
        std::optional<ResumePoint> point = find_resume_checkpoint(cfg_, world_);
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
        load_checkpoint(*point, model_.sharded_state(), model_.layout(), &world_);
        train_.restore(m.data);
        sample_rng_.set_state(m.sampler_rng);
        log_.open(metrics_path_, m.step);
        log_.log_event(strformat("resumed from %s%s: step %d, written by %d rank(s) at ZeRO-%d", point->dir.c_str(),
                                 point->tier.local() ? " (local tier)" : "", m.step, m.world_size, m.zero_stage),
                       {{"step", m.step}, {"resumed_from", point->dir}, {"tier", point->tier.local() ? "local" : "shared"},
                        {"written_by_ranks", m.world_size}, {"written_at_zero_stage", m.zero_stage}});
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
            if (dp_.rank() == 0) fprintf(stderr, "error: checkpoint %s failed: %s\n", r.dir.c_str(), r.error.c_str());
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
    Model& model_;
    Communicator& dp_;
    Communicator& world_;
    DataLoader train_;
    std::unique_ptr<DataLoader> val_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::string metrics_path_;
    MetricsLog log_;
    Rng sample_rng_;
};

}  // namespace llmc
