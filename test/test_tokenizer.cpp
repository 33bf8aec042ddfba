// test_tokenizer.cpp: llmc::Tokenizer against GPT-2's own vocabulary, the Python encoder's round-trip
// fixture, and malformed files.
//
// The reference for every token's bytes is computed here, independently of dev/data/gpt2_bpe.py:
// encoder.json's keys are GPT-2's printable-unicode spellings, and inverting bytes_to_unicode (implemented
// below from its definition) gives the raw bytes the tokenizer file must hold.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "llmc/text/bpe_encoder.h"
#include "llmc/text/tokenizer.h"
#include "llmc/utils.h"

namespace {

const char* kTokenizerPath = "data/gpt2_tokenizer.bin";
const char* kEncoderPath = "data/gpt2_bpe/encoder.json";
const char* kFixturePath = "test/fixtures/tokenizer_roundtrip.json";

// Missing generated data is a failure, not a skip: a skipped test would hide a broken data pipeline.
void require_data_file(const char* path) {
    if (!std::filesystem::exists(path))
        FAIL("'" << path << "' is missing: run `make data` (from the repository root) first");
}

// GPT-2's bytes_to_unicode, inverted: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves, and the remaining 68 bytes, in increasing order, are spelled as code points 256, 257, ...
std::map<uint32_t, uint8_t> unicode_to_byte() {
    std::map<uint32_t, uint8_t> inverse;
    int next = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        inverse[printable ? b : 256 + next++] = (uint8_t)b;
    }
    return inverse;
}

// UTF-8 -> code points. encoder.json is valid UTF-8 and only holds code points below 0x800 (2 bytes).
std::vector<uint32_t> code_points(const std::string& utf8) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < utf8.size();) {
        uint8_t c = (uint8_t)utf8[i];
        if (c < 0x80) {
            out.push_back(c);
            i += 1;
        } else if ((c & 0xE0) == 0xC0 && i + 1 < utf8.size()) {
            out.push_back(((c & 0x1Fu) << 6) | ((uint8_t)utf8[i + 1] & 0x3Fu));
            i += 2;
        } else {
            FAIL("unexpected UTF-8 lead byte " << (int)c << " in encoder.json key");
        }
    }
    return out;
}

std::string temp_dir() {
    auto dir = std::filesystem::temp_directory_path() / ("llmc_test_tokenizer_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    return dir.string();
}

// A tokenizer file with the given header fields and tokens, optionally cut to `keep_bytes`.
std::string write_tokenizer_file(const std::string& path, int32_t magic, int32_t version, int32_t vocab_size,
                                 int32_t eot, const std::vector<std::string>& tokens, long keep_bytes = -1) {
    std::string bytes(256 * sizeof(int32_t), '\0');
    int32_t* header = reinterpret_cast<int32_t*>(bytes.data());
    header[0] = magic;
    header[1] = version;
    header[2] = vocab_size;
    header[3] = eot;
    for (const auto& t : tokens) {
        bytes += (char)(uint8_t)t.size();
        bytes += t;
    }
    if (keep_bytes >= 0) bytes.resize(keep_bytes);
    llmc::write_text_file_atomic(path, bytes);
    return path;
}

}  // namespace

TEST_CASE("tokenizer decodes every GPT-2 token to its encoder.json bytes", "[tokenizer][data]") {
    require_data_file(kTokenizerPath);
    require_data_file(kEncoderPath);
    llmc::Tokenizer tok(kTokenizerPath);
    REQUIRE(tok.vocab_size() == 50257);
    REQUIRE(tok.eot_token() == 50256);

    auto encoder = nlohmann::json::parse(llmc::read_text_file(kEncoderPath));
    REQUIRE(encoder.size() == 50257);
    auto inverse = unicode_to_byte();
    std::vector<bool> seen(50257, false);
    int mismatches = 0;
    for (auto& [key, value] : encoder.items()) {
        int id = value.get<int>();
        if (id < 0 || id >= 50257) FAIL("encoder.json gives '" << key << "' id " << id << ", outside [0, 50257)");
        seen[id] = true;
        std::string expected;
        if (key == "<|endoftext|>") {
            expected = key;  // the special token is stored as its literal text
        } else {
            for (uint32_t cp : code_points(key)) {
                auto it = inverse.find(cp);
                if (it == inverse.end()) FAIL("encoder.json key '" << key << "' has code point " << cp
                                                                   << ", which bytes_to_unicode never produces");
                expected += (char)it->second;
            }
        }
        if (tok.decode(id) != expected) {
            // One CHECK per mismatch, not per token: 50257 passing assertions would drown the report.
            CHECK(tok.decode(id) == expected);
            if (++mismatches > 10) FAIL("more than 10 tokens decode wrongly; stopping");
        }
    }
    CHECK(mismatches == 0);
    CHECK(std::count(seen.begin(), seen.end(), false) == 0);
}

TEST_CASE("tokenizer decodes the Python encoder's ids back to the original text", "[tokenizer][data]") {
    require_data_file(kTokenizerPath);
    llmc::Tokenizer tok(kTokenizerPath);
    auto fixture = nlohmann::json::parse(llmc::read_text_file(kFixturePath));
    REQUIRE(fixture.size() >= 10);
    for (const auto& entry : fixture) {
        auto text = entry.at("text").get<std::string>();
        auto ids = entry.at("ids").get<std::vector<int>>();
        INFO("text: " << text);
        CHECK(tok.decode(ids) == text);
    }
    CHECK(tok.decode(std::vector<int>{15496, 995}) == "Hello world");
}

TEST_CASE("the C++ BPE encoder gives the Python encoder's ids for every fixture text", "[tokenizer][bpe][data]") {
    require_data_file(kEncoderPath);
    require_data_file(kFixturePath);
    llmc::BpeEncoder bpe("data/gpt2_bpe");
    auto fixture = nlohmann::json::parse(llmc::read_text_file(kFixturePath));
    REQUIRE(fixture.size() >= 10);
    for (const auto& entry : fixture) {
        const std::string text = entry["text"].get<std::string>();
        INFO("text: " << text);
        CHECK(bpe.encode(text) == entry["ids"].get<std::vector<int>>());
    }
}

TEST_CASE("the C++ BPE encoder re-encodes every document of the default corpus's validation shard to the "
          "same tokens", "[tokenizer][bpe][data]") {
    // dev/data/gpt2_bpe.py wrote the shard, each document after an <|endoftext|>; decoding a document
    // gives its text back, so encoding that text must give the document's tokens.
    const char* shard = "data/default/default_val_000000.bin";
    require_data_file(kTokenizerPath);
    require_data_file(shard);
    llmc::Tokenizer tokenizer(kTokenizerPath);
    llmc::BpeEncoder bpe("data/gpt2_bpe");
    const std::string bytes = llmc::read_text_file(shard);
    REQUIRE(bytes.size() > 1024);
    std::vector<uint16_t> tokens((bytes.size() - 1024) / 2);
    memcpy(tokens.data(), bytes.data() + 1024, tokens.size() * 2);
    int documents = 0, mismatched = 0;
    for (size_t begin = 0; begin < tokens.size();) {
        REQUIRE(tokens[begin] == tokenizer.eot_token());
        size_t end = begin + 1;
        while (end < tokens.size() && tokens[end] != tokenizer.eot_token()) end++;
        const std::vector<int> doc(tokens.begin() + begin + 1, tokens.begin() + end);
        if (bpe.encode(tokenizer.decode(doc)) != doc && mismatched++ < 3) FAIL_CHECK("document " << documents << ": " << tokenizer.decode(doc));
        documents++;
        begin = end;
    }
    CHECK(mismatched == 0);
    CHECK(documents > 100);
}

TEST_CASE("GPT-2's pre-tokenization splits words as the regex does", "[tokenizer][bpe]") {
    using V = std::vector<std::string>;
    CHECK(llmc::split_words("Hello world") == V{"Hello", " world"});
    CHECK(llmc::split_words("I'm here's") == V{"I", "'m", " here", "'s"});
    CHECK(llmc::split_words("a  b") == V{"a", " ", " b"});        // the last space joins the word
    CHECK(llmc::split_words("a \n\nb") == V{"a", " \n", "\n", "b"});  // ...or stands alone before it
    CHECK(llmc::split_words("x  ") == V{"x", "  "});               // a run at the end stays whole
    CHECK(llmc::split_words("pi 3.14!") == V{"pi", " 3", ".", "14", "!"});
    CHECK(llmc::split_words("café 日本") == V{"café", " 日本"});
    CHECK(llmc::split_words("").empty());
}

TEST_CASE("tokenizer rejects out-of-range ids", "[tokenizer][data]") {
    require_data_file(kTokenizerPath);
    llmc::Tokenizer tok(kTokenizerPath);
    REQUIRE_THROWS_WITH(tok.decode(50257), Catch::Contains("50257") && Catch::Contains("out of range"));
    REQUIRE_THROWS_WITH(tok.decode(-1), Catch::Contains("-1") && Catch::Contains("50257 tokens"));
    REQUIRE_THROWS_AS(tok.decode(std::vector<int>{1, 2, 99999}), llmc::Error);
}

TEST_CASE("tokenizer rejects malformed files with a message naming the file", "[tokenizer]") {
    std::string dir = temp_dir();
    const std::vector<std::string> three = {"a", "bc", "\xE2\x82"};  // a partial UTF-8 char is legal

    SECTION("a well-formed small file loads") {
        auto path = write_tokenizer_file(dir + "/ok.bin", 20240328, 2, 3, 1, three);
        llmc::Tokenizer tok(path);
        CHECK(tok.vocab_size() == 3);
        CHECK(tok.eot_token() == 1);
        CHECK(tok.decode(std::vector<int>{1, 0, 2}) == "bca\xE2\x82");
    }
    SECTION("version 1 has no eot field: GPT-2's 50256 is used") {
        std::vector<std::string> tokens(50257, "x");
        auto path = write_tokenizer_file(dir + "/v1.bin", 20240328, 1, 50257, 7, tokens);
        CHECK(llmc::Tokenizer(path).eot_token() == 50256);
    }
    SECTION("wrong magic") {
        auto path = write_tokenizer_file(dir + "/magic.bin", 20240520, 2, 3, 1, three);
        REQUIRE_THROWS_WITH(llmc::Tokenizer(path), Catch::Contains(path) && Catch::Contains("magic") &&
                                                       Catch::Contains("20240520") && Catch::Contains("20240328"));
    }
    SECTION("unsupported version") {
        auto path = write_tokenizer_file(dir + "/version.bin", 20240328, 3, 3, 1, three);
        REQUIRE_THROWS_WITH(llmc::Tokenizer(path), Catch::Contains(path) && Catch::Contains("version 3"));
    }
    SECTION("truncated inside the token table") {
        auto path = write_tokenizer_file(dir + "/cut.bin", 20240328, 2, 3, 1, three, 1024 + 4);
        REQUIRE_THROWS_WITH(llmc::Tokenizer(path), Catch::Contains(path) && Catch::Contains("truncated"));
    }
    SECTION("truncated inside the header") {
        auto path = write_tokenizer_file(dir + "/cut_header.bin", 20240328, 2, 3, 1, three, 100);
        REQUIRE_THROWS_WITH(llmc::Tokenizer(path), Catch::Contains(path) && Catch::Contains("truncated"));
    }
    SECTION("zero-length token") {
        auto path = write_tokenizer_file(dir + "/empty_token.bin", 20240328, 2, 3, 1, {"a", "", "c"});
        REQUIRE_THROWS_WITH(llmc::Tokenizer(path), Catch::Contains(path) && Catch::Contains("token 1 has length 0"));
    }
    SECTION("eot outside the vocabulary") {
        auto path = write_tokenizer_file(dir + "/eot.bin", 20240328, 2, 3, 3, three);
        REQUIRE_THROWS_WITH(llmc::Tokenizer(path), Catch::Contains(path) && Catch::Contains("eot token 3"));
    }
    SECTION("trailing bytes after the declared vocabulary") {
        auto path = write_tokenizer_file(dir + "/extra.bin", 20240328, 2, 2, 1, three);
        REQUIRE_THROWS_WITH(llmc::Tokenizer(path), Catch::Contains(path) && Catch::Contains("follow the 2 tokens"));
    }
    SECTION("missing file") {
        REQUIRE_THROWS_WITH(llmc::Tokenizer(dir + "/nope.bin"), Catch::Contains(dir + "/nope.bin"));
    }
    std::filesystem::remove_all(dir);
}
