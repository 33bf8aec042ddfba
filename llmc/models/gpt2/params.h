// models/gpt2/params.h: GPT-2's parameter table: every tensor with its shape, bucket, weight decay
// and initialisation, in llm.c's model-file order. The layout (params/layout.h), the init
// (params/init.h), the model file, AdamW and ZeRO all read this list; nothing else in llmc says what
// GPT-2's tensors are.
//
// Buckets: the embeddings [wte, wpe], one bucket per transformer layer [ln1w ln1b qkvw qkvb attprojw
// attprojb ln2w ln2b fcw fcb fcprojw fcprojb], and the final LayerNorm [lnfw, lnfb]. The embeddings
// are resident because wte is tied: the encoder reads it first and the lm head last. The final norm
// is resident too: it is tiny, and backward starts with it.
//
// Mixture of experts (ModelConfig::num_experts > 0): the blocks with experts (layer kind 1; the others
// are kind 0, params/layout.h) hold, after GPT-2's tensors in table order, the router (E x C) and E
// copies of each MLP tensor (efcw ... efcprojb), initialised like GPT-2's; their dense MLP tensors
// are kept only with moe_shared (the always-on shared expert). The expert copies are per-expert
// tensors: the layer's expert bucket, which expert parallelism cuts into blocks of experts (EpShard);
// the router stays in the layer's bucket, on every rank. Tensor parallelism cuts each expert's MLP
// as it cuts GPT-2's (efcw, efcb by rows, efcprojw by columns, efcprojb a replica) and replicates
// the router, which every tensor rank runs on the same tokens.
//
// Init (GPT-2's): weights ~ N(0, 0.02); the two projections that write into the residual stream
// (attprojw, fcprojw) ~ N(0, 0.02 / sqrt(2 L)) so the residual's variance does not grow with depth;
// biases 0, LayerNorm gains 1; wte rows of padding tokens (id >= vocab_size) 0, so they never
// influence anything.
#pragma once

#include <cmath>
#include <cstddef>

#include "llmc/dist/pipeline_schedule.h"
#include "llmc/models/gpt2/config.h"
#include "llmc/params/init.h"
#include "llmc/params/layout.h"

namespace llmc {

struct GPT2Params {
    // Table order, which is the model file's order.
    enum Tensor { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB,
                  LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB, NUM_GPT2_TENSORS,
                  ROUTERW = NUM_GPT2_TENSORS, EFCW, EFCB, EFCPROJW, EFCPROJB, NUM_TENSORS };
    // A dense block's four linear layers' weights, in bucket order: qkv, attention projection, fc,
    // fc projection (FP8's products, fp8.h's Fp8Product, in the same order).
    static constexpr int LINEAR_WEIGHTS[4] = {QKVW, ATTPROJW, FCW, FCPROJW};
    enum LayerKind { DENSE_LAYER, MOE_LAYER };
    enum Group { EMBEDDINGS, LAYERS, FINAL_NORM };
    static constexpr int EMBEDDING_BUCKET = 0;

    static ParamTable table(const ModelConfig& c) {
        c.validate();
        const size_t Vp = c.padded_vocab_size, C = c.channels, maxT = c.max_seq_len;
        const float weight_std = 0.02f;
        const float residual_std = 0.02f / std::sqrt(2.0f * c.num_layers);
        const ParamInit zeros{InitRule::Zeros}, ones{InitRule::Ones};
        auto normal = [](float std, size_t random_elems = SIZE_MAX) {
            return ParamInit{InitRule::Normal, std, random_elems};
        };
        ParamTable t;
        t.num_layers = c.num_layers;
        t.groups = {{"embeddings", false, true}, {"layers", true, false}, {"final norm", false, true}};
        // Tensor parallelism (Megatron-LM): the products that read the LayerNorm's output are cut by
        // output rows (qkv by heads, in each of its q, k, v blocks; the first MLP matrix), the ones that
        // write back into the residual stream by input columns, and the tied embedding by vocabulary
        // rows. LayerNorms, wpe and the biases of the column-cut products are replicas.
        const TensorSplit rows{TensorSplit::Rows, 1}, qkv_rows{TensorSplit::Rows, 3}, cols{TensorSplit::Cols, 1};
        t.tensors = {
            {"wte", {Vp, C}, EMBEDDINGS, true, normal(weight_std, (size_t)c.vocab_size * C), rows},
            {"wpe", {maxT, C}, EMBEDDINGS, true, normal(weight_std)},
            {"ln1w", {C}, LAYERS, false, ones},
            {"ln1b", {C}, LAYERS, false, zeros},
            {"qkvw", {3 * C, C}, LAYERS, true, normal(weight_std), qkv_rows},
            {"qkvb", {3 * C}, LAYERS, false, zeros, qkv_rows},
            {"attprojw", {C, C}, LAYERS, true, normal(residual_std), cols},
            {"attprojb", {C}, LAYERS, false, zeros},
            {"ln2w", {C}, LAYERS, false, ones},
            {"ln2b", {C}, LAYERS, false, zeros},
            {"fcw", {4 * C, C}, LAYERS, true, normal(weight_std), rows},
            {"fcb", {4 * C}, LAYERS, false, zeros, rows},
            {"fcprojw", {C, 4 * C}, LAYERS, true, normal(residual_std), cols},
            {"fcprojb", {C}, LAYERS, false, zeros},
            {"lnfw", {C}, FINAL_NORM, false, ones},
            {"lnfb", {C}, FINAL_NORM, false, zeros},
        };
        if (c.num_experts > 0) add_experts(t, c, weight_std, residual_std);
        return t;
    }
    static void add_experts(ParamTable& t, const ModelConfig& c, float weight_std, float residual_std) {
        const size_t E = c.num_experts, C = c.channels;
        for (int l = 0; l < c.num_layers; l++) t.layer_kinds.push_back(c.is_moe_layer(l) ? MOE_LAYER : DENSE_LAYER);
        if (!c.moe_shared)
            for (int k : {FCW, FCB, FCPROJW, FCPROJB}) t.tensors[k].layer_kind = DENSE_LAYER;
        const ParamInit zeros{InitRule::Zeros};
        const ParamInit weights{InitRule::Normal, weight_std}, residual{InitRule::Normal, residual_std};
        const TensorSplit whole{}, rows{TensorSplit::Rows, 1}, cols{TensorSplit::Cols, 1};  // of each expert
        t.tensors.push_back({"routerw", {E, C}, LAYERS, true, weights, whole, MOE_LAYER});
        t.tensors.push_back({"efcw", {E, 4 * C, C}, LAYERS, true, weights, rows, MOE_LAYER, true});
        t.tensors.push_back({"efcb", {E, 4 * C}, LAYERS, false, zeros, rows, MOE_LAYER, true});
        t.tensors.push_back({"efcprojw", {E, C, 4 * C}, LAYERS, true, residual, cols, MOE_LAYER, true});
        t.tensors.push_back({"efcprojb", {E, C}, LAYERS, false, zeros, whole, MOE_LAYER, true});
    }
    // The whole model's layout, or tensor-parallel rank tp.rank's piece of it, of the part of the
    // model one pipeline stage holds (stage_slice), with expert-parallel rank ep.rank's experts.
    static ParamLayout layout(const ModelConfig& c, TpShard tp = {}, StageSlice stage = {}, EpShard ep = {}) {
        return ParamLayout(table(c), tp, std::move(stage), ep);
    }
    // What pipeline rank `rank` holds: its chunks' layers; the embeddings where it runs the first
    // virtual stage (the encoder) or the last (the lm head reads the tied wte), as a copy on the last
    // when that is another rank; the final norm with the last. The whole model without a pipeline.
    static StageSlice stage_slice(const PipelineSplit& split, int rank) {
        if (split.virtual_stages() == 1) return {};
        const bool first = split.holds_first(rank), last = split.holds_last(rank);
        StageSlice s;
        s.layers = split.rank_layers(rank);
        s.groups = {first || last, true, last};
        s.copies = {last && !first, false, false};
        return s;
    }
};

// GPT-2's random initialisation of the flat parameter buffer (its layout's floats).
inline void init_gpt2_params(const ModelConfig& config, float* params, uint64_t seed) {
    init_params(GPT2Params::layout(config), params, seed);
}

}  // namespace llmc
