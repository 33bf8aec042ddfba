// metrics.h: what a run reports: one aligned console line per step and a JSONL metrics file.
//
// The console is for a human glancing at a run's health; <output_dir>/metrics.jsonl is for tools
// (one JSON object per line, flushed at once, so a crashed run still leaves every finished step).
// A log made with an empty path is silent: the ranks other than 0 keep one of those.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "llmc/utils.h"

namespace llmc {

struct StepMetrics {
    int step = 0;  // 1-based: the number of optimizer updates done after this step
    int total_steps = 0;
    float train_loss = 0;
    float lr = 0;
    float grad_norm = 0;
    double step_ms = 0;
    double comm_ms = 0;  // of step_ms, the time spent waiting for communication (not overlapped)
    double tokens_per_s = 0;
};

class MetricsLog {
public:
    explicit MetricsLog(const std::string& path) {
        if (!path.empty()) file_ = std::make_unique<File>(path, "wb");
    }

    void log_step(const StepMetrics& m) {
        if (!file_) return;
        printf("step %*d/%d | loss %7.4f | lr %.2e | norm %7.4f | %8.1f ms | comm %6.1f ms | %9.0f tok/s\n",
               digits(m.total_steps), m.step, m.total_steps, m.train_loss, m.lr, m.grad_norm, m.step_ms, m.comm_ms,
               m.tokens_per_s);
        fflush(stdout);
        write({{"step", m.step}, {"train_loss", m.train_loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm},
               {"step_ms", m.step_ms}, {"comm_ms", m.comm_ms}, {"tokens_per_s", m.tokens_per_s}});
    }
    void log_val(int step, float val_loss) {
        if (!file_) return;
        printf("val loss %.4f (after %d steps)\n", val_loss, step);
        fflush(stdout);
        write({{"step", step}, {"val_loss", val_loss}});
    }
    void log_sample(int step, const std::string& prompt, const std::string& completion) {
        if (!file_) return;
        printf("---- sample after %d steps%s ----\n%s%s\n--------\n", step, prompt.empty() ? "" : " (prompted)",
               prompt.c_str(), completion.c_str());
        fflush(stdout);
        write({{"step", step}, {"prompt", prompt}, {"sample", completion}});
    }

private:
    static int digits(int n) { return (int)std::to_string(n).size(); }
    void write(const nlohmann::json& record) {
        // Decoded samples may end mid-way through a multi-byte character; replace, don't throw.
        std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
        file_->write(line.data(), line.size());
        file_->flush();
    }
    std::unique_ptr<File> file_;
};

}  // namespace llmc
