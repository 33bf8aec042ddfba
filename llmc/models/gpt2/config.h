// models/gpt2/config.h: GPT-2's presets, shapes of ModelConfig (models/model_config.h). The tensors
// a GPT-2 shape implies are listed in models/gpt2/params.h.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "llmc/models/model_config.h"
#include "llmc/utils.h"

namespace llmc {

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
