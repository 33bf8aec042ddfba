// model_config.h: the GPT-2 shape (ModelConfig), its presets, and the layout of the flat parameter
// buffer (ParamLayout).
//
// Parameters, gradients, AdamW moments and master weights each live in ONE flat buffer whose tensor
// order is llm.c's (and so the model file's): wte wpe ln1w ln1b qkvw qkvb attprojw attprojb ln2w
// ln2b fcw fcb fcprojw fcprojb lnfw lnfb, each per-layer tensor holding all layers back to back.
// ParamLayout is the single place that computes sizes and offsets; the CPU model, the CUDA model,
// the model file, the optimizer and (later) ZeRO sharding all read it, so they cannot disagree.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "utils.h"

namespace llmc {

struct ModelConfig {
    int max_seq_len = 1024;         // maxT: rows of the position embedding
    int vocab_size = 50257;         // V: real tokens
    int padded_vocab_size = 50304;  // Vp: rows of wte, V rounded up to a multiple of 128 for fast kernels
    int num_layers = 12;            // L
    int num_heads = 12;             // NH
    int channels = 768;             // C

    int head_size() const { return channels / num_heads; }

    // Throws naming the offending field unless the shape is usable.
    void validate() const {
        auto positive = [](const char* name, int v) {
            if (v <= 0) fail(strformat("model config: %s must be positive, got %d", name, v));
        };
        positive("max_seq_len", max_seq_len);
        positive("vocab_size", vocab_size);
        positive("num_layers", num_layers);
        positive("num_heads", num_heads);
        positive("channels", channels);
        if (channels % num_heads != 0)
            fail(strformat("model config: channels (%d) must be divisible by num_heads (%d)", channels, num_heads));
        if (padded_vocab_size < vocab_size)
            fail(strformat("model config: padded_vocab_size (%d) must be at least vocab_size (%d)",
                           padded_vocab_size, vocab_size));
    }
};

// V rounded up to a multiple of 128, as llm.c pads it.
inline int pad_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

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

constexpr int NUM_PARAM_TENSORS = 16;

// Where each parameter tensor sits in the flat buffer. Offsets and counts are in elements.
struct ParamLayout {
    enum Tensor { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB,
                  LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };
    static constexpr std::array<const char*, NUM_PARAM_TENSORS> names = {
        "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
        "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

    std::array<size_t, NUM_PARAM_TENSORS> sizes{};    // elements in each tensor (all layers)
    std::array<size_t, NUM_PARAM_TENSORS> offsets{};  // first element of each tensor
    size_t num_params = 0;

    explicit ParamLayout(const ModelConfig& c) {
        size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, maxT = c.max_seq_len;
        sizes = {Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                 L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
        for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
            offsets[i] = num_params;
            num_params += sizes[i];
        }
    }

    // AdamW's weight decay applies to matrices (embeddings and weights), not to biases or LayerNorm.
    static bool is_decayed(int tensor) {
        return tensor == WTE || tensor == WPE || tensor == QKVW || tensor == ATTPROJW ||
               tensor == FCW || tensor == FCPROJW;
    }
};

}  // namespace llmc
