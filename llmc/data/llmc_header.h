// llmc_header.h: the header that starts every llm.c file llmc reads or writes: 256 int32, [0] the
// magic number (which kind of file), [1] the format version, then the kind's own fields, zeros after.
// Token shards (dataloader.h), evaluation files (eval_loader.h), the tokenizer (tokenizer.h) and the
// GPT-2 model file (models/gpt2/model_file.h) read theirs with read_llmc_header, so a wrong, truncated or
// mixed-up file is reported the same way: the file, what was found, what was expected.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "llmc/utils.h"

namespace llmc {

constexpr int LLMC_HEADER_INTS = 256;
constexpr int64_t LLMC_HEADER_BYTES = LLMC_HEADER_INTS * (int64_t)sizeof(int32_t);
using LlmcHeader = std::array<int32_t, LLMC_HEADER_INTS>;

// The magic numbers of the kinds of llm.c file llmc knows.
constexpr int32_t MODEL_FILE_MAGIC = 20240326;
constexpr int32_t TOKENIZER_MAGIC = 20240328;
constexpr int32_t TOKEN_SHARD_MAGIC = 20240520;
constexpr int32_t EVAL_FILE_MAGIC = 20240522;  // multiple-choice items (HellaSwag), llm.c's write_evalfile

// The kind of file a magic number marks, for error messages; nullptr for one llmc does not know.
inline const char* llmc_file_kind(int32_t magic) {
    switch (magic) {
        case MODEL_FILE_MAGIC: return "GPT-2 model file";
        case TOKENIZER_MAGIC: return "tokenizer file";
        case TOKEN_SHARD_MAGIC: return "token shard";
        case EVAL_FILE_MAGIC: return "multiple-choice evaluation file";
        default: return nullptr;
    }
}

// Reads the header at the start of `f` and checks that it marks a file of `magic`'s kind. A short
// file fails as truncated (File::read); a wrong magic number fails naming the file, the number found
// (and the kind of file it marks, when llmc knows it) and the one expected, followed by `hint`.
inline LlmcHeader read_llmc_header(File& f, int32_t magic, const char* hint = "") {
    const char* kind = llmc_file_kind(magic);
    LlmcHeader header;
    f.read(header.data(), LLMC_HEADER_INTS, strformat("%s header", kind).c_str());
    if (header[0] != magic) {
        const char* found = llmc_file_kind(header[0]);
        fail(strformat("'%s' is not a %s: magic number %d at byte offset 0%s, expected %d%s", f.path().c_str(), kind,
                       header[0], found ? strformat(" (a %s's)", found).c_str() : "", magic, hint));
    }
    return header;
}

// Fails for a format version (header[1]) the reader does not support; `expected` lists those it does.
[[noreturn]] inline void fail_llmc_version(const File& f, int32_t magic, int32_t version, const char* expected) {
    fail(strformat("'%s': unsupported %s version %d (byte offset 4), expected %s", f.path().c_str(),
                   llmc_file_kind(magic), version, expected));
}

}  // namespace llmc
