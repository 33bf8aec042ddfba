// ckpt/checkpoint.h: sharded checkpoints: written in the background, verified, resumed on any
// world size and ZeRO stage.
//
// A checkpoint is a directory <output_dir>/ckpt_<step, 8 digits>/ holding
//   rank_<rank, 5 digits>.bin  every rank's part of the training state (ShardedState's snapshot,
//                              less the copies that another rank's file holds: each element once)
//   manifest.json              what every file holds, its size and CRC32C, and the run's state
//                              (step, data position, random states, config): manifest.h
//   COMPLETE                   written last, by rank 0, once every rank's file is durable; it holds
//                              the manifest's CRC32C. A directory without it does not exist for resume.
// Every file is written under a temporary name, fsynced and renamed, and the directory fsynced, so a
// crash at any moment leaves either the previous state or the new one.
//
// Writing (CheckpointWriter). After an optimizer step the trainer calls save(): the model starts
// copying its state into host memory (a side stream on the GPU, a thread on the CPU) and the
// trainer goes straight on with the next forward and backward, which do not change the state; only
// the next optimizer update waits for the copy (before_update). A background thread then checksums
// and writes the rank's file and, on a communicator of its own, learns every rank's outcome; rank 0
// writes the manifest and the marker, or removes the directory if any rank failed, and prunes old
// checkpoints. One checkpoint is in flight at most: a save() that finds the previous one still
// writing waits for it, and says so. --ckpt-sync does everything on the training thread instead.
//
// Resuming (find_resume_checkpoint, load_checkpoint). Candidates newest first; each rank checks the
// marker and manifest and the CRC32C of a share of the files, and the ranks agree: a directory with
// any problem is reported (which file, expected and found) and the next older one is tried. Each
// rank then reads the ranges it now holds from whichever files hold them (manifest.h's slices), so
// the world size and ZeRO stage may differ from the run that wrote it.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/numerics/bf16.h"
#include "llmc/ckpt/crc32c.h"
#include "llmc/ckpt/manifest.h"
#include "llmc/ckpt/shard_state.h"
#include "llmc/config.h"
#include "llmc/dist/comm.h"
#include "llmc/failures/faults.h"
#include "llmc/utils.h"

namespace llmc {

inline constexpr const char* CHECKPOINT_MARKER = "COMPLETE";
inline constexpr const char* CHECKPOINT_MANIFEST = "manifest.json";

inline std::string checkpoint_dir_name(int step) { return strformat("ckpt_%08d", step); }
inline std::string rank_file_name(int rank) { return strformat("rank_%05d.bin", rank); }
// The step of a directory named ckpt_<8 digits>, or -1.
inline int checkpoint_step_of(const std::string& name) {
    if (name.size() != 13 || name.rfind("ckpt_", 0) != 0) return -1;
    for (size_t i = 5; i < name.size(); i++)
        if (name[i] < '0' || name[i] > '9') return -1;
    return std::atoi(name.c_str() + 5);
}
// The steps of the ckpt_<step> directories in root, complete or not, oldest first (none where root
// cannot be read).
inline std::vector<int> checkpoint_steps_in(const std::string& root) {
    std::vector<int> steps;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
        const int step = checkpoint_step_of(entry.path().filename().string());
        if (step >= 0 && entry.is_directory()) steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}
// --resume-from's checkpoint directory, normalized ("out/ckpt_00000008/" is out/ckpt_00000008), and
// the directory that holds it.
inline std::filesystem::path resume_from_path(const std::string& resume_from) {
    std::filesystem::path p = std::filesystem::path(resume_from).lexically_normal();
    return p.filename().empty() ? p.parent_path() : p;
}
inline std::string resume_from_root(const std::string& resume_from) {
    const std::filesystem::path parent = resume_from_path(resume_from).parent_path();
    return parent.empty() ? "." : parent.string();
}
// A field of the manifest in checkpoint directory `dir`; `otherwise` where it lacks the field or
// cannot be read (an incomplete checkpoint).
template <typename T>
inline T manifest_field(const std::string& dir, const char* key, const T& otherwise) {
    try {
        return nlohmann::json::parse(read_text_file(dir + "/" + CHECKPOINT_MANIFEST)).value(key, otherwise);
    } catch (const std::exception&) {
        return otherwise;
    }
}

namespace detail {

// Writes n bytes to dir/name durably: a temporary file, written and checksummed chunk by chunk,
// fsynced, renamed over the name, the directory fsynced. Returns the CRC32C. On an error the
// temporary is removed and the error names the path and the system's reason. A large buffer that
// starts on a 4 KiB boundary (a snapshot) is written with O_DIRECT, from the buffer to the disk
// without a copy into the page cache, which saves the CPU that training is using meanwhile; the
// unaligned tail, and filesystems without O_DIRECT (tmpfs), go through the page cache.
inline uint32_t write_file_durably(const std::string& dir, const std::string& name, const void* data, size_t n,
                                   bool inject_full_disk = false) {
    const std::string path = dir + "/" + name, tmp = path + ".tmp";
    constexpr size_t kAlign = 4096;
    bool direct = reinterpret_cast<uintptr_t>(data) % kAlign == 0 && n >= (1u << 20);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct && errno == EINVAL) {
        direct = false;
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (fd < 0) fail(strformat("cannot create '%s': %s", tmp.c_str(), strerror(errno)));
    auto leave_direct = [&] {
        direct = false;
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
    };
    auto fail_with = [&](const char* what, int err) {
        ::close(fd);
        ::unlink(tmp.c_str());
        fail(strformat("cannot %s '%s': %s", what, tmp.c_str(), strerror(err)));
    };
    const char* p = static_cast<const char*>(data);
    uint32_t crc = 0;
    const size_t chunk = 8u << 20;
    for (size_t at = 0; at < n;) {
        size_t len = std::min(chunk, n - at);
        if (direct && len % kAlign != 0) {  // the tail: whole blocks directly, the rest buffered
            if (len >= kAlign) len -= len % kAlign;
            else leave_direct();
        }
        if (inject_full_disk && at + len > n / 2) fail_with("write", ENOSPC);
        ssize_t wrote = ::write(fd, p + at, len);
        if (wrote < 0) {
            if (errno == EINTR) continue;
            if (direct && errno == EINVAL) {  // this filesystem refuses direct writes after all
                leave_direct();
                continue;
            }
            fail_with("write", errno);
        }
        crc = crc32c(crc, p + at, (size_t)wrote);  // only what was written: a short write resumes there
        at += (size_t)wrote;
        if (direct && at % kAlign != 0) leave_direct();
    }
    if (::fsync(fd) != 0) fail_with("sync", errno);
    if (::close(fd) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        fail(strformat("cannot close '%s': %s", tmp.c_str(), strerror(err)));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        fail(strformat("cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(), strerror(err)));
    }
    fsync_dir(dir);
    return crc;
}

// CRC32C and size of a whole file, read in chunks.
inline uint32_t crc32c_of_file(const std::string& path, uint64_t* size) {
    File f(path, "rb");
    *size = (uint64_t)f.size();
    std::vector<char> buf(8u << 20);
    uint32_t crc = 0;
    for (uint64_t at = 0; at < *size;) {
        const size_t len = (size_t)std::min<uint64_t>(buf.size(), *size - at);
        f.read(buf.data(), len, "checkpoint data");
        crc = crc32c(crc, buf.data(), len);
        at += len;
    }
    return crc;
}

inline void remove_tree(const std::string& path) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) fail(strformat("cannot remove '%s': %s", path.c_str(), ec.message().c_str()));
}

}  // namespace detail

// Where a tier of checkpoints goes, how often, and how many are kept. The shared tier is
// <output_dir>/ckpt_<step>/ on storage every rank sees (-n, -nk, -nm). The local tier
// (--local-ckpt-every) is frequent and cheap: node k's ranks write into <local dir>/run_<run id>/
// node_<k, 5 digits>/, storage only that node sees (/dev/shm, NVMe; one directory per run, see
// ckpt/output_dir.h), and each rank also sends its file over the
// communicator to the same rank of the next node, which keeps it as a replica, so a node that
// loses its storage gets its files back from its buddy. A "node" is ranks_per_node consecutive ranks.
struct CheckpointTier {
    std::string name;  // "shared" or "local", for the log
    std::string root;  // the shared directory, or the local one that holds the node_<k> directories
    int every = 0, keep = 0, major = 0;
    int ranks_per_node = 0;  // 0: the shared tier

    bool local() const { return ranks_per_node > 0; }
    bool due(int steps_done, int last_step) const {
        return every > 0 && (steps_done % every == 0 || (!local() && steps_done == last_step));
    }
    // The directory the checkpoint files of `rank` go to (its node's, on the local tier).
    std::string rank_root(int rank) const {
        return local() ? root + "/" + strformat("node_%05d", rank / ranks_per_node) : root;
    }
    std::string dir(int step, int rank) const { return rank_root(rank) + "/" + checkpoint_dir_name(step); }
    // The rank that writes the manifest and marker into rank_root(rank): rank 0, or each node's first.
    bool leads(int rank) const { return local() ? rank % ranks_per_node == 0 : rank == 0; }
};

// The local tier's root: one directory per run (ckpt/output_dir.h's run_id), so runs that share a
// machine's --local-ckpt-dir neither resume from nor prune each other's checkpoints.
inline std::string local_ckpt_root(const RunConfig& cfg) {
    return cfg.run_id.empty() ? cfg.local_ckpt_dir : cfg.local_ckpt_dir + "/run_" + cfg.run_id;
}

// The tiers a run writes: the shared one with -n, the local one with --local-ckpt-every.
inline std::vector<CheckpointTier> checkpoint_tiers(const RunConfig& cfg) {
    std::vector<CheckpointTier> tiers;
    if (cfg.checkpoint_every > 0)
        tiers.push_back({"shared", cfg.output_dir, cfg.checkpoint_every, cfg.checkpoint_keep, cfg.checkpoint_major, 0});
    if (cfg.local_ckpt_every > 0)
        tiers.push_back({"local", local_ckpt_root(cfg), cfg.local_ckpt_every, cfg.local_ckpt_keep, 0, cfg.ranks_per_node});
    return tiers;
}

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

// A file's bytes to or from one peer, in pieces below MPI's 2 GiB per call, each piece's handle
// added to `ops` (all in flight at once; the caller waits on them).
constexpr uint64_t FILE_PIECE_BYTES = 256ull << 20;
inline void send_in_pieces(Communicator& comm, const void* data, uint64_t bytes, int peer, std::vector<CommHandle>& ops) {
    for (uint64_t at = 0; at < bytes; at += FILE_PIECE_BYTES)
        ops.push_back(comm.send(static_cast<const char*>(data) + at, std::min(FILE_PIECE_BYTES, bytes - at), peer));
}
inline void recv_in_pieces(Communicator& comm, void* data, uint64_t bytes, int peer, std::vector<CommHandle>& ops) {
    for (uint64_t at = 0; at < bytes; at += FILE_PIECE_BYTES)
        ops.push_back(comm.recv(static_cast<char*>(data) + at, std::min(FILE_PIECE_BYTES, bytes - at), peer));
}

// Sends `bytes` of `data` to rank `to` and receives rank `from`'s file. The sizes travel first.
inline std::vector<char> exchange_file(Communicator& comm, const void* data, uint64_t bytes, int to, int from) {
    uint64_t their_bytes = 0;
    CommHandle s = comm.send(&bytes, sizeof bytes, to), r = comm.recv(&their_bytes, sizeof their_bytes, from);
    s.wait();
    r.wait();
    std::vector<char> theirs(their_bytes);
    std::vector<CommHandle> ops;
    send_in_pieces(comm, data, bytes, to, ops);
    recv_in_pieces(comm, theirs.data(), their_bytes, from, ops);
    for (CommHandle& h : ops) h.wait();
    return theirs;
}

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

// Writes the manifest and then the marker into a checkpoint directory.
inline void commit_checkpoint(const std::string& dir, int step, const std::string& manifest) {
    const uint32_t crc = write_file_durably(dir, CHECKPOINT_MANIFEST, manifest.data(), manifest.size());
    const std::string marker = nlohmann::json{{"step", step}, {"manifest_crc32c", crc}}.dump() + "\n";
    write_file_durably(dir, CHECKPOINT_MARKER, marker.data(), marker.size());
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

// ---- resume ----

// Reads ranges of a saved buffer out of a checkpoint's rank files, whichever files hold them.
class CheckpointReader {
public:
    CheckpointReader(const std::string& dir, const Manifest& m, const ParamLayout& layout)
        : dir_(dir), manifest_(m), layout_(layout) {
        const std::vector<ManifestTensor> mine = manifest_tensors(layout);
        for (const ManifestTensor& t : mine) {
            int found = -1;
            for (size_t i = 0; i < m.tensors.size(); i++)
                if (m.tensors[i].name == t.name) found = (int)i;
            if (found < 0) fail(strformat("checkpoint '%s' has no tensor '%s'", dir.c_str(), t.name.c_str()));
            if (m.tensors[found].shape != t.shape)
                fail(strformat("checkpoint '%s': tensor '%s' has shape %s; this model's is %s", dir.c_str(),
                               t.name.c_str(), nlohmann::json(m.tensors[found].shape).dump().c_str(),
                               nlohmann::json(t.shape).dump().c_str()));
            tensor_of_manifest_.push_back(found);
        }
    }

    bool has_buffer(const std::string& name) const {
        for (const ManifestFile& f : manifest_.files)
            for (const ManifestBuffer& b : f.buffers)
                if (b.name == name) return true;
        return false;
    }

    // Fills out[0, r.size()) with flat elements r of buffer `name`, as fp32. Each piece of the
    // range is a run of a global tensor (several, strided, for a tensor-parallel piece), and each
    // run is assembled from whichever slices of whichever files overlap it.
    void read(const std::string& name, FlatRange r, float* out) {
        const Index& index = index_for(name);
        for (const TensorPiece& p : tensor_pieces(layout_, r))
            for (size_t k = 0; k < p.runs(); k++) {
                const uint64_t lo = p.begin + k * p.stride, hi = lo + p.run_length();
                float* dst = out + (p.flat_begin - r.begin) + k * p.run_length();
                const uint64_t covered = read_run(index[tensor_of_manifest_[p.tensor]], lo, hi, dst);
                if (covered != hi - lo)
                    fail(strformat("checkpoint '%s': the files hold %llu of elements [%llu, %llu) of %s's '%s'; "
                                   "expected each exactly once",
                                   dir_.c_str(), (unsigned long long)covered, (unsigned long long)lo,
                                   (unsigned long long)hi, name.c_str(), layout_.name(p.tensor).c_str()));
            }
    }

private:
    struct Entry {
        int file;
        StateDtype dtype;
        ManifestSlice slice;
    };
    // Per manifest tensor, the slices of one buffer in every file sorted by begin, and for each
    // position the largest end among the slices up to it (slices of tensor-parallel pieces interleave).
    struct TensorIndex {
        std::vector<Entry> entries;
        std::vector<uint64_t> max_end;
    };
    using Index = std::vector<TensorIndex>;

    const Index& index_for(const std::string& name) {
        auto it = index_.find(name);
        if (it != index_.end()) return it->second;
        Index index(manifest_.tensors.size());
        for (size_t f = 0; f < manifest_.files.size(); f++)
            for (const ManifestBuffer& b : manifest_.files[f].buffers)
                if (b.name == name)
                    for (const ManifestSlice& s : b.slices) index[s.tensor].entries.push_back({(int)f, b.dtype, s});
        for (TensorIndex& t : index) {
            std::sort(t.entries.begin(), t.entries.end(),
                      [](const Entry& a, const Entry& b) { return a.slice.begin < b.slice.begin; });
            uint64_t max_end = 0;
            for (const Entry& e : t.entries) t.max_end.push_back(max_end = std::max(max_end, e.slice.end));
        }
        return index_[name] = std::move(index);
    }

    // Reads the elements of [lo, hi) that the tensor's slices hold into dst[0, hi - lo); returns how
    // many it read (hi - lo when every element is held exactly once; more means overlapping slices).
    uint64_t read_run(const TensorIndex& t, uint64_t lo, uint64_t hi, float* dst) {
        uint64_t covered = 0;
        // The slices that may overlap begin before hi; walking down from the last of them, none
        // before position i reaches lo once max_end[i] <= lo.
        size_t i = std::lower_bound(t.entries.begin(), t.entries.end(), hi,
                                    [](const Entry& e, uint64_t x) { return e.slice.begin < x; }) - t.entries.begin();
        while (i-- > 0 && t.max_end[i] > lo) {
            const ManifestSlice& s = t.entries[i].slice;
            if (s.end <= lo) continue;
            // the slice's runs that overlap [lo, hi), with their position in the slice's stored data
            const uint64_t first = s.strided() && lo > s.begin ? (lo - s.begin) / s.stride : 0;
            for (uint64_t k = first; k < s.runs(); k++) {
                const uint64_t run_begin = s.begin + k * (s.strided() ? s.stride : 0);
                if (run_begin >= hi) break;
                const uint64_t a = std::max(lo, run_begin), b = std::min(hi, run_begin + s.run_length());
                if (a >= b) continue;
                read_elements(t.entries[i], k * s.run_length() + (a - run_begin), b - a, dst + (a - lo));
                covered += b - a;
            }
        }
        return covered;
    }

    // n elements of the entry's stored data from element `first` of it on, as fp32.
    void read_elements(const Entry& e, uint64_t first, uint64_t n, float* out) {
        const ManifestFile& file = manifest_.files[e.file];
        auto& f = files_[e.file];
        if (!f) f = std::make_unique<File>(dir_ + "/" + file.path, "rb");
        const size_t elem = state_dtype_bytes(e.dtype);
        f->seek((int64_t)(e.slice.byte_offset + first * elem));
        if (e.dtype == StateDtype::F32) {
            f->read(out, n, "checkpoint data");
        } else {
            std::vector<uint16_t> bits(n);
            f->read(bits.data(), n, "checkpoint data");
            for (uint64_t i = 0; i < n; i++) out[i] = bf16_bits_to_float(bits[i]);
        }
    }

    std::string dir_;
    const Manifest& manifest_;
    const ParamLayout& layout_;
    std::vector<int> tensor_of_manifest_;  // per layout tensor
    std::map<std::string, Index> index_;
    std::map<int, std::unique_ptr<File>> files_;
};

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
                            Communicator* expert_dp = nullptr) {
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
    for (int i = 0; i < (int)buffers.size(); i++) {
        std::string source = buffers[i].name;
        if (source == STATE_MASTER && !reader.has_buffer(STATE_MASTER)) source = STATE_PARAMS;
        if (source == STATE_PARAMS && !has_master && reader.has_buffer(STATE_MASTER)) source = STATE_MASTER;
        if (!reader.has_buffer(source))
            fail(strformat("checkpoint '%s' holds no buffer '%s'", p.dir.c_str(), source.c_str()));
        if (!local || state.held_ranges(i) == owned) {
            state.restore(i, [&](FlatRange r, float* out) { reader.read(source, r, out); });
            continue;
        }
        // Every rank holds whole ranges here (the same ones on every rank of its data-parallel
        // group, which holds the same layout, or of its expert data group for an expert bucket's):
        // each sends its part.
        auto group_of = [&](FlatRange r) -> Communicator& {
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
