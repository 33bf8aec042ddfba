// models/gpt2/config.h: the GPT-2 shape (ModelConfig) and its presets. The tensors this shape
// implies are listed in models/gpt2/params.h.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "llmc/utils.h"

namespace llmc {

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

    // Upper bounds, far above any GPT-2 (and any machine's memory), that keep every size computed
    // from a shape (parameters: at most 12 L C^2 + Vp C + ... < 2^60) inside 64 bits, and a corrupt
    // model-file header from building a layout of a billion layers before its size is checked.
    static constexpr int kMaxSeqLen = 1 << 20;
    static constexpr int kMaxVocab = 1 << 24;  // a multiple of 128, so padding stays within it
    static constexpr int kMaxLayers = 1 << 12;
    static constexpr int kMaxChannels = 1 << 16;

    int head_size() const { return channels / num_heads; }
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
    }
};

// V rounded up to a multiple of 128, as llm.c pads it (in 64 bits: V near 2^31 must not wrap to a
// negative size before validate() refuses it).
inline int pad_vocab(int vocab_size) { return (int)std::min<int64_t>(((int64_t)vocab_size + 127) / 128 * 128, INT32_MAX); }

inline constexpr std::array<const char*, 6> MODEL_PRESET_NAMES = {"d4", "d6", "d12", "d24", "d36", "d48"};
inline bool is_model_preset(const std::string& name) {
    for (const char* preset : MODEL_PRESET_NAMES)
        if (name == preset) return true;
    return false;
}

// "dN" presets: N layers, 64*N channels, 64-wide heads, except that GPT-2's own sizes keep their
// published head counts (d24 = 345M has 16 heads, d36 = 774M 20, d48 = 1558M 25).
// d12 is GPT-2 124M, d48 is GPT-2 1.5B.
inline ModelConfig model_preset(const std::string& name, int max_seq_len = 1024, int vocab_size = 50257) {
    ModelConfig c;
    c.max_seq_len = max_seq_len;
    c.vocab_size = vocab_size;
    c.padded_vocab_size = pad_vocab(vocab_size);
    if      (name == "d4")  { c.num_layers = 4;  c.channels = 256;  c.num_heads = 4; }
    else if (name == "d6")  { c.num_layers = 6;  c.channels = 384;  c.num_heads = 6; }
    else if (name == "d12") { c.num_layers = 12; c.channels = 768;  c.num_heads = 12; }
    else if (name == "d24") { c.num_layers = 24; c.channels = 1024; c.num_heads = 16; }
    else if (name == "d36") { c.num_layers = 36; c.channels = 1280; c.num_heads = 20; }
    else if (name == "d48") { c.num_layers = 48; c.channels = 1600; c.num_heads = 25; }
    else fail(strformat("unknown model preset '%s': expected one of d4 d6 d12 d24 d36 d48", name.c_str()));
    return c;
}

}  // namespace llmc
