// ckpt/writer.h: CheckpointWriter: a rank's part of the training state snapshotted after an optimizer
// step and written in the background, committed by rank 0 once every rank's file is durable
// (checkpoint.h describes the protocol).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/ckpt/crc32c.h"
#include "llmc/ckpt/files.h"
#include "llmc/ckpt/manifest.h"
#include "llmc/ckpt/shard_state.h"
#include "llmc/ckpt/tiers.h"
#include "llmc/config.h"
#include "llmc/dist/comm.h"
#include "llmc/failures/faults.h"
#include "llmc/utils.h"

namespace llmc {

// One checkpoint's outcome on one tier, as the trainer logs it (rank 0's view).
struct CheckpointReport {
    int step = 0;
    std::string tier;
    std::string dir;
    bool ok = false;
    std::string error;     // every failed rank's error, when !ok
    double stall_ms = 0;   // training time lost: snapshot start, its wait before the next update, sync writes
    double wait_ms = 0;    // of stall_ms, the wait for the previous checkpoint to finish first
    double write_ms = 0;   // from the snapshot to the marker (or the failure)
    uint64_t bytes = 0;    // all ranks' files (without the local tier's replicas)
    double mb_per_s() const { return write_ms > 0 ? bytes / 1e6 / (write_ms / 1e3) : 0; }
};

// What the trainer knows of a step that the model does not: it goes into the manifest.
struct TrainState {
    int step = 0;
    DataLoaderState data;
    std::array<uint64_t, 4> sampler_rng{};
    bool verified = true;  // the replicas' fingerprints agreed at this step, or none are compared
    // the model's ReplicatedState, taken when the checkpoint is (CheckpointWriter::save fills it)
    std::vector<std::pair<std::string, std::vector<float>>> model_state;
};

namespace detail {

// Moves the runs of a snapshot to its front, back to back, in place (each run moves towards the
// front, so none is overwritten before it moves): the snapshot then starts with the file's bytes.
inline void squeeze(void* snapshot, const std::vector<SnapshotRun>& runs) {
    char* base = static_cast<char*>(snapshot);
    uint64_t at = 0;
    for (const SnapshotRun& r : runs) {
        if (r.snapshot_offset != at) std::memmove(base + at, base + r.snapshot_offset, r.bytes);
        at += r.bytes;
    }
}

}  // namespace detail

class CheckpointWriter {
public:
    // Collective over `world` (it splits a communicator for the writer thread): every rank calls it.
    // run_config: the config.json of this run, recorded in every manifest.
    CheckpointWriter(const RunConfig& cfg, const nlohmann::json& run_config, ShardedState& state,
                     const ParamLayout& layout, Communicator& world, std::vector<CheckpointTier> tiers)
        : cfg_(cfg), run_config_(run_config), state_(state), layout_(layout), tiers_(std::move(tiers)),
          comm_(world.split(0, world.rank())), tensors_(manifest_tensors(layout)), buffers_(state.state_buffers()),
          owned_(state.owned_ranges()) {
        for (const CheckpointTier& t : tiers_)
            if (t.local() && world.world_size() % t.ranks_per_node != 0)
                fail(strformat("--ranks-per-node %d does not divide the %d ranks into whole nodes", t.ranks_per_node,
                               world.world_size()));
        // Writing takes as long as the disk needs: a rank waits that long for the slowest one.
        comm_->timeout_s = std::max(world.timeout_s, 3600.0);
        state_.snapshot_memory(state_.snapshot_bytes());  // allocated (and touched) now, not at the first save
    }
    CheckpointWriter(const RunConfig& cfg, const nlohmann::json& run_config, ShardedState& state,
                     const ParamLayout& layout, Communicator& world)
        : CheckpointWriter(cfg, run_config, state, layout, world, checkpoint_tiers(cfg)) {}
    ~CheckpointWriter() {
        if (thread_.joinable()) thread_.join();
    }
    CheckpointWriter(const CheckpointWriter&) = delete;
    CheckpointWriter& operator=(const CheckpointWriter&) = delete;

    // Whether the state after `steps_done` optimizer steps is saved on some tier: the shared one
    // every -n steps and at the end, the local one every --local-ckpt-every steps.
    bool due(int steps_done) const { return !due_tiers(steps_done).empty(); }

    // Saves the state as it is now (after the update of step t.step) on every tier that is due.
    // Returns once the snapshot is started (asynchronous) or the checkpoint is complete (--ckpt-sync).
    void save(const TrainState& state_of_step) {
        auto start = std::chrono::steady_clock::now();
        TrainState t = state_of_step;
        if (const ReplicatedState* r = state_.replicated_state()) t.model_state = r->named_values();
        const std::vector<CheckpointTier> tiers = due_tiers(t.step);
        if (tiers.empty()) return;
        double wait_ms = 0;
        if (thread_.joinable()) {
            if (writing_ && comm_->rank() == 0)
                printf("checkpoint %s: waiting for %s to finish writing first\n", checkpoint_dir_name(t.step).c_str(),
                       checkpoint_dir_name(in_flight_step_).c_str());
            thread_.join();
            wait_ms = ms_since(start);
        }
        void* host = state_.snapshot_memory(state_.snapshot_bytes());
        state_.start_snapshot(host);
        in_flight_step_ = t.step;
        if (cfg_.ckpt_sync) {
            std::vector<CheckpointReport> reports = write_all(t, tiers, host);
            std::lock_guard<std::mutex> lock(mutex_);
            for (CheckpointReport& r : reports) {
                r.wait_ms = wait_ms;
                r.stall_ms = ms_since(start);
                finished_sync_.push_back(r);
            }
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            pending_.push_back(Pending{t.step, ms_since(start), wait_ms, {}, false, false});
        }
        settled_ = false;
        writing_ = true;
        thread_ = std::thread([this, t, tiers, host] {
            std::vector<CheckpointReport> reports = write_all(t, tiers, host);
            writing_ = false;
            std::lock_guard<std::mutex> lock(mutex_);
            for (Pending& q : pending_)
                if (q.step == t.step && !q.written) {
                    q.reports = std::move(reports);
                    q.written = true;
                }
        });
    }

    // Before the next optimizer update: the snapshot copy must be done. Its wait counts as stall.
    void before_update() {
        if (settled_) return;
        auto start = std::chrono::steady_clock::now();
        state_.wait_snapshot();
        std::lock_guard<std::mutex> lock(mutex_);
        for (Pending& q : pending_)
            if (!q.settled) {
                q.stall_ms += ms_since(start);
                q.settled = true;
            }
        settled_ = true;
    }

    // Checkpoints finished since the last call (written or failed, stall known), oldest first.
    std::vector<CheckpointReport> take_finished() {
        std::vector<CheckpointReport> out;
        std::lock_guard<std::mutex> lock(mutex_);
        while (!pending_.empty() && pending_.front().written && pending_.front().settled) {
            for (CheckpointReport r : pending_.front().reports) {
                r.stall_ms = pending_.front().stall_ms;
                r.wait_ms = pending_.front().wait_ms;
                out.push_back(r);
            }
            pending_.erase(pending_.begin());
        }
        for (CheckpointReport& r : finished_sync_) out.push_back(r);
        finished_sync_.clear();
        return out;
    }

    // Waits for the checkpoint in flight (end of training, or before a rollback).
    void finish() {
        before_update();
        if (thread_.joinable()) thread_.join();
    }

private:
    struct Pending {
        int step;
        double stall_ms, wait_ms;
        std::vector<CheckpointReport> reports;
        bool written, settled;
    };

    std::vector<CheckpointTier> due_tiers(int steps_done) const {
        std::vector<CheckpointTier> due;
        for (const CheckpointTier& t : tiers_)
            if (t.due(steps_done, cfg_.steps)) due.push_back(t);
        return due;
    }

    // The local tier first: it is the quick one, and the shared one may take long; and it writes
    // the whole snapshot, out of which the shared one then squeezes the copies it does not write.
    std::vector<CheckpointReport> write_all(const TrainState& t, std::vector<CheckpointTier> tiers, void* host) {
        std::stable_sort(tiers.begin(), tiers.end(),
                         [](const CheckpointTier& a, const CheckpointTier& b) { return a.local() > b.local(); });
        std::vector<CheckpointReport> reports;
        for (const CheckpointTier& tier : tiers) reports.push_back(write(t, tier, host));
        return reports;
    }

    // The whole write of one checkpoint on one tier, on the writer thread (or the trainer's,
    // --ckpt-sync). Never throws: every failure ends in a report, and in a removed directory.
    CheckpointReport write(const TrainState& t, const CheckpointTier& tier, void* host) {
        auto start = std::chrono::steady_clock::now();
        Communicator& comm = *comm_;
        const int rank = comm.rank(), world = comm.world_size();
        const std::string dir = tier.dir(t.step, rank);
        CheckpointReport r;
        r.step = t.step;
        r.tier = tier.name;
        r.dir = tier.dir(t.step, 0);
        std::string error;
        try {
            state_.wait_snapshot();
            // The leader clears what a crashed run may have left under this name; the others wait.
            if (tier.leads(rank)) {
                detail::remove_tree(dir);
                make_dirs(dir);
            }
        } catch (const std::exception& e) {
            error = e.what();
        }
        try {
            for (const std::string& e : all_gather_strings(comm, error))
                if (!e.empty() && error.empty()) error = "another rank could not prepare its checkpoint directory";
            std::vector<SnapshotRun> runs;
            ManifestFile mine =
                describe_rank_file(layout_, buffers_, owned_, rank, rank_file_name(rank), tier.local(), &runs);
            detail::squeeze(host, runs);
            if (error.empty()) {
                try {
                    const bool inject = faults().at("ckpt_fail", t.step, rank);  // faults.h: a full disk
                    mine.crc32c = detail::write_file_durably(dir, mine.path, host, mine.bytes, inject);
                    if (faults().at("ckpt_pause", t.step, rank)) std::this_thread::sleep_for(std::chrono::hours(1));
                } catch (const std::exception& e) {
                    error = e.what();
                }
            }
            // The local tier: a replica of this rank's file on the next node, and of the previous
            // node's rank here. Every rank takes part even after an error, so none waits in vain.
            if (tier.local() && world > tier.ranks_per_node) {
                const int to = (rank + tier.ranks_per_node) % world, from = (rank - tier.ranks_per_node + world) % world;
                std::vector<char> replica = detail::exchange_file(comm, host, mine.bytes, to, from);
                if (error.empty()) {
                    try {
                        detail::write_file_durably(dir, rank_file_name(from), replica.data(), replica.size());
                    } catch (const std::exception& e) {
                        error = strformat("the replica of rank %d: %s", from, e.what());
                    }
                }
            }
            // Every rank's outcome: its file's description, or its error.
            nlohmann::json outcome = error.empty() ? nlohmann::json{{"file", file_json(mine, tensors_)}}
                                                   : nlohmann::json{{"error", error}};
            std::vector<std::string> outcomes = all_gather_strings(comm, outcome.dump());
            // Rank 0's verdict and the manifest, shared with every rank.
            std::string verdict_text = rank == 0 ? verdict(t, outcomes) : "";
            const nlohmann::json verdict = nlohmann::json::parse(all_gather_strings(comm, verdict_text)[0]);
            r.ok = verdict.at("ok").get<bool>();
            r.error = verdict.at("error").get<std::string>();
            r.bytes = verdict.at("bytes").get<uint64_t>();
            // Each leader commits its directory (manifest, then marker) or removes it.
            std::string commit_error;
            if (tier.leads(rank)) {
                try {
                    if (r.ok) {
                        detail::commit_checkpoint(dir, t.step, verdict.at("manifest").get<std::string>());
                        prune(tier, tier.rank_root(rank), t.step, cfg_.run_id);
                    } else {
                        detail::remove_tree(dir);
                    }
                } catch (const std::exception& e) {
                    commit_error = strformat("rank %d: %s", rank, e.what());
                }
            }
            for (const std::string& e : all_gather_strings(comm, commit_error))
                if (!e.empty()) {
                    r.ok = false;
                    r.error += (r.error.empty() ? "" : "; ") + e;
                }
        } catch (const std::exception& e) {
            r.ok = false;
            r.error = strformat("rank %d: %s", rank, e.what());
        }
        r.write_ms = ms_since(start);
        return r;
    }

    // Rank 0, once every rank has reported: {ok, error, bytes, manifest}.
    std::string verdict(const TrainState& t, const std::vector<std::string>& outcomes) {
        std::string errors;
        uint64_t bytes = 0;
        nlohmann::json files = nlohmann::json::array();
        for (size_t i = 0; i < outcomes.size(); i++) {
            nlohmann::json o = nlohmann::json::parse(outcomes[i]);
            if (o.contains("error")) {
                errors += strformat("%srank %zu: %s", errors.empty() ? "" : "; ", i, o["error"].get<std::string>().c_str());
            } else {
                bytes += o["file"]["bytes"].get<uint64_t>();
                files.push_back(o["file"]);
            }
        }
        std::string text;
        if (errors.empty()) {
            Manifest m;
            m.step = t.step;
            m.world_size = (int)outcomes.size();
            m.tp = cfg_.dims.tp;
            m.pp = cfg_.dims.pp;
            m.ep = cfg_.dims.ep;
            if (cfg_.dims.pp > 1) m.pp_layers = pipeline_split(cfg_).describe();
            m.zero_stage = cfg_.zero_stage;
            m.run_id = cfg_.run_id;
            m.verified = t.verified;
            m.model = cfg_.model_config;
            m.run_config = run_config_;
            m.data = t.data;
            m.sampler_rng = t.sampler_rng;
            m.model_rng = state_.rng_states();
            m.model_state = t.model_state;
            m.tensors = tensors_;
            nlohmann::json j = manifest_json(m);
            j["files"] = files;
            text = manifest_text(j);
        }
        return nlohmann::json{{"ok", errors.empty()}, {"error", errors}, {"bytes", bytes}, {"manifest", text}}.dump();
    }

    // Retention in one directory of checkpoints: keep the newest `keep` complete ones (all with 0)
    // and every step that is a multiple of `major`; never the newest complete one (just written),
    // nor the newest verified one (a fingerprint mismatch replays from it), nor another run's.
    // Incomplete directories older than the newest are debris of crashed writes and go too.
    static void prune(const CheckpointTier& tier, const std::string& root, int newest, const std::string& run_id) {
        std::vector<int> complete;  // newest first
        for (int step : checkpoint_steps_in(root)) {
            const std::string dir = root + "/" + checkpoint_dir_name(step);
            if (std::filesystem::exists(dir + "/" + CHECKPOINT_MARKER)) complete.insert(complete.begin(), step);
            else if (step < newest) detail::remove_tree(dir);
        }
        int verified = -1;  // the newest verified step
        for (int step : complete)
            if (verified < 0 && manifest_field(root + "/" + checkpoint_dir_name(step), "verified", true)) verified = step;
        for (size_t i = 0; i < complete.size(); i++) {
            const int step = complete[i];
            const std::string dir = root + "/" + checkpoint_dir_name(step);
            const bool keep = step == newest || step == verified || tier.keep == 0 || (int)i < tier.keep ||
                              (tier.major > 0 && step % tier.major == 0) ||
                              manifest_field(dir, "run_id", run_id) != run_id;
            if (!keep) detail::remove_tree(dir);
        }
    }

    const RunConfig& cfg_;
    nlohmann::json run_config_;
    ShardedState& state_;
    const ParamLayout& layout_;
    std::vector<CheckpointTier> tiers_;
    std::unique_ptr<Communicator> comm_;  // the writer thread's own
    std::vector<ManifestTensor> tensors_;
    std::vector<StateBuffer> buffers_;
    std::vector<FlatRange> owned_;
    std::thread thread_;
    std::atomic<bool> writing_{false};
    int in_flight_step_ = 0;
    bool settled_ = true;  // the last snapshot's copy is known to be done
    std::mutex mutex_;
    std::vector<Pending> pending_;
    std::vector<CheckpointReport> finished_sync_;
};

}  // namespace llmc
