// cpu/fp8_linear.h: the CPU model's simulation of FP8 linear layers (--fp8 1), the reference the
// CUDA model's FP8 products are checked against.
//
// Each of a block's four products (qkv, attention projection, fc, fc projection) multiplies what
// the GPU would: its input and weight quantized to E4M3 and, in the backward, its output gradient
// to E5M2 (fp8.h: encoded with a power-of-two scale, decoded, unscaled), in fp32 on the CPU; the
// bias gradient comes from the unquantized output gradient, as the GPU's cast kernel computes it.
// Quantizing exactly what the GPU quantizes, with the same scales, is what makes the simulation an
// oracle rather than an approximation of one.
//
// The one idea is where scales come from. Current scaling: each tensor's own amax, every time it is
// quantized. Delayed scaling (Transformer Engine's): a tensor's scale for a step comes from the
// largest amax of the last `history` steps, so the quantizing kernel needs no pass over the tensor
// first; a step's amax is the maximum over its micro-batches and over the data-parallel ranks (so N
// ranks scale as 1 rank does), and joins the history when the step ends. A tensor with no history
// yet (the first step, or a run resumed without one) is scaled as by current scaling. Within a
// step the scales stay fixed, so the backward quantizes an input exactly as the forward did.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/ckpt/shard_state.h"
#include "llmc/cpu/ops.h"
#include "llmc/dist/comm.h"
#include "llmc/numerics/fp8.h"
#include "llmc/utils.h"

namespace llmc::cpu {

class Fp8Linears : public ReplicatedState {
public:
    Fp8Linears(int layers, const Fp8Options& options) : options_(options), scales_((size_t)layers * FP8_PRODUCTS * FP8_OPERANDS) {
        if (options.history < 1) fail(strformat("--fp8-history must be >= 1 step, got %d", options.history));
    }

    bool enabled() const { return options_.enabled; }
    // Training passes record amax and clipping; evaluation passes only use the scales.
    void set_training(bool training) { training_ = training; }

    // out = base + q(inp) q(W)^T + bias: inp rows x C, W (OC, C); base and bias may be null.
    void forward(int layer, Fp8Product p, float* out, const float* inp, const float* weight, const float* bias,
                 const float* base, int rows, int C, int OC) {
        const float* inp_q = quantized(layer, p, FP8_INPUT, inp, (size_t)rows * C, input_q_, training_);
        const float* weight_q = quantized(layer, p, FP8_WEIGHT, weight, (size_t)OC * C, weight_q_, training_);
        matmul_forward(out, inp_q, weight_q, bias, base, rows, C, OC);
    }
    // dinp = q(dout) q(W) (overwritten), dweight += q(dout)^T q(inp), dbias += column sums of dout.
    void backward(int layer, Fp8Product p, float* dinp, float* dweight, float* dbias, const float* dout,
                  const float* inp, const float* weight, int rows, int C, int OC) {
        const float* dout_q = quantized(layer, p, FP8_GRAD, dout, (size_t)rows * OC, grad_q_, true);
        const float* inp_q = quantized(layer, p, FP8_INPUT, inp, (size_t)rows * C, input_q_, false);
        const float* weight_q = quantized(layer, p, FP8_WEIGHT, weight, (size_t)OC * C, weight_q_, false);
        matmul_backward(dinp, dweight, nullptr, dout_q, inp_q, weight_q, rows, C, OC);
        if (dbias) bias_backward(dbias, dout, rows, OC);
    }

    // Ends an optimizer step: with delayed scaling each tensor's step amax, the maximum over the
    // ranks of `group`, joins its history and sets its next scale. Every rank of the group calls it.
    // `replicas`: under hybrid sharding `group` is one shard group, and the maximum goes on over the
    // shard's replicas (a maximum of maxima: every rank ends with the same scales).
    void end_step(Communicator& group, Communicator* replicas = nullptr) {
        if (!enabled() || options_.scaling != Fp8Scaling::Delayed) return;
        std::vector<float> amax(scales_.size());
        for (size_t i = 0; i < scales_.size(); i++) amax[i] = scales_[i].step_amax;
        amax = max_over_ranks(group, amax);
        if (replicas) amax = max_over_ranks(*replicas, amax);
        for (size_t i = 0; i < scales_.size(); i++) {
            TensorScale& s = scales_[i];
            s.step_amax = 0.0f;
            if (!(amax[i] > 0.0f)) continue;  // not quantized this step (an evaluation-only rank, say)
            s.history.push_back(amax[i]);
            if ((int)s.history.size() > options_.history) s.history.erase(s.history.begin());
            const float largest = *std::max_element(s.history.begin(), s.history.end());
            s.scale = fp8::scale_for_amax(largest, fp8_format((int)(i % FP8_OPERANDS)), s.scale);
            s.primed = true;
        }
    }

    Fp8Stats take_stats() {
        const Fp8Stats s = stats_;
        stats_ = {};
        return s;
    }

    // ReplicatedState: the delayed-scaling state under one name, "fp8_scaling".
    std::vector<std::pair<std::string, std::vector<float>>> named_values() const override {
        if (!enabled() || options_.scaling != Fp8Scaling::Delayed) return {};
        return {{"fp8_scaling", state()}};
    }
    bool restore(const std::string& name, const std::vector<float>& values, const std::string& where) override {
        if (name != "fp8_scaling") return false;
        // A run resumed without delayed scaling has no use for the histories.
        if (enabled() && options_.scaling == Fp8Scaling::Delayed) set_state(values, where);
        return true;
    }

    // The delayed-scaling state, for checkpoints: per tensor its scale, whether it has one, and its
    // history (oldest first, padded with zeros to `history` entries). Empty without delayed scaling.
    std::vector<float> state() const {
        std::vector<float> out;
        if (!enabled() || options_.scaling != Fp8Scaling::Delayed) return out;
        for (const TensorScale& s : scales_) {
            out.push_back(s.scale);
            out.push_back(s.primed ? 1.0f : 0.0f);
            out.push_back((float)s.history.size());
            for (int h = 0; h < options_.history; h++) out.push_back(h < (int)s.history.size() ? s.history[h] : 0.0f);
        }
        return out;
    }
    void set_state(const std::vector<float>& state, const std::string& where) {
        const size_t per_tensor = fp8_state_floats_per_tensor(options_.history);
        check_fp8_state_size(state.size(), scales_.size(), options_.history, where);
        for (size_t i = 0; i < scales_.size(); i++) {
            const float* v = state.data() + i * per_tensor;
            TensorScale& s = scales_[i];
            s.scale = v[0], s.primed = v[1] != 0.0f, s.step_amax = 0.0f;
            s.history.assign(v + 3, v + 3 + std::min<size_t>((size_t)v[2], (size_t)options_.history));
        }
    }

private:
    struct TensorScale {
        float scale = 1.0f;
        bool primed = false;  // has a scale from its history
        float step_amax = 0.0f;
        std::vector<float> history;
    };

    static std::vector<float> max_over_ranks(Communicator& group, const std::vector<float>& mine) {
        if (group.world_size() == 1) return mine;
        std::vector<float> all(mine.size() * group.world_size());
        group.all_gather(mine.data(), all.data(), mine.size(), CommDtype::F32).wait();
        std::vector<float> out = mine;
        for (int r = 0; r < group.world_size(); r++)
            for (size_t i = 0; i < mine.size(); i++) out[i] = std::max(out[i], all[r * mine.size() + i]);
        return out;
    }

    static float amax_of(const float* x, size_t n) {
        float amax = 0.0f;
#pragma omp parallel for reduction(max : amax) schedule(static)
        for (size_t i = 0; i < n; i++) amax = std::max(amax, std::fabs(x[i]));
        return amax;
    }

    // x quantized into `scratch` with this tensor's scale; `record`: its amax joins the step's and
    // what it clipped is counted.
    const float* quantized(int layer, Fp8Product p, Fp8Operand operand, const float* x, size_t n,
                           std::vector<float>& scratch, bool record) {
        TensorScale& s = scales_[((size_t)layer * FP8_PRODUCTS + p) * FP8_OPERANDS + operand];
        const fp8::Format format = fp8_format(operand);
        const bool delayed = options_.scaling == Fp8Scaling::Delayed && s.primed;
        const float scale = delayed ? s.scale : fp8::scale_for_amax(amax_of(x, n), format, 1.0f);
        scratch.assign(x, x + n);
        fp8::Clipping clipping;
        const float amax = fp8::quantize(scratch.data(), (int64_t)n, scale, format, record ? &clipping : nullptr);
        if (record) {
            s.step_amax = std::max(s.step_amax, amax);
            Fp8Counts& c = stats_.counts[p][operand];
            c.elements += n, c.overflows += clipping.overflows, c.underflows += clipping.underflows;
        }
        return scratch.data();
    }

    Fp8Options options_;
    std::vector<TensorScale> scales_;  // [layer][product][operand]
    Fp8Stats stats_;
    bool training_ = true;
    std::vector<float> input_q_, weight_q_, grad_q_;
};

}  // namespace llmc::cpu
