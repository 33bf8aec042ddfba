// ckpt/reader.h: CheckpointReader: ranges of a saved buffer read out of a checkpoint's rank files,
// whichever files hold them (manifest.h's slices), so a run resumes on another mesh.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "llmc/ckpt/manifest.h"
#include "llmc/numerics/bf16.h"
#include "llmc/params/layout.h"
#include "llmc/utils.h"

namespace llmc {

// Reads ranges of a saved buffer out of a checkpoint's rank files, whichever files hold them.
class CheckpointReader {
public:
    CheckpointReader(const std::string& dir, const Manifest& m, const ParamLayout& layout)
        : dir_(dir), manifest_(m), layout_(layout) {
        const std::vector<ManifestTensor> mine = manifest_tensors(layout);
        for (const ManifestTensor& t : mine) {
            int found = -1;
            for (size_t i = 0; i < m.tensors.size(); i++)
                if (m.tensors[i].name == t.name) found = (int)i;
            if (found < 0) fail(strformat("checkpoint '%s' has no tensor '%s'", dir.c_str(), t.name.c_str()));
            if (m.tensors[found].shape != t.shape)
                fail(strformat("checkpoint '%s': tensor '%s' has shape %s; this model's is %s", dir.c_str(),
                               t.name.c_str(), nlohmann::json(m.tensors[found].shape).dump().c_str(),
                               nlohmann::json(t.shape).dump().c_str()));
            tensor_of_manifest_.push_back(found);
        }
    }

    bool has_buffer(const std::string& name) const {
        for (const ManifestFile& f : manifest_.files)
            for (const ManifestBuffer& b : f.buffers)
                if (b.name == name) return true;
        return false;
    }

    // Fills out[0, r.size()) with flat elements r of buffer `name`, as fp32. Each piece of the
    // range is a run of a global tensor (several, strided, for a tensor-parallel piece), and each
    // run is assembled from whichever slices of whichever files overlap it.
    void read(const std::string& name, FlatRange r, float* out) {
        const Index& index = index_for(name);
        for (const TensorPiece& p : tensor_pieces(layout_, r))
            for (size_t k = 0; k < p.runs(); k++) {
                const uint64_t lo = p.begin + k * p.stride, hi = lo + p.run_length();
                float* dst = out + (p.flat_begin - r.begin) + k * p.run_length();
                const uint64_t covered = read_run(index[tensor_of_manifest_[p.tensor]], lo, hi, dst);
                if (covered != hi - lo)
                    fail(strformat("checkpoint '%s': the files hold %llu of elements [%llu, %llu) of %s's '%s'; "
                                   "expected each exactly once",
                                   dir_.c_str(), (unsigned long long)covered, (unsigned long long)lo,
                                   (unsigned long long)hi, name.c_str(), layout_.name(p.tensor).c_str()));
            }
    }

private:
    struct Entry {
        int file;
        StateDtype dtype;
        ManifestSlice slice;
    };
    // Per manifest tensor, the slices of one buffer in every file sorted by begin, and for each
    // position the largest end among the slices up to it (slices of tensor-parallel pieces interleave).
    struct TensorIndex {
        std::vector<Entry> entries;
        std::vector<uint64_t> max_end;
    };
    using Index = std::vector<TensorIndex>;

    const Index& index_for(const std::string& name) {
        auto it = index_.find(name);
        if (it != index_.end()) return it->second;
        Index index(manifest_.tensors.size());
        for (size_t f = 0; f < manifest_.files.size(); f++)
            for (const ManifestBuffer& b : manifest_.files[f].buffers)
                if (b.name == name)
                    for (const ManifestSlice& s : b.slices) index[s.tensor].entries.push_back({(int)f, b.dtype, s});
        for (TensorIndex& t : index) {
            std::sort(t.entries.begin(), t.entries.end(),
                      [](const Entry& a, const Entry& b) { return a.slice.begin < b.slice.begin; });
            uint64_t max_end = 0;
            for (const Entry& e : t.entries) t.max_end.push_back(max_end = std::max(max_end, e.slice.end));
        }
        return index_[name] = std::move(index);
    }

    // Reads the elements of [lo, hi) that the tensor's slices hold into dst[0, hi - lo); returns how
    // many it read (hi - lo when every element is held exactly once; more means overlapping slices).
    uint64_t read_run(const TensorIndex& t, uint64_t lo, uint64_t hi, float* dst) {
        uint64_t covered = 0;
        // The slices that may overlap begin before hi; walking down from the last of them, none
        // before position i reaches lo once max_end[i] <= lo.
        size_t i = std::lower_bound(t.entries.begin(), t.entries.end(), hi,
                                    [](const Entry& e, uint64_t x) { return e.slice.begin < x; }) - t.entries.begin();
        while (i-- > 0 && t.max_end[i] > lo) {
            const ManifestSlice& s = t.entries[i].slice;
            if (s.end <= lo) continue;
            // the slice's runs that overlap [lo, hi), with their position in the slice's stored data
            const uint64_t first = s.strided() && lo > s.begin ? (lo - s.begin) / s.stride : 0;
            for (uint64_t k = first; k < s.runs(); k++) {
                const uint64_t run_begin = s.begin + k * (s.strided() ? s.stride : 0);
                if (run_begin >= hi) break;
                const uint64_t a = std::max(lo, run_begin), b = std::min(hi, run_begin + s.run_length());
                if (a >= b) continue;
                read_elements(t.entries[i], k * s.run_length() + (a - run_begin), b - a, dst + (a - lo));
                covered += b - a;
            }
        }
        return covered;
    }

    // n elements of the entry's stored data from element `first` of it on, as fp32.
    void read_elements(const Entry& e, uint64_t first, uint64_t n, float* out) {
        const ManifestFile& file = manifest_.files[e.file];
        auto& f = files_[e.file];
        if (!f) f = std::make_unique<File>(dir_ + "/" + file.path, "rb");
        const size_t elem = state_dtype_bytes(e.dtype);
        f->seek((int64_t)(e.slice.byte_offset + first * elem));
        if (e.dtype == StateDtype::F32) {
            f->read(out, n, "checkpoint data");
        } else {
            std::vector<uint16_t> bits(n);
            f->read(bits.data(), n, "checkpoint data");
            for (uint64_t i = 0; i < n; i++) out[i] = bf16_bits_to_float(bits[i]);
        }
    }

    std::string dir_;
    const Manifest& manifest_;
    const ParamLayout& layout_;
    std::vector<int> tensor_of_manifest_;  // per layout tensor
    std::map<std::string, Index> index_;
    std::map<int, std::unique_ptr<File>> files_;
};

}  // namespace llmc
