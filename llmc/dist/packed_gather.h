// packed_gather.h: how a bucket's parameters travel packed in ZeRO-3's all-gather, some of its
// tensors as one byte an element (codes: the FP8 weights, models/cuda/fp8_gather.cuh) and the others
// as they are stored. Pure arithmetic on the ZeRO plan: no memory, no communication.
//
// ZeRO-3 gathers a bucket as equal slices, one per rank (zero_plan.h). Packed, rank r's slice
// becomes a chunk of chunk_bytes: first the codes of its elements that belong to coded tensors, then
// its other elements as stored, each in bucket order. Slices hold different mixes of the two, and an
// all-gather takes equal chunks, so every chunk is as long as the largest mix needs: for GPT-2's
// layers (12 C^2 weight elements, 13 C others) about the slice's element count plus twice C's
// multiples, not twice the slice.
//
// A piece is a run of one slice's elements in one tensor kind (coded tensor t, or the others).
// Packing walks this rank's pieces (shard -> chunk); unpacking the gathered chunks walks every
// rank's: a coded piece lands in the codes buffer (the coded tensors' codes back to back, in bucket
// order), any other in the bucket's gathered buffer at its own offset. Each coded piece starts at
// a 16-byte boundary of its chunk, so a kernel moves it with wide accesses where its other end allows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "llmc/dist/zero_plan.h"
#include "llmc/utils.h"

namespace llmc {

struct ElementRange {
    size_t begin = 0, count = 0;
};

struct PackedPiece {
    size_t begin = 0, count = 0;  // the piece's elements, as bucket offsets
    int coded = -1;               // the coded tensor it is part of (its index in the list), or -1
    size_t packed = 0;            // bytes into its rank's chunk
    // Where unpacking puts it: coded, a byte offset into the codes buffer; else its bucket offset.
    size_t unpacked = 0;
};

struct PackedBucket {
    static constexpr size_t CODE_ALIGN = 16;
    static constexpr size_t aligned(size_t bytes) { return (bytes + CODE_ALIGN - 1) / CODE_ALIGN * CODE_ALIGN; }
    size_t code_bytes = 0;   // the chunk's coded part (the most any slice needs)
    size_t plain_count = 0;  // elements in the chunk's other part (the most any slice holds)
    size_t chunk_bytes = 0;  // code_bytes + plain_count elements, rounded up to CODE_ALIGN
    size_t codes_total = 0;  // the codes buffer: every coded tensor's elements
    std::vector<size_t> codes_at;  // where each coded tensor starts in the codes buffer
    std::vector<std::vector<PackedPiece>> ranks;  // per rank of the bucket's group, its slice's pieces
    // Bytes of the bucket gathered as stored, for comparison: every rank's slice.
    size_t unpacked_bytes = 0;
};

// Bucket k packed: `coded` its coded tensors' element ranges (in bucket order, not overlapping),
// `element_bytes` a stored element's size.
inline PackedBucket plan_packed_bucket(const ZeroPlan::Bucket& k, const std::vector<ElementRange>& coded,
                                       size_t element_bytes) {
    PackedBucket p;
    for (size_t t = 0; t < coded.size(); t++) {
        const ElementRange& c = coded[t];
        if (c.begin + c.count > k.size || (t > 0 && c.begin < coded[t - 1].begin + coded[t - 1].count))
            fail(strformat("plan_packed_bucket: coded range %zu [%zu, %zu) is outside bucket '%s' (%zu elements) or "
                           "overlaps the one before",
                           t, c.begin, c.begin + c.count, k.name.c_str(), k.size));
        p.codes_at.push_back(p.codes_total);
        p.codes_total += c.count;
    }
    p.ranks.resize(k.world_size);
    for (int r = 0; r < k.world_size; r++) {
        const size_t lo = std::min(k.size, (size_t)r * k.shard_size), hi = std::min(k.size, lo + k.shard_size);
        size_t code_cursor = 0, plain = 0;
        auto add_plain = [&](size_t a, size_t z) {
            if (z > a) p.ranks[r].push_back({a, z - a, -1, plain, a}), plain += z - a;
        };
        size_t at = lo;
        for (size_t t = 0; t < coded.size() && at < hi; t++) {
            const size_t a = std::max(at, coded[t].begin), z = std::min(hi, coded[t].begin + coded[t].count);
            if (a >= z) continue;
            add_plain(at, a);
            code_cursor = PackedBucket::aligned(code_cursor);
            p.ranks[r].push_back({a, z - a, (int)t, code_cursor, p.codes_at[t] + (a - coded[t].begin)});
            code_cursor += z - a;
            at = z;
        }
        add_plain(at, hi);
        p.code_bytes = std::max(p.code_bytes, PackedBucket::aligned(code_cursor));
        p.plain_count = std::max(p.plain_count, plain);
    }
    // The plain part follows the coded one: its pieces' offsets were counted in elements.
    for (auto& pieces : p.ranks)
        for (PackedPiece& piece : pieces)
            if (piece.coded < 0) piece.packed = p.code_bytes + piece.packed * element_bytes;
    p.chunk_bytes = PackedBucket::aligned(p.code_bytes + p.plain_count * element_bytes);
    p.unpacked_bytes = k.padded_extent * element_bytes;
    return p;
}

}  // namespace llmc
