// models/llama/config.h: the Llama family's presets, shapes of ModelConfig (models/model_config.h)
// with arch Llama. The tensors a Llama shape implies are listed in models/llama/params.h.
//
// Two kinds of preset:
//   dN (d4 ... d48)   GPT-2's depth presets (layers, channels, heads: models/gpt2/config.h) made
//                     Llama: kv heads the largest divisor of the heads at most a quarter of them
//                     (Llama 3's four query heads a kv head, where the head count allows), and the
//                     SwiGLU MLP 8C/3 wide rounded up to a multiple of 256 (Llama's rule: three
//                     matrices of that width hold about what GPT-2's two 4C ones do).
//                     d12: 12 heads, 3 kv heads, MLP 2048; d48: 25 heads, 5 kv heads, MLP 4352.
//   llama3-8b, llama3-70b, llama3-405b   the published shapes ("The Llama 3 Herd of Models", Meta
//                     2024, table 3), with Llama 3's 128,256-token vocabulary and RoPE base 500,000,
//                     whatever vocabulary the caller passes: for --plan and --plan-search (and for
//                     training where they fit). 8,030,261,248, 70,553,706,496 and 405,853,388,800
//                     parameters (test/test_llama_config.cpp counts them from the table).
#pragma once

#include <array>
#include <string>

#include "llmc/models/gpt2/config.h"
#include "llmc/models/model_config.h"
#include "llmc/utils.h"

namespace llmc {

inline constexpr std::array<const char*, 3> LLAMA3_PRESET_NAMES = {"llama3-8b", "llama3-70b", "llama3-405b"};
inline constexpr int LLAMA3_VOCAB = 128256;

inline bool is_llama_preset(const std::string& name) {
    if (is_model_preset(name)) return true;
    for (const char* preset : LLAMA3_PRESET_NAMES)
        if (name == preset) return true;
    return false;
}

// The largest divisor of heads that is at most heads / 4 (1 where none is).
inline int llama_kv_heads(int heads) {
    for (int kv = heads / 4; kv > 1; kv--)
        if (heads % kv == 0) return kv;
    return 1;
}

// Llama's SwiGLU width for C channels: 8C/3 rounded up to a multiple of 256.
inline int llama_ffn_hidden(int channels) { return (8 * channels / 3 + 255) / 256 * 256; }

inline ModelConfig llama_preset(const std::string& name, int max_seq_len = 1024, int vocab_size = 50257) {
    ModelConfig c;
    auto published = [&](int layers, int channels, int heads, int kv_heads, int ffn_hidden) {
        c.max_seq_len = max_seq_len;
        c.vocab_size = LLAMA3_VOCAB;
        c.padded_vocab_size = pad_vocab(LLAMA3_VOCAB);
        c.num_layers = layers, c.channels = channels, c.num_heads = heads;
        c.kv_heads = kv_heads, c.ffn_hidden = ffn_hidden;
    };
    if (name == "llama3-8b") published(32, 4096, 32, 8, 14336);
    else if (name == "llama3-70b") published(80, 8192, 64, 8, 28672);
    else if (name == "llama3-405b") published(126, 16384, 128, 8, 53248);
    else if (is_model_preset(name)) {
        c = model_preset(name, max_seq_len, vocab_size);
        c.kv_heads = llama_kv_heads(c.num_heads);
        c.ffn_hidden = llama_ffn_hidden(c.channels);
    } else {
        fail(strformat("unknown Llama preset '%s': expected one of d4 d6 d12 d24 d36 d48 llama3-8b llama3-70b "
                       "llama3-405b", name.c_str()));
    }
    c.arch = ModelArch::Llama;
    c.rope_theta = 500000.0f;
    c.validate();
    return c;
}

}  // namespace llmc
