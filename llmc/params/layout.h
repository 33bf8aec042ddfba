// model_config.h: the GPT-2 shape (ModelConfig), its presets, and the layout of the flat parameter
// buffer (ParamLayout).
//
// Parameters, gradients, AdamW moments and master weights each live in ONE flat buffer, laid out
// bucket-major (embeddings, then one bucket per transformer layer, then the final LayerNorm) so
// that a ZeRO bucket is a contiguous range; model files keep llm.c's order (see ParamLayout).
// ParamLayout is the single place that computes sizes and offsets; the CPU model, the CUDA model,
// the model file, the optimizer and ZeRO sharding all read it, so they cannot disagree.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "llmc/utils.h"

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

constexpr int NUM_PARAM_TENSORS = 16;

// Where each parameter sits in the flat buffers. Offsets and sizes are in elements.
//
// Flat order is bucket-major: bucket 0 holds the embeddings [wte, wpe], bucket 1 + l holds all of
// transformer layer l [ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb fcprojw fcprojb],
// and the last bucket the final LayerNorm [lnfw, lnfb]. ZeRO works bucket by bucket ("layer l's
// gradients are ready", "gather layer l's parameters"), and bucket-major makes each of those one
// contiguous range. Model files keep llm.c's tensor-major order (each per-layer tensor holding all
// layers back to back); file_offset() says where a slice sits there, and model_file.h permutes.
struct ParamLayout {
    enum Tensor { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB,
                  LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };
    static constexpr std::array<const char*, NUM_PARAM_TENSORS> names = {
        "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
        "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
    static constexpr int EMBEDDING_BUCKET = 0;

    // One tensor slice (one layer's, for a per-layer tensor) at flat elements [begin, end).
    struct Segment {
        int tensor;
        int layer;  // 0 for the tensors that are not per-layer
        size_t begin, end;
    };

    size_t num_params = 0;

    explicit ParamLayout(const ModelConfig& c) : num_layers_(c.num_layers) {
        const size_t Vp = c.padded_vocab_size, C = c.channels, maxT = c.max_seq_len;
        sizes_ = {Vp * C, maxT * C, C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, C * 4 * C, C, C, C};
        size_t kind_size[3] = {};  // running size of an embedding, a layer and the final bucket
        size_t file_at = 0;
        for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
            offset_in_bucket_[t] = kind_size[kind_of(t)];
            kind_size[kind_of(t)] += sizes_[t];
            file_begin_[t] = file_at;
            file_at += (is_per_layer(t) ? num_layers_ : 1) * sizes_[t];
        }
        embedding_size_ = kind_size[0];
        layer_size_ = kind_size[1];
        final_size_ = kind_size[2];
        num_params = embedding_size_ + num_layers_ * layer_size_ + final_size_;
        for (int b = 0; b < num_buckets(); b++) {
            const int kind = b == EMBEDDING_BUCKET ? 0 : b == final_bucket() ? 2 : 1;
            for (int t = 0; t < NUM_PARAM_TENSORS; t++)
                if (kind_of(t) == kind) {
                    const size_t begin = bucket_begin(b) + offset_in_bucket_[t];
                    segments_.push_back({t, kind == 1 ? b - 1 : 0, begin, begin + sizes_[t]});
                }
        }
    }

    // ln1w .. fcprojb: one slice per transformer layer.
    static bool is_per_layer(int tensor) { return tensor >= LN1W && tensor <= FCPROJB; }
    // Elements of one layer's slice for a per-layer tensor, of the whole tensor otherwise.
    size_t tensor_size(int tensor) const { return sizes_[tensor]; }

    int num_buckets() const { return num_layers_ + 2; }
    int layer_bucket(int layer) const { return layer + 1; }
    int final_bucket() const { return num_layers_ + 1; }
    int bucket_of(int tensor, int layer = 0) const {
        check(tensor, layer);
        const int kind = kind_of(tensor);
        return kind == 0 ? EMBEDDING_BUCKET : kind == 1 ? layer_bucket(layer) : final_bucket();
    }
    // Buckets tile [0, num_params) in order: bucket_begin(b + 1) == bucket_begin(b) + bucket_size(b).
    size_t bucket_begin(int b) const {
        check_bucket(b);
        return b == EMBEDDING_BUCKET ? 0 : embedding_size_ + (size_t)(b - 1) * layer_size_;
    }
    size_t bucket_size(int b) const {
        check_bucket(b);
        return b == EMBEDDING_BUCKET ? embedding_size_ : b == final_bucket() ? final_size_ : layer_size_;
    }
    size_t offset_in_bucket(int tensor) const { return offset_in_bucket_[tensor]; }
    // Flat offset of a tensor's slice; `layer` only for per-layer tensors.
    size_t offset(int tensor, int layer = 0) const {
        return bucket_begin(bucket_of(tensor, layer)) + offset_in_bucket_[tensor];
    }

    // Every slice in flat order; together they tile [0, num_params).
    const std::vector<Segment>& segments() const { return segments_; }

    // Where the same slice sits in a model file's parameters (llm.c order), in elements.
    size_t file_offset(int tensor, int layer = 0) const {
        check(tensor, layer);
        return file_begin_[tensor] + (size_t)layer * sizes_[tensor];
    }

    // AdamW's weight decay applies to matrices (embeddings and weights), not to biases or LayerNorm.
    static bool is_decayed(int tensor) {
        return tensor == WTE || tensor == WPE || tensor == QKVW || tensor == ATTPROJW ||
               tensor == FCW || tensor == FCPROJW;
    }

private:
    // The kind of bucket a tensor lives in: 0 the embeddings, 1 a transformer layer, 2 the final LayerNorm.
    static int kind_of(int tensor) { return tensor == WTE || tensor == WPE ? 0 : is_per_layer(tensor) ? 1 : 2; }
    void check(int tensor, int layer) const {
        if (tensor < 0 || tensor >= NUM_PARAM_TENSORS)
            fail(strformat("ParamLayout: tensor %d is not in [0, %d)", tensor, NUM_PARAM_TENSORS));
        const int layers = is_per_layer(tensor) ? num_layers_ : 1;
        if (layer < 0 || layer >= layers)
            fail(strformat("ParamLayout: layer %d of %s is not in [0, %d)", layer, names[tensor], layers));
    }
    void check_bucket(int b) const {
        if (b < 0 || b >= num_buckets()) fail(strformat("ParamLayout: bucket %d is not in [0, %d)", b, num_buckets()));
    }

    int num_layers_;
    size_t embedding_size_ = 0, layer_size_ = 0, final_size_ = 0;
    std::array<size_t, NUM_PARAM_TENSORS> sizes_{};             // one slice
    std::array<size_t, NUM_PARAM_TENSORS> offset_in_bucket_{};  // within its bucket
    std::array<size_t, NUM_PARAM_TENSORS> file_begin_{};        // first element in file order
    std::vector<Segment> segments_;
};

// Model FLOPs per trained token at sequence length T, the figure MFU is measured against: 6 per
// parameter that multiplies (forward 2, backward 4; all but the position embedding), plus causal
// attention's QK^T and PV: 4 T C per layer forward at full length, halved by the mask, times 3 for
// forward and backward.
inline double model_flops_per_token(const ModelConfig& c, int T) {
    const double multiplying = (double)ParamLayout(c).num_params - (double)c.max_seq_len * c.channels;
    return 6.0 * multiplying + 6.0 * c.num_layers * (double)c.channels * T;
}

}  // namespace llmc
