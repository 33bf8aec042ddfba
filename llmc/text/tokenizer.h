// tokenizer.h: GPT-2 token id -> bytes, loaded from llm.c's tokenizer file (decoding only).
//
// The file stores each token's raw bytes (already mapped back from GPT-2's printable-unicode form by
// dev/data/gpt2_bpe.py), so decoding is table lookup and concatenation; no BPE logic is needed in C++.
// Layout: int32[256] header {magic 20240328, version, vocab size, eot id (version 2 only)}, then per token
// a uint8 length (1..255) followed by that many bytes. A token may be part of a multi-byte UTF-8
// character, so decode(id) returns bytes, not necessarily valid UTF-8 on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmc/data/llmc_header.h"
#include "llmc/utils.h"

namespace llmc {

class Tokenizer {
public:
    static constexpr int32_t kMagic = TOKENIZER_MAGIC;
    static constexpr int kGpt2EotToken = 50256;  // version 1 files have no eot field: GPT-2's

    explicit Tokenizer(const std::string& path) {
        File f(path, "rb");
        const LlmcHeader header = read_llmc_header(f, kMagic, " (regenerate it with `make data`)");
        int version = header[1];
        if (version != 1 && version != 2) fail_llmc_version(f, kMagic, version, "1 or 2");
        int vocab_size = header[2];
        if (vocab_size <= 0)
            fail(strformat("'%s': vocab size is %d, expected a positive number", path.c_str(), vocab_size));
        // Each token takes at least its length byte: check before sizing the table by the header.
        const int64_t room = f.size() - LLMC_HEADER_BYTES;
        if (vocab_size > room)
            fail(strformat("'%s' is truncated: the header declares %d tokens, but only %lld bytes follow it (at least "
                           "one per token)", path.c_str(), vocab_size, (long long)room));
        eot_token_ = version == 1 ? kGpt2EotToken : header[3];
        if (eot_token_ < 0 || eot_token_ >= vocab_size)
            fail(strformat("'%s': eot token %d is outside the vocabulary [0, %d)", path.c_str(), eot_token_,
                           vocab_size));

        tokens_.resize(vocab_size);
        for (int id = 0; id < vocab_size; id++) {
            uint8_t length;
            f.read(&length, 1, "token length");
            if (length == 0)
                fail(strformat("'%s': token %d has length 0 (at byte offset %lld), expected 1..255",
                               path.c_str(), id, (long long)f.tell() - 1));
            tokens_[id].resize(length);
            f.read(tokens_[id].data(), length, "token bytes");
        }
        // Bytes left over mean the header's vocab size does not describe this table.
        if (f.tell() != f.size())
            fail(strformat("'%s': %lld bytes follow the %d tokens the header declares; expected none",
                           path.c_str(), (long long)(f.size() - f.tell()), vocab_size));
    }

    int vocab_size() const { return (int)tokens_.size(); }
    int eot_token() const { return eot_token_; }

    const std::string& decode(int id) const {
        if (id < 0 || id >= vocab_size())
            fail(strformat("token id %d is out of range: the vocabulary has %d tokens", id, vocab_size()));
        return tokens_[id];
    }

    std::string decode(const std::vector<int>& ids) const {
        std::string text;
        for (int id : ids) text += decode(id);
        return text;
    }

private:
    std::vector<std::string> tokens_;
    int eot_token_ = kGpt2EotToken;
};

}  // namespace llmc
