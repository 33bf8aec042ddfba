// models/cpu_model.h: CPUModel, the fp32 CPU reference implementation of llmc::Model (forward, backward,
// AdamW), fast enough to be the project's default trainer on a small multicore machine. Its layers
// are llmc/cpu/ops.h (and cpu/llama_ops.h); this file wires them into a model of either family and
// owns the activation memory.
//
// Two families, one layer walk (models/family.h): both are pre-norm transformers whose block is
// residual += proj(attention(qkv(norm1(x)))); residual += down(act(up(norm2(x)))), so the walk is
// written once, and what differs is in four places: the norm (GPT-2's LayerNorm with bias, Llama's
// RMSNorm), the positions (GPT-2 adds wpe to the embedding, Llama rotates q and k in place after the
// qkv product, RoPE), the attention (Llama's key/value heads serve groups of query heads) and the
// MLP's activation (GELU of 4C units, SwiGLU of two ffn_hidden-wide halves). Which tensor plays each
// part is the family's BlockTensors; GPT-2's biases and wpe are tensors Llama lacks (-1: null), and
// GPT-2's head is its tied wte where Llama's is lm_head.
//
// Memory: parameters, gradients and the AdamW moments are one flat buffer each in ParamLayout's
// bucket-major order, reached only through param(tensor, layer) and grad(tensor, layer); activations
// are one flat buffer sized for max_B x max_T, cut per call by ActivationLayout. The lm-head logits
// (B x T x Vp floats) stay readable after evaluate(); forward_backward turns them into dlogits in
// place, inside the cross-entropy, while each row is still in cache.
//
// Parallelism, all of it optional and each a communicator the model is given: ZeRO over the
// data-parallel group (zero.h), tensor and sequence parallelism over the tensor group (TensorParallel:
// each layer's matrices cut, a few collectives per layer), pipeline parallelism over the pipeline
// group (PipelineParallel: this rank runs some chunks of consecutive layers, the first one with the
// embedding, the last with the head), and context parallelism over the context group (this rank
// runs every layer on 2 of the 2N chunks of each sequence, context_parallel.h; attention is ring
// attention, cpu/ring_attention.h; the ranks' weight gradients are partial sums, so ZeRO's group is
// then data x context). Forward and backward are written per chunk (forward_chunk,
// backward_chunk); without a pipeline the model is one chunk of every layer, and with one,
// run_schedule walks the step's schedule of chunk passes, messages between them.
//
// Mixture of experts (ModelConfig::num_experts): a block with experts runs cpu/moe.h in place of
// its MLP (or beside it, the shared expert); its routing and the experts' activations are kept per
// block (and per activation slot, for a pipeline's micro-batches in flight) outside the activation
// buffer, their size depending on the routing. The balance and z losses enter the training loss
// with MoeOptions' weights. Expert parallelism over the expert group (ep ranks carved from the data
// ranks): this rank holds a block of every MoE block's experts (EpShard), routes its own tokens, and
// runs its experts on the rows every rank of the group sends them (dist/expert_parallel.h); ZeRO
// reduces the experts over the data ranks that hold the same ones. Under tensor parallelism (as
// Megatron-LM does) the router is a replica and every tensor rank routes all B x T rows (gathered
// under sequence parallelism) alike, so routing, capacity and losses do not depend on tp; each
// expert's MLP is cut as GPT-2's is, its outputs summed over the tensor group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llmc/cpu/fp8_linear.h"
#include "llmc/cpu/llama_ops.h"
#include "llmc/cpu/moe.h"
#include "llmc/cpu/ops.h"
#include "llmc/cpu/ring_attention.h"
#include "llmc/dist/context_parallel.h"
#include "llmc/dist/expert_parallel.h"
#include "llmc/dist/host_memory.h"
#include "llmc/dist/pipeline_stage.h"
#include "llmc/dist/zero.h"
#include "llmc/model.h"
#include "llmc/models/family.h"
#include "llmc/models/model_file.h"
#include "llmc/utils.h"

namespace llmc {

// How a model is cut over its tensor-parallel group (Megatron-LM, with Korthikanti et al.'s sequence
// parallelism): `size` ranks, this one `rank`; with `sequence_parallel` the LayerNorms, residual
// stream and embeddings hold 1/size of a batch's B x T token rows (contiguous blocks, rank order).
struct TensorParallel {
    int size = 1, rank = 0;
    bool sequence_parallel = false;
    // Token rows per rank of a batch of BT rows.
    int rows(int BT) const { return sequence_parallel ? BT / size : BT; }
};

// Where each activation lives in the flat activation buffer for a call with B x T tokens. Per-layer
// tensors hold all of the rank's layers back to back. Sizes grow with B and T, so the layout for any
// B <= max_B, T <= max_T fits in a buffer of size_for(max_B, max_T). Under tensor parallelism the
// attention and MLP activations hold this rank's heads and hidden units (1/tp), the logits its
// vocabulary columns, and with sequence parallelism the residual stream and LayerNorm outputs its
// n = BT/tp token rows. Under pipeline parallelism the buffer holds `slots` micro-batches'
// activations (one slot each; `slot` picks the one this layout points into) and one set of the
// backward's scratch, which every slot shares. With ring attention (context parallelism: B x T are
// this rank's rows) `att` holds each query row's log-sum-exp rather than its softmax row.
struct ActivationLayout {
    // per slot: each chunk's input (the embedding's output, or the activation received from the
    // previous stage), the layers' activations, and with the head the final norm, logits and losses
    float *inputs, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu, *residual3, *lnf, *lnf_mean, *lnf_rstd, *logits, *row_loss;
    // shared backward scratch: gradients of the residual stream and of one layer's intermediates
    // (d3C: of qkv, d4C: of the MLP's up product, dhidden: of its activation's output, SwiGLU only)
    float *dresidual, *dC, *d3C, *d4C, *dhidden;
    // tensor parallelism only (empty otherwise): a LayerNorm output gathered to all B x T rows, a
    // row-parallel product's partial sum, the gathered residual gradient, the reduced gradient of a
    // LayerNorm output (sequence parallel), every rank's cross-entropy statistics, and the LayerNorm
    // weight gradients of one layer before they are summed over the group (sequence parallel)
    float *full, *partial, *dfull, *dln, *ce_stats, *dln_weights;
    // pipeline parallelism only: where a message from a neighbouring stage lands, and two buffers the
    // input gradients leave from
    float *recv, *send_grad;
    // ring attention only: the key/value blocks in flight and their gradients, and the backward's
    // per-row sums (cpu/ring_attention.h)
    float *ring, *rowsum;

    size_t slot_floats = 0, scratch_floats = 0;
    size_t total_floats = 0;  // the buffer size this layout needs (every slot and the scratch)
    int slot = 0;             // the slot this layout points into

    static size_t size_for(const ModelConfig& c, int B, int T, const TensorParallel& tp = {},
                           const StageShape& stage = {}, bool ring_attention = false) {
        return ActivationLayout(c, B, T, nullptr, tp, stage, 0, ring_attention).total_floats;
    }

    // Assigns slices of `base`; with base == nullptr only the sizes are computed.
    ActivationLayout(const ModelConfig& c, int B, int T, float* base, const TensorParallel& tp = {},
                     const StageShape& stage = {}, int slot = 0, bool ring_attention = false)
        : slot(slot) {
        const size_t BT = (size_t)B * T, C = c.channels, NH = c.num_heads / tp.size;
        const BlockWidths w(c, tp.size);
        const size_t L = stage.layers < 0 ? c.num_layers : stage.layers;
        const size_t Vp = c.padded_vocab_size / tp.size, n = tp.rows((int)BT), Cl = C / tp.size;
        const bool split = tp.size > 1, sp = tp.sequence_parallel, head = stage.head, pipe = stage.pipelined;
        struct Take {
            float** p;
            size_t offset, count;
            bool per_slot;
        };
        std::vector<Take> takes;
        auto take = [&](float*& p, size_t count, bool per_slot) {
            size_t& at = per_slot ? slot_floats : scratch_floats;
            takes.push_back({&p, at, count, per_slot});
            at += (count + 15) / 16 * 16;  // keep every tensor 64-byte aligned
        };
        auto keep = [&](float*& p, size_t count) { take(p, count, true); };
        auto share = [&](float*& p, size_t count) { take(p, count, false); };
        keep(inputs, stage.chunks * n * C);
        keep(ln1, L * n * C);
        keep(ln1_mean, L * n);  // LayerNorm's only; RMSNorm leaves it unused
        keep(ln1_rstd, L * n);
        keep(qkv, L * BT * w.qkv);
        keep(atty, L * BT * Cl);
        keep(att, ring_attention ? L * B * NH * T : L * B * NH * T * T);
        keep(residual2, L * n * C);
        keep(ln2, L * n * C);
        keep(ln2_mean, L * n);
        keep(ln2_rstd, L * n);
        keep(fch, L * BT * w.up);
        keep(fch_gelu, L * BT * w.hidden);
        keep(residual3, L * n * C);
        keep(lnf, head ? n * C : 0);
        keep(lnf_mean, head ? n : 0);
        keep(lnf_rstd, head ? n : 0);
        keep(logits, head ? BT * Vp : 0);
        keep(row_loss, head ? BT : 0);
        share(dresidual, n * C);
        share(dC, BT * C);
        share(d3C, BT * w.qkv);
        share(d4C, BT * w.up);
        share(dhidden, w.swiglu ? BT * w.hidden : 0);
        share(full, sp ? BT * C : 0);
        share(partial, split ? BT * C : 0);
        share(dfull, sp ? BT * C : 0);
        share(dln, sp ? n * C : 0);
        share(ce_stats, split && head ? BT * 3 * tp.size : 0);
        share(dln_weights, sp ? 4 * C : 0);
        share(recv, pipe ? n * C : 0);
        share(send_grad, pipe ? 2 * n * C : 0);
        share(ring, ring_attention ? cpu::RingAttention::ring_floats(B, T, w.kv_heads * w.head_size) : 0);
        share(rowsum, ring_attention ? B * NH * T : 0);
        total_floats = stage.slots * slot_floats + scratch_floats;
        for (const Take& t : takes) {
            const size_t at = t.per_slot ? slot * slot_floats + t.offset : stage.slots * slot_floats + t.offset;
            *t.p = base && t.count ? base + at : nullptr;
        }
    }
};

class CPUModel : public Model, private PipelineStage {
public:
    // A model sharded over `dp` by ZeRO stage `zero_stage` (see zero.h); when `tp` has more than one
    // rank, cut over it by tensor parallelism (sequence parallel if asked; see TensorParallel); when
    // `pp` has more than one rank, cut into pipeline stages over it (see PipelineParallel); when `cp`
    // has more than one rank, each sequence split over it (context parallelism; `dp` must then be the
    // data x context group, ProcessGroups::dp_cp(), since the context ranks' gradients add up); when
    // `ep` has more than one rank, the experts split over it (expert parallelism; `expert_data` is the
    // group of data-parallel ranks that hold the same experts, ProcessGroups::expert_data(), which
    // ZeRO reduces them over; null: dp). Under hybrid sharding `dp` is the shard group
    // (ProcessGroups::zero_shard) and `replicas` the replicas of this rank's shard (zero_replicas).
    // Every entry point takes whole sequences of max_T or fewer tokens, the same on every context rank.
    CPUModel(const ModelConfig& config, int max_B, int max_T, Communicator& dp, int zero_stage,
            Communicator& tp = local_communicator(), bool sequence_parallel = false,
            Communicator& pp = local_communicator(), const PipelineParallel& pipe = {},
            Communicator& cp = local_communicator(), Communicator& ep = local_communicator(),
            Communicator* expert_data = nullptr, Communicator* replicas = nullptr)
        : config_(validated(config)), tp_comm_(tp),
          tp_{tp.world_size(), tp.rank(), sequence_parallel && tp.world_size() > 1}, pp_comm_(pp),
          pipe_(checked_pipeline("CPUModel", config.num_layers, pp, pipe)),
          layout_(model_layout(config, {tp.rank(), tp.world_size()}, model_stage_slice(config, pipe_.split, pp.rank()),
                               {ep.rank(), ep.world_size()})),
          stage_(pipeline_stage_shape(pipe_, pp.rank())), max_B_(max_B), max_T_(max_T),
          engine_(layout_,
                  ZeroPlan(layout_, zero_stage, dp.rank(), dp.world_size(), 1, (expert_data ? *expert_data : dp).rank(),
                           (expert_data ? *expert_data : dp).world_size()),
                  dp, memory_),
          dp_comm_(dp), replicas_comm_(replicas), cp_comm_(cp), cp_{cp.world_size(), cp.rank(), max_T}, ring_(cp),
          ep_comm_(ep) {
        if (max_B < 1) fail(strformat("CPUModel: max_B must be >= 1, got %d", max_B));
        if (max_T < 1 || max_T > config.max_seq_len)
            fail(strformat("CPUModel: max_T must be in [1, %d] (the model's max_seq_len), got %d", config.max_seq_len,
                           max_T));
        ContextSplit::check(max_T, cp_.size, "CPUModel");
        check_tensor_parallel_shape(config_, tp_.size);
        if (tp_.sequence_parallel && max_T / cp_.size % tp_.size != 0)
            fail(strformat("CPUModel: sequence parallelism over %d ranks needs T / cp (%d / %d) divisible by them",
                           tp_.size, max_T, cp_.size));
        engine_.set_tensor_parallel(tp);
        engine_.set_pipeline_parallel(pp);
        engine_.set_expert_parallel(expert_data ? *expert_data : dp, ep);
        if (replicas) engine_.set_replicas(*replicas);
        chunks_ = pipeline_chunks(pipe_.split, pp.rank());
        // Where activations and gradients travel between the stages (pipeline_links).
        if (stage_.pipelined) links_ = pipeline_links(pp, pipe_.edge_links);
        acts_.assign(activation_floats(config_, max_B, max_T, tp_, stage_, cp_.size), 0.0f);
    }
    // A single-rank model (stage 0, nothing to communicate).
    CPUModel(const ModelConfig& config, int max_B, int max_T) : CPUModel(config, max_B, max_T, local_communicator(), 0) {}

    // The activation buffer's length for a max_B x max_T model on a context group of cp ranks (the
    // planner reads the same function).
    static size_t activation_floats(const ModelConfig& c, int max_B, int max_T, const TensorParallel& tp = {},
                                    const StageShape& stage = {}, int cp = 1) {
        // + slack for 64-byte alignment
        return ActivationLayout::size_for(c, max_B, max_T / cp, tp, stage, cp > 1) + 16;
    }
    // Everything one rank allocates: the engine's buffers and the activations (what --plan prints).
    static std::vector<BufferSpec> memory_specs(const ZeroPlan& zero, const ModelConfig& c, int max_B, int max_T,
                                                const TensorParallel& tp = {}, const StageShape& stage = {},
                                                int cp = 1, int ep = 1) {
        std::vector<BufferSpec> specs = buffer_specs(zero);
        specs.push_back({stage.slots > 1 ? strformat("activations (%d micro-batches)", stage.slots) : "activations",
                         MemoryKind::Activations, activation_floats(c, max_B, max_T, tp, stage, cp)});
        if (c.num_experts > 0)
            specs.push_back({"expert activations (at most)", MemoryKind::Activations,
                             moe_activation_floats(c, max_B, max_T, ep, tp.size) * stage.slots});
        return specs;
    }
    // The most the MoE blocks keep per activation slot, dropless: per block its routing (rows x E
    // probabilities, the choices), its assignments' input and output rows, the rows its experts ran
    // on (input, fc, GELU, output; under expert parallelism at most every rank's assignments, when
    // all go to this rank's experts), and its output; once, the scratch of the passes. (The vectors
    // grow to what the routing needs, never past this.) Every tensor rank routes all rows; its
    // experts' hidden activations are its 1/tp of their units.
    static size_t moe_activation_floats(const ModelConfig& c, int max_B, int max_T, int ep = 1, int tp = 1) {
        const size_t rows = (size_t)max_B * max_T, A = rows * c.moe_top_k, C = c.channels, F = 4 * C / tp;
        const size_t E = c.num_experts;
        const size_t R = A * ep;  // rows at this rank's experts
        size_t blocks = 0;
        for (int l = 0; l < c.num_layers; l++) blocks += c.is_moe_layer(l);
        const size_t routing = rows * E + rows + 3 * A + E + 1 + E;  // ints count as floats
        const size_t block = routing + 2 * A * C + R * (2 * C + 2 * F) + rows * C;
        return blocks * block + rows * E + 2 * A * C + R * (4 * C + F) + rows * C;
    }

    const ModelConfig& config() const override { return config_; }
    const ParamLayout& layout() const override { return layout_; }
    void set_moe_options(const MoeOptions& o) { moe_options_ = o; }
    // FP8 products (cpu/fp8_linear.h): the simulation the CUDA model's FP8 kernels are checked against.
    void set_fp8_options(const Fp8Options& o) {
        fp8_ = cpu::Fp8Linears(layout_.num_layers(), o);
        engine_.attach_replicated_state(&fp8_);
    }
    Fp8Stats take_fp8_stats() override { return fp8_.take_stats(); }
    RouterStats take_router_stats() override { return router_stats_.take(); }
    int max_batch() const override { return max_B_; }
    int max_seq_len() const override { return max_T_; }

    // Both start a fresh model: gradients and AdamW moments are reset. Every rank passes the same
    // seed or file and keeps its own shard (its tensor-parallel piece of its stage, cut from the
    // whole model).
    void init_random(uint64_t seed) override {
        std::vector<float> whole(whole_layout().num_params);
        init_params(whole_layout(), whole.data(), seed);
        reset(piece_of(whole));
    }
    void load(const std::string& path) override {
        std::vector<float> whole(whole_layout().num_params);
        read_model_file(path, config_, whole.data());
        reset(piece_of(whole));
    }
    // A collective: every rank calls it, rank 0 of every group writes the whole model.
    void save(const std::string& path, bool bf16 = false) override {
        std::vector<float> whole(whole_layout().num_params);
        get_whole_params(whole.data());
        if (engine_.plan().rank == 0 && tp_.rank == 0 && pp_comm_.rank() == 0)
            write_model_file(path, config_, whole.data(), bf16 ? MODEL_FILE_VERSION_BF16 : MODEL_FILE_VERSION_FP32);
    }
    // This rank's parameters in its own layout (layout()), whatever the ZeRO stage; a collective.
    void get_params(float* local) { engine_.get_params(local); }
    // The whole model's parameters in the whole-model layout, on every rank; a collective over every
    // group. Each rank puts the elements it holds first-hand into a zeroed whole (ParamLayout::
    // is_primary: every element comes from one rank; of the expert group, whose ranks all hold the
    // tensors that are not per-expert, rank 0 only puts those) and the sums over the tensor,
    // pipeline and expert groups fill in the rest, exactly (x + 0 is x).
    void get_whole_params(float* whole) {
        std::vector<float> local(layout_.num_params);
        engine_.get_params(local.data());
        if (layout_.is_whole()) {
            std::copy(local.begin(), local.end(), whole);
            return;
        }
        std::fill(whole, whole + whole_layout().num_params, 0.0f);
        copy_between_layouts(whole_layout(), whole, layout_, local.data(), false, /*primary_only=*/true);
        if (ep_comm_.rank() > 0)
            for (const ParamLayout::Segment& seg : whole_layout().segments())
                if (!whole_layout().is_per_expert(seg.tensor)) std::fill(whole + seg.begin, whole + seg.end, 0.0f);
        for (Communicator* group : {&tp_comm_, &pp_comm_, &ep_comm_})
            if (group->world_size() > 1) group->all_reduce_sum(whole, whole_layout().num_params, CommDtype::F32).wait();
    }

    void zero_grad() override { engine_.zero_grad(); }

    float forward_backward(const int* inputs, const int* targets, int B, int T, float grad_scale,
                           bool last_micro_batch) override {
        check_batch(inputs, targets, B, T, "forward_backward");
        if (stage_.pipelined)
            fail("CPUModel: a pipeline-parallel model runs a whole step at once (forward_backward_step)");
        const LocalBatch local = local_batch(inputs, targets, B, T);
        const ActivationLayout a = activations(B, local.T, 0);
        const float loss = forward_chunk(a, 0, local.inputs, local.targets, B, local.T, Pass::Train, grad_scale);
        backward_chunk(a, 0, local.inputs, B, local.T, last_micro_batch);
        return loss;
    }
    double forward_backward_step(const int* inputs, const int* targets, int micro_batches, int B, int T,
                                 float grad_scale) override {
        if (!stage_.pipelined) return Model::forward_backward_step(inputs, targets, micro_batches, B, T, grad_scale);
        for (int m = 0; m < micro_batches; m++)
            check_batch(inputs + (size_t)m * B * T, targets + (size_t)m * B * T, B, T, "forward_backward_step");
        const LocalBatch local = local_batch(inputs, targets, micro_batches * B, T);
        return run_schedule(local.inputs, local.targets, micro_batches, B, local.T, grad_scale);
    }
    float evaluate(const int* inputs, const int* targets, int B, int T) override {
        check_batch(inputs, targets, B, T, "evaluate");
        const LocalBatch local = local_batch(inputs, targets, B, T);
        return forward_through_stages(local.inputs, local.targets, B, local.T, Pass::Evaluate);
    }
    // The last stage holds the losses of this rank's positions (all rows on every tensor rank): the
    // context ranks' are gathered and put back in place, then the last stage broadcasts them.
    void evaluate_rows(const int* inputs, const int* targets, int B, int T, float* row_losses) override {
        check_batch(inputs, targets, B, T, "evaluate_rows");
        const LocalBatch local = local_batch(inputs, targets, B, T);
        forward_through_stages(local.inputs, local.targets, B, local.T, Pass::Evaluate);
        if (stage_.head) {
            const float* mine = activations(B, local.T, 0).row_loss;
            const size_t n = (size_t)B * local.T;
            if (cp_.size == 1) {
                std::copy(mine, mine + n, row_losses);
            } else {
                std::vector<float> gathered(n * cp_.size);
                cp_comm_.all_gather(mine, gathered.data(), n, CommDtype::F32).wait();
                cp_.place_gathered(gathered.data(), B, row_losses);
            }
        }
        if (stage_.pipelined)
            wait(pp_comm_.broadcast(row_losses, (size_t)B * T * sizeof(float), pipe_.split.last_rank()));
    }
    // Every rank of the tensor and pipeline groups calls it with the same tokens and gets the whole row.
    void next_token_logits(const int* tokens, int T, float* logits_out) override {
        llmc::check_batch(config_, max_B_, max_T_, tokens, nullptr, 1, T, "next_token_logits");
        // Sequence and context parallelism cut the rows into equal blocks: pad with token 0 to a length
        // they cut. Attention is causal, so the padding cannot change the logits at position T - 1,
        // which the context rank that holds it broadcasts (every other one computes a row unused).
        const int unit = cp_.padding_unit(tp_.sequence_parallel ? tp_.size : 1);
        std::vector<int> padded(tokens, tokens + T);
        padded.resize((T + unit - 1) / unit * unit, 0);
        const LocalBatch local = local_batch(padded.data(), nullptr, 1, (int)padded.size());
        forward_through_stages(local.inputs, nullptr, 1, local.T, Pass::LastLogits, cp_.local_index_at_owner(T - 1));
        const ActivationLayout a = activations(1, local.T, 0);
        const size_t cols = config_.padded_vocab_size / tp_.size;
        if (stage_.head) {
            if (tp_.size == 1) std::copy(a.logits, a.logits + cols, logits_out);
            else tp_comm_.all_gather(a.logits, logits_out, cols, CommDtype::F32).wait();
            if (cp_.size > 1)
                cp_comm_.broadcast(logits_out, config_.padded_vocab_size * sizeof(float), cp_.owner_of(T - 1)).wait();
        }
        if (stage_.pipelined)
            wait(pp_comm_.broadcast(logits_out, config_.padded_vocab_size * sizeof(float), pipe_.split.last_rank()));
    }

    double grad_norm_squared() override { return engine_.grad_norm_squared(); }
    void adamw_step(const AdamWConfig& opt, int step, float grad_multiplier) override {
        fp8_.end_step(dp_comm_, replicas_comm_);
        engine_.adamw_step(opt, step, grad_multiplier);
    }
    double take_exposed_comm_ms() override {
        return engine_.take_exposed_comm_ms() + take(tp_exposed_ms_) + ring_.take_wait_ms();
    }
    // Milliseconds this rank waited on the other pipeline stages since the last call (its share of
    // the pipeline's bubble, and the messages' time), also counted in take_exposed_comm_ms.
    double take_pipeline_wait_ms() { return take(pp_wait_ms_); }
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
    const float* logits() const { return activations(last_B_, last_T_, 0).logits; }

private:
    static const ModelConfig& validated(const ModelConfig& c) {
        c.validate();
        return c;
    }
    static double take(double& ms) {
        const double t = ms;
        ms = 0;
        return t;
    }
    // The activation buffer rounded up to a 64-byte boundary (acts_ has 16 floats of slack).
    float* activation_base() const {
        const uintptr_t p = reinterpret_cast<uintptr_t>(acts_.data());
        return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
    }
    // The layout for B sequences of this rank's T rows each.
    ActivationLayout activations(int B, int T, int slot) const {
        return ActivationLayout(config_, B, T, activation_base(), tp_, stage_, slot, cp_.size > 1);
    }
    template <typename T>
    T* unsharded(T* p) {
        if (engine_.plan().world_size != 1 || engine_.plan().stage != 0 || !layout_.is_whole())
            fail("CPUModel: params()/grads() need an unsharded single-rank model (stage 0, 1 rank, no tensor or "
                 "pipeline parallelism)");
        return p;
    }

    // The whole model's layout (model files, init), and this rank's piece of a whole-model buffer.
    const ParamLayout& whole_layout() const { return layout_.is_whole() ? layout_ : whole_layout_; }
    std::vector<float> piece_of(std::vector<float>& whole) const { return piece_of_whole(whole_layout(), whole, layout_); }

    // Parameters and gradients are reached only through the bucket view (zero.h), so the model
    // never knows how they are sharded.
    // A tensor the family lacks (-1 in BlockTensors: GPT-2's biases in Llama) is null.
    const float* param(int tensor, int layer = 0) const { return tensor < 0 ? nullptr : buckets_.param(tensor, layer); }
    float* grad(int tensor, int layer = 0) const { return tensor < 0 ? nullptr : buckets_.grad(tensor, layer); }
    void release_all() { buckets_.release_all(); }

    void reset(const std::vector<float>& local) {
        engine_.set_params(local.data());
        engine_.reset_optimizer();
    }

    void check_batch(const int* inputs, const int* targets, int B, int T, const char* who) const {
        llmc::check_batch(config_, max_B_, max_T_, inputs, targets, B, T, who);
        ContextSplit::check(T, cp_.size, who);
        if (tp_.sequence_parallel && (B * T / cp_.size) % tp_.size != 0)
            fail(strformat("%s: sequence parallelism needs B*T/cp = %d*%d/%d divisible by the %d tensor-parallel ranks",
                           who, B, T, cp_.size, tp_.size));
    }

    // ---- context parallelism: this rank's positions of each sequence (context_parallel.h) ----

    LocalBatch local_batch(const int* inputs, const int* targets, int sequences, int T) {
        return batcher_.take(cp_, inputs, targets, sequences, T);
    }
    // The global position of each of this rank's rows of a sequence (null: row t is position t).
    const int* positions() const { return cp_.size > 1 ? batcher_.positions().data() : nullptr; }

    // ---- tensor parallelism: the four collectives of the tensor-parallel group ----
    // With one rank each is the identity, so the model below is one code path for every tp.

    void tp_wait(CommHandle h) {
        h.wait();
        tp_exposed_ms_ += h.wait_ms();
    }
    // All B x T rows of a tensor of `C` columns this rank holds `rows` of (its block under sequence
    // parallelism, gathered into `full`; otherwise already whole).
    const float* gather_rows(const float* mine, float* full, int BT, int C) {
        if (!tp_.sequence_parallel) return mine;
        tp_wait(tp_comm_.all_gather(mine, full, (size_t)tp_.rows(BT) * C, CommDtype::F32));
        return full;
    }
    // Sums the group's partial products (B x T rows of C) and returns this rank's rows of the sum:
    // reduce-scattered into `mine` under sequence parallelism, else all-reduced in place.
    const float* reduce_rows(float* partial, float* mine, int BT, int C) {
        if (tp_.size == 1) return partial;
        if (!tp_.sequence_parallel) {
            tp_wait(tp_comm_.all_reduce_sum(partial, (size_t)BT * C, CommDtype::F32));
            return partial;
        }
        tp_wait(tp_comm_.reduce_scatter_sum(partial, mine, (size_t)tp_.rows(BT) * C, CommDtype::F32));
        return mine;
    }
    // out = base + inp W^T + bias for a row-parallel product (W cut by input columns, inp this
    // rank's columns of every row): each rank's product is a partial sum, reduced over the group
    // before the bias and the residual `base` (this rank's rows) are added.
    void row_parallel_forward(const ActivationLayout& a, int l, Fp8Product product, float* out, const float* inp,
                              const float* weight, const float* bias, const float* base, int BT, int IC, int C) {
        if (tp_.size == 1) {
            linear_forward(l, product, out, inp, weight, bias, base, BT, IC, C);
            return;
        }
        linear_forward(l, product, a.partial, inp, weight, nullptr, nullptr, BT, IC, C);
        const float* sum = reduce_rows(a.partial, out, BT, C);
        const int n = tp_.rows(BT);
#pragma omp parallel for schedule(static)
        for (int r = 0; r < n; r++)
            for (int c = 0; c < C; c++)
                out[(size_t)r * C + c] = base[(size_t)r * C + c] + sum[(size_t)r * C + c] + (bias ? bias[c] : 0.0f);
    }
    // Block l's product `product`, out = base + inp W^T + bias: in fp32, or through the FP8 simulation.
    void linear_forward(int l, Fp8Product product, float* out, const float* inp, const float* weight,
                        const float* bias, const float* base, int rows, int C, int OC) {
        if (fp8_.enabled()) fp8_.forward(l, product, out, inp, weight, bias, base, rows, C, OC);
        else cpu::matmul_forward(out, inp, weight, bias, base, rows, C, OC);
    }
    void linear_backward(int l, Fp8Product product, float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, int rows, int C, int OC) {
        if (fp8_.enabled()) fp8_.backward(l, product, dinp, dweight, dbias, dout, inp, weight, rows, C, OC);
        else cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, rows, C, OC);
    }

    // The first vocabulary row this rank holds, and how many of its rows are real tokens.
    int vocab_begin() const { return tp_.rank * (config_.padded_vocab_size / tp_.size); }
    int vocab_real() const {
        return std::clamp(config_.vocab_size - vocab_begin(), 0, config_.padded_vocab_size / tp_.size);
    }
    // Where a layer's norm weight gradients accumulate: straight into the gradient buffer, or,
    // under sequence parallelism (each rank saw only its rows, so each holds a partial sum), into a
    // scratch that finish_layernorm_grads sums over the group and adds in. Null for a tensor the
    // family lacks (RMSNorm's bias).
    float* layernorm_grad(const ActivationLayout& a, int tensor, int layer, int slot) {
        if (tensor < 0) return nullptr;
        return tp_.sequence_parallel ? a.dln_weights + (size_t)slot * config_.channels : grad(tensor, layer);
    }
    void start_layernorm_grads(const ActivationLayout& a) {
        if (tp_.sequence_parallel) std::fill(a.dln_weights, a.dln_weights + 4 * (size_t)config_.channels, 0.0f);
    }
    void finish_layernorm_grads(const ActivationLayout& a, std::initializer_list<std::pair<int, int>> tensors) {
        if (!tp_.sequence_parallel) return;
        const size_t C = config_.channels;
        tp_wait(tp_comm_.all_reduce_sum(a.dln_weights, tensors.size() * C, CommDtype::F32));
        int slot = 0;
        for (auto [tensor, layer] : tensors) {
            const float* d = a.dln_weights + slot++ * C;
            if (tensor < 0) continue;
            float* g = grad(tensor, layer);
            for (size_t c = 0; c < C; c++) g[c] += d[c];
        }
    }

    // What a forward pass leaves behind: the loss and logits (Evaluate), the loss and dlogits
    // scaled by grad_scale, ready for backward (Train), or only row logits_row's logits.
    enum class Pass { Evaluate, Train, LastLogits };

    // ---- pipeline parallelism: this rank's part of a step (pipeline_stage.h runs the schedule) ----

    // The chunk's output: the residual stream after its last layer (this rank's rows of it).
    float* chunk_output(const ActivationLayout& a, const PipelineChunk& ch, int BT) const {
        return a.residual3 + (size_t)(ch.end - 1) * tp_.rows(BT) * config_.channels;
    }
    float* chunk_input(const ActivationLayout& a, int chunk, int BT) const {
        return a.inputs + (size_t)chunk * tp_.rows(BT) * config_.channels;
    }
    size_t message_bytes(int BT) const { return (size_t)tp_.rows(BT) * config_.channels * sizeof(float); }

    PipelineBatch step_;  // the step under way, for the PipelineStage calls below

    // PipelineStage: the passes and buffers of the step under way (host memory, synchronous).
    double pipeline_forward(int chunk, int mb, int slot) override {
        return forward_chunk(activations(step_.B, step_.T, slot), chunk, step_.inputs_of(mb), step_.targets_of(mb),
                             step_.B, step_.T, Pass::Train, step_.grad_scale);
    }
    void pipeline_backward(int chunk, int mb, int slot, bool last_micro_batch) override {
        backward_chunk(activations(step_.B, step_.T, slot), chunk, step_.inputs_of(mb),
                       step_.B, step_.T, last_micro_batch);
    }
    void* chunk_input(int chunk, int slot) override {
        return chunk_input(activations(step_.B, step_.T, slot), chunk, step_.rows());
    }
    void* chunk_output(int chunk, int slot) override {
        return chunk_output(activations(step_.B, step_.T, slot), chunks_[chunk], step_.rows());
    }
    void* residual_grad() override { return activations(step_.B, step_.T, 0).dresidual; }
    void* message_buffer(int which) override {
        const ActivationLayout a = activations(step_.B, step_.T, 0);
        return which == 0 ? a.recv : a.send_grad + (size_t)(which - 1) * tp_.rows(step_.rows()) * config_.channels;
    }
    void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void add(float* into, const float* from, size_t count) override {
        for (size_t i = 0; i < count; i++) into[i] += from[i];
    }
    void wait(CommHandle h) override {
        h.wait();
        pp_wait_ms_ += h.wait_ms();
        tp_exposed_ms_ += h.wait_ms();
    }

    // A forward pass through every virtual stage in order, one micro-batch, stage after stage: what
    // evaluation and sampling run (Pass::Evaluate or LastLogits). Returns the mean loss on every rank.
    float forward_through_stages(const int* inputs, const int* targets, int B, int T, Pass pass, int logits_row = 0) {
        const ActivationLayout a = activations(B, T, 0);
        if (!stage_.pipelined) return forward_chunk(a, 0, inputs, targets, B, T, pass, 0.0f, logits_row);
        step_ = {inputs, targets, B, T, 0.0f};
        float loss = (float)run_pipeline_forward(*this, pipe_.split, pp_comm_.rank(), message_bytes(B * T), links_,
                                                 [&](int chunk) {
                                                     return forward_chunk(a, chunk, inputs, targets, B, T, pass, 0.0f,
                                                                          logits_row);
                                                 });
        wait(pp_comm_.broadcast(&loss, sizeof(loss), pipe_.split.last_rank()));
        return loss;
    }

    // One step of a pipeline-parallel model (run_pipeline_step): returns the sum of the micro-batch
    // losses, computed by the last stage and broadcast to the others. Then GPT-2's tied embedding's
    // two copies, the first stage's and the last's, each holding a part of its gradient, both get
    // the sum, so both take the same AdamW update and stay equal.
    double run_schedule(const int* inputs, const int* targets, int m, int B, int T, float grad_scale) {
        step_ = {inputs, targets, B, T, grad_scale};
        const int rank = pp_comm_.rank();
        double loss_sum = run_pipeline_step(*this, pipe_.split, rank, m, stage_.slots, message_bytes(B * T), links_);
        wait(pp_comm_.broadcast(&loss_sum, sizeof(loss_sum), pipe_.split.last_rank()));
        if (const int peer = pipe_.split.tied_embedding_peer(rank); peer >= 0 && tensors_.tied()) {
            size_t count = 0;
            float* mine = engine_.update_grads(layout_.bucket_of(tensors_.wte), &count);
            sum_with_peer(*this, pp_comm_, mine, count, peer, activation_base(), acts_.size() - 16, pp_comm_);
        }
        return loss_sum;
    }

    // The forward pass of one chunk of this rank's layers on a checked batch, in the activation slot
    // `a`: from the embedding, or from the input received into the slot; to the loss (returned; 0 for
    // LastLogits) where the chunk ends the model, else to its output in the slot.
    float forward_chunk(const ActivationLayout& a, int chunk, const int* inputs, const int* targets, int B, int T,
                        Pass pass, float grad_scale, int logits_row = 0) {
        last_B_ = B;
        moe_training_ = pass == Pass::Train;
        fp8_.set_training(pass == Pass::Train);
        moe_grad_scale_ = grad_scale;  // every chunk's MoE blocks weigh their losses' gradients by it
        last_T_ = T;
        const PipelineChunk& ch = chunks_[chunk];
        const int C = config_.channels, Cl = C / tp_.size, QKV = (int)widths_.qkv;
        const int V = config_.vocab_size, Vl = config_.padded_vocab_size / tp_.size, BT = B * T, n = tp_.rows(BT);
        float* x = chunk_input(a, chunk, BT);
        const BlockTensors& P = tensors_;
        buckets_.acquire_resident();
        if (ch.embedding) embedding_forward(a, x, inputs, B, T);
        for (int l = ch.begin; l < ch.end; l++) {
            buckets_.enter_layer(l, Walk::Forward, ch.begin, ch.end);
            const size_t nc = (size_t)l * n * C, bc = (size_t)l * BT * Cl;  // this layer's slices
            const float* residual = l == ch.begin ? x : a.residual3 + nc - (size_t)n * C;
            norm_forward(a.ln1 + nc, a.ln1_mean + l * n, a.ln1_rstd + l * n, residual, P.norm1_w, P.norm1_b, l, n);
            float* qkv = a.qkv + (size_t)l * BT * QKV;
            linear_forward(l, FP8_QKV, qkv, gather_rows(a.ln1 + nc, a.full, BT, C), param(P.qkv_w, l),
                           param(P.qkv_b, l), nullptr, BT, C, QKV);
            if (rotary()) rope(qkv, B, T, 1.0f);
            attention_forward(a, l, B, T);
            row_parallel_forward(a, l, FP8_ATTPROJ, a.residual2 + nc, a.atty + bc, param(P.attproj_w, l),
                                 param(P.attproj_b, l), residual, BT, Cl, C);
            norm_forward(a.ln2 + nc, a.ln2_mean + l * n, a.ln2_rstd + l * n, a.residual2 + nc, P.norm2_w, P.norm2_b,
                         l, n);
            mlp_forward(a, l, BT);
            buckets_.leave_layer(l, Walk::Forward);
        }
        if (!ch.head) {
            if (pass != Pass::Train) release_all();
            return 0.0f;
        }
        norm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, chunk_output(a, ch, BT), P.normf_w, P.normf_b, 0, n);
        const float* lnf = gather_rows(a.lnf, a.full, BT, C);
        if (pass == Pass::LastLogits) {
            cpu::matmul_forward(a.logits, lnf + (size_t)logits_row * C, param(P.head), nullptr, nullptr, 1, C, Vl);
            release_all();
            return 0.0f;
        }
        cpu::matmul_forward(a.logits, lnf, param(P.head), nullptr, nullptr, BT, C, Vl);
        // Training keeps the embeddings and final norm for backward; an evaluation is done with them.
        if (pass != Pass::Train) release_all();
        // The whole backward is linear in the loss gradient, so grad_scale enters once, here (and
        // for the experts' auxiliary losses, in backward). The loss is the mean over the context
        // group's rows.
        const bool train = pass == Pass::Train;
        const int group_rows = BT * cp_.size;
        if (tp_.size == 1) {
            cpu::crossentropy(a.row_loss, a.logits, targets, train, grad_scale / group_rows, BT, V, Vl);
        } else {  // vocabulary-parallel: only each row's max, sum of exponentials and target logit travel
            float* mine = a.ce_stats + (size_t)tp_.rank * BT * 3;
            cpu::crossentropy_local_stats(mine, a.logits, targets, BT, vocab_begin(), vocab_real(), Vl);
            tp_wait(tp_comm_.all_gather(mine, a.ce_stats, (size_t)BT * 3, CommDtype::F32));
            cpu::crossentropy_from_stats(a.row_loss, a.logits, targets, a.ce_stats, tp_.size, train,
                                         grad_scale / group_rows, BT, vocab_begin(), vocab_real(), Vl);
        }
        double total = 0.0;
        for (int r = 0; r < BT; r++) total += a.row_loss[r];
        if (cp_.size > 1) total = sum_over_ranks(cp_comm_, total);
        return (float)(total / group_rows);
    }

    // ---- what differs between the families (family.h), each behind one call of the walk ----

    // The embedding of this rank's rows into x: the token's wte row, plus (GPT-2) its position's wpe
    // row; vocabulary-parallel under tensor parallelism (each rank embeds the tokens it holds rows
    // for, and the sum has them all).
    void embedding_forward(const ActivationLayout& a, float* x, const int* inputs, int B, int T) {
        const BlockTensors& P = tensors_;
        const int C = config_.channels, BT = B * T, n = tp_.rows(BT), row0 = tp_.sequence_parallel ? tp_.rank * n : 0;
        const int v_end = vocab_begin() + config_.padded_vocab_size / tp_.size;
        if (tp_.size == 1 && P.wpe >= 0) {
            cpu::encoder_forward(x, inputs, param(P.wte), param(P.wpe), B, T, C, positions());
            return;
        }
        float* rows = tp_.size == 1 ? x : a.partial;
        cpu::embedding_forward_range(rows, inputs, param(P.wte), vocab_begin(), v_end, BT, C);
        if (tp_.size == 1) return;
        const float* sum = reduce_rows(a.partial, x, BT, C);
        if (P.wpe >= 0) cpu::add_positions(x, sum, param(P.wpe), row0, n, T, C, positions());
        else if (sum != x) std::copy(sum, sum + (size_t)n * C, x);
    }
    // A pre-norm of n rows of C: GPT-2's LayerNorm (weight and bias; mean and rstd kept) or Llama's
    // RMSNorm (weight; rstd kept). `layer` picks the weights of a per-layer norm.
    void norm_forward(float* out, float* mean, float* rstd, const float* inp, int weight, int bias, int layer, int n) {
        if (widths_.layernorm)
            cpu::layernorm_forward(out, mean, rstd, inp, param(weight, layer), param(bias, layer), n, config_.channels);
        else
            cpu::rmsnorm_forward(out, rstd, inp, param(weight, layer), n, config_.channels);
    }
    // Its backward: dinp += the input's gradient, dweight (and dbias) += the parameters'.
    void norm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, int weight,
                       int layer, const float* mean, const float* rstd, int n) {
        if (widths_.layernorm)
            cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, param(weight, layer), mean, rstd, n,
                                    config_.channels);
        else
            cpu::rmsnorm_backward(dinp, dweight, dout, inp, param(weight, layer), rstd, n, config_.channels);
    }
    // Llama's rotary positions: q and k of every row of a qkv buffer rotated in place by sign x their
    // positions' angles (+1 forward, -1 backward on the gradient), at the sequence's global positions.
    bool rotary() const { return widths_.rotary; }
    void rope(float* qkv, int B, int T, float sign) {
        cpu::rope_rotate(qkv, B, T, widths_.heads, widths_.kv_heads, widths_.head_size, config_.rope_theta,
                         positions(), sign);
    }

    // Layer l's causal self-attention of the B x T rows' qkv into atty: over this rank's rows, or
    // around the context group's ring (`att` then holds the log-sum-exps). Llama's kv heads each
    // serve a group of query heads (with as many kv heads as heads it is GPT-2's attention).
    void attention_forward(const ActivationLayout& a, int l, int B, int T) {
        const int Cl = config_.channels / tp_.size, NH = widths_.heads;
        const size_t bc = (size_t)l * B * T * Cl;
        const float* qkv = a.qkv + (size_t)l * B * T * widths_.qkv;
        float* att = a.att + (size_t)l * B * NH * T * (cp_.size == 1 ? T : 1);
        if (cp_.size > 1)
            ring_.forward(a.atty + bc, att, qkv, a.ring, B, T, NH, widths_.kv_heads, widths_.head_size);
        else if (widths_.kv_heads != NH)
            cpu::gqa_attention_forward(a.atty + bc, att, qkv, B, T, NH, widths_.kv_heads, widths_.head_size);
        else
            cpu::attention_forward(a.atty + bc, att, qkv, B, T, Cl, NH);
    }
    // Its backward: d3C (the gradient of layer l's qkv, before RoPE) from dC (the gradient of atty).
    void attention_backward(const ActivationLayout& a, int l, int B, int T) {
        const int Cl = config_.channels / tp_.size, NH = widths_.heads;
        const size_t bc = (size_t)l * B * T * Cl;
        const float* qkv = a.qkv + (size_t)l * B * T * widths_.qkv;
        const float* att = a.att + (size_t)l * B * NH * T * (cp_.size == 1 ? T : 1);
        if (cp_.size > 1)
            ring_.backward(a.d3C, a.dC, a.atty + bc, att, qkv, a.ring, a.rowsum, B, T, NH, widths_.kv_heads,
                           widths_.head_size);
        else if (widths_.kv_heads != NH)
            cpu::gqa_attention_backward(a.d3C, a.dC, att, qkv, B, T, NH, widths_.kv_heads, widths_.head_size);
        else
            cpu::attention_backward(a.d3C, a.dC, att, qkv, B, T, Cl, NH);
        if (rotary()) rope(a.d3C, B, T, -1.0f);
    }

    // Backward of the Pass::Train forward of the same chunk and batch in slot `a`: from the dlogits
    // that forward left in the logits buffer where the chunk ends the model, else from the gradient
    // of its output, which the caller put into a.dresidual; parameter gradients accumulate, and
    // a.dresidual ends as the gradient of the chunk's input. Each bucket is handed to the engine
    // (grads_ready) as soon as its gradient is complete, so its communication overlaps the rest of
    // backward. Under tensor parallelism each column-parallel product's input gradient is a partial
    // sum, reduced over the group (reduce_rows), and each row-parallel product's output gradient is
    // gathered to all rows first (gather_rows), the mirror of the forward.
    void backward_chunk(const ActivationLayout& a, int chunk, const int* inputs, int B, int T, bool last_micro_batch) {
        const PipelineChunk& ch = chunks_[chunk];
        const int C = config_.channels, QKV = (int)widths_.qkv;
        const int Cl = C / tp_.size, Vl = config_.padded_vocab_size / tp_.size, BT = B * T, n = tp_.rows(BT);
        const float* x = chunk_input(a, chunk, BT);
        const BlockTensors& P = tensors_;
        buckets_.acquire_resident();  // a pipeline may have run other passes since this chunk's forward
        if (ch.head) {
            // GPT-2's head is its tied wte, whose bucket (the embeddings) the head's gradient enters
            const int final_norm = layout_.bucket_of(P.normf_w);
            if (P.tied()) buckets_.take_grads(layout_.bucket_of(P.wte));
            buckets_.take_grads(final_norm);
            float* dlogits = a.logits;
            cpu::matmul_backward(a.dC, grad(P.head), nullptr, dlogits, gather_rows(a.lnf, a.full, BT, C),
                                 param(P.head), BT, C, Vl);
            if (P.tied() && !ch.embedding)
                buckets_.grads_ready(layout_.bucket_of(P.wte), last_micro_batch);  // the head's part of wte
            std::fill(a.dresidual, a.dresidual + (size_t)n * C, 0.0f);
            start_layernorm_grads(a);
            norm_backward(a.dresidual, layernorm_grad(a, P.normf_w, 0, 0), layernorm_grad(a, P.normf_b, 0, 1),
                          reduce_rows(a.dC, a.dln, BT, C), chunk_output(a, ch, BT), P.normf_w, 0, a.lnf_mean,
                          a.lnf_rstd, n);
            finish_layernorm_grads(a, {{P.normf_w, 0}, {P.normf_b, 0}});
            buckets_.grads_ready(final_norm, last_micro_batch);
        }
        for (int l = ch.end - 1; l >= ch.begin; l--) {
            buckets_.enter_layer(l, Walk::Backward, ch.begin, ch.end);
            const size_t nc = (size_t)l * n * C, bc = (size_t)l * BT * Cl;
            const float* residual = l == ch.begin ? x : a.residual3 + nc - (size_t)n * C;
            start_layernorm_grads(a);
            mlp_backward(a, l, BT);  // dresidual is d(residual3[l]); a.dC becomes d(ln2[l])
            norm_backward(a.dresidual, layernorm_grad(a, P.norm2_w, l, 0), layernorm_grad(a, P.norm2_b, l, 1),
                          reduce_rows(a.dC, a.dln, BT, C), a.residual2 + nc, P.norm2_w, l, a.ln2_mean + l * n,
                          a.ln2_rstd + l * n, n);
            // dresidual is now d(residual2[l]); the attention projection reads atty
            linear_backward(l, FP8_ATTPROJ, a.dC, grad(P.attproj_w, l), grad(P.attproj_b, l),
                            gather_rows(a.dresidual, a.dfull, BT, C), a.atty + bc, param(P.attproj_w, l), BT, Cl, C);
            attention_backward(a, l, B, T);
            linear_backward(l, FP8_QKV, a.dC, grad(P.qkv_w, l), grad(P.qkv_b, l), a.d3C,
                            gather_rows(a.ln1 + nc, a.full, BT, C), param(P.qkv_w, l), BT, C, QKV);
            norm_backward(a.dresidual, layernorm_grad(a, P.norm1_w, l, 2), layernorm_grad(a, P.norm1_b, l, 3),
                          reduce_rows(a.dC, a.dln, BT, C), residual, P.norm1_w, l, a.ln1_mean + l * n,
                          a.ln1_rstd + l * n, n);
            finish_layernorm_grads(a, {{P.norm2_w, l}, {P.norm2_b, l}, {P.norm1_w, l}, {P.norm1_b, l}});
            buckets_.leave_layer(l, Walk::Backward, last_micro_batch);
        }
        if (ch.embedding) {
            // This rank's vocabulary rows of wte; GPT-2's wpe whole (from all rows, the same on every rank).
            const int embedding = layout_.bucket_of(P.wte);
            if (!(ch.head && P.tied())) buckets_.take_grads(embedding);
            cpu::encoder_backward(grad(P.wte), grad(P.wpe), gather_rows(a.dresidual, a.dfull, BT, C), inputs, B, T,
                                  C, vocab_begin(), vocab_begin() + Vl, positions());
            buckets_.grads_ready(embedding, last_micro_batch);
        }
        engine_.finish_backward();
        release_all();
    }

    // Block l's MLP, residual3 = residual2 + MLP(ln2): the family's dense MLP (GPT-2's GELU, Llama's
    // SwiGLU), the experts' (cpu/moe.h, GPT-2's), or both (the shared expert beside the routed ones).
    void mlp_forward(const ActivationLayout& a, int l, int BT) {
        const BlockTensors& P = tensors_;
        const int C = config_.channels, n = tp_.rows(BT), U = (int)widths_.up, H = (int)widths_.hidden;
        const size_t nc = (size_t)l * n * C, bu = (size_t)l * BT * U, bh = (size_t)l * BT * H;
        const float* residual = a.residual2 + nc;
        const float* ln2 = gather_rows(a.ln2 + nc, a.full, BT, C);  // all B x T rows
        if (layout_.has(P.up_w, l)) {
            linear_forward(l, FP8_FC, a.fch + bu, ln2, param(P.up_w, l), param(P.up_b, l), nullptr, BT, C, U);
            if (widths_.swiglu) cpu::swiglu_forward(a.fch_gelu + bh, a.fch + bu, BT, H);
            else cpu::gelu_forward(a.fch_gelu + bh, a.fch + bu, (size_t)BT * H);
            row_parallel_forward(a, l, FP8_FCPROJ, a.residual3 + nc, a.fch_gelu + bh, param(P.down_w, l),
                                 param(P.down_b, l), residual, BT, H, C);
            residual = a.residual3 + nc;
        }
        if (!is_moe_layer(l)) return;
        MoeBlock& b = moe_block(a.slot, l);
        moe_forward(b, ln2, l, BT);
        count_routing(b, BT);
        // every tensor rank has the experts' output of all rows: this rank's rows of it
        const float* moe = b.out.data() + (size_t)(tp_.sequence_parallel ? tp_.rank * n : 0) * C;
        float* out = a.residual3 + nc;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < (size_t)n * C; i++) out[i] = residual[i] + moe[i];
    }
    // Backward of block l's MLP: from a.dresidual = d(residual3[l]) to d(ln2[l]) in a.dC (under
    // tensor parallelism a partial sum over the group, which the norm's backward reduces).
    void mlp_backward(const ActivationLayout& a, int l, int BT) {
        const BlockTensors& P = tensors_;
        const int C = config_.channels, n = tp_.rows(BT), U = (int)widths_.up, H = (int)widths_.hidden;
        const size_t nc = (size_t)l * n * C, bu = (size_t)l * BT * U, bh = (size_t)l * BT * H;
        const bool dense = layout_.has(P.up_w, l);
        // all B x T rows of d(residual3[l]) and of ln2[l]
        const float* dout = gather_rows(a.dresidual, a.dfull, BT, C);
        const float* ln2 = gather_rows(a.ln2 + nc, a.full, BT, C);
        if (dense) {  // the down projection reads the activation's output; GELU's gradient is in place
            float* dhidden = widths_.swiglu ? a.dhidden : a.d4C;
            linear_backward(l, FP8_FCPROJ, dhidden, grad(P.down_w, l), grad(P.down_b, l), dout, a.fch_gelu + bh,
                            param(P.down_w, l), BT, H, C);
            if (widths_.swiglu) cpu::swiglu_backward(a.d4C, a.dhidden, a.fch + bu, BT, H);
            else cpu::gelu_backward(a.d4C, a.fch + bu, (size_t)BT * H);
            linear_backward(l, FP8_FC, a.dC, grad(P.up_w, l), grad(P.up_b, l), a.d4C, ln2, param(P.up_w, l), BT, C, U);
        }
        if (!is_moe_layer(l)) return;
        moe_dx_.resize((size_t)BT * C);
        float* dx = dense ? moe_dx_.data() : a.dC;
        moe_backward(dx, moe_block(a.slot, l), dout, ln2, l, BT);
        if (dense)
            for (size_t i = 0; i < (size_t)BT * C; i++) a.dC[i] += dx[i];
    }

    // One block's routing, exchange and expert activations, kept from its forward for its backward:
    // `mine` holds this rank's assignments' rows (gathered inputs, then the outputs that came back),
    // `experts` the rows this rank's experts ran on (from every rank of the expert group).
    struct MoeBlock {
        cpu::MoeRouting routing;
        ExpertExchange exchange;
        cpu::MoeActivations mine, experts;
        std::vector<float> out;
    };
    bool is_moe_layer(int l) const { return config_.is_moe_layer(layout_.global_layer(l)); }
    MoeBlock& moe_block(int slot, int l) {
        if (moe_.size() <= (size_t)slot) moe_.resize(slot + 1);
        if (moe_[slot].size() < (size_t)layout_.num_layers()) moe_[slot].resize(layout_.num_layers());
        return moe_[slot][l];
    }
    // Block l's experts on x (BT x C rows of ln2) into b.out: cpu/moe.h's pieces, with the rows sent to
    // the ranks of their experts and back between them (a copy without expert parallelism). Under
    // tensor parallelism each rank's experts run their 1/tp of the hidden units, so their outputs are
    // partial sums: the fc projection's bias goes into tensor rank 0's, and the group's sum makes
    // every rank's outputs whole before they travel back and are weighed by the gates.
    void moe_forward(MoeBlock& b, const float* x, int l, int BT) {
        const cpu::MoeShape s = moe_shape(BT);
        const cpu::MoeWeights w = moe_weights(l);
        cpu::moe_route(b.routing, moe_scratch_, x, w.router, s);
        const size_t rows = (size_t)b.routing.begin[s.E] * s.C;
        b.mine.x.resize(rows), b.mine.y.resize(rows), b.out.resize((size_t)BT * s.C);
        cpu::moe_gather(b.mine.x.data(), b.routing, x, s);
        b.exchange.plan(ep_comm_, b.routing.begin, s.E);
        b.exchange.dispatch(ep_comm_, b.mine.x.data(), b.experts.x, s.C);
        cpu::MoeWeights partial = w;
        if (tp_.rank > 0) partial.fcprojb = nullptr;
        cpu::moe_experts_forward(b.experts, b.exchange.local_begin().data(), b.exchange.local_experts(), partial, s);
        if (tp_.size > 1)
            tp_wait(tp_comm_.all_reduce_sum(b.experts.y.data(), b.experts.y.size(), CommDtype::F32));
        b.exchange.give_back(ep_comm_, b.experts.y.data(), b.mine.y.data(), s.C);
        cpu::moe_combine(b.out.data(), b.routing, b.mine.y.data(), s);
    }
    // Its backward: dx (BT x C, overwritten) from dout, the router's and this rank's experts'
    // gradients accumulated; the outputs' gradients travel to the experts and the inputs' back. Under
    // tensor parallelism every rank has the same dout, gates and router gradient, and dx is a partial
    // sum over the group (each rank's experts' hidden units): the router's part goes in once, on
    // tensor rank 0.
    void moe_backward(float* dx, MoeBlock& b, const float* dout, const float* x, int l, int BT) {
        using P = GPT2Params;
        const cpu::MoeShape s = moe_shape(BT);
        const cpu::MoeWeights w = moe_weights(l);
        cpu::MoeGrads g{grad(P::ROUTERW, l), grad(P::EFCW, l), grad(P::EFCB, l), grad(P::EFCPROJW, l),
                        grad(P::EFCPROJB, l)};
        const size_t rows = (size_t)b.routing.begin[s.E] * s.C;
        moe_scratch_.dy.resize(rows), moe_scratch_.dx.resize(rows);
        cpu::moe_gates_backward(moe_scratch_.dy.data(), moe_scratch_, dout, b.routing, b.mine.y.data(), s,
                                moe_options_.balance_coef * moe_grad_scale_, moe_options_.z_coef * moe_grad_scale_);
        cpu::moe_router_backward(tp_.rank == 0 ? dx : nullptr, g.router, moe_scratch_, x, w.router, s);
        if (tp_.rank > 0) std::fill(dx, dx + (size_t)BT * s.C, 0.0f);
        b.exchange.dispatch(ep_comm_, moe_scratch_.dy.data(), moe_expert_dy_, s.C);
        moe_expert_dx_.resize(moe_expert_dy_.size());
        cpu::moe_experts_backward(moe_expert_dx_.data(), g, moe_scratch_, moe_expert_dy_.data(), b.experts,
                                  b.exchange.local_begin().data(), b.exchange.local_experts(), w, s);
        b.exchange.give_back(ep_comm_, moe_expert_dx_.data(), moe_scratch_.dx.data(), s.C);
        cpu::moe_scatter_backward(dx, b.routing, moe_scratch_.dx.data(), s);
    }
    cpu::MoeWeights moe_weights(int l) const {
        using P = GPT2Params;
        return {param(P::ROUTERW, l), param(P::EFCW, l), param(P::EFCB, l), param(P::EFCPROJW, l),
                param(P::EFCPROJB, l)};
    }
    cpu::MoeShape moe_shape(int BT) const {
        return {BT, config_.channels, 4 * config_.channels / tp_.size, config_.num_experts, config_.moe_top_k,
                moe_options_.capacity_factor};
    }
    // A training forward's routing of one block into router_stats_.
    void count_routing(const MoeBlock& b, int BT) {
        if (!moe_training_) return;
        const cpu::MoeRouting& r = b.routing;
        router_stats_.add_pass(r.balance_loss, r.z_loss, r.dropped, (long)BT * config_.moe_top_k, r.chosen_share);
        if (ep_comm_.world_size() > 1 && r.begin.back() > 0)
            for (int rows : b.exchange.rows_out())
                router_stats_.max_rank_load = std::max(router_stats_.max_rank_load, (double)rows / r.begin.back());
    }

    ModelConfig config_;
    Communicator& tp_comm_;
    TensorParallel tp_;
    Communicator& pp_comm_;                     // the pipeline group
    PipelineParallel pipe_;
    ParamLayout layout_;  // this rank's piece (the whole model without tensor or pipeline parallelism)
    ParamLayout whole_layout_{model_param_table(config_)};
    BlockTensors tensors_ = block_tensors(config_);  // which tensor plays each part of a block (family.h)
    BlockWidths widths_{config_, tp_.size};          // this rank's widths of a block's activations
    StageShape stage_;
    std::vector<PipelineChunk> chunks_;         // this rank's chunks of layers, in virtual-stage order
    PipelineLinks links_;                       // the stages' messages: on pp_comm_ and splits of it
    int max_B_, max_T_;
    int last_B_ = 1, last_T_ = 1;
    double tp_exposed_ms_ = 0, pp_wait_ms_ = 0;
    HostMemory memory_;  // before engine_, which allocates from it
    ZeroEngine<HostMemory> engine_;
    Communicator& dp_comm_;                     // ZeRO's group (data x context ranks, or a shard group of them)
    Communicator* replicas_comm_;               // hybrid sharding: the shard's replicas (null or one rank: none)
    Communicator& cp_comm_;                     // the context group
    ContextSplit cp_;                           // this rank's positions of the batch under way
    cpu::RingAttention ring_;
    LocalBatcher batcher_;  // local_batch's
    BucketView<HostMemory> buckets_{layout_, engine_};  // the buckets acquired for the pass under way
    using Walk = BucketView<HostMemory>::Direction;
    std::vector<float> acts_;
    MoeOptions moe_options_;
    cpu::Fp8Linears fp8_{0, {}};         // the FP8 simulation of the blocks' products (--fp8)
    std::vector<std::vector<MoeBlock>> moe_;  // per activation slot and local layer (the MoE blocks only)
    cpu::MoeScratch moe_scratch_;
    std::vector<float> moe_expert_dy_, moe_expert_dx_;  // the backward's rows at this rank's experts
    std::vector<float> moe_dx_;          // the experts' input gradient beside a shared expert's
    float moe_grad_scale_ = 1.0f;        // the training forward's grad_scale, for the auxiliary losses
    bool moe_training_ = false;          // the forward under way is a training pass
    RouterStats router_stats_;           // since the last take_router_stats
    Communicator& ep_comm_;              // the expert group
};

}  // namespace llmc
