// params/layout.h: what a model declares about its parameters (ParamTable) and where each one then
// sits in the flat buffers and in a model file (ParamLayout). Nothing here knows GPT-2: a model
// lists its tensors (models/gpt2/params.h is GPT-2's list), and the layout, the initialisation
// (params/init.h), the model file, the optimizer, ZeRO's plan and the --plan printout all read
// that one list, so they cannot disagree.
//
// Parameters, gradients, AdamW moments and master weights each live in ONE flat buffer, laid out
// bucket-major: the table names its bucket groups in order (GPT-2: the embeddings, the layers, the
// final LayerNorm), a per-layer group becomes one bucket per layer, and a bucket holds its tensors
// (for a per-layer group, that layer's slice of each) back to back in table order. ZeRO works
// bucket by bucket ("layer l's gradients are ready", "gather layer l's parameters"), and
// bucket-major makes each of those one contiguous range. Model files keep the table's own order,
// tensor-major (llm.c's: each per-layer tensor holds all layers back to back); file_offset() says
// where a slice sits there.
//
// Tensor parallelism: a table's shapes are always the whole (global) tensor's, and a tensor may say
// how it is cut over the ranks of a tensor-parallel group (TensorSplit: by rows, in `parts` equal
// blocks each cut alike, as the fused q|k|v rows are; or by columns). A layout made for rank r of a
// group of n (TpShard) holds only rank r's piece of each split tensor, so its flat buffers are
// 1/n of those tensors and whole copies of the others; split_runs() says where each local element
// sits in the global tensor, and copy_between_layouts() moves values between a whole-model layout
// and a rank's.
//
// Layers of different kinds: a table may give each layer a kind (ParamTable::layer_kinds: a mixture-
// of-experts model whose every N-th block has experts in place of the MLP), and a per-layer tensor
// may belong to one kind only (TensorSpec::layer_kind). A layer's bucket then holds the tensors of
// its kind, so buckets of different kinds differ in size, and a model file stores such a tensor for
// the layers that have it, back to back.
//
// Expert parallelism: a tensor may hold one slice per expert of a mixture-of-experts block
// (TensorSpec::per_expert: its leading dimension is the experts). A layer's such tensors form a
// bucket of their own, after the layer's other tensors (its expert bucket), because ZeRO reduces
// and shards them over other ranks than the rest (zero_plan.h); and a layout made for rank r of an
// expert-parallel group of n (EpShard) holds only the r-th of n equal blocks of the experts, so
// split_runs() places them as it places a tensor-parallel piece. A per-expert tensor's TensorSplit
// cuts each expert's slice (its shape without the leading experts) as it would cut a tensor of
// that shape, so a layout of both kinds of rank holds its tensor piece of each of its experts.
//
// Pipeline parallelism: a layout made for a pipeline stage (StageSlice) holds only some layers of
// the per-layer group (numbered 0.. locally, global_layer() maps them back) and only some of the
// other groups; a group it holds as a copy of another stage's (GPT-2's tied embedding on the last
// stage, which the lm head reads) is marked so, and counts once in norms and checkpoints.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/utils.h"

namespace llmc {

// How a tensor starts a training run. Normal draws N(0, std) for the first random_elems elements of
// each slice and sets the rest to 0 (GPT-2's padded vocabulary rows); Zeros and Ones are constants.
enum class InitRule { Zeros, Ones, Normal };
struct ParamInit {
    InitRule rule = InitRule::Zeros;
    float std = 0.0f;
    size_t random_elems = SIZE_MAX;
};

// How a tensor is cut over a tensor-parallel group of n ranks. Rows: the leading dimension is `parts`
// equal blocks (GPT-2's fused qkv rows: q, k and v), and rank r holds rows [r, r + 1) / n of each
// block (for q|k|v: its heads of all three). Cols: rank r holds columns [r, r + 1) / n of every row
// (a 1-d tensor has one column per element under Rows, and cannot be cut by Cols). None: every rank
// holds the whole tensor (a replica).
struct TensorSplit {
    enum Kind { None, Rows, Cols };
    Kind kind = None;
    int parts = 1;
};

// Which piece of the split tensors a layout holds: rank `rank` of a tensor-parallel group of `size`.
struct TpShard {
    int rank = 0;
    int size = 1;
};

// Which experts the per-expert tensors of a layout hold: block `rank` of `size` equal blocks.
struct EpShard {
    int rank = 0;
    int size = 1;
};

// Which part of the model a pipeline stage's layout holds: the per-layer group's layers `layers`
// (global indices, ascending; empty: all of them) and, per bucket group, whether it is held at all
// (`groups`; empty: every group) and whether it is a copy of the group another stage holds too
// (`copies`; empty: none is).
struct StageSlice {
    std::vector<int> layers;
    std::vector<bool> groups;
    std::vector<bool> copies;
};

// One parameter tensor as the model declares it.
struct TensorSpec {
    std::string name;
    std::vector<size_t> shape;  // of one slice: one layer's, for a tensor of a per-layer group; global
    int group;                  // the bucket group that holds it (index into ParamTable::groups)
    bool decayed;               // AdamW's decoupled weight decay applies (matrices, not biases or gains)
    ParamInit init;
    TensorSplit split = {};     // how tensor parallelism cuts it
    int layer_kind = -1;        // a per-layer tensor in the layers of this kind only (-1: every layer)
    bool per_expert = false;    // its leading dimension is the experts (in the layer's expert bucket)
};

// Local elements [local, local + run * count) of a tensor slice are, in the global slice, `count`
// runs of `run` elements starting `stride` apart from `global` on.
struct SplitRun {
    size_t local, global, run, stride, count;
    size_t size() const { return run * count; }
};

// Buckets, in flat order. A per-layer group is one bucket per layer; any other group is one bucket.
// `resident`: the model uses the bucket at both ends of a pass (GPT-2's tied embedding: the encoder
// first, the lm head last), so ZeRO-3 keeps it gathered for the whole pass and ZeRO-2 gives its
// gradient a buffer of its own; the other buckets share two rotating buffers.
struct BucketGroup {
    std::string name;
    bool per_layer;
    bool resident;
};

struct ParamTable {
    int num_layers = 0;
    std::vector<BucketGroup> groups;  // flat order; at most one per-layer group
    std::vector<TensorSpec> tensors;  // model-file order
    std::vector<int> layer_kinds;     // each layer's kind (empty: every layer is of kind 0)

    int kind_of(int layer) const { return layer_kinds.empty() ? 0 : layer_kinds.at(layer); }
    int num_kinds() const { return layer_kinds.empty() ? 1 : *std::max_element(layer_kinds.begin(), layer_kinds.end()) + 1; }
    // Whether a tensor of the per-layer group is in layer `layer` (global); other tensors are in no layer.
    bool in_layer(int tensor, int layer) const {
        const int kind = tensors.at(tensor).layer_kind;
        return kind < 0 || kind == kind_of(layer);
    }
    // How many layers before `layer` (global) a per-layer tensor is in: its slice's index in the
    // tensor (the model file's and the manifest's); layers_with: all of them.
    int slice_index(int tensor, int layer) const {
        int n = 0;
        for (int l = 0; l < layer; l++) n += in_layer(tensor, l);
        return n;
    }
    int layers_with(int tensor) const { return slice_index(tensor, num_layers); }
};

class ParamLayout {
public:
    // One tensor slice (one layer's, for a per-layer tensor) at flat elements [begin, end).
    struct Segment {
        int tensor;
        int layer;  // 0 for the tensors that are not per-layer
        size_t begin, end;
    };

    size_t num_params = 0;

    // The whole model's layout, or (tp.size > 1) rank tp.rank's piece of it, of the layers and groups
    // a pipeline stage holds (stage), with (ep.size > 1) block ep.rank of the experts.
    explicit ParamLayout(ParamTable table, TpShard tp = {}, StageSlice stage = {}, EpShard ep = {})
        : table_(std::move(table)), tp_(tp), ep_(ep), stage_(std::move(stage)) {
        validate_table();
        validate_stage();
        const int num_tensors = (int)table_.tensors.size(), kinds = table_.num_kinds();
        sizes_.resize(num_tensors);
        global_sizes_.resize(num_tensors);
        offset_in_bucket_.assign(num_tensors, std::vector<size_t>(kinds, 0));
        file_begin_.resize(num_tensors);
        // one bucket of each group, for a layer of each kind (a group that is not per-layer: kind 0),
        // and of the per-layer group's expert tensors (expert_size)
        std::vector<std::vector<size_t>> group_size(table_.groups.size(), std::vector<size_t>(kinds, 0));
        std::vector<size_t> expert_size(kinds, 0);
        size_t file_at = 0;
        for (int t = 0; t < num_tensors; t++) {
            const TensorSpec& spec = table_.tensors[t];
            global_sizes_[t] = 1;
            for (size_t d : spec.shape) global_sizes_[t] *= d;
            sizes_[t] = is_split(t) ? global_sizes_[t] / tp_.size : global_sizes_[t];
            if (spec.per_expert) sizes_[t] /= ep_.size;
            for (int k = 0; k < kinds; k++)
                if (spec.layer_kind < 0 || spec.layer_kind == k) {
                    size_t& size = spec.per_expert ? expert_size[k] : group_size[spec.group][k];
                    offset_in_bucket_[t][k] = size;
                    size += sizes_[t];
                }
            file_begin_[t] = file_at;
            file_at += (is_per_layer(t) ? (size_t)table_.layers_with(t) : 1) * sizes_[t];
        }
        for (int g = 0; g < (int)table_.groups.size(); g++) {
            if (!holds_group(g)) {
                group_first_bucket_.push_back(-1);
                continue;
            }
            group_first_bucket_.push_back((int)buckets_.size());
            const bool per_layer = table_.groups[g].per_layer;
            for (int l = 0; l < (per_layer ? num_layers() : 1); l++) {
                const int kind = per_layer ? kind_of_local(l) : 0;
                if (per_layer) layer_buckets_.push_back(num_buckets());
                add_bucket(g, l, kind, group_size[g][kind], false);
                if (per_layer) expert_buckets_.push_back(expert_size[kind] ? num_buckets() : -1);
                if (per_layer && expert_size[kind]) add_bucket(g, l, kind, expert_size[kind], true);
            }
        }
    }

    const ParamTable& table() const { return table_; }
    // The layers of the per-layer group this layout holds (all of the table's but for a pipeline
    // stage), numbered 0..num_layers()-1 here; global_layer() is the table's number of one.
    int num_layers() const { return stage_.layers.empty() ? table_.num_layers : (int)stage_.layers.size(); }
    int global_layer(int layer) const { return stage_.layers.empty() ? layer : stage_.layers.at(layer); }
    // The table's layer number of a slice (0 for a tensor that is not per-layer).
    int global_layer(const Segment& s) const { return is_per_layer(s.tensor) ? global_layer(s.layer) : 0; }
    // The slice's index in its whole tensor: the table's layer number, counting only the layers that
    // have the tensor (0 for a tensor that is not per-layer).
    int slice_index(const Segment& s) const {
        return is_per_layer(s.tensor) ? table_.slice_index(s.tensor, global_layer(s.layer)) : 0;
    }
    const TpShard& tp() const { return tp_; }
    const EpShard& ep() const { return ep_; }
    const StageSlice& stage() const { return stage_; }
    // Whether this layout holds the bucket group, or the tensor; and whether it holds it as a copy of
    // another pipeline stage's (the copy is kept equal to it, and counted once, by the other stage).
    bool holds_group(int group) const { return stage_.groups.empty() || stage_.groups.at(group); }
    bool holds(int tensor) const { return holds_group(spec(tensor).group); }
    bool is_stage_copy(int tensor) const {
        return !stage_.copies.empty() && stage_.copies.at(spec(tensor).group);
    }
    // Whether this rank's copy of the tensor is the one that counts: its tensor-parallel piece, or a
    // replica held on tensor rank 0, and not a pipeline stage's copy.
    bool is_primary(int tensor) const { return (tp_.rank == 0 || is_split(tensor)) && !is_stage_copy(tensor); }
    // Whether the layout is the whole model's (no tensor, expert or pipeline cut).
    bool is_whole() const { return tp_.size == 1 && ep_.size == 1 && stage_.layers.empty() && stage_.groups.empty(); }

    // ---- tensors ----
    int num_tensors() const { return (int)table_.tensors.size(); }
    const std::string& name(int tensor) const { return spec(tensor).name; }
    bool is_per_layer(int tensor) const { return table_.groups[spec(tensor).group].per_layer; }
    // Whether layer `layer` (this layout's numbering) has the tensor: always for a tensor of every
    // layer or of no layer; for one of a layer kind, where the layer is of that kind.
    bool has(int tensor, int layer) const {
        return !is_per_layer(tensor) || table_.in_layer(check_tensor(tensor), global_layer(layer));
    }
    bool is_decayed(int tensor) const { return spec(tensor).decayed; }
    const ParamInit& init(int tensor) const { return spec(tensor).init; }
    // Elements of one layer's slice for a per-layer tensor, of the whole tensor otherwise: the
    // piece this layout holds (tensor_size) and the whole (global_tensor_size).
    size_t tensor_size(int tensor) const { return sizes_[check_tensor(tensor)]; }
    size_t global_tensor_size(int tensor) const { return global_sizes_[check_tensor(tensor)]; }
    // Whether this layout holds a piece of the tensor rather than all of it.
    bool is_split(int tensor) const { return tp_.size > 1 && spec(tensor).split.kind != TensorSplit::None; }
    // Whether the tensor holds one slice per expert (and this layout, under expert parallelism, some of them).
    bool is_per_expert(int tensor) const { return spec(tensor).per_expert; }

    // Where local elements [lo, hi) of one slice of `tensor` sit in the global slice: one run when
    // the tensor is whole here, else one per block of a row split, or for a column split the
    // partial first row, the whole rows between (one strided run) and the partial last row.
    std::vector<SplitRun> split_runs(int tensor, size_t lo, size_t hi) const {
        std::vector<SplitRun> runs;
        if (lo >= hi) return runs;
        // this rank's block of the experts (the whole tensor without expert parallelism): the rest
        // places elements within it
        const size_t first = is_per_expert(tensor) ? (size_t)ep_.rank * (global_sizes_[tensor] / ep_.size) : 0;
        if (!is_split(tensor)) return {{lo, first + lo, hi - lo, hi - lo, 1}};
        const TensorSplit& split = spec(tensor).split;
        const size_t n = tp_.size, r = tp_.rank;
        if (split.kind == TensorSplit::Rows) {
            // Each block is rows/parts global rows (of each of this rank's experts, for a per-expert
            // tensor); this rank holds a contiguous 1/n of each.
            const size_t blocks = (size_t)split.parts * (is_per_expert(tensor) ? spec(tensor).shape[0] / ep_.size : 1);
            const size_t block = global_sizes_[tensor] / ep_size_of(tensor) / blocks, local_block = block / n;
            for (size_t b = lo / local_block; b * local_block < hi; b++) {
                const size_t a = std::max(lo, b * local_block), z = std::min(hi, (b + 1) * local_block);
                const size_t g = first + b * block + r * local_block + (a - b * local_block);
                runs.push_back({a, g, z - a, z - a, 1});
            }
            return runs;
        }
        // Cols: local row i is columns [r * lc, (r + 1) * lc) of global row i.
        const size_t cols = spec(tensor).shape.back(), lc = cols / n;
        auto global_of = [&](size_t local) { return first + local / lc * cols + r * lc + local % lc; };
        size_t at = lo;
        if (at % lc) {  // the partial first row
            const size_t z = std::min(hi, (at / lc + 1) * lc);
            runs.push_back({at, global_of(at), z - at, z - at, 1});
            at = z;
        }
        if (hi - at >= lc) {  // whole rows
            const size_t rows = (hi - at) / lc;
            runs.push_back({at, global_of(at), lc, cols, rows});
            at += rows * lc;
        }
        if (at < hi) runs.push_back({at, global_of(at), hi - at, hi - at, 1});  // the partial last row
        return runs;
    }
    // Where a tensor's slice starts in its bucket (in layer `layer`'s, for a per-layer tensor).
    size_t offset_in_bucket(int tensor, int layer = 0) const {
        check(tensor, layer);
        return offset_in_bucket_[tensor][is_per_layer(tensor) ? kind_of_local(layer) : 0];
    }
    // Flat offset of a tensor's slice; `layer` only for per-layer tensors.
    size_t offset(int tensor, int layer = 0) const {
        return bucket_begin(bucket_of(tensor, layer)) + offset_in_bucket(tensor, layer);
    }

    // ---- buckets ----
    int num_buckets() const { return (int)buckets_.size(); }
    // Layer `layer`'s bucket, and its expert bucket (-1: the layer has no expert tensors).
    int layer_bucket(int layer) const { return layer_buckets_[check_layer(layer)]; }
    int expert_bucket(int layer) const { return expert_buckets_[check_layer(layer)]; }
    bool is_expert_bucket(int b) const { return bucket(b).experts; }
    int final_bucket() const { return num_buckets() - 1; }  // the last bucket in flat order
    int bucket_of(int tensor, int layer = 0) const {
        check(tensor, layer);
        if (!holds(tensor))
            fail(strformat("ParamLayout: this pipeline stage does not hold %s", name(tensor).c_str()));
        if (is_per_layer(tensor)) return is_per_expert(tensor) ? expert_bucket(layer) : layer_bucket(layer);
        return group_first_bucket_[spec(tensor).group];
    }
    // Buckets tile [0, num_params) in order: bucket_begin(b + 1) == bucket_begin(b) + bucket_size(b).
    size_t bucket_begin(int b) const { return bucket(b).begin; }
    size_t bucket_size(int b) const { return bucket(b).size; }
    const std::string& bucket_name(int b) const { return table_.groups[bucket(b).group].name; }
    bool is_resident(int b) const { return table_.groups[bucket(b).group].resident; }

    // ---- flat order and file order ----
    // Every slice in flat order; together they tile [0, num_params).
    const std::vector<Segment>& segments() const { return segments_; }
    // Where the same slice sits in a model file's parameters (table order), in elements. Only for a
    // whole-model layout: a tensor-parallel rank's piece is not a model file.
    size_t file_offset(int tensor, int layer = 0) const {
        check(tensor, layer);
        if (!is_whole()) fail("ParamLayout: file offsets are for a whole-model layout, not a tensor or pipeline piece");
        return file_begin_[tensor] + (size_t)table_.slice_index(tensor, layer) * sizes_[tensor];
    }
    // Where a whole tensor (every layer's slice that has it) starts in a model file, and its length.
    size_t file_begin(int tensor) const { return file_begin_[check_tensor(tensor)]; }
    size_t file_size(int tensor) const {
        return (is_per_layer(tensor) ? (size_t)table_.layers_with(tensor) : 1) * sizes_[tensor];
    }
    // The segments in the order a model file stores them (ascending file_offset).
    std::vector<Segment> file_order_segments() const {
        std::vector<Segment> segs = segments_;
        std::sort(segs.begin(), segs.end(), [&](const Segment& a, const Segment& b) {
            return file_offset(a.tensor, a.layer) < file_offset(b.tensor, b.layer);
        });
        return segs;
    }

private:
    struct Bucket {
        size_t begin, size;
        int group;
        bool experts;  // a layer's expert bucket
    };

    // Appends layer l's bucket of group g (its expert bucket, or the rest of it) and its segments.
    void add_bucket(int g, int l, int kind, size_t size, bool experts) {
        buckets_.push_back({num_params, size, g, experts});
        const bool per_layer = table_.groups[g].per_layer;
        for (int t = 0; t < num_tensors(); t++)
            if (table_.tensors[t].group == g && (!per_layer || has(t, l)) && table_.tensors[t].per_expert == experts) {
                const size_t begin = num_params + offset_in_bucket_[t][kind];
                segments_.push_back({t, l, begin, begin + sizes_[t]});
            }
        num_params += size;
    }
    int check_layer(int layer) const {
        if (layer_buckets_.empty()) fail("ParamLayout: the table has no per-layer bucket group");
        if (layer < 0 || layer >= num_layers())
            fail(strformat("ParamLayout: layer %d is not in [0, %d)", layer, num_layers()));
        return layer;
    }

    size_t layers_of(int tensor) const { return is_per_layer(tensor) ? (size_t)num_layers() : 1; }
    const TensorSpec& spec(int tensor) const { return table_.tensors[check_tensor(tensor)]; }
    int check_tensor(int tensor) const {
        if (tensor < 0 || tensor >= num_tensors())
            fail(strformat("ParamLayout: tensor %d is not in [0, %d)", tensor, num_tensors()));
        return tensor;
    }
    int kind_of_local(int layer) const { return table_.kind_of(global_layer(layer)); }
    // The expert-parallel group's size for a per-expert tensor (it holds 1/that of the experts), else 1.
    size_t ep_size_of(int tensor) const { return is_per_expert(tensor) ? ep_.size : 1; }
    void check(int tensor, int layer) const {
        const int layers = (int)layers_of(check_tensor(tensor));
        if (layer < 0 || layer >= layers)
            fail(strformat("ParamLayout: layer %d of %s is not in [0, %d)", layer, name(tensor).c_str(), layers));
        if (!has(tensor, layer))
            fail(strformat("ParamLayout: layer %d has no %s (a tensor of layer kind %d)", global_layer(layer),
                           name(tensor).c_str(), spec(tensor).layer_kind));
    }
    const Bucket& bucket(int b) const {
        if (b < 0 || b >= num_buckets()) fail(strformat("ParamLayout: bucket %d is not in [0, %d)", b, num_buckets()));
        return buckets_[b];
    }
    void validate_table() const {
        if (table_.num_layers < 1) fail(strformat("ParamTable: num_layers must be >= 1, got %d", table_.num_layers));
        int per_layer_groups = 0;
        for (const BucketGroup& g : table_.groups) per_layer_groups += g.per_layer;
        if (per_layer_groups > 1) fail("ParamTable: at most one bucket group may be per-layer");
        if (!table_.layer_kinds.empty() && (int)table_.layer_kinds.size() != table_.num_layers)
            fail(strformat("ParamTable: layer_kinds names %zu layers, the table has %d", table_.layer_kinds.size(),
                           table_.num_layers));
        for (int k : table_.layer_kinds)
            if (k < 0) fail(strformat("ParamTable: a layer kind must be >= 0, got %d", k));
        for (const TensorSpec& t : table_.tensors)
            if (t.layer_kind >= 0 && (t.group < 0 || t.group >= (int)table_.groups.size() ||
                                      !table_.groups[t.group].per_layer || t.layer_kind >= table_.num_kinds()))
                fail(strformat("ParamTable: tensor %s of layer kind %d must be per-layer, of a kind some layer has",
                               t.name.c_str(), t.layer_kind));
        for (const TensorSpec& t : table_.tensors)
            if (t.group < 0 || t.group >= (int)table_.groups.size())
                fail(strformat("ParamTable: tensor %s names bucket group %d, not in [0, %zu)", t.name.c_str(), t.group,
                               table_.groups.size()));
        if (tp_.size < 1 || tp_.rank < 0 || tp_.rank >= tp_.size)
            fail(strformat("ParamLayout: tensor-parallel rank %d of %d is not a rank of the group", tp_.rank, tp_.size));
        if (ep_.size < 1 || ep_.rank < 0 || ep_.rank >= ep_.size)
            fail(strformat("ParamLayout: expert-parallel rank %d of %d is not a rank of the group", ep_.rank, ep_.size));
        for (const TensorSpec& t : table_.tensors) {
            if (!t.per_expert) continue;
            if (!table_.groups[t.group].per_layer || t.shape.empty() || t.shape[0] % ep_.size != 0)
                fail(strformat("ParamTable: per-expert tensor %s must be per-layer, its %zu experts divisible by the %d "
                               "expert-parallel ranks", t.name.c_str(), t.shape.empty() ? 0 : t.shape[0], ep_.size));
        }
        if (tp_.size == 1) return;
        for (const TensorSpec& t : table_.tensors) {
            if (t.split.kind == TensorSplit::None) continue;
            // the shape the split cuts: a per-expert tensor's is one expert's
            const std::vector<size_t> shape(t.shape.begin() + (t.per_expert ? 1 : 0), t.shape.end());
            const size_t rows = shape.empty() ? 1 : shape[0];
            const size_t cols = shape.size() > 1 ? shape[1] : 1;
            const bool ok = t.split.kind == TensorSplit::Rows
                                ? t.split.parts >= 1 && rows % ((size_t)t.split.parts * tp_.size) == 0
                                : shape.size() == 2 && cols % tp_.size == 0;
            if (!ok)
                fail(strformat("ParamTable: tensor %s (%zu x %zu) cannot be cut %s over %d tensor-parallel ranks",
                               t.name.c_str(), rows, cols,
                               t.split.kind == TensorSplit::Rows
                                   ? strformat("into %d row block(s) of equal pieces", t.split.parts).c_str()
                                   : "by columns",
                               tp_.size));
        }
    }

    void validate_stage() const {
        const int groups = (int)table_.groups.size();
        if ((!stage_.groups.empty() && (int)stage_.groups.size() != groups) ||
            (!stage_.copies.empty() && (int)stage_.copies.size() != groups))
            fail(strformat("StageSlice: groups and copies must name each of the table's %d bucket groups", groups));
        for (size_t i = 0; i < stage_.layers.size(); i++)
            if (stage_.layers[i] < 0 || stage_.layers[i] >= table_.num_layers || (i && stage_.layers[i] <= stage_.layers[i - 1]))
                fail(strformat("StageSlice: layer %d (entry %zu) is not an ascending layer in [0, %d)", stage_.layers[i],
                               i, table_.num_layers));
        for (int g = 0; g < groups; g++)
            if (table_.groups[g].per_layer && !holds_group(g))
                fail("StageSlice: a stage holds the per-layer group (at least one of its layers)");
    }

    ParamTable table_;
    TpShard tp_;
    EpShard ep_;
    StageSlice stage_;
    std::vector<size_t> sizes_;             // one slice, the piece this layout holds
    std::vector<size_t> global_sizes_;      // one slice, whole
    std::vector<std::vector<size_t>> offset_in_bucket_;  // within its bucket, per layer kind
    std::vector<size_t> file_begin_;        // first element in file order
    std::vector<Bucket> buckets_;
    std::vector<Segment> segments_;
    std::vector<int> group_first_bucket_;  // per bucket group: its (first) bucket
    std::vector<int> layer_buckets_, expert_buckets_;  // per layer: its bucket, its expert bucket (or -1)
};

// Copies every parameter between a whole-model layout's flat buffer and a tensor-parallel rank's
// (both of the same table): to_piece fills the piece from the whole, otherwise the whole's elements
// that the piece holds are set from it. Replicated tensors are copied whole.
// `primary_only` (to the whole): only what the piece holds first-hand, not the replicas that tensor
// ranks other than 0 hold, nor a pipeline stage's copies; every element of the whole then comes
// from exactly one rank.
inline void copy_between_layouts(const ParamLayout& whole, float* whole_buf, const ParamLayout& piece,
                                 float* piece_buf, bool to_piece, bool primary_only = false) {
    if (!whole.is_whole()) fail("copy_between_layouts: the first layout must be a whole-model one");
    for (const ParamLayout::Segment& s : piece.segments()) {
        if (primary_only && !piece.is_primary(s.tensor)) continue;
        float* global = whole_buf + whole.offset(s.tensor, piece.global_layer(s));
        float* local = piece_buf + s.begin;
        for (const SplitRun& run : piece.split_runs(s.tensor, 0, s.end - s.begin))
            for (size_t k = 0; k < run.count; k++) {
                float* g = global + run.global + k * run.stride;
                float* l = local + run.local + k * run.run;
                if (to_piece) std::memcpy(l, g, run.run * sizeof(float));
                else std::memcpy(g, l, run.run * sizeof(float));
            }
    }
}

// A rank's piece (`piece`) of a whole-model buffer `buf` (in `whole`'s layout): the buffer itself,
// moved, when the piece is the whole model; else a new buffer in the piece's layout.
inline std::vector<float> piece_of_whole(const ParamLayout& whole, std::vector<float>& buf, const ParamLayout& piece) {
    if (piece.is_whole()) return std::move(buf);
    std::vector<float> out(piece.num_params);
    copy_between_layouts(whole, buf.data(), piece, out.data(), true);
    return out;
}

}  // namespace llmc
