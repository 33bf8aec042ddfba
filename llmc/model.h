// model.h: the interface between the train loop and a model implementation.
//
// The train loop (host C++, no CUDA) drives a Model through this narrow interface; the CPU
// reference (models/cpu_model.h, fp32) and the CUDA model (bf16) both implement it. Buffers named here are
// the flat buffers of params/layout.h's ParamLayout, so an optimizer "shard" is just a range
// [begin, end) of element indices, which is what ZeRO needs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "llmc/ckpt/shard_state.h"
#include "llmc/numerics/fp8.h"
#include "llmc/models/model_config.h"
#include "llmc/params/layout.h"
#include "llmc/utils.h"

namespace llmc {

// What the memory of a rank is for (the planner's categories). MasterWeights stays empty on the fp32
// CPU model, whose parameters are their own master copy.
enum class MemoryKind { Parameters, Gradients, OptimizerState, MasterWeights, CommBuffers, Activations, Count };
inline const char* memory_kind_name(MemoryKind k) {
    static const char* names[] = {"parameters", "gradients", "optimizer state", "master weights", "comm buffers",
                                  "activations"};
    return names[(int)k];
}

// How a mixture-of-experts model routed the tokens of some training passes (cpu/moe.h): the
// auxiliary losses averaged over its MoE blocks' forwards (balance 1 when the load is even, E when
// every token picks the same experts); the assignments the capacity factor dropped, of all made;
// and the largest share of a block's choices that one expert got (1/E when balanced, 1/K when every
// token picks the same experts). passes: the MoE blocks' forwards counted (0: a dense model).
struct RouterStats {
    int passes = 0;
    double balance_loss = 0, z_loss = 0, max_load = 0;
    double max_rank_load = 0;  // expert parallelism: the largest share of a rank's assignments sent to one rank
    long dropped = 0, assigned = 0;

    // Counts one MoE block's training forward: its losses, drops, choices made and each expert's
    // share of them.
    void add_pass(double balance, double z, long dropped_now, long assigned_now, const std::vector<float>& shares) {
        passes++;
        balance_loss += balance, z_loss += z, dropped += dropped_now, assigned += assigned_now;
        for (float share : shares) max_load = std::max(max_load, (double)share);
    }
    // What was counted, the losses averaged over the passes; counting starts again.
    RouterStats take() {
        RouterStats s = *this;
        if (s.passes > 0) s.balance_loss /= s.passes, s.z_loss /= s.passes;
        *this = {};
        return s;
    }
};

// The mixture-of-experts training options (--capacity-factor, --moe-balance-coef, --moe-z-coef), the
// same for both models.
struct MoeOptions {
    float capacity_factor = 0, balance_coef = 0.01f, z_coef = 0.001f;
};

struct AdamWConfig {
    float lr = 3e-4f;
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;  // decoupled, applied to matrices only (TensorSpec::decayed)
};

class Model {
public:
    virtual ~Model() = default;
    virtual const ModelConfig& config() const = 0;
    // The largest micro-batch the activations were sized for; calls may use any B <= max_B, T <= max_T.
    virtual int max_batch() const = 0;
    virtual int max_seq_len() const = 0;

    // Random GPT-2 init from a seed (identical across implementations), or weights from a model file.
    virtual void init_random(uint64_t seed) = 0;
    virtual void load(const std::string& path) = 0;
    // Writes llm.c's model file: fp32 (version 3) or, with bf16, bf16 rounded to nearest (version 5).
    virtual void save(const std::string& path, bool bf16 = false) = 0;

    virtual void zero_grad() = 0;
    // Forward and backward on one micro-batch of B x T tokens. Gradients ACCUMULATE (+=) and are
    // scaled by grad_scale (1 / (accumulation steps x ranks) gives the mean over the global batch).
    // last_micro_batch: the step's gradient is complete after this one, so its collectives start.
    // Returns this rank's micro-batch mean cross-entropy loss.
    virtual float forward_backward(const int* inputs, const int* targets, int B, int T, float grad_scale,
                                   bool last_micro_batch) = 0;
    // One optimizer step's gradient: forward and backward of `micro_batches` micro-batches of B x T
    // tokens each (inputs and targets hold them back to back), gradients accumulated and scaled as
    // forward_backward's. Returns the sum of the micro-batches' mean losses, the same on every rank
    // of a model cut over ranks. A pipeline-parallel model runs them by its schedule; any other
    // runs them one after another.
    virtual double forward_backward_step(const int* inputs, const int* targets, int micro_batches, int B, int T,
                                         float grad_scale) {
        double loss_sum = 0.0;
        const size_t BT = (size_t)B * T;
        for (int m = 0; m < micro_batches; m++)
            loss_sum += forward_backward(inputs + m * BT, targets + m * BT, B, T, grad_scale, m == micro_batches - 1);
        return loss_sum;
    }
    // Mean loss on a micro-batch, gradients untouched.
    virtual float evaluate(const int* inputs, const int* targets, int B, int T) = 0;
    // The cross-entropy at each of the micro-batch's B x T positions, into row_losses (host memory,
    // row-major in the batch's own order), the same on every rank of a model cut over ranks (the
    // context ranks' positions put back in place, the last pipeline stage's broadcast); gradients
    // untouched. What per-ending scores (HellaSwag, training/hellaswag.h) are summed from.
    virtual void evaluate_rows(const int* inputs, const int* targets, int B, int T, float* row_losses) = 0;
    // Logits (padded_vocab_size floats; only the first vocab_size mean anything) for the token that
    // follows tokens[0..T), written to logits_out (host memory).
    virtual void next_token_logits(const int* tokens, int T, float* logits_out) = 0;

    // The squared norm of the whole (all-rank) gradient; the same on every rank.
    virtual double grad_norm_squared() = 0;
    // One AdamW step (1-based `step` for bias correction) on this rank's shard of the parameters.
    // Each gradient is multiplied by grad_multiplier first (global-norm clipping).
    virtual void adamw_step(const AdamWConfig& opt, int step, float grad_multiplier) = 0;

    // Milliseconds spent blocked on communication since the last call (exposed, not overlapped).
    virtual double take_exposed_comm_ms() = 0;
    // A mixture-of-experts model's routing over its training passes since the last call.
    virtual RouterStats take_router_stats() { return {}; }
    // What FP8 quantizing clipped since the last call (--fp8; nothing without it).
    virtual Fp8Stats take_fp8_stats() { return {}; }
    // Bytes this rank allocated for one kind of memory (the --plan printout must agree).
    virtual size_t allocated_bytes(MemoryKind kind) const = 0;

    // Where each parameter sits in the flat buffers (built from the model's parameter table).
    virtual const ParamLayout& layout() const = 0;
    // The training state as this rank holds it, for checkpoints (ckpt/shard_state.h).
    virtual ShardedState& sharded_state() = 0;
    size_t num_params() const { return layout().num_params; }
};

// The argument checks every implementation makes before a pass: B and T within what the model was
// sized for, every token id within the vocabulary (targets may be null).
inline void check_batch(const ModelConfig& config, int max_B, int max_T, const int* inputs, const int* targets, int B,
                        int T, const char* who) {
    if (B < 1 || B > max_B) fail(strformat("%s: B = %d is not in [1, %d] (max_B)", who, B, max_B));
    if (T < 1 || T > max_T) fail(strformat("%s: T = %d is not in [1, %d] (max_T)", who, T, max_T));
    const int V = config.vocab_size;
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            fail(strformat("%s: inputs[%d] = %d is not a token id in [0, %d)", who, i, inputs[i], V));
        if (targets && (targets[i] < 0 || targets[i] >= V))
            fail(strformat("%s: targets[%d] = %d is not a token id in [0, %d)", who, i, targets[i], V));
    }
}

}  // namespace llmc
