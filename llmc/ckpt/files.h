// ckpt/files.h: a checkpoint directory's names (ckpt_<step>/, rank_<rank>.bin, manifest.json,
// COMPLETE) and the durable writes every file of it goes through (checkpoint.h says why).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/ckpt/crc32c.h"
#include "llmc/failures/faults.h"
#include "llmc/utils.h"

namespace llmc {

inline constexpr const char* CHECKPOINT_MARKER = "COMPLETE";
inline constexpr const char* CHECKPOINT_MANIFEST = "manifest.json";

inline std::string checkpoint_dir_name(int step) { return strformat("ckpt_%08d", step); }
inline std::string rank_file_name(int rank) { return strformat("rank_%05d.bin", rank); }
// The step of a directory named ckpt_<8 digits>, or -1.
inline int checkpoint_step_of(const std::string& name) {
    if (name.size() != 13 || name.rfind("ckpt_", 0) != 0) return -1;
    for (size_t i = 5; i < name.size(); i++)
        if (name[i] < '0' || name[i] > '9') return -1;
    return std::atoi(name.c_str() + 5);
}
// The steps of the ckpt_<step> directories in root, complete or not, oldest first (none where root
// cannot be read).
inline std::vector<int> checkpoint_steps_in(const std::string& root) {
    std::vector<int> steps;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
        const int step = checkpoint_step_of(entry.path().filename().string());
        if (step >= 0 && entry.is_directory()) steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}
// --resume-from's checkpoint directory, normalized ("out/ckpt_00000008/" is out/ckpt_00000008), and
// the directory that holds it.
inline std::filesystem::path resume_from_path(const std::string& resume_from) {
    std::filesystem::path p = std::filesystem::path(resume_from).lexically_normal();
    return p.filename().empty() ? p.parent_path() : p;
}
inline std::string resume_from_root(const std::string& resume_from) {
    const std::filesystem::path parent = resume_from_path(resume_from).parent_path();
    return parent.empty() ? "." : parent.string();
}
// A field of the manifest in checkpoint directory `dir`; `otherwise` where it lacks the field or
// cannot be read (an incomplete checkpoint).
template <typename T>
inline T manifest_field(const std::string& dir, const char* key, const T& otherwise) {
    try {
        return nlohmann::json::parse(read_text_file(dir + "/" + CHECKPOINT_MANIFEST)).value(key, otherwise);
    } catch (const std::exception&) {
        return otherwise;
    }
}

namespace detail {

// Writes n bytes to dir/name durably: a temporary file, written and checksummed chunk by chunk,
// fsynced, renamed over the name, the directory fsynced. Returns the CRC32C. On an error the
// temporary is removed and the error names the path and the system's reason. A large buffer that
// starts on a 4 KiB boundary (a snapshot) is written with O_DIRECT, from the buffer to the disk
// without a copy into the page cache, which saves the CPU that training is using meanwhile; the
// unaligned tail, and filesystems without O_DIRECT (tmpfs), go through the page cache.
inline uint32_t write_file_durably(const std::string& dir, const std::string& name, const void* data, size_t n,
                                   bool inject_full_disk = false) {
    const std::string path = dir + "/" + name, tmp = path + ".tmp";
    constexpr size_t kAlign = 4096;
    bool direct = reinterpret_cast<uintptr_t>(data) % kAlign == 0 && n >= (1u << 20);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0 && direct && errno == EINVAL) {
        direct = false;
        fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (fd < 0) fail(strformat("cannot create '%s': %s", tmp.c_str(), strerror(errno)));
    auto leave_direct = [&] {
        direct = false;
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
    };
    auto fail_with = [&](const char* what, int err) {
        ::close(fd);
        ::unlink(tmp.c_str());
        fail(strformat("cannot %s '%s': %s", what, tmp.c_str(), strerror(err)));
    };
    const char* p = static_cast<const char*>(data);
    uint32_t crc = 0;
    const size_t chunk = 8u << 20;
    for (size_t at = 0; at < n;) {
        size_t len = std::min(chunk, n - at);
        if (direct && len % kAlign != 0) {  // the tail: whole blocks directly, the rest buffered
            if (len >= kAlign) len -= len % kAlign;
            else leave_direct();
        }
        if (inject_full_disk && at + len > n / 2) fail_with("write", ENOSPC);
        ssize_t wrote = ::write(fd, p + at, len);
        if (wrote < 0) {
            if (errno == EINTR) continue;
            if (direct && errno == EINVAL) {  // this filesystem refuses direct writes after all
                leave_direct();
                continue;
            }
            fail_with("write", errno);
        }
        crc = crc32c(crc, p + at, (size_t)wrote);  // only what was written: a short write resumes there
        at += (size_t)wrote;
        if (direct && at % kAlign != 0) leave_direct();
    }
    if (::fsync(fd) != 0) fail_with("sync", errno);
    if (::close(fd) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        fail(strformat("cannot close '%s': %s", tmp.c_str(), strerror(err)));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        fail(strformat("cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(), strerror(err)));
    }
    fsync_dir(dir);
    return crc;
}

// CRC32C and size of a whole file, read in chunks.
inline uint32_t crc32c_of_file(const std::string& path, uint64_t* size) {
    File f(path, "rb");
    *size = (uint64_t)f.size();
    std::vector<char> buf(8u << 20);
    uint32_t crc = 0;
    for (uint64_t at = 0; at < *size;) {
        const size_t len = (size_t)std::min<uint64_t>(buf.size(), *size - at);
        f.read(buf.data(), len, "checkpoint data");
        crc = crc32c(crc, buf.data(), len);
        at += len;
    }
    return crc;
}

inline void remove_tree(const std::string& path) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) fail(strformat("cannot remove '%s': %s", path.c_str(), ec.message().c_str()));
}

// Writes the manifest and then the marker into a checkpoint directory.
inline void commit_checkpoint(const std::string& dir, int step, const std::string& manifest) {
    const uint32_t crc = write_file_durably(dir, CHECKPOINT_MANIFEST, manifest.data(), manifest.size());
    const std::string marker = nlohmann::json{{"step", step}, {"manifest_crc32c", crc}}.dump() + "\n";
    write_file_durably(dir, CHECKPOINT_MARKER, marker.data(), marker.size());
}

}  // namespace detail

}  // namespace llmc
