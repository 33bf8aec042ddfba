// models/model_config.h: a model's shape (ModelConfig), whichever family it belongs to (GPT-2 or
// Llama: ModelArch), and what both share: the vocabulary's padding. Each family's presets are in
// models/<family>/config.h, its tensors in models/<family>/params.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "llmc/utils.h"

namespace llmc {

enum class ModelArch { GPT2, Llama };

inline const char* arch_name(ModelArch a) { return a == ModelArch::GPT2 ? "gpt2" : "llama"; }
// "gpt2" or "llama" (a flag's or a file's value); anything else fails naming `what`.
inline ModelArch parse_arch(const std::string& value, const char* what) {
    if (value == "gpt2") return ModelArch::GPT2;
    if (value == "llama") return ModelArch::Llama;
    fail(strformat("%s must be gpt2 or llama, got '%s'", what, value.c_str()));
}

struct ModelConfig {
    int max_seq_len = 1024;         // maxT: rows of the position embedding
    int vocab_size = 50257;         // V: real tokens
    int padded_vocab_size = 50304;  // Vp: rows of wte, V rounded up to a multiple of 128 for fast kernels
    int num_layers = 12;            // L
    int num_heads = 12;             // NH
    int channels = 768;             // C
    // Mixture of experts (cpu/moe.h; 0 experts: GPT-2's dense MLP everywhere): every moe_every-th
    // block (the last of each group of moe_every) has num_experts expert MLPs, each token routed to
    // moe_top_k of them, in place of its MLP, or beside it as one always-on shared expert with
    // moe_shared.
    int num_experts = 0;
    int moe_top_k = 2;
    int moe_every = 1;
    int moe_shared = 0;
    // The family (models/<family>/params.h lists each one's tensors) and what only Llama varies:
    // grouped-query attention's key/value heads (dividing num_heads; 0 and GPT-2: num_heads), the
    // SwiGLU MLP's hidden width (0 and GPT-2: 4C, GELU) and the rotary embedding's base.
    ModelArch arch = ModelArch::GPT2;
    int kv_heads = 0;
    int ffn_hidden = 0;
    float rope_theta = 500000.0f;

    // Upper bounds, far above any GPT-2 (and any machine's memory), that keep every size computed
    // from a shape (parameters: at most 12 L C^2 + Vp C + ... < 2^60) inside 64 bits, and a corrupt
    // model-file header from building a layout of a billion layers before its size is checked.
    static constexpr int kMaxSeqLen = 1 << 20;
    static constexpr int kMaxVocab = 1 << 24;  // a multiple of 128, so padding stays within it
    static constexpr int kMaxLayers = 1 << 12;
    static constexpr int kMaxChannels = 1 << 16;

    int head_size() const { return channels / num_heads; }
    int kv_head_count() const { return kv_heads > 0 ? kv_heads : num_heads; }
    int mlp_hidden() const { return ffn_hidden > 0 ? ffn_hidden : 4 * channels; }
    bool is_moe_layer(int layer) const { return num_experts > 0 && layer % moe_every == moe_every - 1; }
    static constexpr int kMaxExperts = 1 << 10;

    // Throws naming the offending field unless the shape is usable.
    void validate() const {
        auto in_range = [](const char* name, int v, int max_value) {
            if (v <= 0 || v > max_value)
                fail(strformat("model config: %s must be in [1, %d], got %d", name, max_value, v));
        };
        in_range("max_seq_len", max_seq_len, kMaxSeqLen);
        in_range("vocab_size", vocab_size, kMaxVocab);
        in_range("num_layers", num_layers, kMaxLayers);
        in_range("num_heads", num_heads, kMaxChannels);
        in_range("channels", channels, kMaxChannels);
        in_range("padded_vocab_size", padded_vocab_size, kMaxVocab);
        if (channels % num_heads != 0)
            fail(strformat("model config: channels (%d) must be divisible by num_heads (%d)", channels, num_heads));
        if (num_experts < 0 || num_experts > kMaxExperts)
            fail(strformat("model config: num_experts must be in [0, %d] (0: dense), got %d", kMaxExperts, num_experts));
        if (num_experts > 0) {
            if (moe_top_k < 1 || moe_top_k > num_experts)
                fail(strformat("model config: moe_top_k must be in [1, num_experts = %d], got %d", num_experts, moe_top_k));
            if (moe_every < 1 || moe_every > num_layers)
                fail(strformat("model config: moe_every must be in [1, num_layers = %d], got %d", num_layers, moe_every));
            if (moe_shared != 0 && moe_shared != 1)
                fail(strformat("model config: moe_shared must be 0 or 1, got %d", moe_shared));
        }
        if (padded_vocab_size < vocab_size)
            fail(strformat("model config: padded_vocab_size (%d) must be at least vocab_size (%d)",
                           padded_vocab_size, vocab_size));
        if (arch == ModelArch::GPT2) {
            if (kv_heads != 0 && kv_heads != num_heads)
                fail(strformat("model config: GPT-2 has as many key/value heads as heads (%d), got kv_heads %d "
                               "(grouped-query attention is Llama's: --arch llama)", num_heads, kv_heads));
            if (ffn_hidden != 0 && ffn_hidden != 4 * channels)
                fail(strformat("model config: GPT-2's MLP is 4 x channels = %d wide, got ffn_hidden %d (--arch llama "
                               "sets the width)", 4 * channels, ffn_hidden));
            return;
        }
        if (kv_heads < 0 || kv_head_count() > num_heads || num_heads % kv_head_count() != 0)
            fail(strformat("model config: kv_heads (%d) must divide num_heads (%d)", kv_heads, num_heads));
        if (head_size() % 2 != 0)
            fail(strformat("model config: RoPE rotates pairs of a head's channels, so the head size (channels %d / "
                           "heads %d = %d) must be even", channels, num_heads, head_size()));
        if (ffn_hidden < 0 || ffn_hidden > kMaxChannels * 8)
            fail(strformat("model config: ffn_hidden must be in [0, %d] (0: 4 x channels), got %d", kMaxChannels * 8,
                           ffn_hidden));
        if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta))
            fail(strformat("model config: rope_theta must be a positive number, got %g", rope_theta));
        if (num_experts > 0)
            fail("model config: a mixture of experts is GPT-2's only, for now (--experts with --arch llama)");
    }
};

// V rounded up to a multiple of 128, as llm.c pads it (in 64 bits: V near 2^31 must not wrap to a
// negative size before validate() refuses it).
inline int pad_vocab(int vocab_size) { return (int)std::min<int64_t>(((int64_t)vocab_size + 127) / 128 * 128, INT32_MAX); }

}  // namespace llmc
