// phase_timer.cuh: where a training step's GPU time goes, by kind of kernel (matmul, attention,
// layernorm, ...), for the benchmark's per-kernel time shares.
//
// Off by default and then free: scope() returns at once. When on, each scope records a CUDA event
// pair on the stream; the pairs are read only in collect(), after the caller has synchronised, so
// timing never adds a synchronisation inside the step. Phases nest, and a phase's time is its own:
// a phase opened inside another (an FP8 product's casts inside the product) is taken out of the
// outer one's, so the phases of a step add up to the step.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

class PhaseTimer {
public:
    PhaseTimer() = default;
    ~PhaseTimer() {
        for (auto& r : records_) {
            cudaEventDestroy(r.start);
            cudaEventDestroy(r.stop);
        }
        for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    }
    PhaseTimer(const PhaseTimer&) = delete;
    PhaseTimer& operator=(const PhaseTimer&) = delete;

    void enable(bool on) { enabled_ = on; }
    bool enabled() const { return enabled_; }

    // Marks the start of a phase on `stream`; end() closes the most recent open phase.
    void begin(const char* phase, cudaStream_t stream) {
        if (!enabled_) return;
        Record r{phase, event(), event(), open_.empty() ? NO_PARENT : open_.back()};
        CUDA_CHECK(cudaEventRecord(r.start, stream));
        records_.push_back(r);
        open_.push_back(records_.size() - 1);
        stream_ = stream;
    }
    // Called from a destructor, so it must not throw: a failed record shows up at the next checked
    // call on the stream (collect() checks every event it reads).
    void end() noexcept {
        if (!enabled_ || open_.empty()) return;
        (void)cudaEventRecord(records_[open_.back()].stop, stream_);
        open_.pop_back();
    }

    // Adds every closed phase's own milliseconds (less those of the phases inside it) into `totals`
    // (by phase name) and forgets them. The caller synchronises the stream first.
    void collect(std::map<std::string, double>& totals) {
        for (auto& r : records_) {
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
            totals[r.phase] += ms;
            if (r.parent != NO_PARENT) totals[records_[r.parent].phase] -= ms;
        }
        for (auto& r : records_) {
            free_events_.push_back(r.start);
            free_events_.push_back(r.stop);
        }
        records_.clear();
        open_.clear();
    }

private:
    static constexpr size_t NO_PARENT = (size_t)-1;
    struct Record {
        const char* phase;
        cudaEvent_t start, stop;
        size_t parent;  // the phase open when this one began (its index in records_), or NO_PARENT
    };
    cudaEvent_t event() {
        if (!free_events_.empty()) {
            cudaEvent_t e = free_events_.back();
            free_events_.pop_back();
            return e;
        }
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        return e;
    }

    bool enabled_ = false;
    cudaStream_t stream_ = nullptr;
    std::vector<Record> records_;
    std::vector<size_t> open_;
    std::vector<cudaEvent_t> free_events_;
};

// RAII phase: PhaseScope s(timer, "matmul", stream);
class PhaseScope {
public:
    PhaseScope(PhaseTimer& timer, const char* phase, cudaStream_t stream) : timer_(timer) { timer_.begin(phase, stream); }
    ~PhaseScope() { timer_.end(); }
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

private:
    PhaseTimer& timer_;
};

}  // namespace llmc
