// bpe_encoder.h: GPT-2's byte-level BPE encoder (text -> token ids), for prompting a model.
//
// The same algorithm as dev/data/gpt2_bpe.py, from the same files (data/gpt2_bpe/encoder.json and
// vocab.bpe): GPT-2's pattern splits the text into words, and inside each word adjacent symbols
// merge in the order of vocab.bpe, lowest rank first, until no listed pair is left. The one idea:
// the printable-unicode spelling of encoder.json and vocab.bpe (bytes_to_unicode) is only a
// spelling, so it is undone once at load time and the merges then work on raw bytes. std::regex
// has no \p{L}/\p{N}, so the pattern is matched by hand (split_words) against the Unicode tables
// of unicode_classes.h, which are generated from the Python `regex` module the reference uses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/text/unicode_classes.h"
#include "llmc/utils.h"

namespace llmc {

namespace bpe_detail {

template <size_t N>
bool in_ranges(const uint32_t (&ranges)[N][2], uint32_t cp) {
    const auto* it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                                      [](uint32_t c, const uint32_t(&r)[2]) { return c < r[0]; });
    return it != std::begin(ranges) && cp <= (*(it - 1))[1];
}

// One code point of a UTF-8 text and where its bytes start. Invalid UTF-8 bytes stand for
// themselves (as U+FFFD would, they are neither letters, numbers nor spaces).
struct CodePoint {
    uint32_t cp;
    size_t byte;
};

inline std::vector<CodePoint> decode_utf8(const std::string& s) {
    std::vector<CodePoint> out;
    for (size_t i = 0; i < s.size();) {
        const uint8_t c = (uint8_t)s[i];
        const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= s.size();
        uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
        for (int k = 1; ok && k < n; k++) {
            ok = ((uint8_t)s[i + k] >> 6) == 2;
            cp = (cp << 6) | ((uint8_t)s[i + k] & 0x3F);
        }
        out.push_back({ok ? cp : 0xFFFD, i});
        i += ok ? n : 1;
    }
    return out;
}

// GPT-2's bytes_to_unicode: the code point that spells each byte in encoder.json and vocab.bpe.
// Printable Latin-1 bytes spell themselves; the other 68, in order, are U+0100, U+0101, ...
inline std::vector<uint32_t> byte_spelling() {
    std::vector<uint32_t> spelling(256);
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        spelling[b] = printable ? (uint32_t)b : next++;
    }
    return spelling;
}

}  // namespace bpe_detail

// GPT-2's pre-tokenization, the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched as a regex engine does: at each position the first alternative that matches wins.
// Returns the words as UTF-8 pieces of `text`, which they cover exactly.
inline std::vector<std::string> split_words(const std::string& text) {
    using namespace bpe_detail;
    const std::vector<CodePoint> cps = decode_utf8(text);
    const size_t n = cps.size();
    auto letter = [&](size_t i) { return i < n && in_ranges(kLetterRanges, cps[i].cp); };
    auto number = [&](size_t i) { return i < n && in_ranges(kNumberRanges, cps[i].cp); };
    auto space = [&](size_t i) { return i < n && in_ranges(kSpaceRanges, cps[i].cp); };
    auto other = [&](size_t i) { return i < n && !letter(i) && !number(i) && !space(i); };
    auto byte_at = [&](size_t i) { return i < n ? cps[i].byte : text.size(); };
    auto ascii = [&](size_t i, char c) { return i < n && cps[i].cp == (uint32_t)c; };

    std::vector<std::string> words;
    for (size_t i = 0; i < n;) {
        size_t end = i;
        if (ascii(i, '\'') && (ascii(i + 1, 's') || ascii(i + 1, 't') || ascii(i + 1, 'm') || ascii(i + 1, 'd'))) {
            end = i + 2;
        } else if (ascii(i, '\'') && ((ascii(i + 1, 'r') && ascii(i + 2, 'e')) || (ascii(i + 1, 'v') && ascii(i + 2, 'e')) ||
                                      (ascii(i + 1, 'l') && ascii(i + 2, 'l')))) {
            end = i + 3;
        } else {
            // ' ?' then a run of one class: letters, numbers, or anything else but spaces.
            for (int cls = 0; cls < 3; cls++) {
                auto is = [&](size_t k) { return cls == 0 ? letter(k) : cls == 1 ? number(k) : other(k); };
                const size_t start = ascii(i, ' ') && is(i + 1) ? i + 1 : i;
                if (!is(start)) continue;
                end = start;
                while (is(end)) end++;
                break;
            }
            if (end == i) {
                // A whitespace run; without the end of the text after it, its last character is
                // left to start the next word (\s+(?!\S)), unless the run is one character (\s+).
                end = i;
                while (space(end)) end++;
                if (end < n && end - i > 1) end--;
            }
        }
        words.push_back(text.substr(byte_at(i), byte_at(end) - byte_at(i)));
        i = end;
    }
    return words;
}

class BpeEncoder {
public:
    // bpe_dir holds GPT-2's encoder.json and vocab.bpe (`make data` fetches them).
    explicit BpeEncoder(const std::string& bpe_dir) {
        const std::vector<uint32_t> spelling = bpe_detail::byte_spelling();
        std::unordered_map<uint32_t, char> byte_of;
        for (int b = 0; b < 256; b++) byte_of[spelling[b]] = (char)b;
        // A GPT-2 spelling (UTF-8 of the spelling code points) -> the raw bytes it stands for.
        auto raw = [&](const std::string& spelled, const std::string& where) {
            std::string bytes;
            for (const bpe_detail::CodePoint& c : bpe_detail::decode_utf8(spelled)) {
                auto it = byte_of.find(c.cp);
                if (it == byte_of.end())
                    fail(strformat("%s: '%s' holds U+%04X, which spells no byte in GPT-2's byte-level BPE", where.c_str(),
                                   spelled.c_str(), c.cp));
                bytes += it->second;
            }
            return bytes;
        };

        const std::string encoder_path = bpe_dir + "/encoder.json";
        nlohmann::json encoder;
        try {
            encoder = nlohmann::json::parse(read_text_file(encoder_path));
        } catch (const nlohmann::json::exception& e) {
            fail(strformat("'%s' is not valid JSON: %s", encoder_path.c_str(), e.what()));
        }
        if (!encoder.is_object() || encoder.empty())
            fail(strformat("'%s' must be a JSON object of token spellings to ids", encoder_path.c_str()));
        for (auto& [spelled, id] : encoder.items()) {
            if (!id.is_number_integer())
                fail(strformat("'%s': token '%s' has id %s, expected an integer", encoder_path.c_str(), spelled.c_str(),
                               id.dump().c_str()));
            if (spelled == "<|endoftext|>") continue;  // special: never produced from text
            ids_[raw(spelled, encoder_path)] = id.get<int>();
        }

        const std::string merges_path = bpe_dir + "/vocab.bpe";
        const std::string merges = read_text_file(merges_path);
        size_t at = merges.find('\n') + 1;  // line 1 is "#version: 0.2"
        for (int line = 2; at > 0 && at < merges.size(); line++) {
            size_t eol = merges.find('\n', at);
            if (eol == std::string::npos) eol = merges.size();
            const std::string text = merges.substr(at, eol - at);
            at = eol + 1;
            if (text.empty()) continue;
            const size_t sp = text.find(' ');
            if (sp == std::string::npos || text.find(' ', sp + 1) != std::string::npos)
                fail(strformat("'%s' line %d: expected two symbols separated by one space, got '%s'",
                               merges_path.c_str(), line, text.c_str()));
            ranks_[pair_key(raw(text.substr(0, sp), merges_path), raw(text.substr(sp + 1), merges_path))] =
                (int)ranks_.size();
        }
    }

    std::vector<int> encode(const std::string& text) {
        std::vector<int> ids;
        for (const std::string& word : split_words(text)) {
            auto cached = cache_.find(word);
            if (cached == cache_.end()) cached = cache_.emplace(word, encode_word(word)).first;
            ids.insert(ids.end(), cached->second.begin(), cached->second.end());
        }
        return ids;
    }

private:
    // A pair's key: the first symbol's length (< 256 bytes, as every GPT-2 token), then both symbols.
    static std::string pair_key(const std::string& a, const std::string& b) {
        return std::string(1, (char)a.size()) + a + b;
    }

    // One word's bytes, merged pair by pair: each round the lowest-ranked adjacent pair merges
    // everywhere it occurs, left to right, as in GPT-2.
    std::vector<int> encode_word(const std::string& word) const {
        std::vector<std::string> symbols;
        for (char c : word) symbols.emplace_back(1, c);
        while (symbols.size() > 1) {
            int best_rank = -1;
            size_t best = 0;
            for (size_t i = 0; i + 1 < symbols.size(); i++) {
                auto it = ranks_.find(pair_key(symbols[i], symbols[i + 1]));
                if (it != ranks_.end() && (best_rank < 0 || it->second < best_rank)) {
                    best_rank = it->second;
                    best = i;
                }
            }
            if (best_rank < 0) break;
            const std::string first = symbols[best], second = symbols[best + 1];
            std::vector<std::string> merged;
            for (size_t i = 0; i < symbols.size(); i++) {
                if (i + 1 < symbols.size() && symbols[i] == first && symbols[i + 1] == second) {
                    merged.push_back(first + second);
                    i++;
                } else {
                    merged.push_back(symbols[i]);
                }
            }
            symbols = std::move(merged);
        }
        std::vector<int> ids;
        for (const std::string& s : symbols) {
            auto it = ids_.find(s);
            if (it == ids_.end()) fail("BPE: a merged symbol is not in encoder.json (encoder.json and vocab.bpe disagree)");
            ids.push_back(it->second);
        }
        return ids;
    }

    std::unordered_map<std::string, int> ids_;    // a token's raw bytes -> its id
    std::unordered_map<std::string, int> ranks_;  // pair_key(a, b) -> merge rank (lower merges first)
    std::unordered_map<std::string, std::vector<int>> cache_;  // word -> ids
};

}  // namespace llmc
