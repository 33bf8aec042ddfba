// models/llama/params.h: the Llama family's parameter table, as models/gpt2/params.h is GPT-2's:
// every tensor with its shape, bucket, weight decay, initialisation and tensor-parallel cut. The
// layout (params/layout.h), the init, AdamW and ZeRO read it as they read GPT-2's.
//
// Buckets: the token embedding [wte]; one bucket per block [attn_norm wq wkv wo mlp_norm wgateup
// wdown]; the head [norm_f lm_head]. Both are resident, as GPT-2's embeddings and final norm are:
// the embedding is read at the start of the forward pass and its gradient written at the end of
// backward, the head is used at the turn, and neither is part of the layer walk that rotates the
// blocks' buckets under ZeRO-3 (a step holds wte and lm_head gathered, as GPT-2's tied wte). No
// biases. Two products are fused as the kernels run them: wkv is k's rows then v's (each
// kv_heads x head size), wgateup the gate's rows then up's (each ffn_hidden); q stays a tensor of
// its own, since it has more heads than k and v under grouped-query attention, and the two are
// adjacent in every layout, so one product over [wq; wkv] computes q, k and v.
//
// Tensor parallelism (Megatron-LM, as GPT-2's): wq by its heads, wkv by its kv heads (in each of its
// k and v blocks), wgateup by its hidden units (in each block), wo and wdown by input columns, wte
// and lm_head by vocabulary rows; the norms are replicas. The kv heads must divide among the ranks.
//
// Init: matrices ~ N(0, 0.02), the two that write into the residual stream (wo, wdown) ~
// N(0, 0.02 / sqrt(2 L)) as GPT-2's; norm gains 1; the rows of padding tokens in wte and lm_head 0.
#pragma once

#include <cmath>
#include <cstddef>

#include "llmc/dist/pipeline_schedule.h"
#include "llmc/models/model_config.h"
#include "llmc/params/init.h"
#include "llmc/params/layout.h"

namespace llmc {

struct LlamaParams {
    // Table order, which is the model file's order.
    enum Tensor { WTE, ATTN_NORM, WQ, WKV, WO, MLP_NORM, WGATEUP, WDOWN, NORM_F, LM_HEAD, NUM_TENSORS };
    enum Group { EMBEDDING, LAYERS, HEAD };

    static ParamTable table(const ModelConfig& c) {
        c.validate();
        if (c.arch != ModelArch::Llama) fail("LlamaParams: the model config is not of the Llama family");
        const size_t Vp = c.padded_vocab_size, C = c.channels, HS = c.head_size();
        const size_t Q = c.num_heads * HS, KV = c.kv_head_count() * HS, F = c.mlp_hidden();
        const float weight_std = 0.02f;
        const float residual_std = 0.02f / std::sqrt(2.0f * c.num_layers);
        const ParamInit ones{InitRule::Ones};
        const ParamInit weights{InitRule::Normal, weight_std}, residual{InitRule::Normal, residual_std};
        const ParamInit vocab_rows{InitRule::Normal, weight_std, (size_t)c.vocab_size * C};
        const TensorSplit rows{TensorSplit::Rows, 1}, two_blocks{TensorSplit::Rows, 2}, cols{TensorSplit::Cols, 1};
        ParamTable t;
        t.num_layers = c.num_layers;
        t.groups = {{"embedding", false, true}, {"layers", true, false}, {"head", false, true}};
        t.tensors = {
            {"wte", {Vp, C}, EMBEDDING, true, vocab_rows, rows},
            {"attn_norm", {C}, LAYERS, false, ones},
            {"wq", {Q, C}, LAYERS, true, weights, rows},
            {"wkv", {2 * KV, C}, LAYERS, true, weights, two_blocks},
            {"wo", {C, Q}, LAYERS, true, residual, cols},
            {"mlp_norm", {C}, LAYERS, false, ones},
            {"wgateup", {2 * F, C}, LAYERS, true, weights, two_blocks},
            {"wdown", {C, F}, LAYERS, true, residual, cols},
            {"norm_f", {C}, HEAD, false, ones},
            {"lm_head", {Vp, C}, HEAD, true, vocab_rows, rows},
        };
        return t;
    }
    static ParamLayout layout(const ModelConfig& c, TpShard tp = {}, StageSlice stage = {}) {
        return ParamLayout(table(c), tp, std::move(stage));
    }
    // What pipeline rank `rank` holds: its chunks' layers, the embedding where it runs the first
    // virtual stage, the head where it runs the last (untied: no copies). The whole model without a
    // pipeline.
    static StageSlice stage_slice(const PipelineSplit& split, int rank) {
        if (split.virtual_stages() == 1) return {};
        StageSlice s;
        s.layers = split.rank_layers(rank);
        s.groups = {split.holds_first(rank), true, split.holds_last(rank)};
        s.copies = {false, false, false};
        return s;
    }
};

}  // namespace llmc
