// parallel_dims.h: the device mesh, how the launch's ranks are laid out over the kinds of parallelism.
//
// The idea: a rank is a point in a 4-d grid (dp, pp, cp, tp) numbered row-major with tp innermost,
// so the ranks of a tensor-parallel group (the chattiest) are adjacent and land on one node, then
// context, then pipeline, with data parallelism outermost. A group along one dimension is the set
// of ranks that differ only in that coordinate, listed in the order of that coordinate, which is
// also each member's rank inside the group. Pure arithmetic: no communicator, no MPI, so it is
// unit-tested alone; process_groups.h turns it into communicators.
//
// Data, pipeline, context and tensor parallelism all run (--pp, --cp, --tp; the rest is dp).
//
// Expert parallelism is not a fifth dimension: it carves the data-parallel ranks into expert groups
// of ep consecutive data coordinates (ep divides dp), each rank of a group holding 1/ep of the
// experts; the ranks with the same place in their expert groups hold the same experts and form
// the expert data group (dp / ep ranks), over which ZeRO reduces them.
//
// Hybrid sharding (HSDP, --dp-shard N) cuts the data-parallel ranks the same way: blocks of N
// consecutive data coordinates are shard groups, over which ZeRO shards (with the context ranks of
// each: ZeRO's group is data x context), and the ranks with the same place in their blocks are
// replica groups (dp / N ranks), which hold the same shards and sum their gradients' slices. With
// the data coordinate outermost, a shard group's ranks are the N x pp x cp x tp consecutive ranks
// of its block: on one node where the node holds them.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "llmc/utils.h"

namespace llmc {

// The mesh's dimensions, outermost first (the order of the coordinates in a rank's number).
enum class MeshDim { DP, PP, CP, TP };
constexpr std::array<MeshDim, 4> kMeshDims = {MeshDim::DP, MeshDim::PP, MeshDim::CP, MeshDim::TP};

inline const char* mesh_dim_name(MeshDim dim) {
    switch (dim) {
        case MeshDim::DP: return "dp";
        case MeshDim::PP: return "pp";
        case MeshDim::CP: return "cp";
        case MeshDim::TP: return "tp";
    }
    return "?";
}

// A rank's place in the mesh: one coordinate per dimension, indexed by MeshDim.
struct MeshCoord {
    std::array<int, 4> at{};
    int& operator[](MeshDim dim) { return at[(int)dim]; }
    int operator[](MeshDim dim) const { return at[(int)dim]; }
};

struct ParallelDims {
    int dp = 1;  // data parallel: replicas (or ZeRO shards) of the model on different data
    int tp = 1;  // tensor parallel: one layer's matrices split over ranks
    int pp = 1;  // pipeline parallel: consecutive layers on different ranks
    int cp = 1;  // context parallel: one sequence split over ranks
    int ep = 1;  // expert parallel: the data-parallel ranks in groups of ep, the experts split over each
    int dp_shard = 0;  // hybrid sharding: ZeRO shards over blocks of dp_shard data ranks (0: all of dp)

    // Every rank in data parallelism (resolve_run_config then sets tp and pp).
    static ParallelDims data_parallel(int world_size) {
        ParallelDims dims;
        dims.dp = world_size;
        return dims;
    }

    int size(MeshDim dim) const {
        switch (dim) {
            case MeshDim::DP: return dp;
            case MeshDim::PP: return pp;
            case MeshDim::CP: return cp;
            case MeshDim::TP: return tp;
        }
        return 0;
    }
    // The number of ranks the mesh needs (as a long long: a product of bad sizes may overflow int).
    long long ranks() const { return (long long)dp * tp * pp * cp; }
    std::string describe() const {
        return strformat("dp %d x pp %d x cp %d x tp %d", dp, pp, cp, tp) + (ep > 1 ? strformat(" (ep %d)", ep) : "") +
               (hybrid() ? strformat(" (dp shard %d)", dp_shard) : "");
    }
    // The data ranks ZeRO shards over (each with its context ranks), and the replicas of each shard.
    int shard_size() const { return dp_shard > 0 ? dp_shard : dp; }
    int replicas() const { return dp / shard_size(); }
    bool hybrid() const { return replicas() > 1; }

    // Fails unless every size is positive and the mesh has exactly world_size ranks.
    void validate(int world_size) const {
        for (MeshDim dim : kMeshDims)
            if (size(dim) < 1)
                fail(strformat("parallel dims %s: %s must be at least 1, got %d", describe().c_str(), mesh_dim_name(dim),
                               size(dim)));
        if (ranks() != world_size)
            fail(strformat("parallel dims %s need %lld ranks, but the launch has %d", describe().c_str(), ranks(),
                           world_size));
        if (ep < 1 || dp % ep != 0)
            fail(strformat("parallel dims %s: ep must divide the %d data-parallel ranks", describe().c_str(), dp));
        if (dp_shard < 0 || (dp_shard > 0 && dp % dp_shard != 0))
            fail(strformat("parallel dims %s: dp_shard must divide the %d data-parallel ranks, got %d",
                           describe().c_str(), dp, dp_shard));
    }

    // Expert parallelism: `rank`'s expert group (the ranks of its dp group with the same dp / ep) and
    // its expert data group (those with the same dp % ep), each in the order of its rank in it.
    std::vector<int> expert_group_ranks(int rank) const { return dp_subgroup(rank, ep, true); }
    std::vector<int> expert_data_ranks(int rank) const { return dp_subgroup(rank, ep, false); }
    // Hybrid sharding: `rank`'s shard group (the ranks of its data x context group in the same block
    // of dp_shard data coordinates, ordered by (data place in the block, context), which is ZeRO's
    // rank order), and its replica group (the same place in every block, the same context coordinate,
    // ordered by block).
    std::vector<int> shard_group_ranks(int rank) const {
        std::vector<int> ranks;
        MeshCoord c = coord_of(rank);
        for (int d : dp_subgroup(rank, shard_size(), true)) {
            c[MeshDim::DP] = coord_of(d)[MeshDim::DP];
            for (c[MeshDim::CP] = 0; c[MeshDim::CP] < cp; c[MeshDim::CP]++) ranks.push_back(rank_of(c));
        }
        return ranks;
    }
    std::vector<int> replica_group_ranks(int rank) const { return dp_subgroup(rank, shard_size(), false); }

    // Row-major over (dp, pp, cp, tp): tp varies fastest.
    MeshCoord coord_of(int rank) const {
        check_rank(rank);
        MeshCoord c;
        for (int i = (int)kMeshDims.size() - 1; i >= 0; i--) {
            c.at[i] = rank % size(kMeshDims[i]);
            rank /= size(kMeshDims[i]);
        }
        return c;
    }
    int rank_of(const MeshCoord& c) const {
        int rank = 0;
        for (MeshDim dim : kMeshDims) rank = rank * size(dim) + c[dim];
        return rank;
    }

    // The ranks of `rank`'s group along `dim`, ordered by their coordinate along dim (so a rank's
    // index in the list is its rank in the group).
    std::vector<int> group_ranks(MeshDim dim, int rank) const {
        MeshCoord c = coord_of(rank);
        std::vector<int> ranks;
        for (c[dim] = 0; c[dim] < size(dim); c[dim]++) ranks.push_back(rank_of(c));
        return ranks;
    }
    // Which group along dim `rank` is in: the same number for every member, different between groups
    // (the lowest rank of the group). The colour to split a communicator by.
    int group_id(MeshDim dim, int rank) const { return group_ranks(dim, rank).front(); }

private:
    // The data-parallel ranks of `rank` cut into blocks of n consecutive data coordinates: its block
    // (`in_block`), or the ranks with its place in every block.
    std::vector<int> dp_subgroup(int rank, int n, bool in_block) const {
        MeshCoord c = coord_of(rank);
        const int block = c[MeshDim::DP] / n, place = c[MeshDim::DP] % n;
        std::vector<int> ranks;
        for (int i = 0; i < (in_block ? n : dp / n); i++) {
            c[MeshDim::DP] = in_block ? block * n + i : i * n + place;
            ranks.push_back(rank_of(c));
        }
        return ranks;
    }
    void check_rank(int rank) const {
        if (rank < 0 || rank >= ranks())
            fail(strformat("rank %d is not in the mesh %s of %lld ranks", rank, describe().c_str(), ranks()));
    }
};

}  // namespace llmc
