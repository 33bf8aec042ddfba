// guards.h: the pieces of the train loop's numerical guards and silent-data-corruption checks that
// need no model: the z-score window of -sl / -sg, and who diverges when replicas' parameter
// fingerprints disagree. The train loop (train_loop.h) owns the decisions; these are pure logic,
// so the unit tests (test/test_guards.cpp) cover them directly.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

namespace llmc {

// The z-score of a value against the last `window` accepted values (llm.c's -sl / -sg outlier
// detector): z = (x - mean) / stddev (population). It says nothing (nullopt) until `min_count`
// values are in, or while they are all equal. Non-finite values never enter the window.
class ZScoreWindow {
public:
    static constexpr int DEFAULT_WINDOW = 100;
    static constexpr int DEFAULT_MIN_COUNT = 20;

    explicit ZScoreWindow(int window = DEFAULT_WINDOW, int min_count = DEFAULT_MIN_COUNT)
        : window_(window), min_count_(min_count) {}

    std::optional<double> zscore(double x) const {
        if ((int)values_.size() < min_count_ || !std::isfinite(x)) return std::nullopt;
        double mean = 0;
        for (double v : values_) mean += v;
        mean /= values_.size();
        double var = 0;
        for (double v : values_) var += (v - mean) * (v - mean);
        var /= values_.size();
        if (!(var > 0)) return std::nullopt;
        return (x - mean) / std::sqrt(var);
    }
    // Whether x is an outlier above the window: z > threshold (threshold 0: the check is off).
    bool is_outlier(double x, double threshold) const {
        if (threshold <= 0) return false;
        std::optional<double> z = zscore(x);
        return z && *z > threshold;
    }
    void push(double x) {
        if (!std::isfinite(x)) return;
        values_.push_back(x);
        if ((int)values_.size() > window_) values_.pop_front();
    }
    int size() const { return (int)values_.size(); }

private:
    int window_, min_count_;
    std::deque<double> values_;
};

// Given every replica's fingerprint (index = data-parallel rank), the replicas that diverge: those
// outside the largest group of equal fingerprints. Empty when all agree. With no single largest
// group (two replicas that disagree, or a tie) nobody can be told apart: then every replica is
// returned and *no_majority set (the caller says so).
inline std::vector<int> diverging_replicas(const std::vector<uint32_t>& fingerprints, bool* no_majority = nullptr) {
    if (no_majority) *no_majority = false;
    std::map<uint32_t, int> count;
    for (uint32_t f : fingerprints) count[f]++;
    if (count.size() <= 1) return {};
    int best = 0, ties = 0;
    uint32_t majority = 0;
    for (const auto& [f, n] : count) {
        if (n > best) {
            best = n;
            majority = f;
            ties = 1;
        } else if (n == best) {
            ties++;
        }
    }
    std::vector<int> out;
    if (ties > 1) {
        if (no_majority) *no_majority = true;
        for (int r = 0; r < (int)fingerprints.size(); r++) out.push_back(r);
        return out;
    }
    for (int r = 0; r < (int)fingerprints.size(); r++)
        if (fingerprints[r] != majority) out.push_back(r);
    return out;
}

}  // namespace llmc
