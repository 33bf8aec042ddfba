// Tests for llmc/data/dataloader.h. Shards are written into a fresh mkdtemp directory; token i of shard s
// has the value s*1000 + i, so a batch's first input names its shard and window exactly.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <set>
#include <utility>

#include "llmc/data/dataloader.h"

using llmc::DataLoader;
using llmc::DataLoaderState;

namespace {

constexpr int kVocab = 50257;

struct TempDir {
    std::string path;
    TempDir() {
        char name[] = "/tmp/llmc_dataloader_XXXXXX";
        if (!mkdtemp(name)) llmc::fail("mkdtemp failed");
        path = name;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string file(const std::string& name) const { return path + "/" + name; }
};

struct ShardSpec {
    int32_t magic = DataLoader::kShardMagic;
    int32_t version = DataLoader::kShardVersion;
    int64_t header_tokens = -1;  // token count written in the header; -1 = the true count
    int64_t extra_bytes = 0;     // appended after the tokens (negative: cut off the end)
};

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens, ShardSpec spec = {}) {
    int32_t header[256] = {};
    header[0] = spec.magic;
    header[1] = spec.version;
    header[2] = (int32_t)(spec.header_tokens >= 0 ? spec.header_tokens : (int64_t)tokens.size());
    std::string bytes((const char*)header, sizeof(header));
    bytes.append((const char*)tokens.data(), tokens.size() * 2);
    if (spec.extra_bytes >= 0) bytes.append(spec.extra_bytes, '\0');
    else bytes.resize(bytes.size() + spec.extra_bytes);
    llmc::File f(path, "wb");
    f.write(bytes.data(), bytes.size());
    f.close();
}

std::vector<uint16_t> shard_tokens(int shard, int64_t count) {
    std::vector<uint16_t> tokens(count);
    for (int64_t i = 0; i < count; i++) tokens[i] = (uint16_t)(shard * 1000 + i);
    return tokens;
}

// Three shards of awkward sizes (none a whole number of windows), written as s0.bin, s1.bin, s2.bin.
constexpr int kB = 2, kT = 4, kBT = kB * kT;
const int64_t kShardTokens[3] = {kBT * 13 + 1, kBT * 7 + 5, kBT * 20 + 3};

void write_three_shards(const TempDir& dir) {
    for (int s = 0; s < 3; s++) write_shard(dir.file(llmc::strformat("s%d.bin", s)), shard_tokens(s, kShardTokens[s]));
}

// A window is named by (shard, window index), recovered from the batch's first input token.
using Window = std::pair<int, int>;
Window window_of(const DataLoader& loader) {
    int first = loader.inputs()[0];
    return {first / 1000, (first % 1000) / kBT};
}

std::vector<int> batch_of(const DataLoader& loader) {
    std::vector<int> batch(loader.inputs(), loader.inputs() + kBT);
    batch.insert(batch.end(), loader.targets(), loader.targets() + kBT);
    return batch;
}

std::vector<std::vector<int>> read_batches(DataLoader& loader, size_t count) {
    std::vector<std::vector<int>> batches;
    for (size_t i = 0; i < count; i++) {
        loader.next_batch();
        batches.push_back(batch_of(loader));
    }
    return batches;
}

}  // namespace

TEST_CASE("dataloader: targets are inputs shifted by one, windows at stride B*T", "[dataloader]") {
    TempDir dir;
    write_shard(dir.file("a.bin"), shard_tokens(0, kBT * 5 + 1));
    DataLoader loader(dir.file("*.bin"), kB, kT, 0, 1, kVocab, false, 0);
    REQUIRE(loader.batches_per_epoch() == 5);
    REQUIRE(loader.num_tokens_total() == kBT * 5 + 1);
    for (int w = 0; w < 5; w++) {
        loader.next_batch();
        for (int i = 0; i < kBT; i++) {
            REQUIRE(loader.inputs()[i] == w * kBT + i);
            REQUIRE(loader.targets()[i] == w * kBT + i + 1);
        }
    }
}

TEST_CASE("dataloader: ranks read disjoint windows of one round and together cover every used window",
          "[dataloader]") {
    TempDir dir;
    write_three_shards(dir);
    for (bool shuffle : {false, true}) {
        for (int world_size = 1; world_size <= 4; world_size++) {
            // Independently computed: shard s has (tokens-1)/BT whole windows, whole rounds of them are used.
            std::set<Window> expected;
            size_t rounds_total = 0;
            for (int s = 0; s < 3; s++) {
                int rounds = (int)((kShardTokens[s] - 1) / kBT) / world_size;
                rounds_total += rounds;
                for (int w = 0; w < rounds * world_size; w++) expected.insert({s, w});
            }
            std::vector<std::unique_ptr<DataLoader>> ranks;
            for (int r = 0; r < world_size; r++)
                ranks.push_back(std::make_unique<DataLoader>(dir.file("s*.bin"), kB, kT, r, world_size, kVocab,
                                                             shuffle, 7));
            for (auto& loader : ranks) REQUIRE(loader->batches_per_epoch() == rounds_total);

            std::set<Window> seen;
            for (size_t step = 0; step < rounds_total; step++) {
                std::set<Window> this_step;
                for (int r = 0; r < world_size; r++) {
                    ranks[r]->next_batch();
                    Window w = window_of(*ranks[r]);
                    CAPTURE(shuffle, world_size, step, r, w.first, w.second);
                    REQUIRE(w.second % world_size == r);  // rank r reads slot r of its round
                    REQUIRE(w.second / world_size == window_of(*ranks[0]).second / world_size);
                    REQUIRE(w.first == window_of(*ranks[0]).first);
                    REQUIRE(this_step.insert(w).second);
                    REQUIRE(seen.insert(w).second);  // no window twice in an epoch
                }
            }
            REQUIRE(seen == expected);
            for (auto& loader : ranks) REQUIRE(loader->epoch() == 1);
        }
    }
}

TEST_CASE("dataloader: shuffle is a pure function of the seed; no shuffle is sequential", "[dataloader]") {
    TempDir dir;
    write_three_shards(dir);
    auto make = [&](bool shuffle, uint64_t seed) {
        return DataLoader(dir.file("s*.bin"), kB, kT, 1, 2, kVocab, shuffle, seed);
    };
    DataLoader a = make(true, 42), b = make(true, 42), c = make(true, 43);
    size_t n = a.batches_per_epoch();
    auto seq_a = read_batches(a, 2 * n);
    REQUIRE(seq_a == read_batches(b, 2 * n));
    REQUIRE(seq_a != read_batches(c, 2 * n));
    // Each epoch is a fresh permutation of the same windows.
    std::vector<std::vector<int>> epoch0(seq_a.begin(), seq_a.begin() + n), epoch1(seq_a.begin() + n, seq_a.end());
    REQUIRE(epoch0 != epoch1);
    REQUIRE(std::multiset<std::vector<int>>(epoch0.begin(), epoch0.end()) ==
            std::multiset<std::vector<int>>(epoch1.begin(), epoch1.end()));

    DataLoader seq = make(false, 42);
    std::vector<Window> expected;
    for (int s = 0; s < 3; s++) {
        int rounds = (int)((kShardTokens[s] - 1) / kBT) / 2;
        for (int r = 0; r < rounds; r++) expected.push_back({s, r * 2 + 1});
    }
    REQUIRE(expected.size() == n);
    for (int epoch = 0; epoch < 2; epoch++) {
        for (const Window& w : expected) {
            seq.next_batch();
            REQUIRE(window_of(seq) == w);
        }
    }
    REQUIRE(make(false, 1).batches_per_epoch() == n);
    DataLoader other_seed = make(false, 99);
    REQUIRE(read_batches(other_seed, n) == read_batches(seq, n));  // the seed is ignored without shuffle
}

TEST_CASE("dataloader: epochs wrap and reset returns to the start", "[dataloader]") {
    TempDir dir;
    write_three_shards(dir);
    for (bool shuffle : {false, true}) {
        DataLoader loader(dir.file("s*.bin"), kB, kT, 0, 1, kVocab, shuffle, 5);
        size_t n = loader.batches_per_epoch();
        auto first = read_batches(loader, 1);
        read_batches(loader, n - 2);
        REQUIRE(loader.epoch() == 0);
        loader.next_batch();
        REQUIRE(loader.epoch() == 1);
        REQUIRE(loader.state() == DataLoaderState{1, 0, 0});
        auto after_wrap = read_batches(loader, 1);
        if (!shuffle) REQUIRE(after_wrap == first);
        loader.reset();
        REQUIRE(loader.epoch() == 0);
        REQUIRE(read_batches(loader, 1) == first);
    }
}

TEST_CASE("dataloader: skip_batch moves to the next batch as next_batch does, without reading", "[dataloader]") {
    TempDir dir;
    write_three_shards(dir);
    DataLoader reader(dir.file("s*.bin"), kB, kT, 0, 1, kVocab, true, 3);
    DataLoader skipper(dir.file("s*.bin"), kB, kT, 0, 1, kVocab, true, 3);
    for (size_t k = 0; k < 2 * reader.batches_per_epoch() + 1; k++) {
        const std::vector<int> held = batch_of(skipper);
        reader.next_batch();
        skipper.skip_batch();
        REQUIRE(skipper.state() == reader.state());
        REQUIRE(batch_of(skipper) == held);
    }
}

TEST_CASE("dataloader: a restored state continues exactly, across epochs and through JSON", "[dataloader]") {
    TempDir dir;
    write_three_shards(dir);
    auto make = [&]() { return DataLoader(dir.file("s*.bin"), kB, kT, 1, 2, kVocab, true, 11); };
    DataLoader original = make();
    size_t n = original.batches_per_epoch();
    for (size_t k : {size_t{0}, size_t{3}, n - 1, n, n + 4, 2 * n + 1}) {
        original.reset();
        read_batches(original, k);
        DataLoaderState state = original.state();
        nlohmann::json j = state;
        DataLoaderState parsed = nlohmann::json::parse(j.dump()).get<DataLoaderState>();
        REQUIRE(parsed == state);
        DataLoader restored = make();
        restored.restore(parsed);
        CAPTURE(k);
        REQUIRE(restored.epoch() == original.epoch());
        REQUIRE(read_batches(restored, n + 2) == read_batches(original, n + 2));
        REQUIRE(restored.state() == original.state());
    }
}

TEST_CASE("dataloader: bad inputs are errors naming the file and what was expected", "[dataloader]") {
    using Catch::Contains;
    TempDir dir;
    auto open = [&](const std::string& pattern, int world_size = 1, int vocab = kVocab) {
        return DataLoader(pattern, kB, kT, 0, world_size, vocab, false, 0);
    };
    const int64_t ok_tokens = kBT * 3 + 1;

    SECTION("no file matches the glob") {
        REQUIRE_THROWS_WITH(open(dir.file("nothing*.bin")), Contains("no files match") && Contains("nothing*.bin"));
    }
    SECTION("wrong magic") {
        ShardSpec spec;
        spec.magic = 1234;
        write_shard(dir.file("m.bin"), shard_tokens(0, ok_tokens), spec);
        REQUIRE_THROWS_WITH(open(dir.file("m.bin")),
                            Contains("m.bin") && Contains("magic number 1234") && Contains("expected 20240520"));
    }
    SECTION("wrong version") {
        ShardSpec spec;
        spec.version = 7;
        write_shard(dir.file("v.bin"), shard_tokens(0, ok_tokens), spec);
        REQUIRE_THROWS_WITH(open(dir.file("v.bin")), Contains("v.bin") && Contains("version 7") && Contains("expected 1"));
    }
    SECTION("truncated token data") {
        ShardSpec spec;
        spec.extra_bytes = -6;
        write_shard(dir.file("t.bin"), shard_tokens(0, ok_tokens), spec);
        int64_t end = 1024 + 2 * ok_tokens - 6;
        REQUIRE_THROWS_WITH(open(dir.file("t.bin")), Contains("t.bin") && Contains("truncated") &&
                                                          Contains("byte offset " + std::to_string(end)));
    }
    SECTION("truncated header") {
        llmc::File f(dir.file("h.bin"), "wb");
        f.write("abc", 3);
        f.close();
        REQUIRE_THROWS_WITH(open(dir.file("h.bin")), Contains("h.bin") && Contains("truncated"));
    }
    SECTION("bytes past the promised tokens") {
        ShardSpec spec;
        spec.extra_bytes = 2;
        write_shard(dir.file("x.bin"), shard_tokens(0, ok_tokens), spec);
        int64_t want = 1024 + 2 * ok_tokens;
        REQUIRE_THROWS_WITH(open(dir.file("x.bin")), Contains("x.bin") && Contains(std::to_string(want + 2) + " bytes") &&
                                                          Contains("expected exactly " + std::to_string(want)));
    }
    SECTION("too few tokens for one round") {
        write_shard(dir.file("a.bin"), shard_tokens(0, ok_tokens));
        write_shard(dir.file("b.bin"), shard_tokens(1, kBT * 2));  // 2*BT+1 needed for world_size 2
        REQUIRE_NOTHROW(open(dir.file("a.bin"), 2));
        REQUIRE_THROWS_WITH(open(dir.file("*.bin"), 2),
                            Contains("b.bin") && Contains("has 16 tokens") && Contains("at least 17 tokens"));
    }
    SECTION("token id >= vocab size, found when its window is read") {
        std::vector<uint16_t> tokens(ok_tokens, 5);
        tokens[kBT + 3] = 600;  // window 1, so the first batch reads fine
        write_shard(dir.file("bad.bin"), tokens);
        DataLoader loader = open(dir.file("bad.bin"), 1, 512);
        REQUIRE_NOTHROW(loader.next_batch());
        int64_t offset = 1024 + 2 * (kBT + 3);
        REQUIRE_THROWS_WITH(loader.next_batch(), Contains("bad.bin") && Contains("byte offset " + std::to_string(offset)) &&
                                                     Contains("600") && Contains("vocab_size 512"));
    }
    SECTION("bad rank") {
        write_shard(dir.file("a.bin"), shard_tokens(0, ok_tokens));
        REQUIRE_THROWS_WITH(DataLoader(dir.file("a.bin"), kB, kT, 2, 2, kVocab, false, 0),
                            Contains("rank 2") && Contains("world_size=2"));
    }
    SECTION("bad restore state") {
        write_three_shards(dir);
        DataLoader loader = open(dir.file("s*.bin"));
        REQUIRE_THROWS_WITH(loader.restore({0, 3, 0}), Contains("shard_index 3") && Contains("3 shards"));
        // Unshuffled, position 1 is s1.bin with (7*8+5-1)/8 = 7 rounds.
        REQUIRE_THROWS_WITH(loader.restore({2, 1, 7}),
                            Contains("round_index 7") && Contains("s1.bin") && Contains("has 7 rounds"));
        REQUIRE_THROWS_WITH(loader.restore({-1, 0, 0}), Contains("epoch -1"));
        REQUIRE_NOTHROW(loader.restore({2, 1, 6}));
        REQUIRE_THROWS_WITH(nlohmann::json::parse(R"({"epoch": 0, "shard_index": 1})").get<DataLoaderState>(),
                            Contains("missing field \"round_index\""));
        REQUIRE_THROWS_WITH(
            nlohmann::json::parse(R"({"epoch": -2, "shard_index": 1, "round_index": 0})").get<DataLoaderState>(),
            Contains("\"epoch\" is -2"));
    }
}

TEST_CASE("dataloader: each step's global batch depends on W = ranks x accumulation, not on the split",
          "[dataloader]") {
    TempDir dir;
    write_three_shards(dir);
    constexpr int W = 6;  // windows per optimizer step
    // The windows every rank reads in each of `steps` steps, as a set per step.
    auto global_batches = [&](int world_size, bool shuffle, int steps, const DataLoaderState* start = nullptr) {
        const int accumulation = W / world_size;
        std::vector<std::unique_ptr<DataLoader>> ranks;
        for (int r = 0; r < world_size; r++) {
            ranks.push_back(std::make_unique<DataLoader>(dir.file("s*.bin"), kB, kT, r, world_size, kVocab, shuffle,
                                                         3, accumulation));
            if (start) ranks.back()->restore(*start);
        }
        std::vector<std::multiset<Window>> out;
        for (int s = 0; s < steps; s++) {
            std::multiset<Window> windows;
            for (auto& loader : ranks)
                for (int a = 0; a < accumulation; a++) {
                    loader->next_batch();
                    windows.insert(window_of(*loader));
                }
            REQUIRE(windows.size() == (size_t)W);
            out.push_back(windows);
            for (auto& loader : ranks) REQUIRE(loader->state() == ranks[0]->state());
        }
        return out;
    };
    for (bool shuffle : {false, true}) {
        CAPTURE(shuffle);
        // 40 windows in all hold 6 whole rounds (2 + 1 + 3), so 20 steps run past two epochs.
        auto reference = global_batches(1, shuffle, 20);
        std::set<Window> distinct;
        for (auto& step : reference) distinct.insert(step.begin(), step.end());
        REQUIRE(distinct.size() == 36);  // every window of the 6 rounds, none twice within a step
        for (int world_size : {2, 3, 6}) {
            CAPTURE(world_size);
            REQUIRE(global_batches(world_size, shuffle, 20) == reference);
        }
        // A position saved between steps on 3 ranks continues on 2 with the same batches.
        DataLoader three(dir.file("s*.bin"), kB, kT, 0, 3, kVocab, shuffle, 3, 2);
        read_batches(three, 2 * 7);
        DataLoaderState after7 = three.state();
        REQUIRE(after7.batch_in_round == 0);
        auto resumed = global_batches(2, shuffle, 13, &after7);
        REQUIRE(resumed == std::vector<std::multiset<Window>>(reference.begin() + 7, reference.end()));
    }
}

TEST_CASE("dataloader: a position inside a round is restored too", "[dataloader]") {
    TempDir dir;
    write_three_shards(dir);
    DataLoader a(dir.file("s*.bin"), kB, kT, 1, 2, kVocab, true, 5, 3);
    read_batches(a, 4);
    REQUIRE(a.state().batch_in_round == 1);
    DataLoader b(dir.file("s*.bin"), kB, kT, 1, 2, kVocab, true, 5, 3);
    b.restore(a.state());
    REQUIRE(read_batches(a, 10) == read_batches(b, 10));
    DataLoaderState bad = a.state();
    bad.batch_in_round = 3;
    REQUIRE_THROWS_WITH(b.restore(bad), Catch::Contains("batch_in_round 3 is out of range"));
}
