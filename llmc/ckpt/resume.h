// ckpt/resume.h: finding the newest usable checkpoint (every rank checks a share, the ranks agree),
// refusing one this run cannot continue exactly, and restoring the model's state from it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/ckpt/files.h"
#include "llmc/ckpt/manifest.h"
#include "llmc/ckpt/reader.h"
#include "llmc/ckpt/shard_state.h"
#include "llmc/ckpt/tiers.h"
#include "llmc/config.h"
#include "llmc/dist/comm.h"
#include "llmc/utils.h"

namespace llmc {

struct ResumePoint {
    std::string dir;  // the shared directory, or rank 0's node directory of the local tier
    Manifest manifest;
    CheckpointTier tier;  // which tier it is on (the shared one: only name and root are set)
    // The local tier: for every rank, whether its own file is in its node's directory (else only
    // its replica on the next node is left, and it is fetched from there).
    std::vector<char> own_file;
};

namespace detail {

// Why a directory's marker and manifest cannot be used ("" if they can); *out and *text get the
// manifest. The directory's name, the marker and the manifest must agree on the step, and the
// manifest must be of this run (run_id; "" before run identities, accepted).
inline std::string manifest_problem(const std::string& dir, const std::string& run_id, Manifest* out,
                                    std::string* text) {
    try {
        const std::string marker_path = dir + "/" + CHECKPOINT_MARKER;
        if (!std::filesystem::exists(marker_path))
            return strformat("no completion marker '%s' (the write did not finish)", marker_path.c_str());
        nlohmann::json marker;
        try {
            marker = nlohmann::json::parse(read_text_file(marker_path));
        } catch (const nlohmann::json::exception& e) {
            return strformat("the marker '%s' is not valid JSON: %s", marker_path.c_str(), e.what());
        }
        const std::string manifest_path = dir + "/" + CHECKPOINT_MANIFEST;
        *text = read_text_file(manifest_path);
        const uint32_t crc = crc32c(0, text->data(), text->size());
        if (!marker.contains("manifest_crc32c") || !marker["manifest_crc32c"].is_number_unsigned() ||
            marker["manifest_crc32c"].get<uint64_t>() != crc)
            return strformat("'%s' has CRC32C %u; the marker expects %s", manifest_path.c_str(), crc,
                             marker.value("manifest_crc32c", nlohmann::json()).dump().c_str());
        *out = parse_manifest(*text, strformat("manifest '%s'", manifest_path.c_str()));
        const int named = checkpoint_step_of(std::filesystem::path(dir).filename().string());
        const nlohmann::json marked = marker.value("step", nlohmann::json());
        if (!marked.is_number_integer() || marked.get<int64_t>() != named || out->step != named)
            return strformat("'%s' is named for step %d, but its marker says step %s and its manifest step %d",
                             dir.c_str(), named, marked.dump().c_str(), out->step);
        if (!out->run_id.empty() && !run_id.empty() && out->run_id != run_id)
            return strformat("'%s' was written by run %s; this is run %s (ckpt/output_dir.h)", dir.c_str(),
                             out->run_id.c_str(), run_id.c_str());
        for (size_t i = 0; i < out->files.size(); i++)
            if (out->files[i].rank != (int)i)
                return strformat("manifest '%s': files[%zu] is rank %d's; expected the files in rank order",
                                 manifest_path.c_str(), i, out->files[i].rank);
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

// Why a rank file cannot be used ("" if it can): missing, or its size or CRC32C is not the manifest's.
inline std::string file_problem(const std::string& dir, const ManifestFile& f) {
    try {
        const std::string path = dir + "/" + f.path;
        if (!std::filesystem::exists(path)) return strformat("'%s' is missing", path.c_str());
        uint64_t size = 0;
        const uint32_t crc = crc32c_of_file(path, &size);
        if (size != f.bytes)
            return strformat("'%s' has %llu bytes; the manifest expects %llu (truncated?)", path.c_str(),
                             (unsigned long long)size, (unsigned long long)f.bytes);
        if (crc != f.crc32c)
            return strformat("'%s' has CRC32C %u; the manifest expects %u (corrupt)", path.c_str(), crc, f.crc32c);
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

// Joins the distinct non-empty problems the ranks reported.
inline std::string joined_problems(const std::vector<std::string>& all) {
    std::string problems;
    for (const std::string& p : all)
        if (!p.empty() && problems.find(p) == std::string::npos) problems += (problems.empty() ? "" : "; ") + p;
    return problems;
}

// A shared-tier directory, checked by every rank: the marker and manifest, and the files with
// index = rank (mod world). Collective.
inline std::optional<ResumePoint> check_shared_checkpoint(const std::string& dir, const CheckpointTier& tier,
                                                          const std::string& run_id, Communicator& world,
                                                          std::string* problems) {
    ResumePoint point{dir, {}, tier, {}};
    std::string text;
    std::string mine = manifest_problem(dir, run_id, &point.manifest, &text);
    for (size_t i = world.rank(); mine.empty() && i < point.manifest.files.size(); i += world.world_size())
        mine = file_problem(dir, point.manifest.files[i]);
    *problems = joined_problems(all_gather_strings(world, mine));
    if (!problems->empty()) return std::nullopt;
    return point;
}

// A local-tier checkpoint: every rank checks its node's directory: the marker and manifest, its
// own file, and the replica it keeps of the previous node's rank. Usable when every rank's file
// is somewhere: its own copy, or its replica on the next node, and when it was written on the same
// mesh: each rank restores from its own file, which holds its own piece of the model. Collective.
inline std::optional<ResumePoint> check_local_checkpoint(int step, const CheckpointTier& tier, Communicator& world,
                                                         const RunConfig& cfg, std::string* problems) {
    const int rank = world.rank(), W = world.world_size(), rpn = tier.ranks_per_node;
    const std::string dir = tier.dir(step, rank);
    Manifest m;
    std::string text, why = manifest_problem(dir, cfg.run_id, &m, &text);
    bool own = false, replica = false;
    if (why.empty() && m.world_size != W)
        why = strformat("'%s' was written by %d rank(s) and this run has %d (the local tier resumes on the same "
                        "ranks; the shared tier on any)", dir.c_str(), m.world_size, W);
    const std::string layers = cfg.dims.pp > 1 ? pipeline_split(cfg).describe() : "";
    if (why.empty() && (m.tp != cfg.dims.tp || m.pp != cfg.dims.pp || m.pp_layers != layers || m.ep != cfg.dims.ep)) {
        auto ep = [&](int n) { return m.ep > 1 || cfg.dims.ep > 1 ? strformat(", ep %d", n) : std::string(); };
        why = strformat("'%s' was written at tp %d, pp %d (layers %s)%s and this run is tp %d, pp %d (layers %s)%s: the "
                        "local tier resumes on the same mesh, the shared tier on any", dir.c_str(), m.tp, m.pp,
                        m.pp_layers.empty() ? "-" : m.pp_layers.c_str(), ep(m.ep).c_str(), cfg.dims.tp, cfg.dims.pp,
                        layers.empty() ? "-" : layers.c_str(), ep(cfg.dims.ep).c_str());
    }
    if (why.empty()) {
        why = file_problem(dir, m.files[rank]);
        own = why.empty();
        if (W > rpn) replica = file_problem(dir, m.files[(rank - rpn + W) % W]).empty();
    }
    const nlohmann::json status{{"own", own}, {"replica", replica}, {"why", why}};
    std::vector<nlohmann::json> all;
    for (const std::string& s : all_gather_strings(world, status.dump())) all.push_back(nlohmann::json::parse(s));
    std::vector<std::string> missing;
    int source = -1;  // a rank whose node directory has a good manifest
    ResumePoint point{tier.dir(step, 0), {}, tier, std::vector<char>(W, 0)};
    for (int j = 0; j < W; j++) {
        point.own_file[j] = all[j]["own"].get<bool>();
        if (point.own_file[j] && source < 0) source = j;
        const bool replicated = W > rpn && all[(j + rpn) % W]["replica"].get<bool>();
        if (!point.own_file[j] && !replicated)
            missing.push_back(strformat("rank %d: %s%s", j, all[j]["why"].get<std::string>().c_str(),
                                        W > rpn ? ", and no replica on the next node" : ""));
    }
    *problems = joined_problems(missing);
    if (!problems->empty()) return std::nullopt;
    text = all_gather_strings(world, rank == source ? text : "")[source];
    point.manifest = parse_manifest(text, strformat("the manifest of local checkpoint step %d", step));
    return point;
}

}  // namespace detail

// The newest usable checkpoint. Under --resume-from DIR: DIR, or else the newest complete one
// before it in DIR's parent. Otherwise the newest of output_dir's checkpoints and, with
// --local-ckpt-every, the local tier's (the local one first at the same step: it is the quicker
// read). Collective over `world`: every rank gets the same answer. Every checkpoint skipped is
// reported (rank 0 prints why). at_most_step: none after this step (an in-process rollback to a
// state known to be good).
inline std::optional<ResumePoint> find_resume_checkpoint(const RunConfig& cfg, Communicator& world,
                                                         int at_most_step = INT32_MAX) {
    CheckpointTier shared{"shared", cfg.output_dir};
    int newest_step = INT32_MAX;
    if (!cfg.resume_from.empty()) {
        newest_step = checkpoint_step_of(resume_from_path(cfg.resume_from).filename().string());
        if (newest_step < 0)
            fail(strformat("--resume-from '%s': expected a checkpoint directory named ckpt_<8 digits>",
                           cfg.resume_from.c_str()));
        shared.root = resume_from_root(cfg.resume_from);
    }
    std::optional<CheckpointTier> local;
    for (const CheckpointTier& t : checkpoint_tiers(cfg))
        if (t.local() && cfg.resume_from.empty()) local = t;
    // Rank 0 lists the shared candidates and each node's first rank its node's local ones, so every
    // rank tries the same ones in the same order: (step, is local), newest first.
    auto steps_in = [&](const std::string& root) {
        std::string listing;
        for (int step : checkpoint_steps_in(root))
            if (step <= newest_step && step <= at_most_step) listing += std::to_string(step) + " ";
        return listing;
    };
    std::string mine;
    if (world.rank() == 0) mine = "shared " + steps_in(shared.root) + "\n";
    if (local && local->leads(world.rank())) mine += "local " + steps_in(local->rank_root(world.rank())) + "\n";
    std::vector<std::pair<int, bool>> candidates;
    for (const std::string& listing : all_gather_strings(world, mine)) {
        std::istringstream lines(listing);
        for (std::string line; std::getline(lines, line);) {
            std::istringstream words(line);
            std::string kind;
            words >> kind;
            for (int step; words >> step;) candidates.push_back({step, kind == "local"});
        }
    }
    std::sort(candidates.begin(), candidates.end(), [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second > b.second; });
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    if (!cfg.resume_from.empty() && newest_step <= at_most_step &&
        (candidates.empty() || candidates[0].first != newest_step) && world.rank() == 0)
        printf("resume: '%s' does not exist\n", cfg.resume_from.c_str());
    for (const auto& [step, is_local] : candidates) {
        std::string problems;
        std::optional<ResumePoint> point =
            is_local ? detail::check_local_checkpoint(step, *local, world, cfg, &problems)
                     : detail::check_shared_checkpoint(shared.root + "/" + checkpoint_dir_name(step), shared,
                                                       cfg.run_id, world, &problems);
        if (point) return point;
        if (world.rank() == 0)
            printf("resume: skipping %s%s: %s\n", is_local ? "the local tier's " : "",
                   (is_local ? checkpoint_dir_name(step) : shared.root + "/" + checkpoint_dir_name(step)).c_str(),
                   problems.c_str());
    }
    return std::nullopt;
}

// Refuses a checkpoint this run cannot continue exactly: another model shape, seed, window size
// (B*T), total batch or shuffling. The message names the field and both values. Steps, learning
// rate, intervals, world size, tensor-parallel split and ZeRO stage may change.
inline void check_resume_compatible(const ResumePoint& p, const RunConfig& cfg) {
    auto refuse = [&](const char* field, const std::string& theirs, const std::string& ours,
                      const std::string& hint = "") {
        fail(strformat("cannot resume from '%s': its %s is %s but this run's is %s%s", p.dir.c_str(), field,
                       theirs.c_str(), ours.c_str(), hint.c_str()));
    };
    const ModelConfig &a = p.manifest.model, &b = cfg.model_config;
    const std::pair<const char*, std::pair<int, int>> model_fields[] = {
        {"num_layers", {a.num_layers, b.num_layers}},       {"num_heads", {a.num_heads, b.num_heads}},
        {"channels", {a.channels, b.channels}},             {"vocab_size", {a.vocab_size, b.vocab_size}},
        {"padded_vocab_size", {a.padded_vocab_size, b.padded_vocab_size}},
        {"max_seq_len", {a.max_seq_len, b.max_seq_len}}};
    for (const auto& [field, values] : model_fields)
        if (values.first != values.second)
            refuse(strformat("model %s", field).c_str(), std::to_string(values.first), std::to_string(values.second));
    const nlohmann::json& rc = p.manifest.run_config;
    auto number = [&](const char* key) -> long long {
        if (!rc.contains(key) || !rc[key].is_number_integer())
            fail(strformat("cannot resume from '%s': its run_config has no integer \"%s\"", p.dir.c_str(), key));
        return rc[key].get<long long>();
    };
    if ((uint64_t)number("seed") != cfg.seed)
        refuse("seed", std::to_string(number("seed")), std::to_string(cfg.seed));
    const long long window = number("batch_size") * number("seq_len");
    if (window != (long long)cfg.batch_size * cfg.seq_len)
        refuse("B*T (window size)", strformat("%lld*%lld", number("batch_size"), number("seq_len")),
               strformat("%d*%d", cfg.batch_size, cfg.seq_len));
    if (number("total_batch_tokens") != cfg.total_batch_tokens)
        refuse("total_batch_tokens", std::to_string(number("total_batch_tokens")), std::to_string(cfg.total_batch_tokens),
               strformat(": pass -d %lld to keep the run's total batch (the data order depends on it)",
                         number("total_batch_tokens")));
    if (!rc.contains("shuffle") || !rc["shuffle"].is_boolean() || rc["shuffle"].get<bool>() != cfg.shuffle)
        refuse("shuffle", rc.value("shuffle", nlohmann::json()).dump(), cfg.shuffle ? "true" : "false");
}

namespace detail {

// The local tier: a rank whose own file is gone gets it from its replica on the next node (and
// writes it back into its node's directory, whose leader recommits the manifest and marker).
inline void heal_local_checkpoint(const ResumePoint& p, Communicator& world) {
    const int rank = world.rank(), W = world.world_size(), rpn = p.tier.ranks_per_node;
    const int holder = (rank + rpn) % W, held = (rank - rpn + W) % W;  // who keeps mine, whose I keep
    const std::string dir = p.tier.dir(p.manifest.step, rank);
    std::vector<char> theirs, mine;
    std::vector<CommHandle> ops;
    if (W > rpn && !p.own_file[held]) {  // send the replica I keep to its owner
        theirs.resize(p.manifest.files[held].bytes);
        File f(dir + "/" + p.manifest.files[held].path, "rb");
        f.read(theirs.data(), theirs.size(), "checkpoint replica");
        send_in_pieces(world, theirs.data(), theirs.size(), held, ops);
    }
    if (!p.own_file[rank]) {
        mine.resize(p.manifest.files[rank].bytes);
        recv_in_pieces(world, mine.data(), mine.size(), holder, ops);
    }
    for (CommHandle& h : ops) h.wait();
    if (!p.own_file[rank]) {
        make_dirs(dir);
        write_file_durably(dir, p.manifest.files[rank].path, mine.data(), mine.size());
        printf("resume: rank %d recovered its local checkpoint file from rank %d's replica\n", rank, holder);
    }
    all_gather_strings(world, "");  // every file is back before a leader recommits its directory
    if (p.tier.leads(rank) && !std::filesystem::exists(dir + "/" + CHECKPOINT_MARKER))
        commit_checkpoint(dir, p.manifest.step, manifest_text(manifest_json(p.manifest)));
}

}  // namespace detail

// Sets the model's state from a checkpoint: every buffer's held ranges, and its random states. A
// checkpoint of a model without separate master weights gives them from its fp32 parameters; a
// model without them takes its fp32 parameters from the master weights where the checkpoint has
// them. The shared tier is read by every rank from whichever files hold what it needs; the local
// tier (collective over `world`, which it needs) by each rank from its own file only, the ranges
// other ranks own arriving by all-gather.
// dp: the ranks that hold the same layout (the data-parallel group; null: world), among which a
// local-tier restore shares what each read from its own file; expert_dp: under expert parallelism,
// those that hold the same experts, which share the expert buckets' ranges instead (null: dp).
inline void load_checkpoint(const ResumePoint& p, ShardedState& state, const ParamLayout& layout,
                            Communicator* world = nullptr, Communicator* dp = nullptr,
                            Communicator* expert_dp = nullptr, Communicator* shard_replicas = nullptr) {
    const bool local = p.tier.local();
    if (local && !world) fail("load_checkpoint: the local tier needs the world communicator");
    Manifest own_only;
    if (local) {
        detail::heal_local_checkpoint(p, *world);
        own_only = p.manifest;
        own_only.files = {p.manifest.files[world->rank()]};
    }
    const std::string dir = local ? p.tier.dir(p.manifest.step, world->rank()) : p.dir;
    CheckpointReader reader(dir, local ? own_only : p.manifest, layout);
    const std::vector<FlatRange> owned = state.owned_ranges();
    const std::vector<StateBuffer> buffers = state.state_buffers();
    bool has_master = false;
    for (const StateBuffer& b : buffers) has_master |= b.name == STATE_MASTER;
    size_t whole = 0;  // the layout's elements: a buffer held whole, or a shard of one
    for (int b = 0; b < layout.num_buckets(); b++) whole += layout.bucket_size(b);
    for (int i = 0; i < (int)buffers.size(); i++) {
        std::string source = buffers[i].name;
        if (source == STATE_MASTER && !reader.has_buffer(STATE_MASTER)) source = STATE_PARAMS;
        if (source == STATE_PARAMS && !has_master && reader.has_buffer(STATE_MASTER)) source = STATE_MASTER;
        if (!reader.has_buffer(source))
            fail(strformat("checkpoint '%s' holds no buffer '%s'", p.dir.c_str(), source.c_str()));
        // A rank whose own file holds what it holds reads it; otherwise the ranks exchange their
        // parts, a collective, so every rank takes the same path (under hybrid sharding a replica
        // owns nothing and always exchanges, while its shard group's ranks hold what they own).
        bool own_file = !local || state.held_ranges(i) == owned;
        if (local) own_file = sum_over_ranks(*world, own_file ? 0.0 : 1.0) == 0.0;
        if (own_file) {
            state.restore(i, [&](FlatRange r, float* out) { reader.read(source, r, out); });
            continue;
        }
        // Every rank holds whole ranges here (the same ones on every rank of its data-parallel
        // group, which holds the same layout, or of its expert data group for an expert bucket's):
        // each sends its part. Or, under hybrid sharding, its shard of a sharded buffer: the same
        // ranges as every replica of the shard, the first of which owns them.
        size_t held = 0;
        for (const FlatRange& r : state.held_ranges(i)) held += r.size();
        const bool shard = held < whole && shard_replicas && shard_replicas->world_size() > 1;
        auto group_of = [&](FlatRange r) -> Communicator& {
            if (shard) return *shard_replicas;
            for (int b = 0; b < layout.num_buckets(); b++)
                if (layout.is_expert_bucket(b) && r.begin >= layout.bucket_begin(b) &&
                    r.begin < layout.bucket_begin(b) + layout.bucket_size(b) && expert_dp)
                    return *expert_dp;
            return dp ? *dp : *world;
        };
        state.restore(i, [&](FlatRange r, float* out) {
            std::string part(2 * sizeof(uint64_t), '\0');
            for (const FlatRange& o : owned) {
                const uint64_t lo = std::max(r.begin, o.begin), hi = std::min(r.end, o.end);
                if (lo >= hi) continue;
                std::memcpy(part.data(), &lo, sizeof lo);
                std::memcpy(part.data() + sizeof lo, &hi, sizeof hi);
                part.resize(part.size() + (hi - lo) * sizeof(float));
                reader.read(source, {lo, hi}, reinterpret_cast<float*>(part.data() + 2 * sizeof(uint64_t)));
            }
            size_t covered = 0;
            for (const std::string& q : all_gather_strings(group_of(r), part)) {
                uint64_t lo, hi;
                std::memcpy(&lo, q.data(), sizeof lo);
                std::memcpy(&hi, q.data() + sizeof lo, sizeof hi);
                if (hi <= lo) continue;
                std::memcpy(out + (lo - r.begin), q.data() + 2 * sizeof(uint64_t), (hi - lo) * sizeof(float));
                covered += hi - lo;
            }
            if (covered != r.size())
                fail(strformat("local checkpoint step %d: the ranks own %zu of elements [%zu, %zu) of '%s'; expected all",
                               p.manifest.step, covered, r.begin, r.end, source.c_str()));
        });
    }
    for (const auto& [name, value] : p.manifest.model_rng)
        for (const auto& [known, unused] : state.rng_states())
            if (known == name) state.set_rng_state(name, value);
    if (ReplicatedState* r = state.replicated_state())
        for (const auto& [name, values] : p.manifest.model_state)
            r->restore(name, values, strformat("%s/%s", p.dir.c_str(), CHECKPOINT_MANIFEST));
}

}  // namespace llmc
