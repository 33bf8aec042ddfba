// gpt2_cpu.h: GPT2CPU, the fp32 CPU reference implementation of llmc::Model (forward, backward,
// AdamW), fast enough to be the project's default trainer on a small multicore machine. Its layers
// are llmc/cpu/ops.h; this file wires them into GPT-2 and owns the activation memory.
//
// Memory: parameters, gradients and the AdamW moments are one flat buffer each in ParamLayout's
// bucket-major order, reached only through param(tensor, layer) and grad(tensor, layer); activations
// are one flat buffer sized for max_B x max_T, cut per call by ActivationLayout. The lm-head logits
// (B x T x Vp floats) stay readable after evaluate(); forward_backward turns them into dlogits in
// place, inside the cross-entropy, while each row is still in cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/cpu/ops.h"
#include "llmc/dist/host_memory.h"
#include "llmc/dist/zero.h"
#include "llmc/model.h"
#include "llmc/models/gpt2/model_file.h"
#include "llmc/models/gpt2/params.h"
#include "llmc/utils.h"

namespace llmc {

// Where each activation lives in the flat activation buffer for a call with B x T tokens. Per-layer
// tensors hold all L layers back to back. Sizes grow with B and T, so the layout for any B <= max_B,
// T <= max_T fits in a buffer of size_for(max_B, max_T).
struct ActivationLayout {
    float *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu, *residual3, *lnf, *lnf_mean, *lnf_rstd, *logits, *row_loss;
    // backward scratch: gradients of the residual stream and of one layer's intermediates
    float *dresidual, *dC, *d3C, *d4C;

    size_t total_floats = 0;  // the buffer size this layout needs

    static size_t size_for(const ModelConfig& c, int B, int T) { return ActivationLayout(c, B, T, nullptr).total_floats; }

    // Assigns consecutive slices of `base`; with base == nullptr only total_floats is computed.
    ActivationLayout(const ModelConfig& c, int B, int T, float* base) {
        const size_t BT = (size_t)B * T, C = c.channels, L = c.num_layers, NH = c.num_heads;
        const size_t Vp = c.padded_vocab_size;
        auto take = [&](float*& p, size_t n) {
            p = base ? base + total_floats : nullptr;
            total_floats += (n + 15) / 16 * 16;  // keep every tensor 64-byte aligned
        };
        take(encoded, BT * C);
        take(ln1, L * BT * C);
        take(ln1_mean, L * BT);
        take(ln1_rstd, L * BT);
        take(qkv, L * BT * 3 * C);
        take(atty, L * BT * C);
        take(att, L * B * NH * T * T);
        take(residual2, L * BT * C);
        take(ln2, L * BT * C);
        take(ln2_mean, L * BT);
        take(ln2_rstd, L * BT);
        take(fch, L * BT * 4 * C);
        take(fch_gelu, L * BT * 4 * C);
        take(residual3, L * BT * C);
        take(lnf, BT * C);
        take(lnf_mean, BT);
        take(lnf_rstd, BT);
        take(logits, BT * Vp);
        take(row_loss, BT);
        take(dresidual, BT * C);
        take(dC, BT * C);
        take(d3C, BT * 3 * C);
        take(d4C, BT * 4 * C);
    }
};

class GPT2CPU : public Model {
public:
    // A model sharded over `comm` by ZeRO stage `zero_stage` (see zero.h).
    GPT2CPU(const ModelConfig& config, int max_B, int max_T, Communicator& comm, int zero_stage)
        : config_(validated(config)), layout_(GPT2Params::layout(config)), max_B_(max_B), max_T_(max_T),
          engine_(layout_, ZeroPlan(layout_, zero_stage, comm.rank(), comm.world_size()), comm, memory_) {
        if (max_B < 1) fail(strformat("GPT2CPU: max_B must be >= 1, got %d", max_B));
        if (max_T < 1 || max_T > config.max_seq_len)
            fail(strformat("GPT2CPU: max_T must be in [1, %d] (the model's max_seq_len), got %d", config.max_seq_len,
                           max_T));
        acts_.assign(activation_floats(config_, max_B, max_T), 0.0f);
    }
    // A single-rank model (stage 0, nothing to communicate).
    GPT2CPU(const ModelConfig& config, int max_B, int max_T) : GPT2CPU(config, max_B, max_T, local_communicator(), 0) {}

    // The activation buffer's length for a max_B x max_T model (the planner reads the same function).
    static size_t activation_floats(const ModelConfig& c, int max_B, int max_T) {
        return ActivationLayout::size_for(c, max_B, max_T) + 16;  // + slack for 64-byte alignment
    }
    // Everything one rank allocates: the engine's buffers and the activations (what --plan prints).
    static std::vector<BufferSpec> memory_specs(const ZeroPlan& zero, const ModelConfig& c, int max_B, int max_T) {
        std::vector<BufferSpec> specs = buffer_specs(zero);
        specs.push_back({"activations", MemoryKind::Activations, activation_floats(c, max_B, max_T)});
        return specs;
    }

    const ModelConfig& config() const override { return config_; }
    const ParamLayout& layout() const override { return layout_; }
    int max_batch() const override { return max_B_; }
    int max_seq_len() const override { return max_T_; }

    // Both start a fresh model: gradients and AdamW moments are reset. Every rank passes the same
    // seed or file and keeps its own shard.
    void init_random(uint64_t seed) override {
        std::vector<float> full(layout_.num_params);
        init_params(layout_, full.data(), seed);
        reset(full);
    }
    void load(const std::string& path) override {
        std::vector<float> full(layout_.num_params);
        read_model_file(path, config_, full.data());
        reset(full);
    }
    // A collective: every rank calls it, rank 0 writes the file.
    void save(const std::string& path, bool bf16 = false) override {
        std::vector<float> full(layout_.num_params);
        engine_.get_params(full.data());
        if (engine_.plan().rank == 0)
            write_model_file(path, config_, full.data(), bf16 ? MODEL_FILE_VERSION_BF16 : MODEL_FILE_VERSION_FP32);
    }
    void get_params(float* full) { engine_.get_params(full); }

    void zero_grad() override { engine_.zero_grad(); }

    float forward_backward(const int* inputs, const int* targets, int B, int T, float grad_scale,
                           bool last_micro_batch) override {
        check_batch(inputs, targets, B, T, "forward_backward");
        const float loss = forward(inputs, targets, B, T, Pass::Train, grad_scale);
        backward(inputs, B, T, last_micro_batch);
        return loss;
    }
    float evaluate(const int* inputs, const int* targets, int B, int T) override {
        check_batch(inputs, targets, B, T, "evaluate");
        return forward(inputs, targets, B, T, Pass::Evaluate, 0.0f);
    }
    void next_token_logits(const int* tokens, int T, float* logits_out) override {
        check_batch(tokens, nullptr, 1, T, "next_token_logits");
        forward(tokens, nullptr, 1, T, Pass::LastLogits, 0.0f);
        const ActivationLayout a(config_, 1, T, activation_base());
        std::copy(a.logits, a.logits + config_.padded_vocab_size, logits_out);
    }

    double grad_norm_squared() override { return engine_.grad_norm_squared(); }
    void adamw_step(const AdamWConfig& opt, int step, float grad_multiplier) override {
        engine_.adamw_step(opt, step, grad_multiplier);
    }
    double take_exposed_comm_ms() override { return engine_.take_exposed_comm_ms(); }
    ShardedState& sharded_state() override { return engine_; }
    size_t allocated_bytes(MemoryKind kind) const override {
        if (kind == MemoryKind::Activations) return acts_.size() * sizeof(float);
        return engine_.allocated_bytes(kind);
    }

    // Direct access for tests and tools on an unsharded single-rank model (stage 0, 1 rank), where
    // the engine's buffers are exactly ParamLayout's: parameters and gradients, and the B x T x Vp
    // logits of the most recent evaluate() (after forward_backward the buffer holds dlogits).
    float* params() { return unsharded(engine_.full_params()); }
    const float* grads() { return unsharded(engine_.full_grads()); }
    const float* logits() const { return ActivationLayout(config_, last_B_, last_T_, activation_base()).logits; }

private:
    static const ModelConfig& validated(const ModelConfig& c) {
        c.validate();
        return c;
    }
    // The activation buffer rounded up to a 64-byte boundary (acts_ has 16 floats of slack).
    float* activation_base() const {
        const uintptr_t p = reinterpret_cast<uintptr_t>(acts_.data());
        return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
    }
    template <typename T>
    T* unsharded(T* p) {
        if (engine_.plan().world_size != 1 || engine_.plan().stage != 0)
            fail("GPT2CPU: params()/grads() need an unsharded single-rank model (stage 0, 1 rank)");
        return p;
    }

    // Parameters and gradients are reached only through the bucket view (zero.h), so the model
    // never knows how they are sharded.
    const float* param(int tensor, int layer = 0) const { return buckets_.param(tensor, layer); }
    float* grad(int tensor, int layer = 0) const { return buckets_.grad(tensor, layer); }
    void release_all() { buckets_.release_all(); }

    void reset(const std::vector<float>& full) {
        engine_.set_params(full.data());
        engine_.reset_optimizer();
    }

    void check_batch(const int* inputs, const int* targets, int B, int T, const char* who) const {
        llmc::check_batch(config_, max_B_, max_T_, inputs, targets, B, T, who);
    }

    // What a forward pass leaves behind: the loss and logits (Evaluate), the loss and dlogits
    // scaled by grad_scale, ready for backward() (Train), or only the last position's logits.
    enum class Pass { Evaluate, Train, LastLogits };

    // Runs the forward pass on a checked batch; returns the mean loss (0 for LastLogits).
    float forward(const int* inputs, const int* targets, int B, int T, Pass pass, float grad_scale) {
        last_B_ = B;
        last_T_ = T;
        const int C = config_.channels, L = config_.num_layers, NH = config_.num_heads;
        const int V = config_.vocab_size, Vp = config_.padded_vocab_size, BT = B * T;
        const ActivationLayout a(config_, B, T, activation_base());
        using P = GPT2Params;
        buckets_.acquire_resident();
        cpu::encoder_forward(a.encoded, inputs, param(P::WTE), param(P::WPE), B, T, C);
        for (int l = 0; l < L; l++) {
            buckets_.enter_layer(l, Walk::Forward);
            const size_t lc = (size_t)l * BT * C;
            const float* residual = l == 0 ? a.encoded : a.residual3 + lc - (size_t)BT * C;
            cpu::layernorm_forward(a.ln1 + lc, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, residual,
                                   param(P::LN1W, l), param(P::LN1B, l), BT, C);
            cpu::matmul_forward(a.qkv + 3 * lc, a.ln1 + lc, param(P::QKVW, l), param(P::QKVB, l), nullptr, BT, C,
                                3 * C);
            cpu::attention_forward(a.atty + lc, a.att + (size_t)l * B * NH * T * T, a.qkv + 3 * lc, B, T, C, NH);
            cpu::matmul_forward(a.residual2 + lc, a.atty + lc, param(P::ATTPROJW, l), param(P::ATTPROJB, l), residual,
                                BT, C, C);
            cpu::layernorm_forward(a.ln2 + lc, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, a.residual2 + lc,
                                   param(P::LN2W, l), param(P::LN2B, l), BT, C);
            cpu::matmul_forward(a.fch + 4 * lc, a.ln2 + lc, param(P::FCW, l), param(P::FCB, l), nullptr, BT, C,
                                4 * C);
            cpu::gelu_forward(a.fch_gelu + 4 * lc, a.fch + 4 * lc, (size_t)BT * 4 * C);
            cpu::matmul_forward(a.residual3 + lc, a.fch_gelu + 4 * lc, param(P::FCPROJW, l),
                                param(P::FCPROJB, l), a.residual2 + lc, BT, 4 * C, C);
            buckets_.leave_layer(l, Walk::Forward);
        }
        cpu::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual3 + (size_t)(L - 1) * BT * C,
                               param(P::LNFW), param(P::LNFB), BT, C);
        if (pass == Pass::LastLogits) {
            cpu::matmul_forward(a.logits, a.lnf + (size_t)(BT - 1) * C, param(P::WTE), nullptr, nullptr, 1, C, Vp);
            release_all();
            return 0.0f;
        }
        cpu::matmul_forward(a.logits, a.lnf, param(P::WTE), nullptr, nullptr, BT, C, Vp);
        // Training keeps the embeddings and final norm for backward; an evaluation is done with them.
        if (pass != Pass::Train) release_all();
        // The whole backward is linear in the loss gradient, so grad_scale enters once, here.
        cpu::crossentropy(a.row_loss, a.logits, targets, pass == Pass::Train, grad_scale / BT, BT, V, Vp);
        double total = 0.0;
        for (int r = 0; r < BT; r++) total += a.row_loss[r];
        return (float)(total / BT);
    }

    // Backward of the Pass::Train forward that just ran on the same batch, starting from the
    // dlogits it left in the logits buffer; parameter gradients accumulate. Each bucket is handed to
    // the engine (grads_ready) as soon as its gradient is complete, so its communication overlaps
    // the rest of backward.
    void backward(const int* inputs, int B, int T, bool last_micro_batch) {
        const int C = config_.channels, L = config_.num_layers, NH = config_.num_heads;
        const int Vp = config_.padded_vocab_size, BT = B * T;
        const ActivationLayout a(config_, B, T, activation_base());
        using P = GPT2Params;
        const int embedding = layout_.bucket_of(P::WTE), final_norm = layout_.bucket_of(P::LNFW);
        buckets_.take_grads(embedding);
        buckets_.take_grads(final_norm);
        float* dlogits = a.logits;
        cpu::matmul_backward(a.dC, grad(P::WTE), nullptr, dlogits, a.lnf, param(P::WTE), BT, C, Vp);
        std::fill(a.dresidual, a.dresidual + (size_t)BT * C, 0.0f);
        cpu::layernorm_backward(a.dresidual, grad(P::LNFW), grad(P::LNFB), a.dC,
                                a.residual3 + (size_t)(L - 1) * BT * C, param(P::LNFW), a.lnf_mean, a.lnf_rstd, BT, C);
        buckets_.grads_ready(final_norm, last_micro_batch);
        for (int l = L - 1; l >= 0; l--) {
            buckets_.enter_layer(l, Walk::Backward);
            const size_t lc = (size_t)l * BT * C;
            const float* residual = l == 0 ? a.encoded : a.residual3 + lc - (size_t)BT * C;
            // dresidual is now d(residual3[l]); the fc projection reads fch_gelu
            cpu::matmul_backward(a.d4C, grad(P::FCPROJW, l), grad(P::FCPROJB, l), a.dresidual, a.fch_gelu + 4 * lc,
                                 param(P::FCPROJW, l), BT, 4 * C, C);
            cpu::gelu_backward(a.d4C, a.fch + 4 * lc, (size_t)BT * 4 * C);
            cpu::matmul_backward(a.dC, grad(P::FCW, l), grad(P::FCB, l), a.d4C, a.ln2 + lc, param(P::FCW, l), BT, C,
                                 4 * C);
            cpu::layernorm_backward(a.dresidual, grad(P::LN2W, l), grad(P::LN2B, l), a.dC,
                                    a.residual2 + lc, param(P::LN2W, l), a.ln2_mean + l * BT,
                                    a.ln2_rstd + l * BT, BT, C);
            // dresidual is now d(residual2[l]); the attention projection reads atty
            cpu::matmul_backward(a.dC, grad(P::ATTPROJW, l), grad(P::ATTPROJB, l), a.dresidual, a.atty + lc,
                                 param(P::ATTPROJW, l), BT, C, C);
            cpu::attention_backward(a.d3C, a.dC, a.att + (size_t)l * B * NH * T * T, a.qkv + 3 * lc, B, T, C, NH);
            cpu::matmul_backward(a.dC, grad(P::QKVW, l), grad(P::QKVB, l), a.d3C, a.ln1 + lc, param(P::QKVW, l), BT,
                                 C, 3 * C);
            cpu::layernorm_backward(a.dresidual, grad(P::LN1W, l), grad(P::LN1B, l), a.dC, residual,
                                    param(P::LN1W, l), a.ln1_mean + l * BT, a.ln1_rstd + l * BT, BT, C);
            buckets_.leave_layer(l, Walk::Backward, last_micro_batch);
        }
        cpu::encoder_backward(grad(P::WTE), grad(P::WPE), a.dresidual, inputs, B, T, C);
        buckets_.grads_ready(embedding, last_micro_batch);
        engine_.finish_backward();
        release_all();
    }


    ModelConfig config_;
    ParamLayout layout_;
    int max_B_, max_T_;
    int last_B_ = 1, last_T_ = 1;
    HostMemory memory_;  // before engine_, which allocates from it
    ZeroEngine<HostMemory> engine_;
    BucketView<HostMemory> buckets_{layout_, engine_};  // the buckets acquired for the pass under way
    using Walk = BucketView<HostMemory>::Direction;
    std::vector<float> acts_;
};

}  // namespace llmc
