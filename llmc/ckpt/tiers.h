// ckpt/tiers.h: where checkpoints go: the shared tier every rank sees and the node-local tier, whose
// files also travel to the next node as replicas (the transfers are here).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmc/ckpt/files.h"
#include "llmc/config/run_config.h"
#include "llmc/dist/comm.h"
#include "llmc/utils.h"

namespace llmc {

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

}  // namespace detail

}  // namespace llmc
