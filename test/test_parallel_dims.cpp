// The device mesh (parallel_dims.h): validation against the world size, rank <-> coordinates, and
// the ranks of each group, checked against layouts written out by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "llmc/dist/parallel_dims.h"

using namespace llmc;
using Catch::Contains;

namespace {

ParallelDims dims_of(int dp, int pp, int cp, int tp) {
    ParallelDims d;
    d.dp = dp;
    d.pp = pp;
    d.cp = cp;
    d.tp = tp;
    return d;
}

}  // namespace

TEST_CASE("data parallelism alone puts every rank in one dp group", "[parallel_dims]") {
    ParallelDims d = ParallelDims::data_parallel(4);
    d.validate(4);
    CHECK(d.group_ranks(MeshDim::DP, 2) == std::vector<int>{0, 1, 2, 3});
    for (MeshDim dim : {MeshDim::TP, MeshDim::PP, MeshDim::CP}) {
        CAPTURE(mesh_dim_name(dim));
        CHECK(d.group_ranks(dim, 2) == std::vector<int>{2});
    }
    CHECK(d.coord_of(3)[MeshDim::DP] == 3);
}

TEST_CASE("validation names the sizes and the world size", "[parallel_dims]") {
    CHECK_THROWS_WITH(dims_of(2, 1, 1, 2).validate(8), Contains("dp 2 x pp 1 x cp 1 x tp 2") && Contains("need 4 ranks") &&
                                                           Contains("the launch has 8"));
    CHECK_THROWS_WITH(dims_of(4, 1, 0, 1).validate(4), Contains("cp must be at least 1, got 0"));
    CHECK_THROWS_WITH(dims_of(-1, 1, 1, 1).validate(1), Contains("dp must be at least 1, got -1"));
    CHECK_THROWS_WITH(ParallelDims::data_parallel(2).coord_of(2), Contains("rank 2 is not in the mesh"));
    CHECK_NOTHROW(dims_of(2, 2, 2, 2).validate(16));
}

TEST_CASE("tp is innermost, then cp, pp, and dp outermost", "[parallel_dims]") {
    ParallelDims d = dims_of(2, 1, 1, 2);  // 4 ranks: tp pairs {0,1} {2,3}, dp pairs {0,2} {1,3}
    CHECK(d.group_ranks(MeshDim::TP, 0) == std::vector<int>{0, 1});
    CHECK(d.group_ranks(MeshDim::TP, 3) == std::vector<int>{2, 3});
    CHECK(d.group_ranks(MeshDim::DP, 1) == std::vector<int>{1, 3});
    CHECK(d.group_ranks(MeshDim::DP, 2) == std::vector<int>{0, 2});

    // 24 ranks: dp 2 x pp 3 x cp 2 x tp 2. Rank 17 = ((1*3 + 1)*2 + 0)*2 + 1.
    ParallelDims big = dims_of(2, 3, 2, 2);
    MeshCoord c = big.coord_of(17);
    CHECK((c[MeshDim::DP] == 1 && c[MeshDim::PP] == 1 && c[MeshDim::CP] == 0 && c[MeshDim::TP] == 1));
    CHECK(big.group_ranks(MeshDim::TP, 17) == std::vector<int>{16, 17});
    CHECK(big.group_ranks(MeshDim::CP, 17) == std::vector<int>{17, 19});
    CHECK(big.group_ranks(MeshDim::PP, 17) == std::vector<int>{13, 17, 21});
    CHECK(big.group_ranks(MeshDim::DP, 17) == std::vector<int>{5, 17});
}

TEST_CASE("every dimension's groups partition the ranks, and members agree on the group", "[parallel_dims]") {
    ParallelDims d = dims_of(2, 3, 2, 2);
    for (int r = 0; r < 24; r++) CHECK(d.rank_of(d.coord_of(r)) == r);
    for (MeshDim dim : kMeshDims) {
        CAPTURE(mesh_dim_name(dim));
        std::set<int> seen, ids;
        for (int r = 0; r < 24; r++) {
            std::vector<int> group = d.group_ranks(dim, r);
            REQUIRE((int)group.size() == d.size(dim));
            CHECK(group[d.coord_of(r)[dim]] == r);  // a rank's index in its group is its coordinate
            for (int member : group) CHECK(d.group_ranks(dim, member) == group);
            for (int member : group) CHECK(d.group_id(dim, member) == d.group_id(dim, r));
            seen.insert(r);
            ids.insert(d.group_id(dim, r));
        }
        CHECK(seen.size() == 24);
        CHECK((int)ids.size() == 24 / d.size(dim));  // one colour per group
    }
}

TEST_CASE("expert groups are ep consecutive data-parallel ranks; the ranks that hold the same experts, every ep-th",
          "[parallel_dims]") {
    // 8 ranks: dp 4 x tp 2, ep 2. Rank 5 = dp 2, tp 1.
    ParallelDims d = dims_of(4, 1, 1, 2);
    d.ep = 2;
    d.validate(8);
    CHECK(d.expert_group_ranks(5) == std::vector<int>{5, 7});   // dp 2 and 3
    CHECK(d.expert_data_ranks(5) == std::vector<int>{1, 5});    // dp 0 and 2: the same place in their groups
    CHECK(d.expert_group_ranks(0) == std::vector<int>{0, 2});
    CHECK(d.describe() == "dp 4 x pp 1 x cp 1 x tp 2 (ep 2)");
    d.ep = 3;
    CHECK_THROWS_WITH(d.validate(8), Contains("ep must divide the 4 data-parallel ranks"));
}

TEST_CASE("hybrid sharding: shard groups are blocks of dp_shard data ranks with their context ranks, replica groups "
          "the same place in every block",
          "[parallel_dims]") {
    ParallelDims d;  // 16 ranks: dp 4 x cp 2 x tp 2, shard groups of 2 data ranks
    d.dp = 4, d.cp = 2, d.tp = 2, d.dp_shard = 2;
    d.validate(16);
    CHECK(d.hybrid());
    CHECK(d.shard_size() == 2);
    CHECK(d.replicas() == 2);
    // rank 13 = dp 3, cp 0, tp 1: its block is dp 2-3; ZeRO's order is (data place, context)
    CHECK(d.shard_group_ranks(13) == std::vector<int>{9, 11, 13, 15});
    CHECK(d.replica_group_ranks(13) == std::vector<int>{5, 13});  // dp 1 and 3: place 1 of each block
    // the shard groups and the replica groups partition the data x context groups
    for (int r = 0; r < 16; r++) {
        const std::vector<int> shard = d.shard_group_ranks(r), replicas = d.replica_group_ranks(r);
        CHECK(std::count(shard.begin(), shard.end(), r) == 1);
        CHECK(std::count(replicas.begin(), replicas.end(), r) == 1);
        for (int s : shard) CHECK(d.shard_group_ranks(s) == shard);
        for (int s : replicas) CHECK(d.replica_group_ranks(s) == replicas);
    }
    CHECK(d.describe() == "dp 4 x pp 1 x cp 2 x tp 2 (dp shard 2)");
    d.dp_shard = 4;  // the whole data group: flat sharding, one group
    CHECK_FALSE(d.hybrid());
    CHECK(d.shard_group_ranks(13).size() == 8);
    d.dp_shard = 3;
    CHECK_THROWS_WITH(d.validate(16), Contains("dp_shard must divide the 4 data-parallel ranks, got 3"));
}
