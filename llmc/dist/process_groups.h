// process_groups.h: the device mesh's communicators: one per dimension (dp, pp, cp, tp), each over
// the ranks of this rank's group along that dimension, split from the world's communicator.
//
// The idea: a group along a dimension is the ranks that share every other coordinate
// (parallel_dims.h), so splitting the world by "which group" as colour and "coordinate along the
// dimension" as key gives every rank its group with its rank in it equal to its coordinate. A group
// that spans the whole world (dp today) is the world communicator itself rather than a copy, and a
// group of one is a LocalComm (no split, no communication thread).
//
// One group spans two dimensions: dp_cp, the ranks that differ only in their data and context
// coordinates. They hold the same weights (context ranks are replicas too, only each sees other
// positions of the sequences), so their gradients are summed together and ZeRO shards over them.
// Without context parallelism it is the data-parallel group.
//
// Expert parallelism (ParallelDims::ep > 1) adds two groups carved from the data-parallel one: the
// expert group (ep ranks that split the experts between them and exchange tokens) and the expert
// data group (the dp / ep ranks that hold the same experts). Both are split from the world even
// where they span it, so the token exchange's messages never share a communicator with ZeRO's
// collectives. Without it the expert group is one rank and the expert data group is dp.
//
// Hybrid sharding (ParallelDims::dp_shard) cuts the data x context group in two: the shard group
// (ZeRO's group: dp_shard data ranks with their context ranks) and the replica group (the dp /
// dp_shard ranks holding the same shard). Without it the shard group is dp_cp and the replica group
// is one rank.
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <utility>

#include "llmc/dist/comm.h"
#include "llmc/dist/parallel_dims.h"
#include "llmc/utils.h"

namespace llmc {

class ProcessGroups {
public:
    const ParallelDims& dims() const { return dims_; }
    Communicator& world() const { return *world_; }
    Communicator& group(MeshDim dim) const { return *group_[(int)dim]; }
    Communicator& dp() const { return group(MeshDim::DP); }
    Communicator& pp() const { return group(MeshDim::PP); }
    Communicator& cp() const { return group(MeshDim::CP); }
    Communicator& tp() const { return group(MeshDim::TP); }
    Communicator& dp_cp() const { return dp_cp_ ? *dp_cp_ : dp(); }
    Communicator& ep() const { return ep_ ? *ep_ : local_communicator(); }
    Communicator& expert_data() const { return expert_data_ ? *expert_data_ : dp(); }
    // ZeRO's group (gradients reduce-scattered, parameters and states sharded), and the group of the
    // replicas of this rank's shard (its gradients' slices all-reduced over them).
    Communicator& zero_shard() const { return shard_ ? *shard_ : dp_cp(); }
    Communicator& zero_replicas() const { return replicas_ ? *replicas_ : local_communicator(); }
    // The colour and key that split world rank `rank`'s shard group (`replicas` false) or replica
    // group from the world (for device communicators that mirror them).
    std::pair<int, int> hybrid_split(int rank, bool replicas) const {
        return split_of(replicas ? dims_.replica_group_ranks(rank) : dims_.shard_group_ranks(rank), rank);
    }
    // The colour and key that split world rank `rank`'s dp x cp group from the world (for device
    // communicators that mirror it): the group's first rank, and the rank's (dp, cp) index in it.
    std::pair<int, int> dp_cp_split(int rank) const {
        MeshCoord coord = dims_.coord_of(rank);
        const int key = coord[MeshDim::DP] * dims_.cp + coord[MeshDim::CP];
        coord[MeshDim::DP] = coord[MeshDim::CP] = 0;
        return {dims_.rank_of(coord), key};
    }
    // The same for world rank `rank`'s expert group (`expert_data` false) or expert data group:
    // coloured by the group's first rank, keyed by the place of `rank` in it.
    std::pair<int, int> expert_split(int rank, bool expert_data) const {
        return split_of(expert_data ? dims_.expert_data_ranks(rank) : dims_.expert_group_ranks(rank), rank);
    }

    // Collective over world: every rank calls it with the same dims. world must outlive the groups.
    ProcessGroups(Communicator& world, const ParallelDims& dims) : dims_(dims), world_(&world) {
        dims.validate(world.world_size());
        const int rank = world.rank();
        const MeshCoord coord = dims.coord_of(rank);
        for (MeshDim dim : kMeshDims) {
            Communicator* comm = &world;
            if (dims.size(dim) == 1 && world.world_size() > 1) {
                owned_[(int)dim] = std::make_unique<LocalComm>();  // a group of one needs no messages
                comm = owned_[(int)dim].get();
            } else if (dims.size(dim) != world.world_size()) {
                owned_[(int)dim] = world.split(dims.group_id(dim, rank), coord[dim]);
                comm = owned_[(int)dim].get();
            }
            if (comm->world_size() != dims.size(dim) || comm->rank() != coord[dim])
                fail(strformat("the %s group of rank %d (mesh %s) has %d ranks with this one at %d; expected %d ranks "
                               "with it at %d",
                               mesh_dim_name(dim), rank, dims.describe().c_str(), comm->world_size(), comm->rank(),
                               dims.size(dim), coord[dim]));
            group_[(int)dim] = comm;
        }
        if (dims.cp > 1) dp_cp_ = split_dp_cp(world, coord);
        if (dims.ep > 1) {
            ep_ = split_by(world, dims.expert_group_ranks(rank));
            expert_data_ = split_by(world, dims.expert_data_ranks(rank));
        }
        if (dims.hybrid()) {
            shard_ = split_by(world, dims.shard_group_ranks(rank));
            replicas_ = split_by(world, dims.replica_group_ranks(rank));
        }
    }

private:
    // The colour and key of `rank`'s group of `ranks` (listed in group-rank order): its first rank,
    // and the place in the list.
    static std::pair<int, int> split_of(const std::vector<int>& ranks, int rank) {
        return {ranks.front(), (int)(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin())};
    }
    // This rank's group of `ranks`, split from the world.
    static std::unique_ptr<Communicator> split_by(Communicator& world, const std::vector<int>& ranks) {
        const auto [color, key] = split_of(ranks, world.rank());
        return world.split(color, key);
    }
    std::unique_ptr<Communicator> split_dp_cp(Communicator& world, MeshCoord coord) const {
        const auto [color, key] = dp_cp_split(dims_.rank_of(coord));
        return world.split(color, key);
    }

    ParallelDims dims_;
    Communicator* world_;
    std::array<std::unique_ptr<Communicator>, 4> owned_;  // the groups split from world
    std::array<Communicator*, 4> group_{};                  // each dimension's group: owned, or world
    std::unique_ptr<Communicator> dp_cp_;                   // with cp > 1: the data x context group
    std::unique_ptr<Communicator> ep_, expert_data_;        // with ep > 1: the expert and expert data groups
    std::unique_ptr<Communicator> shard_, replicas_;        // hybrid sharding: ZeRO's group and the replicas'
};

}  // namespace llmc
