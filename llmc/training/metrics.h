// metrics.h: what a run reports: one aligned console line per step and a JSONL metrics file.
//
// The console is for a human glancing at a run's health; <output_dir>/metrics.jsonl is for tools
// (one JSON object per line, flushed at once, so a crashed run still leaves every finished step;
// each with its wall-clock "time"). dev/plot_metrics.py draws the curves from it. A run that goes
// back (a resume rewrites the file without the steps it repeats; a rollback or replay marks their
// records "superseded": true and keeps them) still reads as one curve.
// A log made with an empty path is silent: the ranks other than 0 keep one of those.
// A record that cannot be written (a full disk) does not stop training, which matters more than its
// log: the first failure is warned about, naming the file and the error, the part of the record
// written is cut off so the file keeps whole lines, and later records are tried again.
#pragma once

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "llmc/model.h"  // RouterStats
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
    bool skipped = false;  // the update was skipped (train_loop.h's guards)
    double elapsed_s = 0;  // since this process's first step (validation and samples included)
    double eta_s = 0;      // the steps left at this process's mean time per step so far
    double mfu = -1;       // model FLOPs utilization in [0, 1] (mfu.h); < 0: unknown (no peak, e.g. the CPU)
    RouterStats router;    // a mixture-of-experts model's routing (router.passes 0: a dense model)
    Fp8Stats fp8;          // what FP8 quantizing clipped (no elements: no --fp8)
};

// " | fp8 sat 3 flush 0.01%": saturated elements and the share of elements flushed to zero.
inline std::string fp8_summary(const Fp8Stats& s) {
    const Fp8Counts t = s.total();
    if (!t.elements) return "";
    return strformat(" | fp8 sat %llu flush %.2f%%", (unsigned long long)t.overflows, 100.0 * t.underflows / t.elements);
}
// {"qkv": {"input": [elements, saturated, flushed], "weight": [...], "grad": [...]}, "attproj": ...}
inline nlohmann::json fp8_json(const Fp8Stats& s) {
    nlohmann::json j = nlohmann::json::object();
    for (int p = 0; p < FP8_PRODUCTS; p++)
        for (int o = 0; o < FP8_OPERANDS; o++) {
            const Fp8Counts& c = s.counts[p][o];
            j[fp8_product_name(p)][fp8_operand_name(o)] = {c.elements, c.overflows, c.underflows};
        }
    return j;
}

// "1:02:03": hours, minutes and seconds, for the step line's elapsed time and ETA.
inline std::string format_duration(double seconds) {
    const long s = seconds > 0 ? (long)(seconds + 0.5) : 0;
    return strformat("%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
}

class MetricsLog {
public:
    MetricsLog() = default;
    explicit MetricsLog(const std::string& path) { open(path); }

    // Starts the file (path "" for a silent log). A run resumed after `resumed_step` steps keeps the
    // records up to that step but the ones it writes again (repeated_after) and appends, so the file
    // reads as one run. A fresh run that finds a file there (an earlier run into the same directory)
    // keeps it under the first free name <path>.<n>: a rerun never destroys another run's metrics.
    void open(const std::string& path, int resumed_step = -1) {
        file_.reset();
        path_ = path;
        if (path.empty()) return;
        std::error_code ec;
        if (resumed_step < 0 && std::filesystem::file_size(path, ec) > 0 && !ec) {
            std::string kept_as;
            for (int n = 1; kept_as.empty() || std::filesystem::exists(kept_as); n++) kept_as = strformat("%s.%d", path.c_str(), n);
            if (rename(path.c_str(), kept_as.c_str()) != 0)
                fail(strformat("cannot rename '%s' to '%s': %s", path.c_str(), kept_as.c_str(), strerror(errno)));
            printf("metrics: an earlier run's %s is kept as %s\n", path.c_str(), kept_as.c_str());
        }
        if (resumed_step < 0 || !std::filesystem::exists(path)) {
            file_ = std::make_unique<File>(path, "wb");
            return;
        }
        rewrite([&](nlohmann::json& r) { return !repeated_after(r, resumed_step); });
    }

    // After the run went back to the state after `step` steps (a rollback, a replay): the records
    // of the abandoned history that the run writes again are marked "superseded": true, so that a
    // reader sees one curve (dev/plot_metrics.py skips them). Events stay as they are: they tell
    // what happened.
    void supersede_after(int step) {
        if (!file_) return;
        rewrite([&](nlohmann::json& r) {
            if (!r.contains("event") && repeated_after(r, step)) r["superseded"] = true;
            return true;
        });
    }

    void log_step(const StepMetrics& m) {
        if (!file_) return;
        const RouterStats& routing = m.router;
        printf("step %*d/%d | loss %7.4f | lr %.2e | norm %7.4f | %8.1f ms | comm %6.1f ms | %9.0f tok/s%s | "
               "%s elapsed, eta %s%s%s%s\n",
               digits(m.total_steps), m.step, m.total_steps, m.train_loss, m.lr, m.grad_norm, m.step_ms, m.comm_ms,
               m.tokens_per_s, m.mfu >= 0 ? strformat(" | MFU %4.1f%%", 100 * m.mfu).c_str() : "",
               format_duration(m.elapsed_s).c_str(), format_duration(m.eta_s).c_str(),
               routing.passes ? strformat(" | experts: balance %.3f z %.3f max load %.2f dropped %ld%s", routing.balance_loss,
                                    routing.z_loss, routing.max_load, routing.dropped,
                                    routing.max_rank_load > 0 ? strformat(" busiest rank %.2f", routing.max_rank_load).c_str()
                                                              : "").c_str() : "",
               fp8_summary(m.fp8).c_str(), m.skipped ? " | update SKIPPED" : "");
        fflush(stdout);
        nlohmann::json r = {{"step", m.step}, {"train_loss", m.train_loss}, {"lr", m.lr}, {"grad_norm", m.grad_norm},
                            {"step_ms", m.step_ms}, {"comm_ms", m.comm_ms}, {"tokens_per_s", m.tokens_per_s},
                            {"elapsed_s", m.elapsed_s}, {"eta_s", m.eta_s}};
        if (m.mfu >= 0) r["mfu"] = m.mfu;
        if (m.router.passes)
            r["experts"] = {{"balance_loss", m.router.balance_loss}, {"z_loss", m.router.z_loss},
                            {"max_load", m.router.max_load}, {"dropped", m.router.dropped},
                            {"assigned", m.router.assigned}};
        if (m.router.max_rank_load > 0) r["experts"]["max_rank_load"] = m.router.max_rank_load;
        if (m.fp8.total().elements) r["fp8"] = fp8_json(m.fp8);
        if (m.skipped) r["skipped"] = true;
        write(r);
    }
    void log_val(int step, float val_loss) {
        if (!file_) return;
        printf("val loss %.4f (after %d steps)\n", val_loss, step);
        fflush(stdout);
        write({{"step", step}, {"val_loss", val_loss}});
    }
    // HellaSwag's accuracy after `step` steps, with the evaluation's time beside the last step's
    // (step_ms < 0: no step yet), so its cost per -v steps is seen at a glance.
    void log_hellaswag(int step, int correct, int items, double eval_ms, double step_ms) {
        if (!file_) return;
        const double acc = items ? (double)correct / items : 0.0;
        printf("hellaswag acc %.4f (%d/%d items, after %d steps) | eval %.1f ms%s\n", acc, correct, items, step,
               eval_ms, step_ms >= 0 ? strformat(" (a step takes %.1f ms)", step_ms).c_str() : "");
        fflush(stdout);
        write({{"step", step}, {"hellaswag_acc", acc}, {"hellaswag_correct", correct}, {"hellaswag_items", items},
               {"hellaswag_ms", eval_ms}});
    }
    void log_sample(int step, const std::string& prompt, const std::string& completion) {
        if (!file_) return;
        printf("---- sample after %d steps%s ----\n%s%s\n--------\n", step, prompt.empty() ? "" : " (prompted)",
               prompt.c_str(), completion.c_str());
        fflush(stdout);
        write({{"step", step}, {"prompt", prompt}, {"sample", completion}});
    }

    // Any other event: a console line and a record (checkpoints, resumes).
    void log_event(const std::string& line, const nlohmann::json& record) {
        if (!file_) return;
        printf("%s\n", line.c_str());
        fflush(stdout);
        write(record);
    }

    // A record without a console line (per-rank step times).
    void log_record(const nlohmann::json& record) {
        if (file_) write(record);
    }

private:
    static int digits(int n) { return (int)std::to_string(n).size(); }

    // Whether a run that goes back to the state after `step` steps writes the record again: it is of
    // a later step, or an evaluation or sample of that step (the loop evaluates before each step).
    static bool repeated_after(const nlohmann::json& r, int step) {
        const int s = r["step"].get<int>();
        return s > step || (s == step && (r.contains("val_loss") || r.contains("hellaswag_acc") || r.contains("sample")));
    }

    // Writes the file anew (whole or not at all) from its records, each passed through edit(record),
    // which may change it and returns whether it stays; then appends after them. A line that is not
    // a record with a step (one cut off by a crash) is dropped; an unchanged record keeps its text.
    void rewrite(const std::function<bool(nlohmann::json&)>& edit) {
        std::string kept;
        std::istringstream lines(read_text_file(path_));
        for (std::string line; std::getline(lines, line);) {
            nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
            if (r.is_discarded() || !r.is_object() || !r.contains("step") || !r["step"].is_number()) continue;
            const nlohmann::json before = r;
            if (edit(r)) kept += (r == before ? line : dump(r)) + "\n";
        }
        file_.reset();
        write_text_file_atomic(path_, kept);
        file_ = std::make_unique<File>(path_, "ab");
        written_bytes_ = (int64_t)kept.size();
    }
    static std::string dump(const nlohmann::json& record) {
        // Decoded samples may end mid-way through a multi-byte character; replace, don't throw.
        return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    // Every record carries its wall-clock time ("time": seconds since the Unix epoch, to the ms).
    void write(nlohmann::json record) {
        const double now_ms = (double)std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch()).count();
        record["time"] = now_ms / 1000.0;
        const std::string line = dump(record) + "\n";
        try {
            file_->write(line.data(), line.size());
            file_->flush();
            written_bytes_ += (int64_t)line.size();
        } catch (const Error& e) {
            file_->truncate(written_bytes_);
            if (!warned_) {
                fprintf(stderr, "warning: metrics: %s; training goes on, without the records that cannot be written "
                                "(said once)\n", e.what());
                fflush(stderr);
                warned_ = true;
            }
        }
    }
    std::string path_;
    std::unique_ptr<File> file_;
    int64_t written_bytes_ = 0;  // the whole records in the file
    bool warned_ = false;  // of a record that could not be written
};

}  // namespace llmc
