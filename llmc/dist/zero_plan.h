// zero_plan.h: how ZeRO cuts the flat buffers among ranks (pure arithmetic, no memory, no comm).
//
// The flat parameter buffer is bucket-major (params/layout.h): each bucket the model's parameter
// table declares (GPT-2: the embeddings, each transformer layer, the final LayerNorm) is
// contiguous. Each bucket is sharded ON ITS OWN: it is padded to a multiple of the world size and
// rank r owns the r-th of world_size equal slices. So
// a bucket's gradients can be reduce-scattered the moment backward finishes that layer, and a
// layer's parameters can be all-gathered just before it runs, each as one collective of equal
// counts (which NCCL requires). Any parameter count works on any world size; the padding is at
// most world_size - 1 elements per bucket and is always zero.
//
// shard_align rounds every slice up to a multiple of that many elements (the CUDA model uses 8, so
// every bucket and slice starts 16 bytes aligned in bf16 buffers, as its vector loads need).
//
// Expert parallelism: a layer's expert bucket (ParamLayout::is_expert_bucket) holds this rank's
// block of the experts, which only the data-parallel ranks with the same block hold too (its expert
// data group, expert_world_size of them): such a bucket is sharded over that group, the others over
// the whole data-parallel group. Without expert parallelism both groups are the same.
//
// A rank's shard is the concatenation of its slices of every bucket, stored compactly (shard
// buffers: AdamW moments, master weights, sharded gradients and parameters). Full-size buffers use
// the padded layout (padded_begin), so a bucket's slices sit back to back as collectives expect.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "llmc/params/layout.h"
#include "llmc/utils.h"

namespace llmc {

struct ZeroPlan {
    struct Bucket {
        size_t begin = 0, size = 0;  // the bucket in the unpadded ParamLayout flat buffer
        size_t padded_begin = 0;     // the bucket in padded full-size buffers, world_size * shard_size long
        size_t shard_size = 0;       // elements each rank owns: ceil(size / world_size), rounded to shard_align
        size_t padded_extent = 0;    // world_size * shard_size
        size_t shard_offset = 0;     // where this rank's slice sits in the compact shard buffers
        // This rank's slice of the bucket's real (unpadded) elements, relative to the bucket start.
        size_t owned_begin = 0, owned_end = 0;
        // Kept whole for a pass under ZeRO-3, with a gradient buffer of its own under ZeRO-2 (see
        // BucketGroup); the other buckets take turns in two rotating buffers.
        bool resident = false;
        bool experts = false;  // sharded over the expert data group
        int rank = 0, world_size = 1;  // this rank in the group the bucket is sharded over, and its size
        std::string name;  // its bucket group's, for the memory plan
    };

    int stage = 0;
    int rank = 0;
    int world_size = 1;
    int expert_rank = 0, expert_world_size = 1;  // in the expert data group (expert buckets' sharding)
    std::vector<Bucket> buckets;
    size_t padded_num_params = 0;  // length of padded full-size buffers
    size_t shard_num_params = 0;   // length of this rank's compact shard buffers

    // expert_rank_ / expert_world_size_ < 0: the expert data group is the data-parallel group.
    ZeroPlan(const ParamLayout& layout, int stage_, int rank_, int world_size_, size_t shard_align = 1,
             int expert_rank_ = -1, int expert_world_size_ = -1)
        : stage(stage_), rank(rank_), world_size(world_size_), expert_rank(expert_rank_ < 0 ? rank_ : expert_rank_),
          expert_world_size(expert_world_size_ < 0 ? world_size_ : expert_world_size_) {
        if (shard_align < 1) fail("ZeroPlan: shard_align must be >= 1");
        if (stage < 0 || stage > 3) fail(strformat("-z (zero_stage) must be 0, 1, 2 or 3, got %d", stage));
        if (world_size < 1 || rank < 0 || rank >= world_size)
            fail(strformat("ZeroPlan: rank %d is not in [0, %d)", rank, world_size));
        if (expert_world_size < 1 || expert_rank < 0 || expert_rank >= expert_world_size)
            fail(strformat("ZeroPlan: expert data rank %d is not in [0, %d)", expert_rank, expert_world_size));
        for (int b = 0; b < layout.num_buckets(); b++) {
            Bucket k;
            k.begin = layout.bucket_begin(b);
            k.size = layout.bucket_size(b);
            k.experts = layout.is_expert_bucket(b);
            k.rank = k.experts ? expert_rank : rank;
            k.world_size = k.experts ? expert_world_size : world_size;
            k.shard_size = (k.size + k.world_size - 1) / k.world_size;
            k.shard_size = (k.shard_size + shard_align - 1) / shard_align * shard_align;
            k.padded_extent = k.shard_size * k.world_size;
            k.padded_begin = padded_num_params;
            k.shard_offset = shard_num_params;
            k.owned_begin = std::min(k.size, (size_t)k.rank * k.shard_size);
            k.owned_end = std::min(k.size, (size_t)(k.rank + 1) * k.shard_size);
            k.resident = layout.is_resident(b);
            k.name = layout.bucket_name(b);
            padded_num_params += k.padded_extent;
            shard_num_params += k.shard_size;
            buckets.push_back(k);
        }
    }

    // The rotating buffers' size: the largest bucket that is not resident (0 when all are), whole
    // (padded_extent) or one rank's slice (shard_size).
    size_t rotating_extent() const { return rotating_max(&Bucket::padded_extent); }
    size_t rotating_shard_size() const { return rotating_max(&Bucket::shard_size); }
    // The name of the rotating buckets' group ("layers"), for the memory plan.
    std::string rotating_name() const {
        for (const Bucket& k : buckets)
            if (!k.resident) return k.name;
        return "";
    }

    bool shards_optimizer() const { return stage >= 1; }
    bool shards_gradients() const { return stage >= 2; }
    bool shards_parameters() const { return stage >= 3; }

private:
    size_t rotating_max(size_t Bucket::*field) const {
        size_t most = 0;
        for (const Bucket& k : buckets)
            if (!k.resident) most = std::max(most, k.*field);
        return most;
    }
};

}  // namespace llmc
