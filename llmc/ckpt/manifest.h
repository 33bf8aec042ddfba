// ckpt/manifest.h: a checkpoint's manifest.json, and the mapping between ParamLayout's flat order
// and the named tensors the manifest describes its files by.
//
// A rank file is raw bytes: its saved buffers one after another, each the rank's slices back to
// back. The manifest says, for every file, which elements of which named tensor sit at which byte
// offset, with the tensor's global row-major layout as the coordinate system (a per-layer tensor
// is one tensor with the layers as its leading dimension, as in llm.c's model file). Nothing in it
// depends on how the writing run cut its buffers, so a reader with any other cut (world size, ZeRO
// stage, tensor-parallel split) assembles its part from the same description. A tensor-parallel
// rank's piece of a column-split matrix is a strided slice: runs of `run` elements `stride` apart
// (format version 2; version 1 had contiguous slices only and is still read). docs/checkpoints.md
// ("The checkpoint format") documents every field.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/ckpt/shard_state.h"
#include "llmc/data/dataloader.h"
#include "llmc/models/gpt2/config.h"
#include "llmc/params/layout.h"
#include "llmc/utils.h"

namespace llmc {

inline constexpr int CHECKPOINT_FORMAT_VERSION = 2;
inline constexpr int CHECKPOINT_OLDEST_FORMAT_VERSION = 1;  // the oldest this build reads
inline constexpr const char* CHECKPOINT_FORMAT = "llmc-checkpoint";

// Elements of tensor `tensor` (global row-major index) stored back to back from byte `byte_offset`
// of the file on: [begin, end) when contiguous (run 0), else runs of `run` elements starting
// `stride` apart from begin on, the last ending at end.
struct ManifestSlice {
    int tensor;  // index into Manifest::tensors
    uint64_t begin, end, byte_offset;
    uint64_t run = 0, stride = 0;
    bool strided() const { return run != 0; }
    uint64_t runs() const { return strided() ? (end - begin - run) / stride + 1 : 1; }
    uint64_t run_length() const { return strided() ? run : end - begin; }
    uint64_t elements() const { return runs() * run_length(); }
};
struct ManifestBuffer {
    std::string name;  // shard_state.h's STATE_* names
    StateDtype dtype;
    std::vector<ManifestSlice> slices;
};
struct ManifestFile {
    int rank = 0;
    std::string path;  // relative to the checkpoint directory
    uint64_t bytes = 0;
    uint32_t crc32c = 0;
    std::vector<ManifestBuffer> buffers;
};
struct ManifestTensor {
    std::string name;
    std::vector<uint64_t> shape;  // global: per-layer tensors have the layer count first
    uint64_t elements() const {
        uint64_t n = 1;
        for (uint64_t d : shape) n *= d;
        return n;
    }
};

struct Manifest {
    int format_version = CHECKPOINT_FORMAT_VERSION;
    int step = 0;             // optimizer steps done
    int world_size = 1;       // of the run that wrote it
    int tp = 1;               // its tensor-parallel ranks
    int pp = 1;               // its pipeline stages (its data-parallel ranks: world_size / (tp pp))
    int ep = 1;               // its expert-parallel ranks (carved from the data-parallel ones)
    std::string pp_layers;    // layers per virtual pipeline stage, "2,2" ("": one stage)
    int zero_stage = 0;
    std::string run_id;     // the run that wrote it (ckpt/output_dir.h; "" before run identities)
    bool verified = true;   // the replicas' fingerprints agreed at this step (or none are compared)
    ModelConfig model;
    nlohmann::json run_config;  // the writing run's config.json
    DataLoaderState data;       // the training data position: the next batch to read
    std::array<uint64_t, 4> sampler_rng{};
    std::vector<std::pair<std::string, uint64_t>> model_rng;  // ShardedState::rng_states()
    // ReplicatedState::named_values() (the FP8 scaling histories); absent from checkpoints of runs without such state
    std::vector<std::pair<std::string, std::vector<float>>> model_state;
    std::vector<ManifestTensor> tensors;
    std::vector<ManifestFile> files;
};

// The tensors of a layout with their global shapes, in table order.
inline std::vector<ManifestTensor> manifest_tensors(const ParamLayout& layout) {
    std::vector<ManifestTensor> out;
    for (int t = 0; t < layout.num_tensors(); t++) {
        ManifestTensor mt{layout.name(t), {}};
        if (layout.is_per_layer(t)) mt.shape.push_back(layout.table().layers_with(t));
        for (size_t d : layout.table().tensors[t].shape) mt.shape.push_back(d);
        out.push_back(mt);
    }
    return out;
}

// A flat range cut at tensor boundaries and, for a tensor-parallel piece, at the runs of the whole
// tensor it holds: flat elements [flat_begin, flat_begin + size()) are elements [begin, end) of
// tensor `tensor` (global index), or, when strided (run != 0), runs of `run` elements starting
// `stride` apart from begin on.
struct TensorPiece {
    int tensor;
    size_t begin, end, flat_begin;
    size_t run = 0, stride = 0;
    size_t runs() const { return run ? (end - begin - run) / stride + 1 : 1; }
    size_t run_length() const { return run ? run : end - begin; }
    size_t size() const { return runs() * run_length(); }
};
inline std::vector<TensorPiece> tensor_pieces(const ParamLayout& layout, FlatRange r) {
    std::vector<TensorPiece> out;
    const auto& segs = layout.segments();
    // The first segment that ends after r.begin (segments tile the flat order, ascending).
    auto it = std::upper_bound(segs.begin(), segs.end(), r.begin,
                               [](size_t x, const ParamLayout::Segment& s) { return x < s.end; });
    for (; it != segs.end() && it->begin < r.end; ++it) {
        const size_t lo = std::max(r.begin, it->begin), hi = std::min(r.end, it->end);
        const size_t layer_base = (size_t)layout.slice_index(*it) * layout.global_tensor_size(it->tensor);
        for (const SplitRun& run : layout.split_runs(it->tensor, lo - it->begin, hi - it->begin)) {
            const size_t begin = layer_base + run.global;
            TensorPiece p{it->tensor, begin, begin + (run.count - 1) * run.stride + run.run, it->begin + run.local};
            if (run.count > 1) {
                p.run = run.run;
                p.stride = run.stride;
            }
            out.push_back(p);
        }
    }
    return out;
}

// Bytes [snapshot_offset, snapshot_offset + bytes) of a rank's snapshot (ShardedState: every buffer's
// owned ranges back to back), one run of what its file holds.
struct SnapshotRun {
    uint64_t snapshot_offset, bytes;
};

// What a rank's file holds, before its size and checksum are known: `buffers` in order, each the
// rank's `owned` ranges back to back, as in its snapshot, but only the pieces the manifest lists.
// Every rank of a tensor-parallel group holds the replicated tensors (LayerNorms, wpe, some biases)
// whole and equal, and the last pipeline stage a copy of the tied embedding; only the primary copy
// (ParamLayout::is_primary) is listed and written, so each element is in the checkpoint once.
// every_copy: the replicas and stage copies too (the local tier, where each rank restores from its
// own file alone: once in the file). runs (if not null): where the file's bytes are in the snapshot.
inline ManifestFile describe_rank_file(const ParamLayout& layout, const std::vector<StateBuffer>& buffers,
                                       const std::vector<FlatRange>& owned, int rank, const std::string& path,
                                       bool every_copy = false, std::vector<SnapshotRun>* runs = nullptr) {
    ManifestFile f;
    f.rank = rank;
    f.path = path;
    uint64_t at = 0, snapshot_at = 0;
    for (const StateBuffer& b : buffers) {
        ManifestBuffer mb{b.name, b.dtype, {}};
        for (const FlatRange& r : owned)
            for (const TensorPiece& p : tensor_pieces(layout, r)) {
                const uint64_t bytes = p.size() * state_dtype_bytes(b.dtype);
                if (every_copy || layout.is_primary(p.tensor)) {
                    mb.slices.push_back({p.tensor, p.begin, p.end, at, p.run, p.stride});
                    if (runs && !runs->empty() && runs->back().snapshot_offset + runs->back().bytes == snapshot_at)
                        runs->back().bytes += bytes;
                    else if (runs)
                        runs->push_back({snapshot_at, bytes});
                    at += bytes;
                }
                snapshot_at += bytes;
            }
        f.buffers.push_back(std::move(mb));
    }
    f.bytes = at;
    return f;
}

// ---- JSON ----

inline nlohmann::json model_config_json(const ModelConfig& m) {
    return {{"max_seq_len", m.max_seq_len}, {"vocab_size", m.vocab_size}, {"padded_vocab_size", m.padded_vocab_size},
            {"num_layers", m.num_layers},   {"num_heads", m.num_heads},   {"channels", m.channels}};
}

inline nlohmann::json file_json(const ManifestFile& f, const std::vector<ManifestTensor>& tensors) {
    nlohmann::json buffers = nlohmann::json::array();
    for (const ManifestBuffer& b : f.buffers) {
        nlohmann::json slices = nlohmann::json::array();
        for (const ManifestSlice& s : b.slices) {
            if (s.strided()) slices.push_back({tensors[s.tensor].name, s.begin, s.end, s.byte_offset, s.run, s.stride});
            else slices.push_back({tensors[s.tensor].name, s.begin, s.end, s.byte_offset});
        }
        buffers.push_back({{"name", b.name}, {"dtype", state_dtype_name(b.dtype)}, {"slices", slices}});
    }
    return {{"rank", f.rank}, {"path", f.path}, {"bytes", f.bytes}, {"crc32c", f.crc32c}, {"buffers", buffers}};
}

inline nlohmann::json manifest_json(const Manifest& m) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const ManifestTensor& t : m.tensors) tensors.push_back({{"name", t.name}, {"shape", t.shape}});
    nlohmann::json files = nlohmann::json::array();
    for (const ManifestFile& f : m.files) files.push_back(file_json(f, m.tensors));
    nlohmann::json model_rng = nlohmann::json::object();
    for (const auto& [name, value] : m.model_rng) model_rng[name] = value;
    nlohmann::json model_state = nlohmann::json::object();
    for (const auto& [name, values] : m.model_state) model_state[name] = values;
    return {{"format", CHECKPOINT_FORMAT},
            {"format_version", m.format_version},
            {"step", m.step},
            {"world_size", m.world_size},
            {"tp", m.tp},
            {"pp", m.pp},
            {"ep", m.ep},
            {"pp_layers", m.pp_layers},
            {"zero_stage", m.zero_stage},
            {"run_id", m.run_id},
            {"verified", m.verified},
            {"model", model_config_json(m.model)},
            {"run_config", m.run_config},
            {"data", m.data},
            {"rng", {{"sampler", m.sampler_rng}, {"model", model_rng}}},
            {"model_state", model_state},
            {"tensors", tensors},
            {"files", files}};
}

// The manifest as written: one top-level field per line and one file per line, so it reads in a
// pager and diffs well, without a line per number.
inline std::string manifest_text(const nlohmann::json& j) {
    std::string out = "{\n";
    size_t i = 0;
    for (auto it = j.begin(); it != j.end(); ++it, ++i) {
        out += "  " + nlohmann::json(it.key()).dump() + ": ";
        if (it.key() == "files" && it->is_array()) {
            out += "[\n";
            for (size_t f = 0; f < it->size(); f++)
                out += "    " + (*it)[f].dump() + (f + 1 < it->size() ? ",\n" : "\n");
            out += "  ]";
        } else {
            out += it->dump();
        }
        out += i + 1 < j.size() ? ",\n" : "\n";
    }
    return out + "}\n";
}

namespace detail {

// A field of a JSON object, with errors that name the manifest and the field's path.
struct ManifestReader {
    std::string where;  // "manifest 'dir/manifest.json'"

    const nlohmann::json& at(const nlohmann::json& j, const std::string& key, const std::string& path) const {
        if (!j.is_object()) fail(strformat("%s: %s is not a JSON object", where.c_str(), path.c_str()));
        auto it = j.find(key);
        if (it == j.end()) fail(strformat("%s: missing field %s.%s", where.c_str(), path.c_str(), key.c_str()));
        return *it;
    }
    uint64_t uint(const nlohmann::json& v, const std::string& path, uint64_t max_value = UINT64_MAX) const {
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
            fail(strformat("%s: %s is %s; expected a non-negative integer", where.c_str(), path.c_str(),
                           v.dump().c_str()));
        const uint64_t x = v.get<uint64_t>();
        if (x > max_value)
            fail(strformat("%s: %s is %llu; expected at most %llu", where.c_str(), path.c_str(), (unsigned long long)x,
                           (unsigned long long)max_value));
        return x;
    }
    uint64_t uint_at(const nlohmann::json& j, const std::string& key, const std::string& path,
                     uint64_t max_value = UINT64_MAX) const {
        return uint(at(j, key, path), path + "." + key, max_value);
    }
    int int_at(const nlohmann::json& j, const std::string& key, const std::string& path) const {
        return (int)uint_at(j, key, path, INT32_MAX);
    }
    std::string string_at(const nlohmann::json& j, const std::string& key, const std::string& path) const {
        const nlohmann::json& v = at(j, key, path);
        if (!v.is_string())
            fail(strformat("%s: %s.%s is %s; expected a string", where.c_str(), path.c_str(), key.c_str(),
                           v.dump().c_str()));
        return v.get<std::string>();
    }
    const nlohmann::json& array_at(const nlohmann::json& j, const std::string& key, const std::string& path) const {
        const nlohmann::json& v = at(j, key, path);
        if (!v.is_array())
            fail(strformat("%s: %s.%s is not an array", where.c_str(), path.c_str(), key.c_str()));
        return v;
    }
};

// A rank file holds its slices back to back from byte 0 to its end, nothing else: a slice whose
// dtype or extent was changed moves the bytes of every one after it, and is refused here rather
// than read as garbage.
inline void check_slices_tile_file(const ManifestFile& f, const std::string& where, const std::string& path) {
    std::vector<std::pair<uint64_t, uint64_t>> extents;  // [first byte, end) of every slice
    for (const ManifestBuffer& b : f.buffers)
        for (const ManifestSlice& s : b.slices)
            extents.push_back({s.byte_offset, s.byte_offset + s.elements() * state_dtype_bytes(b.dtype)});
    std::sort(extents.begin(), extents.end());
    uint64_t at = 0;
    for (const auto& [begin, end] : extents) {
        if (begin != at)
            fail(strformat("%s: %s ('%s'): a slice starts at byte %llu where the one before ends at %llu; expected "
                           "the slices back to back (a changed dtype or slice?)",
                           where.c_str(), path.c_str(), f.path.c_str(), (unsigned long long)begin,
                           (unsigned long long)at));
        at = end;
    }
    if (at != f.bytes)
        fail(strformat("%s: %s ('%s'): the slices end at byte %llu but the file has %llu (a changed dtype or slice?)",
                       where.c_str(), path.c_str(), f.path.c_str(), (unsigned long long)at,
                       (unsigned long long)f.bytes));
}

// "model_state": {"name": [numbers], ...}.
inline std::vector<std::pair<std::string, std::vector<float>>> parse_model_state(const nlohmann::json& j,
                                                                                 const std::string& where) {
    if (!j.is_object()) fail(strformat("%s: model_state is not a JSON object", where.c_str()));
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (auto& [name, values] : j.items()) {
        std::vector<float> v;
        if (values.is_array())
            for (const nlohmann::json& x : values) {
                if (!x.is_number()) break;
                v.push_back(x.get<float>());
            }
        if (!values.is_array() || v.size() != values.size())
            fail(strformat("%s: model_state.%s is not an array of numbers", where.c_str(), name.c_str()));
        out.push_back({name, std::move(v)});
    }
    return out;
}

}  // namespace detail

// Parses and checks a manifest: every field present with the right type, every slice inside its
// tensor and its file, the slices of each file back to back. `where` names the file in errors.
inline Manifest parse_manifest(const std::string& text, const std::string& where) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail(strformat("%s is not valid JSON (truncated or corrupt?): %s", where.c_str(), e.what()));
    }
    const detail::ManifestReader rd{where};
    Manifest m;
    if (rd.string_at(j, "format", "manifest") != CHECKPOINT_FORMAT)
        fail(strformat("%s: format is '%s'; expected '%s'", where.c_str(), j["format"].get<std::string>().c_str(),
                       CHECKPOINT_FORMAT));
    m.format_version = rd.int_at(j, "format_version", "manifest");
    if (m.format_version < CHECKPOINT_OLDEST_FORMAT_VERSION || m.format_version > CHECKPOINT_FORMAT_VERSION)
        fail(strformat("%s: format_version is %d; this llmc reads versions %d to %d", where.c_str(), m.format_version,
                       CHECKPOINT_OLDEST_FORMAT_VERSION, CHECKPOINT_FORMAT_VERSION));
    m.step = rd.int_at(j, "step", "manifest");
    m.world_size = rd.int_at(j, "world_size", "manifest");
    m.tp = j.contains("tp") ? rd.int_at(j, "tp", "manifest") : 1;  // version 1 had no tensor parallelism
    m.pp = j.contains("pp") ? rd.int_at(j, "pp", "manifest") : 1;  // nor did it have pipelines
    m.ep = j.contains("ep") ? rd.int_at(j, "ep", "manifest") : 1;  // nor expert parallelism
    if (j.contains("pp_layers")) m.pp_layers = rd.string_at(j, "pp_layers", "manifest");
    m.zero_stage = rd.int_at(j, "zero_stage", "manifest");
    if (j.contains("run_id")) m.run_id = rd.string_at(j, "run_id", "manifest");  // absent before run identities
    if (j.contains("verified")) {
        if (!j["verified"].is_boolean())
            fail(strformat("%s: verified is %s; expected true or false", where.c_str(), j["verified"].dump().c_str()));
        m.verified = j["verified"].get<bool>();
    }
    const nlohmann::json& model = rd.at(j, "model", "manifest");
    m.model.max_seq_len = rd.int_at(model, "max_seq_len", "model");
    m.model.vocab_size = rd.int_at(model, "vocab_size", "model");
    m.model.padded_vocab_size = rd.int_at(model, "padded_vocab_size", "model");
    m.model.num_layers = rd.int_at(model, "num_layers", "model");
    m.model.num_heads = rd.int_at(model, "num_heads", "model");
    m.model.channels = rd.int_at(model, "channels", "model");
    m.run_config = rd.at(j, "run_config", "manifest");
    if (!m.run_config.is_object()) fail(strformat("%s: run_config is not a JSON object", where.c_str()));
    try {
        m.data = rd.at(j, "data", "manifest").get<DataLoaderState>();
    } catch (const Error& e) {
        fail(strformat("%s: data: %s", where.c_str(), e.what()));
    }
    const nlohmann::json& rng = rd.at(j, "rng", "manifest");
    const nlohmann::json& sampler = rd.array_at(rng, "sampler", "rng");
    if (sampler.size() != 4) fail(strformat("%s: rng.sampler must hold 4 integers", where.c_str()));
    for (int i = 0; i < 4; i++) m.sampler_rng[i] = rd.uint(sampler[i], strformat("rng.sampler[%d]", i));
    const nlohmann::json& model_rng = rd.at(rng, "model", "rng");
    if (!model_rng.is_object()) fail(strformat("%s: rng.model is not a JSON object", where.c_str()));
    for (auto& [name, value] : model_rng.items()) m.model_rng.push_back({name, rd.uint(value, "rng.model." + name)});
    if (j.contains("model_state")) m.model_state = detail::parse_model_state(j["model_state"], where);

    std::map<std::string, int> tensor_index;
    const nlohmann::json& tensors = rd.array_at(j, "tensors", "manifest");
    for (size_t t = 0; t < tensors.size(); t++) {
        const std::string path = strformat("tensors[%zu]", t);
        ManifestTensor mt{rd.string_at(tensors[t], "name", path), {}};
        for (const nlohmann::json& d : rd.array_at(tensors[t], "shape", path)) mt.shape.push_back(rd.uint(d, path + ".shape"));
        if (!tensor_index.emplace(mt.name, (int)t).second)
            fail(strformat("%s: tensor '%s' is listed twice", where.c_str(), mt.name.c_str()));
        m.tensors.push_back(mt);
    }
    const nlohmann::json& files = rd.array_at(j, "files", "manifest");
    for (size_t i = 0; i < files.size(); i++) {
        const std::string path = strformat("files[%zu]", i);
        ManifestFile f;
        f.rank = rd.int_at(files[i], "rank", path);
        f.path = rd.string_at(files[i], "path", path);
        if (f.path.empty() || f.path.find('/') != std::string::npos || f.path[0] == '.')
            fail(strformat("%s: %s.path '%s' must be a plain file name in the checkpoint directory", where.c_str(),
                           path.c_str(), f.path.c_str()));
        f.bytes = rd.uint_at(files[i], "bytes", path);
        f.crc32c = (uint32_t)rd.uint_at(files[i], "crc32c", path, UINT32_MAX);
        const nlohmann::json& buffers = rd.array_at(files[i], "buffers", path);
        for (size_t b = 0; b < buffers.size(); b++) {
            const std::string bpath = strformat("%s.buffers[%zu]", path.c_str(), b);
            ManifestBuffer mb;
            mb.name = rd.string_at(buffers[b], "name", bpath);
            mb.dtype = parse_state_dtype(rd.string_at(buffers[b], "dtype", bpath), where + ": " + bpath);
            for (const nlohmann::json& s : rd.array_at(buffers[b], "slices", bpath)) {
                if (!s.is_array() || (s.size() != 4 && s.size() != 6) || !s[0].is_string())
                    fail(strformat("%s: %s: a slice is %s; expected [tensor name, begin, end, byte offset] or, "
                                   "strided, [tensor name, begin, end, byte offset, run, stride]",
                                   where.c_str(), bpath.c_str(), s.dump().c_str()));
                auto t = tensor_index.find(s[0].get<std::string>());
                if (t == tensor_index.end())
                    fail(strformat("%s: %s: slice of unknown tensor '%s'", where.c_str(), bpath.c_str(),
                                   s[0].get<std::string>().c_str()));
                ManifestSlice slice{t->second, rd.uint(s[1], bpath), rd.uint(s[2], bpath), rd.uint(s[3], bpath)};
                if (s.size() == 6) {
                    slice.run = rd.uint(s[4], bpath);
                    slice.stride = rd.uint(s[5], bpath);
                    if (slice.run == 0 || slice.stride < slice.run || slice.end < slice.begin + slice.run ||
                        (slice.end - slice.begin - slice.run) % slice.stride != 0)
                        fail(strformat("%s: %s: strided slice %s: runs of `run` elements `stride` >= run apart must "
                                       "end exactly at end", where.c_str(), bpath.c_str(), s.dump().c_str()));
                }
                const uint64_t bytes = slice.elements() * state_dtype_bytes(mb.dtype);
                if (slice.begin >= slice.end || slice.end > m.tensors[slice.tensor].elements() ||
                    slice.byte_offset > f.bytes || bytes > f.bytes - slice.byte_offset)
                    fail(strformat("%s: %s: slice %s lies outside its tensor (%llu elements) or its file (%llu bytes)",
                                   where.c_str(), bpath.c_str(), s.dump().c_str(),
                                   (unsigned long long)m.tensors[slice.tensor].elements(), (unsigned long long)f.bytes));
                mb.slices.push_back(slice);
            }
            f.buffers.push_back(std::move(mb));
        }
        detail::check_slices_tile_file(f, where, path);
        m.files.push_back(std::move(f));
    }
    return m;
}

}  // namespace llmc
