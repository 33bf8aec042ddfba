// models/model_file.h: reads and writes a model file: llm.c's GPT-2 model file, version 3 (fp32
// parameters) or version 5 (bf16 parameters, as llm.c's train_gpt2.py writes them for its CUDA
// trainer), and llmc's extensions of it, whose version numbers llm.c refuses:
//   a GPT-2 mixture of experts   version 103 (fp32) or 105 (bf16), header[8..11] = num_experts,
//                                moe_top_k, moe_every, moe_shared; the experts' tensors
//                                (gpt2/params.h) after GPT-2's.
//   a Llama model                version 203 (fp32) or 205 (bf16), header[12..14] = kv_heads,
//                                ffn_hidden, rope_theta (the float's bits); llama/params.h's tensors.
// A dense GPT-2 is always written as llm.c's 3 or 5. The version says which family a file holds.
//
// Layout: an int32[256] header (header[2..7]: max_seq_len, vocab_size, num_layers, num_heads,
// channels, padded_vocab_size), then every parameter as fp32 or bf16 in the family table's
// tensor-major order (the table's file order, padded vocabulary rows included), nothing after. bf16 is written rounded to
// nearest even (PyTorch's .to(torch.bfloat16)) and read exactly. In memory the flat buffer is bucket-major (see ParamLayout), so
// reading and writing stream the file sequentially, slice by slice, each slice landing at (or coming
// from) its flat offset; no full-size temporary. Because the header carries the whole shape, a reader
// can compute the exact expected file size up front, so truncation and trailing garbage are both
// caught, and reported with the byte offset, before any parameter is read (and before anything is
// sized by a header that may be corrupt). Every parameter read or written must be finite: a NaN is
// reported by tensor, row and byte offset (padding rows of the vocabulary included, which training
// never touches but a NaN there still poisons the tied lm head's logits).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/numerics/bf16.h"
#include "llmc/failures/exit_codes.h"
#include "llmc/data/llmc_header.h"
#include "llmc/models/family.h"
#include "llmc/utils.h"

namespace llmc {

constexpr int MODEL_FILE_VERSION_FP32 = 3;
constexpr int MODEL_FILE_VERSION_BF16 = 5;
constexpr int MODEL_FILE_VERSION_MOE = 100;    // added to 3 or 5 for a mixture-of-experts model
constexpr int MODEL_FILE_VERSION_LLAMA = 200;  // added to 3 or 5 for a Llama model

namespace detail {

// Reads the header of the model file open in `f`, checks it and returns the shape it holds; its
// format version goes to *version.
inline ModelConfig read_model_header(File& f, int* version = nullptr) {
    const std::string& path = f.path();
    const LlmcHeader header = read_llmc_header(f, MODEL_FILE_MAGIC);
    const bool llama = header[1] > MODEL_FILE_VERSION_LLAMA;
    const bool moe = !llama && header[1] > MODEL_FILE_VERSION_MOE;
    const int dtype_version = header[1] - (llama ? MODEL_FILE_VERSION_LLAMA : moe ? MODEL_FILE_VERSION_MOE : 0);
    if (dtype_version != MODEL_FILE_VERSION_FP32 && dtype_version != MODEL_FILE_VERSION_BF16)
        fail_llmc_version(f, MODEL_FILE_MAGIC, header[1],
                          "3 (fp32) or 5 (bf16), 103 or 105 with experts, 203 or 205 for Llama");
    if (version) *version = dtype_version;
    ModelConfig c;
    if (moe) c.num_experts = header[8], c.moe_top_k = header[9], c.moe_every = header[10], c.moe_shared = header[11];
    if (llama) {
        c.arch = ModelArch::Llama;
        c.kv_heads = header[12], c.ffn_hidden = header[13];
        std::memcpy(&c.rope_theta, &header[14], sizeof(float));
    }
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    try {
        c.validate();
    } catch (const Error& e) {
        fail(strformat("'%s' has an invalid header: %s", path.c_str(), e.what()));
    }
    // The shape fixes the file's size: check it now, before anyone sizes buffers by this header.
    const bool bf16 = dtype_version == MODEL_FILE_VERSION_BF16;
    const char* dtype = bf16 ? "bf16" : "fp32";
    const int64_t param_bytes = (int64_t)num_params(c) * (bf16 ? 2 : 4);
    const int64_t expected_bytes = LLMC_HEADER_BYTES + param_bytes;
    const int64_t actual_bytes = f.size();
    if (actual_bytes < expected_bytes)
        fail(strformat("'%s' is truncated: expected %lld bytes of %s parameters at byte offset %lld, found %lld "
                       "(header: L %d, C %d, heads %d, vocab %d padded %d, max T %d)",
                       path.c_str(), (long long)param_bytes, dtype, (long long)LLMC_HEADER_BYTES,
                       (long long)(actual_bytes - LLMC_HEADER_BYTES), c.num_layers, c.channels, c.num_heads,
                       c.vocab_size, c.padded_vocab_size, c.max_seq_len));
    if (moe && c.num_experts == 0)
        fail(strformat("'%s' has an invalid header: version %d (with experts) but 0 experts", path.c_str(), header[1]));
    if (actual_bytes > expected_bytes)
        fail(strformat("'%s' has %lld trailing bytes after the %s parameters of version %d (expected size %lld "
                       "bytes, found %lld)", path.c_str(), (long long)(actual_bytes - expected_bytes), dtype, header[1],
                       (long long)expected_bytes, (long long)actual_bytes));
    return c;
}

// Where element i of slice `s` is: its tensor (and layer), row and column, and what a padding row is.
inline std::string describe_parameter(const ParamLayout& layout, const ModelConfig& c, const ParamLayout::Segment& s,
                                      size_t i) {
    const TensorSpec& spec = layout.table().tensors[s.tensor];
    std::string where = spec.name;
    if (layout.is_per_layer(s.tensor)) where += strformat(" of layer %d", s.layer);
    if (spec.shape.size() != 2) return where + strformat(" element %zu", i);
    const size_t row = i / spec.shape[1];
    where += strformat(" row %zu column %zu", row, i % spec.shape[1]);
    const bool vocab_rows = spec.name == "wte" || spec.name == "lm_head";
    if (vocab_rows && row >= (size_t)c.vocab_size)
        where += strformat(" (a padding row of the vocabulary: ids >= vocab_size %d)", c.vocab_size);
    return where;
}

// The first element of slice `s` (its values at `values`) that is NaN or infinite, described, or "".
inline std::string first_non_finite(const ParamLayout& layout, const ModelConfig& c, const ParamLayout::Segment& s,
                                    const float* values, int64_t* file_byte = nullptr, int param_bytes = 4) {
    const size_t n = s.end - s.begin;
    for (size_t i = 0; i < n; i++) {
        if (std::isfinite(values[i])) continue;
        if (file_byte)
            *file_byte = LLMC_HEADER_BYTES + (int64_t)(layout.file_offset(s.tensor, s.layer) + i) * param_bytes;
        return strformat("%s is %g", describe_parameter(layout, c, s, i).c_str(), values[i]);
    }
    return "";
}

}  // namespace detail

// The shape stored in a model file's header (the file is opened, the parameters are not read).
inline ModelConfig read_model_header(const std::string& path) {
    File f(path, "rb");
    return detail::read_model_header(f);
}

// Reads the parameters of a model file (fp32 or bf16) whose shape must equal `expected` into the flat
// buffer `params` (num_params(expected) floats, bucket-major).
inline void read_model_file(const std::string& path, const ModelConfig& expected, float* params) {
    File f(path, "rb");
    int version = 0;
    ModelConfig got = detail::read_model_header(f, &version);
    auto check = [&](const char* field, int file_value, int expected_value) {
        if (file_value != expected_value)
            fail(strformat("'%s' does not match the model: %s is %d in the file, expected %d", path.c_str(),
                           field, file_value, expected_value));
    };
    check("max_seq_len", got.max_seq_len, expected.max_seq_len);
    check("vocab_size", got.vocab_size, expected.vocab_size);
    check("num_layers", got.num_layers, expected.num_layers);
    check("num_heads", got.num_heads, expected.num_heads);
    check("channels", got.channels, expected.channels);
    check("padded_vocab_size", got.padded_vocab_size, expected.padded_vocab_size);
    if (got.arch != expected.arch)
        fail(strformat("'%s' does not match the model: it holds a %s model, expected %s (--arch)", path.c_str(),
                       arch_name(got.arch), arch_name(expected.arch)));
    check("num_experts", got.num_experts, expected.num_experts);
    check("kv_heads", got.kv_head_count(), expected.kv_head_count());
    check("ffn_hidden", got.mlp_hidden(), expected.mlp_hidden());
    if (got.rope_theta != expected.rope_theta && expected.arch == ModelArch::Llama)
        fail(strformat("'%s' does not match the model: rope_theta is %g in the file, expected %g", path.c_str(),
                       got.rope_theta, expected.rope_theta));
    if (expected.num_experts > 0) {
        check("moe_top_k", got.moe_top_k, expected.moe_top_k);
        check("moe_every", got.moe_every, expected.moe_every);
        check("moe_shared", got.moe_shared, expected.moe_shared);
    }

    const ParamLayout layout = model_layout(expected);
    const bool bf16 = version == MODEL_FILE_VERSION_BF16;  // the header read checked the file's size
    std::vector<uint16_t> bits;
    for (const ParamLayout::Segment& s : layout.file_order_segments()) {
        const size_t n = s.end - s.begin;
        if (!bf16) {
            f.read(params + s.begin, n, "fp32 parameters");
        } else {
            bits.resize(n);
            f.read(bits.data(), n, "bf16 parameters");
            for (size_t i = 0; i < n; i++) params[s.begin + i] = bf16_bits_to_float(bits[i]);
        }
        int64_t byte = 0;
        const std::string bad = detail::first_non_finite(layout, expected, s, params + s.begin, &byte, bf16 ? 2 : 4);
        if (!bad.empty())
            fail(strformat("'%s': parameter %s (byte offset %lld); a model file must hold finite values", path.c_str(),
                           bad.c_str(), (long long)byte));
    }
}

// Writes a model file from the flat buffer `params`, whole or not at all: version 3 (fp32, exact) or
// version 5 (bf16, each parameter rounded to nearest even).
inline void write_model_file(const std::string& path, const ModelConfig& config, const float* params,
                             int version = MODEL_FILE_VERSION_FP32) {
    config.validate();
    if (version != MODEL_FILE_VERSION_FP32 && version != MODEL_FILE_VERSION_BF16)
        fail(strformat("write_model_file '%s': version %d is not 3 (fp32) or 5 (bf16)", path.c_str(), version));
    const ParamLayout layout = model_layout(config);
    for (const ParamLayout::Segment& s : layout.segments()) {
        const std::string bad = detail::first_non_finite(layout, config, s, params + s.begin);
        if (!bad.empty())
            fail_with(EXIT_DIVERGED, strformat("not writing '%s': parameter %s; the model's parameters are not finite "
                                               "(training diverged: try a lower -l)", path.c_str(), bad.c_str()));
    }
    LlmcHeader header = {};
    header[0] = MODEL_FILE_MAGIC;
    header[1] = version + (config.arch == ModelArch::Llama ? MODEL_FILE_VERSION_LLAMA
                           : config.num_experts > 0        ? MODEL_FILE_VERSION_MOE
                                                           : 0);
    if (config.num_experts > 0) {
        header[8] = config.num_experts, header[9] = config.moe_top_k;
        header[10] = config.moe_every, header[11] = config.moe_shared;
    }
    if (config.arch == ModelArch::Llama) {
        header[12] = config.kv_head_count(), header[13] = config.mlp_hidden();
        std::memcpy(&header[14], &config.rope_theta, sizeof(float));
    }
    header[2] = config.max_seq_len;
    header[3] = config.vocab_size;
    header[4] = config.num_layers;
    header[5] = config.num_heads;
    header[6] = config.channels;
    header[7] = config.padded_vocab_size;
    AtomicFile out(path);
    out.file().write(header.data(), LLMC_HEADER_INTS);
    std::vector<uint16_t> bits;
    for (const ParamLayout::Segment& s : layout.file_order_segments()) {
        const size_t n = s.end - s.begin;
        if (version == MODEL_FILE_VERSION_FP32) {
            out.file().write(params + s.begin, n);
            continue;
        }
        bits.resize(n);
        for (size_t i = 0; i < n; i++) bits[i] = float_to_bf16_bits(params[s.begin + i]);
        out.file().write(bits.data(), n);
    }
    out.commit();
}

}  // namespace llmc
