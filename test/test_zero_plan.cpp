// ZeRO sharding arithmetic: every bucket is cut into world_size equal slices, padded, and the
// ranks' owned ranges partition each bucket exactly, for any parameter count and world size.
#include <catch2/catch.hpp>

#include "llmc/dist/zero_plan.h"

using namespace llmc;
using Catch::Contains;

TEST_CASE("each bucket is split into equal padded slices whose owned ranges partition it", "[zero]") {
    ModelConfig c = model_preset("d4", 64, 250);  // 250-token vocab: odd sizes everywhere
    c.channels = 35;
    c.num_heads = 5;
    const ParamLayout layout(c);
    for (int world = 1; world <= 5; world++) {
        CAPTURE(world);
        std::vector<size_t> owned(layout.num_params, 0);
        size_t shard_total = 0;
        for (int rank = 0; rank < world; rank++) {
            const ZeroPlan plan(layout, 2, rank, world);
            REQUIRE(plan.buckets.size() == (size_t)layout.num_buckets());
            size_t padded_at = 0, shard_at = 0;
            for (size_t b = 0; b < plan.buckets.size(); b++) {
                const ZeroPlan::Bucket& k = plan.buckets[b];
                CHECK(k.begin == layout.bucket_begin((int)b));
                CHECK(k.size == layout.bucket_size((int)b));
                CHECK(k.padded_extent == k.shard_size * world);
                CHECK(k.padded_extent >= k.size);
                CHECK(k.padded_extent - k.size < (size_t)world);  // padding below one element per rank
                CHECK(k.padded_begin == padded_at);
                CHECK(k.shard_offset == shard_at);
                padded_at += k.padded_extent;
                shard_at += k.shard_size;
                for (size_t i = k.owned_begin; i < k.owned_end; i++) owned[k.begin + i]++;
            }
            CHECK(plan.padded_num_params == padded_at);
            CHECK(plan.shard_num_params == shard_at);
            shard_total += plan.shard_num_params;
        }
        // every real parameter is owned by exactly one rank
        CHECK(std::count(owned.begin(), owned.end(), 1) == (long)layout.num_params);
        CHECK(shard_total == ZeroPlan(layout, 2, 0, world).padded_num_params);
    }
}

TEST_CASE("ZeroPlan rejects a bad stage or rank", "[zero]") {
    const ParamLayout layout(model_preset("d4"));
    REQUIRE_THROWS_WITH(ZeroPlan(layout, 4, 0, 2), Contains("-z (zero_stage) must be 0, 1, 2 or 3, got 4"));
    REQUIRE_THROWS_WITH(ZeroPlan(layout, 1, 2, 2), Contains("rank 2 is not in [0, 2)"));
}
