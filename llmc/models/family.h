// models/family.h: what the engine asks of a model family, answered for whichever one a ModelConfig
// names (its arch): the parameter table, the layout of one rank's piece of it, what a pipeline
// stage holds, the parameter count and the FLOPs a trained token costs. Everything that sizes,
// reads, writes or prices a model goes through these, never through one family's table directly.
#pragma once

#include <cstddef>

#include "llmc/models/gpt2/params.h"
#include "llmc/models/llama/params.h"
#include "llmc/models/model_config.h"

namespace llmc {

inline ParamTable model_param_table(const ModelConfig& c) {
    return c.arch == ModelArch::Llama ? LlamaParams::table(c) : GPT2Params::table(c);
}
// The whole model's layout, or tensor rank tp.rank's piece of the part one pipeline stage holds,
// with expert rank ep.rank's experts (GPT-2's mixture of experts).
inline ParamLayout model_layout(const ModelConfig& c, TpShard tp = {}, StageSlice stage = {}, EpShard ep = {}) {
    return ParamLayout(model_param_table(c), tp, std::move(stage), ep);
}
inline StageSlice model_stage_slice(const ModelConfig& c, const PipelineSplit& split, int rank) {
    return c.arch == ModelArch::Llama ? LlamaParams::stage_slice(split, rank) : GPT2Params::stage_slice(split, rank);
}
// The tensors a block and the ends of the model read, by the part each plays (-1: the family has
// none, and the model passes null). GPT-2's head is its tied wte, Llama's its own lm_head; in Llama
// wq and wkv are adjacent in every layout, so qkv_w is one (q + 2 kv) x C matrix, as GPT-2's qkvw.
struct BlockTensors {
    int wte, wpe;                        // token and position embeddings
    int norm1_w, norm1_b, qkv_w, qkv_b;  // the attention's norm and input product
    int attproj_w, attproj_b;            // its output product
    int norm2_w, norm2_b, up_w, up_b;    // the MLP's norm and input product (GPT-2's fc; Llama's gate and up)
    int down_w, down_b;                  // its output product (GPT-2's fcproj)
    int normf_w, normf_b, head;          // the final norm and the vocabulary product
    bool tied() const { return head == wte; }
};
inline BlockTensors block_tensors(const ModelConfig& c) {
    if (c.arch == ModelArch::Llama) {
        using P = LlamaParams;
        return {P::WTE, -1, P::ATTN_NORM, -1, P::WQ, -1, P::WO, -1, P::MLP_NORM, -1, P::WGATEUP, -1, P::WDOWN, -1,
                P::NORM_F, -1, P::LM_HEAD};
    }
    using P = GPT2Params;
    return {P::WTE, P::WPE, P::LN1W, P::LN1B, P::QKVW, P::QKVB, P::ATTPROJW, P::ATTPROJB, P::LN2W, P::LN2B, P::FCW,
            P::FCB, P::FCPROJW, P::FCPROJB, P::LNFW, P::LNFB, P::WTE};
}

// A block's widths on one of `tp` tensor-parallel ranks (its heads, kv heads and MLP units): a qkv
// row (q, k and v of its heads), the MLP's up product (GPT-2: 4C/tp; Llama: gate and up, 2 F/tp) and
// its activation's output (4C/tp; F/tp).
struct BlockWidths {
    int heads, kv_heads, head_size;
    size_t qkv, up, hidden;
    bool layernorm, swiglu, rotary;  // GPT-2's LayerNorm and GELU, or Llama's RMSNorm, SwiGLU and RoPE
    BlockWidths(const ModelConfig& c, int tp = 1)
        : heads(c.num_heads / tp), kv_heads(c.kv_head_count() / tp), head_size(c.head_size()),
          qkv((size_t)(heads + 2 * kv_heads) * head_size), layernorm(c.arch == ModelArch::GPT2),
          swiglu(c.arch == ModelArch::Llama), rotary(c.arch == ModelArch::Llama) {
        hidden = (size_t)c.mlp_hidden() / tp;
        up = swiglu ? 2 * hidden : hidden;
    }
};

// Tensor parallelism over tp ranks cuts the heads, the key/value heads, the MLP's hidden units and
// the padded vocabulary into tp equal parts (each family's params.h says which tensors), so each must
// divide. Llama's kv heads are cut, never replicated: fewer kv heads than ranks is refused.
inline void check_tensor_parallel_shape(const ModelConfig& m, int tp) {
    if (tp == 1) return;
    auto divides = [&](const char* what, long long n) {
        if (n % tp != 0)
            fail(strformat("--tp %d must divide the model's %s (%lld): tensor parallelism gives each rank an equal part",
                           tp, what, n));
    };
    divides("head count", m.num_heads);
    if (m.arch == ModelArch::Llama) {
        divides("key/value head count (--kv-heads; each rank holds whole kv heads, none is replicated)",
                m.kv_head_count());
        divides("MLP width (--ffn-hidden)", m.mlp_hidden());
    } else {
        divides("MLP width 4 x channels", 4LL * m.channels);
    }
    divides("padded vocabulary", m.padded_vocab_size);
}

inline size_t num_params(const ModelConfig& c) { return model_layout(c).num_params; }

// The family's random initialisation of the flat parameter buffer (num_params(config) floats).
inline void init_model_params(const ModelConfig& config, float* params, uint64_t seed) {
    init_params(model_layout(config), params, seed);
}

// Model FLOPs per trained token at sequence length T, the figure MFU is measured against: 6 per
// parameter that multiplies (forward 2, backward 4): all but the embeddings a token only looks up
// (GPT-2's position embedding; its tied wte is the head's product; Llama's untied wte), and of each
// block's experts only the top-k a token visits; plus causal attention's QK^T and PV: 4 T C per
// layer forward at full length (query heads x head size = C in both families), halved by the
// mask, times 3 for forward and backward.
inline double model_flops_per_token(const ModelConfig& c, int T) {
    const double looked_up = c.arch == ModelArch::Llama ? (double)c.padded_vocab_size * c.channels
                                                        : (double)c.max_seq_len * c.channels;
    double multiplying = (double)num_params(c) - looked_up;
    const double expert = 8.0 * c.channels * c.channels + 5.0 * c.channels;  // one expert's MLP
    for (int l = 0; l < c.num_layers; l++)
        if (c.is_moe_layer(l)) multiplying -= (double)(c.num_experts - c.moe_top_k) * expert;
    return 6.0 * multiplying + 6.0 * c.num_layers * (double)c.channels * T;
}

// Of those, the FLOPs of every block's four products (qkv, attention output, MLP in, MLP out):
// what --fp8 runs in FP8.
inline double fp8_flops_per_token(const ModelConfig& c) {
    const double C = c.channels, QKV = (double)(c.num_heads + 2 * c.kv_head_count()) * c.head_size();
    const double block = C * QKV + C * C + 3.0 * C * c.mlp_hidden();  // GPT-2: 3C^2 + C^2 + 8C^2 = 12 C^2
    return 6.0 * (c.arch == ModelArch::Llama ? block : 12.0 * C * C) * c.num_layers;
}

}  // namespace llmc
