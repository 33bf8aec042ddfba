// dataloader.h: DataLoader, which streams B x T token batches from llm.c token shards.
//
// Shard format: int32[256] header ([0] = magic 20240520, [1] = version 1, [2] = token count), then
// that many uint16 tokens. Each shard is cut into windows of B*T+1 tokens at stride B*T (inputs are
// window[0, B*T), targets window[1, B*T]). Consecutive runs of W windows form a "round": the windows
// of one global batch, W = world_size x batches_per_round (for training: the data-parallel ranks x
// the gradient-accumulation steps, so one round is one optimizer step). A rank's k-th batch of a
// round is window k * world_size + rank. The one idea: a position is just (epoch, shard, round,
// batch within the round), and every order (shards in an epoch, rounds in a shard) is a pure
// function of (seed, epoch, shard), so all ranks agree on which round a step reads without talking,
// and a checkpoint needs only those numbers to resume exactly. Which windows a round holds depends
// on W, never on how it is split among ranks, so a run resumed on another number of ranks (with the
// accumulation keeping W) reads the same global batches in the same order.
#pragma once

#include <glob.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/data/llmc_header.h"
#include "llmc/numerics/rng.h"
#include "llmc/utils.h"

namespace llmc {

// Where the next batch comes from: shard_index is the position in the epoch's shard order,
// round_index the position in that shard's round order, batch_in_round this rank's next batch of
// the round (0 between optimizer steps).
struct DataLoaderState {
    int epoch = 0;
    size_t shard_index = 0;
    size_t round_index = 0;
    size_t batch_in_round = 0;
    bool operator==(const DataLoaderState&) const = default;
};

inline void to_json(nlohmann::json& j, const DataLoaderState& s) {
    j = nlohmann::json{{"epoch", s.epoch}, {"shard_index", s.shard_index}, {"round_index", s.round_index},
                       {"batch_in_round", s.batch_in_round}};
}

inline void from_json(const nlohmann::json& j, DataLoaderState& s) {
    if (!j.is_object()) fail("dataloader state: expected a JSON object, found " + j.dump());
    auto field = [&](const char* name, int64_t max_value) -> int64_t {
        if (!j.contains(name)) fail(strformat("dataloader state %s: missing field \"%s\"", j.dump().c_str(), name));
        const nlohmann::json& v = j.at(name);
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > max_value)
            fail(strformat("dataloader state: field \"%s\" is %s; expected an integer in [0, %lld]", name,
                           v.dump().c_str(), (long long)max_value));
        return v.get<int64_t>();
    };
    s.epoch = (int)field("epoch", INT32_MAX);
    s.shard_index = (size_t)field("shard_index", INT64_MAX);
    s.round_index = (size_t)field("round_index", INT64_MAX);
    s.batch_in_round = (size_t)field("batch_in_round", INT64_MAX);
}

class DataLoader {
public:
    static constexpr int32_t kShardMagic = TOKEN_SHARD_MAGIC;
    static constexpr int32_t kShardVersion = 1;

    // batches_per_round: how many batches each rank reads from one round (the gradient-accumulation
    // steps), so a round is world_size x batches_per_round windows.
    DataLoader(const std::string& glob_pattern, int B, int T, int rank, int world_size, int vocab_size,
               bool shuffle, uint64_t seed, int batches_per_round = 1)
        : tokens_per_batch_((int64_t)B * T), rank_(rank), world_size_(world_size),
          batches_per_round_(batches_per_round), vocab_size_(vocab_size), shuffle_(shuffle), seed_(seed) {
        if (B <= 0 || T <= 0) fail(strformat("dataloader: B=%d and T=%d must both be positive", B, T));
        if (world_size <= 0 || rank < 0 || rank >= world_size)
            fail(strformat("dataloader: rank %d is not in [0, world_size=%d)", rank, world_size));
        if (batches_per_round < 1)
            fail(strformat("dataloader: batches_per_round must be >= 1, got %d", batches_per_round));
        if (vocab_size <= 0) fail(strformat("dataloader: vocab_size %d must be positive", vocab_size));
        for (const std::string& path : glob_sorted(glob_pattern)) shards_.push_back(open_shard(path));
        for (const Shard& s : shards_) {
            num_tokens_total_ += s.num_tokens;
            rounds_per_epoch_ += s.num_rounds;
        }
        window_tokens_.resize(tokens_per_batch_ + 1);
        inputs_.assign(tokens_per_batch_, 0);
        targets_.assign(tokens_per_batch_, 0);
        reset();
    }

    // Reads the batch at state() into inputs()/targets() and moves state() to the following batch,
    // wrapping into the next epoch after the last batch of this one.
    void next_batch() {
        const Shard& shard = shards_[shard_order_[pos_.shard_index]];
        size_t round = round_order_[pos_.round_index];
        size_t window = round * windows_per_round() + pos_.batch_in_round * world_size_ + rank_;
        read_window(shard, (int64_t)window * tokens_per_batch_);
        for (int64_t i = 0; i < tokens_per_batch_; i++) {
            inputs_[i] = window_tokens_[i];
            targets_[i] = window_tokens_[i + 1];
        }
        skip_batch();
    }

    // Moves state() to the following batch without reading the one at state().
    void skip_batch() {
        const Shard& shard = shards_[shard_order_[pos_.shard_index]];
        DataLoaderState next = pos_;
        if (++next.batch_in_round < (size_t)batches_per_round_) {
            move_to(next);
            return;
        }
        next.batch_in_round = 0;
        if (++next.round_index == shard.num_rounds) {
            next.round_index = 0;
            if (++next.shard_index == shards_.size()) {
                next.shard_index = 0;
                next.epoch++;
            }
        }
        move_to(next);
    }

    // B*T token ids each, row-major (b, t); targets[i] is the token after inputs[i].
    const int* inputs() const { return inputs_.data(); }
    const int* targets() const { return targets_.data(); }

    void reset() { move_to(DataLoaderState{}); }
    // Every rank has the same count: each round of a shard gives every rank batches_per_round batches.
    size_t batches_per_epoch() const { return rounds_per_epoch_ * batches_per_round_; }
    size_t windows_per_round() const { return (size_t)world_size_ * batches_per_round_; }
    // The epoch the next batch comes from, i.e. how many whole epochs have been consumed.
    int epoch() const { return pos_.epoch; }
    // Tokens in all shards, per their headers (all ranks' data, including windows left unused).
    size_t num_tokens_total() const { return num_tokens_total_; }
    size_t num_shards() const { return shards_.size(); }

    DataLoaderState state() const { return pos_; }
    void restore(const DataLoaderState& s) {
        if (s.epoch < 0) fail(strformat("dataloader restore: epoch %d is negative", s.epoch));
        if (s.shard_index >= shards_.size())
            fail(strformat("dataloader restore: shard_index %zu is out of range; this loader has %zu shards",
                           s.shard_index, shards_.size()));
        size_t shard = shard_order_for(s.epoch)[s.shard_index];
        if (s.round_index >= shards_[shard].num_rounds)
            fail(strformat("dataloader restore: round_index %zu is out of range; shard '%s' (position %zu of "
                           "epoch %d) has %zu rounds",
                           s.round_index, shards_[shard].path.c_str(), s.shard_index, s.epoch,
                           shards_[shard].num_rounds));
        if (s.batch_in_round >= (size_t)batches_per_round_)
            fail(strformat("dataloader restore: batch_in_round %zu is out of range; a round gives each rank %d batch(es)",
                           s.batch_in_round, batches_per_round_));
        move_to(s);
    }

private:
    struct Shard {
        std::string path;
        int64_t num_tokens;
        size_t num_rounds;  // rounds of windows_per_round() windows that fit whole
    };

    static std::vector<std::string> glob_sorted(const std::string& pattern) {
        glob_t g{};
        int rc = glob(pattern.c_str(), 0, nullptr, &g);  // flags 0: results come sorted
        std::vector<std::string> paths;
        if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
        globfree(&g);
        if (rc == GLOB_NOMATCH) fail(strformat("dataloader: no files match '%s'", pattern.c_str()));
        if (rc != 0) fail(strformat("dataloader: glob('%s') failed (error %d)", pattern.c_str(), rc));
        return paths;
    }

    Shard open_shard(const std::string& path) const {
        File f(path, "rb");
        int64_t file_bytes = f.size();
        const LlmcHeader header = read_llmc_header(f, kShardMagic);
        if (header[1] != kShardVersion) fail_llmc_version(f, kShardMagic, header[1], "1");
        int64_t num_tokens = header[2];
        if (num_tokens < 0)
            fail(strformat("'%s': negative token count %lld in shard header (byte offset 8)", path.c_str(),
                           (long long)num_tokens));
        int64_t expected_bytes = LLMC_HEADER_BYTES + 2 * num_tokens;
        if (file_bytes < expected_bytes)
            fail(strformat("'%s' is truncated: its header promises %lld tokens (%lld bytes in all), but the data "
                           "ends at byte offset %lld",
                           path.c_str(), (long long)num_tokens, (long long)expected_bytes, (long long)file_bytes));
        if (file_bytes > expected_bytes)
            fail(strformat("'%s' has %lld bytes; its header promises %lld tokens, so expected exactly %lld bytes",
                           path.c_str(), (long long)file_bytes, (long long)num_tokens, (long long)expected_bytes));
        // Window w spans tokens [w*B*T, (w+1)*B*T]; one round needs windows_per_round() of them.
        int64_t tokens_needed = (int64_t)windows_per_round() * tokens_per_batch_ + 1;
        if (num_tokens < tokens_needed)
            fail(strformat("'%s' has %lld tokens, too few for one round of windows: B*T=%lld with world_size %d x "
                           "%d batch(es) per round needs at least %lld tokens",
                           path.c_str(), (long long)num_tokens, (long long)tokens_per_batch_, world_size_,
                           batches_per_round_, (long long)tokens_needed));
        size_t num_windows = (size_t)((num_tokens - 1) / tokens_per_batch_);
        return Shard{path, num_tokens, num_windows / windows_per_round()};
    }

    // splitmix64's finalizer: a bijection that scatters nearby inputs (epoch 0, 1, 2...) far apart.
    static uint64_t mix(uint64_t x) {
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        return x ^ (x >> 31);
    }
    // Stream 0 orders the shards of an epoch; stream 1 + s orders the rounds of shard s (glob index).
    uint64_t order_seed(int epoch, uint64_t stream) const {
        return mix(mix(mix(seed_) + (uint64_t)epoch) + stream);
    }

    std::vector<size_t> shard_order_for(int epoch) const {
        std::vector<size_t> order(shards_.size());
        std::iota(order.begin(), order.end(), size_t{0});
        if (shuffle_) {
            Rng rng(order_seed(epoch, 0));
            shuffle(order.data(), order.size(), rng);
        }
        return order;
    }

    std::vector<size_t> round_order_for(int epoch, size_t shard) const {
        std::vector<size_t> order(shards_[shard].num_rounds);
        std::iota(order.begin(), order.end(), size_t{0});
        if (shuffle_) {
            Rng rng(order_seed(epoch, 1 + (uint64_t)shard));
            shuffle(order.data(), order.size(), rng);
        }
        return order;
    }

    // The orders are caches of pure functions of pos_; recompute only what the move changes.
    void move_to(const DataLoaderState& next) {
        bool new_epoch = shard_order_.empty() || next.epoch != pos_.epoch;
        if (new_epoch) shard_order_ = shard_order_for(next.epoch);
        if (new_epoch || next.shard_index != pos_.shard_index || round_order_.empty()) {
            size_t shard = shard_order_[next.shard_index];
            round_order_ = round_order_for(next.epoch, shard);
            if (!file_ || file_->path() != shards_[shard].path) file_ = std::make_unique<File>(shards_[shard].path, "rb");
        }
        pos_ = next;
    }

    // Reads B*T+1 tokens starting at token `first_token` of the shard and checks each id.
    void read_window(const Shard& shard, int64_t first_token) {
        int64_t first_byte = LLMC_HEADER_BYTES + 2 * first_token;
        file_->seek(first_byte);
        file_->read(window_tokens_.data(), window_tokens_.size(), "tokens");
        for (size_t i = 0; i < window_tokens_.size(); i++)
            if (window_tokens_[i] >= vocab_size_)
                fail(strformat("'%s': token id %u at byte offset %lld is out of range; expected < vocab_size %d",
                               shard.path.c_str(), (unsigned)window_tokens_[i],
                               (long long)(first_byte + 2 * (int64_t)i), vocab_size_));
    }

    int64_t tokens_per_batch_;
    int rank_, world_size_, batches_per_round_, vocab_size_;
    bool shuffle_;
    uint64_t seed_;
    std::vector<Shard> shards_;
    size_t num_tokens_total_ = 0;
    size_t rounds_per_epoch_ = 0;

    DataLoaderState pos_;
    std::vector<size_t> shard_order_;  // shard_order_for(pos_.epoch)
    std::vector<size_t> round_order_;  // round_order_for(pos_.epoch, shard_order_[pos_.shard_index])
    std::unique_ptr<File> file_;       // the shard being read
    std::vector<uint16_t> window_tokens_;
    std::vector<int> inputs_, targets_;
};

}  // namespace llmc
