// dev/bench/batch_sweep.h: which micro-batch sizes and recomputation levels bench_train_step --best
// tries, in what order, and which one wins. Host only: the measuring is a callback, so the choices are
// tested without a GPU (test/test_batch_sweep.cpp).
//
// The one idea: recomputation (-r) only buys memory and costs compute, so a level is worth trying only
// for the batches every lower level could not fit. Batches double from min_B at -r 0 until one does not
// fit; that one is tried at -r 1, doubling on from there, and so on to -r 3. Every batch is thus tried at
// the lowest level that fits it. The sweep ends at the first batch -r 3 cannot fit, at max_B, when a
// doubled batch gains less than min_gain in tokens/s (the card is saturated: larger batches, which need
// as much recomputation or more, will not pay), or before a trial that would overrun the time budget.
#pragma once

#include <functional>
#include <optional>
#include <vector>

namespace llmc {

struct SweepLimits {
    int min_B = 1, max_B = 1024;  // powers of two from min_B, up to max_B
    int max_recompute = 3;
    double min_gain = 0.02;  // stop when a fitting trial is less than 2% faster than the last (0: never)
    double budget_s = 0;     // stop before a trial predicted to end past it (0: no limit)
};

// What one configuration measured; fits false when it ran out of GPU memory (then only seconds counts).
struct TrialMeasure {
    bool fits = false;
    double tokens_per_s = 0, step_ms = 0, mfu = 0;
    double llmc_gib = 0, device_gib = 0;  // llmc's allocations; the device's memory in use
    double seconds = 0;                   // wall time of the whole trial, building the model included
};

struct Trial {
    int B = 0, recompute = 0;
    TrialMeasure measure;
};

enum class SweepEnd { Exhausted, Saturated, Budget };

struct SweepResult {
    std::vector<Trial> trials;  // in the order tried
    SweepEnd end = SweepEnd::Exhausted;  // Exhausted: no larger batch fits, or max_B reached
    Trial next;  // Budget: the trial not run; Saturated: the last trial, which gained too little
};

using MeasureTrial = std::function<TrialMeasure(int B, int recompute)>;

// A trial is predicted to take the last fitting trial's seconds scaled by the batch (the steps dominate,
// and they grow with B); the first trial always runs, so a sweep has a winner whenever anything fits.
inline SweepResult sweep_batch_and_recompute(const SweepLimits& limits, const MeasureTrial& measure) {
    SweepResult result;
    double spent_s = 0;
    std::optional<Trial> last_fit;
    int B = limits.min_B;
    for (int r = 0; r <= limits.max_recompute && B <= limits.max_B; r++) {
        for (; B <= limits.max_B; B *= 2) {
            const double predicted_s = last_fit ? last_fit->measure.seconds * B / last_fit->B : 0;
            if (limits.budget_s > 0 && !result.trials.empty() && spent_s + predicted_s > limits.budget_s) {
                result.end = SweepEnd::Budget, result.next = {B, r, {}};
                return result;
            }
            const Trial t{B, r, measure(B, r)};
            result.trials.push_back(t);
            spent_s += t.measure.seconds;
            if (!t.measure.fits) break;  // the same B at the next level
            if (last_fit && limits.min_gain > 0 &&
                t.measure.tokens_per_s < (1 + limits.min_gain) * last_fit->measure.tokens_per_s) {
                result.end = SweepEnd::Saturated, result.next = t;
                return result;
            }
            last_fit = t;
        }
    }
    return result;
}

// The trial with the most tokens/s (the first of equals), or nothing when none fit.
inline std::optional<Trial> fastest(const std::vector<Trial>& trials) {
    std::optional<Trial> best;
    for (const Trial& t : trials)
        if (t.measure.fits && (!best || t.measure.tokens_per_s > best->measure.tokens_per_s)) best = t;
    return best;
}

}  // namespace llmc
