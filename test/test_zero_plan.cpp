// ZeRO sharding arithmetic: every bucket is cut into world_size equal slices, padded, and the
// ranks' owned ranges partition each bucket exactly, for any parameter count and world size.
#include <catch2/catch.hpp>

#include "llmc/ckpt/manifest.h"
#include "llmc/dist/packed_gather.h"
#include "llmc/dist/zero_plan.h"
#include "llmc/dist/host_memory.h"
#include "llmc/dist/zero.h"
#include "llmc/models/gpt2/params.h"

using namespace llmc;
using Catch::Contains;

TEST_CASE("each bucket is split into equal padded slices whose owned ranges partition it", "[zero]") {
    ModelConfig c = model_preset("d4", 64, 250);  // 250-token vocab: odd sizes everywhere
    c.channels = 35;
    c.num_heads = 5;
    const ParamLayout layout = GPT2Params::layout(c);
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
    const ParamLayout layout = GPT2Params::layout(model_preset("d4"));
    REQUIRE_THROWS_WITH(ZeroPlan(layout, 4, 0, 2), Contains("-z (zero_stage) must be 0, 1, 2 or 3, got 4"));
    REQUIRE_THROWS_WITH(ZeroPlan(layout, 1, 2, 2), Contains("rank 2 is not in [0, 2)"));
}

// A table unlike GPT-2's: an untied output head in a resident bucket of its own, between the layers
// and a final norm that is the last bucket but not resident. Which buckets ZeRO keeps whole must
// follow the table's property, not the bucket's position (first or last).
static ParamTable untied_head_table() {
    ParamTable t;
    t.num_layers = 3;
    t.groups = {{"embeddings", false, true}, {"layers", true, false}, {"output head", false, true},
                {"final norm", false, false}};
    const ParamInit ones{InitRule::Ones};
    t.tensors = {{"wte", {10, 4}, 0, true, ones},     {"w", {4, 4}, 1, true, ones},
                 {"b", {4}, 1, false, ones},           {"lnf", {4}, 3, false, ones},
                 {"head", {12, 4}, 2, true, ones}};
    return t;
}

TEST_CASE("a parameter table's own groups, sizes, file order and decay make the layout", "[zero]") {
    const ParamLayout layout(untied_head_table());
    REQUIRE(layout.num_buckets() == 6);  // embeddings, 3 layers, head, final norm
    CHECK(layout.num_params == 40 + 3 * 20 + 4 + 48);
    CHECK(layout.bucket_of(4) == 4);
    CHECK(layout.bucket_of(3) == 5);
    CHECK(layout.bucket_of(1, 2) == layout.layer_bucket(2));
    CHECK(layout.layer_bucket(0) == 1);
    CHECK(layout.offset(2, 1) == 40 + 20 + 16);     // layer 1's b, after its w
    CHECK(layout.file_offset(2, 1) == 40 + 48 + 4);  // file: wte, every layer's w, then b
    CHECK(layout.file_offset(4) == 40 + 48 + 12 + 4);  // file: table order, head after lnf
    CHECK(layout.offset(3) == 40 + 60 + 48);            // memory: bucket order, lnf after head
    CHECK((layout.is_resident(0) && layout.is_resident(4) && !layout.is_resident(5)));
    CHECK((layout.is_decayed(4) && !layout.is_decayed(3)));
    CHECK(layout.bucket_name(4) == "output head");
    ParamTable bad = untied_head_table();
    bad.tensors[1].group = 7;
    REQUIRE_THROWS_WITH(ParamLayout(bad), Contains("tensor w names bucket group 7, not in [0, 4)"));
}

TEST_CASE("ZeRO keeps whole the buckets the table marks resident, wherever they are", "[zero]") {
    const ParamLayout layout(untied_head_table());
    const ZeroPlan plan(layout, 3, 1, 2);
    std::vector<std::string> names;
    size_t gathered = 0;
    for (const BufferSpec& s : buffer_specs(plan)) {
        names.push_back(s.name);
        if (s.kind == MemoryKind::Parameters && s.name != "parameter shard") gathered += s.count;
    }
    CHECK(std::count(names.begin(), names.end(), "gathered embeddings") == 1);
    CHECK(std::count(names.begin(), names.end(), "gathered output head") == 1);
    CHECK(std::count(names.begin(), names.end(), "gathered final norm") == 0);  // not resident: it rotates
    CHECK(std::count(names.begin(), names.end(), "gathered layers (2)") == 1);
    // resident: embeddings (40) and head (48) whole; two rotating buffers the size of the largest
    // other bucket (a layer's 20), each padded to the 2 ranks
    CHECK(gathered == 40 + 48 + 2 * 20);
    CHECK(plan.rotating_extent() == 20);
    CHECK(plan.rotating_name() == "layers");
}

TEST_CASE("the ZeRO-3 engine serves a table's resident and rotating buckets through a BucketView", "[zero]") {
    const ParamLayout layout(untied_head_table());
    HostMemory memory;
    ZeroEngine<HostMemory> engine(layout, ZeroPlan(layout, 3, 0, 1), local_communicator(), memory);
    std::vector<float> full(layout.num_params);
    for (size_t i = 0; i < full.size(); i++) full[i] = (float)i;
    engine.set_params(full.data());
    BucketView<HostMemory> view(layout, engine);
    using Walk = BucketView<HostMemory>::Direction;
    view.acquire_resident();
    for (int l = 0; l < layout.num_layers(); l++) {
        view.enter_layer(l, Walk::Forward);
        CHECK(view.param(1, l)[0] == (float)layout.offset(1, l));
        view.leave_layer(l, Walk::Forward);
    }
    // the resident buckets stay gathered across the layers; the final norm rotates in on demand
    CHECK(view.param(0)[5] == 5.0f);
    CHECK(view.param(4)[0] == (float)layout.offset(4));
    view.acquire(layout.bucket_of(3), -1);
    CHECK(view.param(3)[0] == (float)layout.offset(3));
    view.release_all();
}

// Layers of two kinds (a mixture-of-experts model whose middle layer has experts in place of the
// MLP): "w" in every layer, "mlp" in layers of kind 0, "experts" in those of kind 1.
static ParamTable two_kind_table() {
    ParamTable t = untied_head_table();
    const ParamInit ones{InitRule::Ones};
    t.layer_kinds = {0, 1, 0};
    t.tensors = {{"wte", {10, 4}, 0, true, ones},
                 {"w", {4, 4}, 1, true, ones},
                 {"mlp", {6}, 1, false, ones, {}, 0},
                 {"experts", {2, 5}, 1, true, ones, {}, 1},
                 {"lnf", {4}, 3, false, ones},
                 {"head", {12, 4}, 2, true, ones}};
    return t;
}

TEST_CASE("layers of different kinds: each bucket holds its kind's tensors, the file each tensor's own layers", "[zero]") {
    const ParamLayout layout(two_kind_table());
    CHECK(layout.bucket_size(layout.layer_bucket(0)) == 16 + 6);
    CHECK(layout.bucket_size(layout.layer_bucket(1)) == 16 + 10);
    CHECK(layout.bucket_size(layout.layer_bucket(2)) == 16 + 6);
    CHECK(layout.num_params == 40 + 22 + 26 + 22 + 48 + 4);
    CHECK((layout.has(2, 0) && !layout.has(2, 1) && layout.has(3, 1) && !layout.has(3, 2)));
    CHECK(layout.offset(3, 1) == 40 + 22 + 16);  // layer 1's experts, after its w
    CHECK(layout.offset(2, 2) == 40 + 22 + 26 + 16);
    REQUIRE_THROWS_WITH(layout.offset(3, 0), Contains("layer 0 has no experts (a tensor of layer kind 1)"));
    // file: wte, w of 3 layers, mlp of layers 0 and 2, experts of layer 1, lnf, head
    CHECK(layout.file_offset(2, 2) == 40 + 48 + 6);
    CHECK(layout.file_offset(3, 1) == 40 + 48 + 12);
    CHECK(layout.file_offset(4) == 40 + 48 + 12 + 10);
    size_t segments = 0, covered = 0;
    for (const ParamLayout::Segment& s : layout.segments()) segments++, covered += s.end - s.begin;
    CHECK(segments == 1 + 3 + 2 + 1 + 2);  // wte; w, mlp and experts; lnf and head
    CHECK(covered == layout.num_params);
    // the manifest's shapes count each tensor's own layers; ZeRO's rotating buffers fit the largest
    const std::vector<ManifestTensor> tensors = manifest_tensors(layout);
    CHECK(tensors[2].shape == std::vector<size_t>{2, 6});
    CHECK(tensors[3].shape == std::vector<size_t>{1, 2, 5});
    const ZeroPlan plan(layout, 3, 0, 2);
    CHECK(plan.rotating_extent() == 26);
    ParamTable bad = two_kind_table();
    bad.tensors[3].layer_kind = 2;
    REQUIRE_THROWS_WITH(ParamLayout(bad), Contains("tensor experts of layer kind 2 must be per-layer"));
    bad = two_kind_table();
    bad.layer_kinds = {0, 1};
    REQUIRE_THROWS_WITH(ParamLayout(bad), Contains("layer_kinds names 2 layers, the table has 3"));
}

TEST_CASE("expert parallelism: a MoE layer's experts are a bucket of their own, a block of them per rank, "
          "sharded over the expert data group", "[zero]") {
    ModelConfig c = model_preset("d4", 64, 256);
    c.num_layers = 2, c.num_experts = 4, c.moe_top_k = 2, c.moe_every = 2;
    const ParamLayout whole = GPT2Params::layout(c), half = GPT2Params::layout(c, {}, {}, {1, 2});
    using P = GPT2Params;
    CHECK(whole.expert_bucket(0) == -1);
    REQUIRE(half.expert_bucket(1) >= 0);
    CHECK(half.is_expert_bucket(half.expert_bucket(1)));
    CHECK(half.bucket_of(P::EFCW, 1) == half.expert_bucket(1));
    CHECK(half.bucket_of(P::ROUTERW, 1) == half.layer_bucket(1));  // the router stays with the layer, on every rank
    CHECK(2 * half.bucket_size(half.expert_bucket(1)) == whole.bucket_size(whole.expert_bucket(1)));
    CHECK(!half.is_whole());
    // rank 1 of 2 holds experts 2 and 3: its first efcw element is expert 2's first
    const auto runs = half.split_runs(P::EFCW, 0, half.tensor_size(P::EFCW));
    REQUIRE(runs.size() == 1);
    CHECK(runs[0].global == 2 * (size_t)4 * c.channels * c.channels);
    // ZeRO over 4 data-parallel ranks, the experts over the 2 that hold the same (expert data rank 1)
    const ZeroPlan plan(half, 1, 3, 4, 1, 1, 2);
    for (const ZeroPlan::Bucket& k : plan.buckets) {
        CHECK(k.world_size == (k.experts ? 2 : 4));
        CHECK(k.rank == (k.experts ? 1 : 3));
    }
    CHECK_THROWS_WITH(GPT2Params::layout(c, {}, {}, {0, 3}), Contains("divisible by the 3 expert-parallel ranks"));
}

namespace {
// A stand-in for the kernels (fp8_pack, fp8_unpack): element i of a bucket stores stored(i) and codes to code(i).
uint16_t stored(size_t i) { return (uint16_t)(i * 7 + 1); }
uint8_t code(size_t i) { return (uint8_t)(i * 31 + 7); }

// Every rank packs its slice of bucket k into its chunk (p's layout), the chunks back to back as an
// all-gather leaves them; each rank's pieces must cover its slice's real elements in order, no byte
// packed twice, the codes 16-byte aligned.
std::vector<uint8_t> pack_and_gather(const ZeroPlan::Bucket& k, const PackedBucket& p) {
    std::vector<uint8_t> gathered(k.world_size * p.chunk_bytes, 0xEE);
    for (int r = 0; r < k.world_size; r++) {
        std::vector<int> used(p.chunk_bytes, 0);
        size_t next = (size_t)r * k.shard_size;
        for (const PackedPiece& piece : p.ranks[r]) {
            CHECK(piece.begin == next);
            next = piece.begin + piece.count;
            const size_t width = piece.coded < 0 ? 2 : 1;
            REQUIRE(piece.packed + piece.count * width <= p.chunk_bytes);
            if (piece.coded >= 0) CHECK(piece.packed % PackedBucket::CODE_ALIGN == 0);
            for (size_t j = 0; j < piece.count; j++) {
                uint8_t* at = &gathered[r * p.chunk_bytes + piece.packed + j * width];
                const uint16_t value = stored(piece.begin + j);
                if (piece.coded >= 0) *at = code(piece.begin + j);
                else memcpy(at, &value, 2);
                for (size_t w = 0; w < width; w++) used[piece.packed + j * width + w]++;
            }
        }
        CHECK(next == std::min(k.size, (size_t)(r + 1) * k.shard_size));
        CHECK(*std::max_element(used.begin(), used.end()) <= 1);
    }
    return gathered;
}

// Every rank's pieces unpacked from the gathered chunks: the codes into `codes`, the rest in place
// in `whole`; every real element of the bucket written exactly once.
void unpack_all(const ZeroPlan::Bucket& k, const PackedBucket& p, const std::vector<uint8_t>& gathered,
                std::vector<uint8_t>& codes, std::vector<uint16_t>& whole) {
    std::vector<int> written(k.size, 0);
    for (int r = 0; r < k.world_size; r++)
        for (const PackedPiece& piece : p.ranks[r])
            for (size_t j = 0; j < piece.count; j++) {
                const uint8_t* from = &gathered[r * p.chunk_bytes + piece.packed + j * (piece.coded < 0 ? 2 : 1)];
                if (piece.coded >= 0) codes.at(piece.unpacked + j) = *from;
                else memcpy(&whole.at(piece.unpacked + j), from, 2);
                written[piece.begin + j]++;
            }
    CHECK(std::count(written.begin(), written.end(), 1) == (long)k.size);
}
}  // namespace

TEST_CASE("a packed ZeRO-3 gather carries every element of a layer once: its weights as codes, the rest as stored",
          "[zero]") {
    for (int channels : {35, 64}) {
        ModelConfig c = model_preset("d4", 64, 250);
        c.channels = channels;
        c.num_heads = channels == 64 ? 2 : 5;
        const ParamLayout layout = GPT2Params::layout(c);
        for (size_t align : {1, 8})
            for (int world = 1; world <= 5; world++) {
                CAPTURE(channels, align, world);
                const int b = layout.layer_bucket(1);
                std::vector<ElementRange> coded;
                for (int t : GPT2Params::LINEAR_WEIGHTS)
                    coded.push_back({layout.offset_in_bucket(t, 1), layout.tensor_size(t)});
                const ZeroPlan plan(layout, 3, 0, world, align);
                const ZeroPlan::Bucket& k = plan.buckets[b];
                const PackedBucket p = plan_packed_bucket(k, coded, 2);
                REQUIRE(p.ranks.size() == (size_t)world);
                CHECK(p.chunk_bytes % PackedBucket::CODE_ALIGN == 0);
                std::vector<uint8_t> codes(p.codes_total, 0);
                std::vector<uint16_t> whole(k.padded_extent, 0);
                unpack_all(k, p, pack_and_gather(k, p), codes, whole);
                for (size_t t = 0; t < coded.size(); t++)
                    for (size_t j = 0; j < coded[t].count; j++)
                        if (codes[p.codes_at[t] + j] != code(coded[t].begin + j)) FAIL("weight " << t << " code " << j);
                size_t plain = 0;
                for (size_t i = 0, t = 0; i < k.size; i++) {
                    while (t < coded.size() && i >= coded[t].begin + coded[t].count) t++;
                    if (t < coded.size() && i >= coded[t].begin) continue;
                    plain++;
                    if (whole[i] != stored(i)) FAIL("element " << i << " of the bucket");
                }
                CHECK(p.codes_total + plain == k.size);
                // about a byte a weight: at most the bf16 gather's 0.55 (C 35's few weights: 0.6)
                CHECK((double)p.chunk_bytes * world / (double)p.unpacked_bytes < (channels == 64 ? 0.55 : 0.6));
            }
    }
    CHECK_THROWS_WITH(plan_packed_bucket(ZeroPlan(GPT2Params::layout(model_preset("d4")), 3, 0, 2).buckets[1],
                                         {{10, 5}, {12, 5}}, 2),
                      Contains("overlaps the one before"));
}
