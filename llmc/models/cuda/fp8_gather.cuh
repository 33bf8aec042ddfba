// fp8_gather.cuh: ZeRO-3's all-gather of each layer's parameters with the four FP8 weights (qkv,
// attention projection, fc, fc projection) travelling as their E4M3 codes, one byte an element
// instead of bf16's two (--fp8 1 -z 3; --fp8-gather 0 gathers bf16 and casts at every use).
//
// The one idea: a code depends only on the element and its weight's scale, so a rank can encode its
// own slice of a weight before the gather, and every rank receives the codes a cast of the whole
// gathered weight would have made. What the scale needs is the whole weight's amax (current scaling,
// and delayed scaling before its first step's end): each rank measures its slices, and one small
// all-gather of those amaxes (a float per weight and rank) gives every rank the same scales. A
// rank's slice changes only when the parameters do and a scale only at a step's end, so each rank
// packs its slices of every layer once a step (Fp8LinearsCUDA decides when) and every gather of the
// step sends the packed copy. The other parameters of a layer (LayerNorms, biases) travel beside
// the codes as bf16 in the same chunk (dist/packed_gather.h says how a slice is laid out).
//
// This class is the mechanics: the packing tables, the buffers and the kernel launches
// (kernels/fp8.cuh). Fp8LinearsCUDA owns it, gives it the scales, and is the engine's GatherCodec.
// Unpacking a gathered layer writes its weights' codes into one of two code buffers, the one that
// belongs to the engine's gather buffer the layer arrived in; the backward's transposed copy is made
// from the codes at each use (fp8_transpose).
#pragma once

#include <algorithm>
#include <vector>

#include "llmc/dist/packed_gather.h"
#include "llmc/dist/zero_plan.h"
#include "llmc/numerics/fp8.h"
#include "llmc/kernels/fp8.cuh"
#include "llmc/models/family.h"
#include "llmc/params/layout.h"

namespace llmc {

// A block's four FP8 products' weights (numerics/fp8.h's Fp8Product order: qkv, attention
// projection, the MLP's input and output products) as the model's family names them (family.h's
// BlockTensors: GPT-2's qkvw, attprojw, fcw, fcprojw; Llama's wq, wo, wgateup, wdown), with each
// product's elements in a layer (OC x C; Llama's qkv product is wq and wkv, adjacent in every
// layout, so more than its first tensor's size).
struct Fp8BlockWeights {
    int tensor[FP8_PRODUCTS] = {};
    size_t size[FP8_PRODUCTS] = {};
    Fp8BlockWeights() = default;
    explicit Fp8BlockWeights(const ModelConfig& c) : Fp8BlockWeights(block_tensors(c), BlockWidths(c), c.channels) {}
    Fp8BlockWeights(const BlockTensors& t, const BlockWidths& w, size_t C)
        : tensor{t.qkv_w, t.attproj_w, t.up_w, t.down_w}, size{w.qkv * C, C * C, w.up * C, C * w.hidden} {}
    size_t per_layer() const { return before(FP8_PRODUCTS); }
    // The elements of the products before p in a layer (where p's copy starts).
    size_t before(int p) const {
        size_t n = 0;
        for (int q = 0; q < p; q++) n += size[q];
        return n;
    }
    size_t largest() const { return *std::max_element(size, size + FP8_PRODUCTS); }
};

class Fp8WeightGather {
public:
    Fp8WeightGather() = default;
    // Every layer bucket of `plan` (over `layout`, a whole dense model's, whose FP8 weights are
    // `weights`), on the model's stream.
    Fp8WeightGather(const ParamLayout& layout, const Fp8BlockWeights& weights, const ZeroPlan& plan,
                    cudaStream_t stream)
        : layers_(layout.num_layers()), stream_(stream) {
        plan_buckets(layout, weights, plan, &buckets_);
        std::vector<Fp8Piece> pack, unpack;
        for (int b = 0; b < (int)buckets_.size(); b++) {
            Bucket& bk = buckets_[b];
            if (bk.layer < 0) continue;
            const ZeroPlan::Bucket& k = plan.buckets[b];
            bk.unpack_at = (int)unpack.size();
            for (int r = 0; r < k.world_size; r++)
                for (const PackedPiece& p : bk.plan.ranks[r]) {
                    const int32_t tensor = p.coded < 0 ? -1 : bk.layer * FP8_PRODUCTS + p.coded;
                    const size_t at = (size_t)r * bk.plan.chunk_bytes + p.packed;
                    unpack.push_back({at, p.unpacked, p.count, tensor});
                    bk.largest_unpack = std::max(bk.largest_unpack, p.count);
                    if (r != k.rank) continue;
                    const size_t in_shard = k.shard_offset + (p.begin - (size_t)k.rank * k.shard_size);
                    pack.push_back({in_shard, bk.packed_at + p.packed, p.count, tensor});
                    largest_pack_ = std::max(largest_pack_, p.count);
                }
            bk.unpack_count = (int)unpack.size() - bk.unpack_at;
        }
        const Sizes sizes = sizes_of(buckets_, plan);
        pack_count_ = (int)pack.size();
        pieces_ = DeviceBuffer<Fp8Piece>(pack.size() + unpack.size(), "FP8 gather's pieces");  // sizes.pieces
        pack.insert(pack.end(), unpack.begin(), unpack.end());
        CUDA_CHECK(cudaMemcpy(pieces_.get(), pack.data(), sizeof(Fp8Piece) * pack.size(), cudaMemcpyHostToDevice));
        packed_ = DeviceBuffer<uint8_t>(sizes.packed, "FP8 gather's packed slices");
        for (int i = 0; i < 2; i++) {
            landing_[i] = DeviceBuffer<uint8_t>(sizes.landing, "FP8 gather's landing buffer");
            codes_[i] = DeviceBuffer<uint8_t>(sizes.codes, "FP8 gathered weights");
        }
    }
    Fp8WeightGather(Fp8WeightGather&&) = default;
    Fp8WeightGather& operator=(Fp8WeightGather&&) = default;

    // Device bytes the constructor allocates for this layout and plan (the memory plan's line).
    static size_t device_bytes(const ParamLayout& layout, const Fp8BlockWeights& weights, const ZeroPlan& plan) {
        std::vector<Bucket> buckets;
        plan_buckets(layout, weights, plan, &buckets);
        const Sizes s = sizes_of(buckets, plan);
        return s.packed + 2 * (s.landing + s.codes) + s.pieces * sizeof(Fp8Piece);
    }
    // What one rank's gathers of every layer send less than bf16 would: (ranks - 1) chunks' worth
    // each, as a ring all-gather sends them (the planner's bytes).
    static double bytes_saved(const ParamLayout& layout, const Fp8BlockWeights& weights, const ZeroPlan& plan) {
        std::vector<Bucket> buckets;
        plan_buckets(layout, weights, plan, &buckets);
        double saved = 0;
        for (int b = 0; b < (int)buckets.size(); b++)
            if (buckets[b].layer >= 0) {
                const ZeroPlan::Bucket& k = plan.buckets[b];
                saved += (k.world_size - 1.0) * ((double)k.shard_size * sizeof(floatX) - (double)buckets[b].plan.chunk_bytes);
            }
        return saved;
    }
    // Bytes one rank sends in a layer's gather, packed and as bf16 (the largest layer's; for the logs).
    static std::pair<size_t, size_t> chunk_bytes(const ParamLayout& layout, const Fp8BlockWeights& weights,
                                                 const ZeroPlan& plan) {
        std::vector<Bucket> buckets;
        plan_buckets(layout, weights, plan, &buckets);
        std::pair<size_t, size_t> most{0, 0};
        for (int b = 0; b < (int)buckets.size(); b++)
            if (buckets[b].layer >= 0)
                most = std::max(most, {buckets[b].plan.chunk_bytes, plan.buckets[b].shard_size * sizeof(floatX)});
        return most;
    }

    size_t allocated_bytes() const {
        return pieces_.bytes() + packed_.bytes() + landing_[0].bytes() + landing_[1].bytes() + codes_[0].bytes() +
               codes_[1].bytes();
    }

    bool packs(int bucket) const { return bucket >= 0 && bucket < (int)buckets_.size() && buckets_[bucket].layer >= 0; }
    size_t chunk_bytes(int bucket) const { return at(bucket).plan.chunk_bytes; }
    // This rank's packed slice of the bucket (as pack() last left it).
    const uint8_t* packed(int bucket) const { return packed_.get() + at(bucket).packed_at; }
    // Where the next gather into buffer `buffer` lands: the layer its codes held is no longer there.
    uint8_t* landing(int buffer) {
        unpacked_[check_buffer(buffer)] = -1;
        return landing_[buffer].get();
    }
    int tensors() const { return layers_ * FP8_PRODUCTS; }

    // amax[l * 4 + p] (layers x products, zeroed here): the largest |element| of this rank's slices
    // of layer l's weight p, from `shard` (the engine's bf16 parameter shard).
    void measure(const floatX* shard, float* amax) {
        CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float) * tensors(), stream_));
        fp8_pieces_amax(pieces_.get(), pack_count_, largest_pack_, shard, amax, stream_);
    }
    // Packs this rank's slice of every layer from `shard`: weight (l, p) encoded with
    // scales[(l * 4 + p) * stride]'s scale, its amax joining that scale's step amax where
    // `record_amax`, what it clipped counted into clips[l * 4 + p] (zeroed here).
    void pack(const floatX* shard, Fp8Scale* scales, int stride, Fp8Clip* clips, bool record_amax) {
        CUDA_CHECK(cudaMemsetAsync(clips, 0, sizeof(Fp8Clip) * tensors(), stream_));
        const float largest = fp8::info(fp8::Format::E4M3).largest;
        fp8_pack({pieces_.get(), shard, packed_.get(), scales, stride, clips, largest, record_amax}, pack_count_,
                 largest_pack_, stream_);
    }
    // The bucket's gathered chunks (in landing buffer `buffer`) unpacked: its weights' codes into
    // that buffer's code buffer, its other parameters into `whole` (its bf16 gather buffer).
    void unpack(int bucket, int buffer, floatX* whole) {
        const Bucket& bk = at(bucket);
        check_buffer(buffer);
        fp8_unpack(pieces_.get() + pack_count_ + bk.unpack_at, bk.unpack_count, bk.largest_unpack,
                   landing_[buffer].get(), codes_[buffer].get(), whole, stream_);
        unpacked_[buffer] = bucket;
        if (unpacked_[1 - buffer] == bucket) unpacked_[1 - buffer] = -1;  // an older copy: never the one to read
    }
    // Layer l's weight p as E4M3 codes (OC x C, row-major), from its last unpacking; the layer must be
    // the one its buffer holds (the engine keeps it while the model holds the layer).
    uint8_t* codes(int layer, Fp8Product p) {
        for (int i = 0; i < 2; i++)
            if (unpacked_[i] >= 0 && buckets_[unpacked_[i]].layer == layer)
                return codes_[i].get() + buckets_[unpacked_[i]].plan.codes_at[p];
        fail(strformat("Fp8WeightGather: layer %d's weights were not gathered (acquire its bucket first)", layer));
    }
    // The engine dropped its gathered buffers: no code buffer holds a layer any more.
    void forget() { unpacked_[0] = unpacked_[1] = -1; }

private:
    struct Bucket {
        int layer = -1;  // the layer whose parameters it is, or -1: not packed
        PackedBucket plan;
        size_t packed_at = 0, largest_unpack = 0;
        int unpack_at = 0, unpack_count = 0;  // its pieces in the unpacking table
    };

    // Each bucket of the plan: a layer's packed, with its four weights coded, its packed slice after
    // the layer before's; the others not.
    static void plan_buckets(const ParamLayout& layout, const Fp8BlockWeights& fp8, const ZeroPlan& plan,
                             std::vector<Bucket>* out) {
        out->assign(plan.buckets.size(), {});
        size_t packed_at = 0;
        for (int l = 0; l < layout.num_layers(); l++) {
            Bucket& bk = (*out)[layout.layer_bucket(l)];
            std::vector<ElementRange> weights;
            for (int p = 0; p < FP8_PRODUCTS; p++)
                weights.push_back({layout.offset_in_bucket(fp8.tensor[p], l), fp8.size[p]});
            bk.layer = l;
            bk.plan = plan_packed_bucket(plan.buckets[layout.layer_bucket(l)], weights, sizeof(floatX));
            bk.packed_at = packed_at;
            packed_at += bk.plan.chunk_bytes;
        }
    }
    // What the constructor allocates: every layer's packed slice, the largest layer's gathered
    // chunks and codes (one landing and one code buffer of each), and the pieces (this rank's
    // packing ones, every rank's unpacking ones).
    struct Sizes {
        size_t packed = 0, landing = 0, codes = 0, pieces = 0;
    };
    static Sizes sizes_of(const std::vector<Bucket>& buckets, const ZeroPlan& plan) {
        Sizes s;
        for (int b = 0; b < (int)buckets.size(); b++) {
            const Bucket& bk = buckets[b];
            if (bk.layer < 0) continue;
            s.packed += bk.plan.chunk_bytes;
            s.landing = std::max(s.landing, bk.plan.chunk_bytes * plan.buckets[b].world_size);
            s.codes = std::max(s.codes, bk.plan.codes_total);
            for (size_t r = 0; r < bk.plan.ranks.size(); r++)
                s.pieces += bk.plan.ranks[r].size() * (r == (size_t)plan.buckets[b].rank ? 2 : 1);
        }
        return s;
    }
    const Bucket& at(int bucket) const {
        if (!packs(bucket)) fail(strformat("Fp8WeightGather: bucket %d is not a layer's", bucket));
        return buckets_[bucket];
    }
    static int check_buffer(int buffer) {
        if (buffer < 0 || buffer > 1) fail(strformat("Fp8WeightGather: gather buffer %d, expected 0 or 1", buffer));
        return buffer;
    }

    int layers_ = 0;
    cudaStream_t stream_ = nullptr;
    std::vector<Bucket> buckets_;
    DeviceBuffer<Fp8Piece> pieces_;  // this rank's packing pieces (pack_count_ of them), then every bucket's unpacking
    int pack_count_ = 0;
    size_t largest_pack_ = 0;
    DeviceBuffer<uint8_t> packed_, landing_[2], codes_[2];
    int unpacked_[2] = {-1, -1};  // the bucket each code buffer holds
};

}  // namespace llmc
