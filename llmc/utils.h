// utils.h: errors, checked file I/O and atomic writes.
//
// Every failure in llmc is an llmc::Error carrying a message that names the file, flag or value
// and what was expected. Library code throws; only main() catches, prints and exits non-zero. That
// keeps the library testable (a test can assert on the message) and lets RAII clean up on the way.
//
// Files are written whole or not at all: AtomicFile writes to "<path>.tmp.<pid>" and renames onto
// the final path only when commit() succeeds, so a crash or an error never leaves a half file; the
// file is fsynced before the rename and its directory after, so a power loss cannot either.
#pragma once

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llmc {

// Every error llmc reports. exit_code (exit_codes.h) is set where the failure says what a
// supervisor should do about it (a communication timeout, a dead peer); 0 leaves the choice to
// main: a configuration error before training starts, a runtime error after.
struct Error : std::runtime_error {
    explicit Error(const std::string& message, int code = 0) : std::runtime_error(message), exit_code(code) {}
    int exit_code = 0;
};

// printf-style formatting into a std::string.
inline std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strformat(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    va_list copy;
    va_copy(copy, args);
    int n = vsnprintf(nullptr, 0, fmt, copy);
    va_end(copy);
    std::string out(n > 0 ? n : 0, '\0');
    if (n > 0) vsnprintf(out.data(), n + 1, fmt, args);
    va_end(args);
    return out;
}

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

// Milliseconds since `start` on the steady clock: how llmc times steps, waits and writes.
inline double ms_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}
// The steady-clock time `seconds` from now. Timeouts may be given as 1e10 or inf ("never"); they are
// clamped to a century, which the clock's 64-bit nanoseconds still hold, instead of overflowing it.
inline std::chrono::steady_clock::time_point deadline_after(double seconds) {
    const double clamped = std::min(seconds, 100.0 * 365 * 24 * 3600);
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(clamped));
}

// An error whose exit code (exit_codes.h) is decided here.
[[noreturn]] inline void fail_with(int exit_code, const std::string& message) { throw Error(message, exit_code); }

// A file to read must be a regular one, and is checked before it is opened: opening a FIFO for
// reading blocks until a writer comes (for ever, if none does), fopen opens a directory, and neither
// they nor a device have a size to read by. A path that does not exist is left to fopen to report.
inline void require_regular_file(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;
    const char* what = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                     : S_ISSOCK(st.st_mode) ? "a socket" : "a device";
    fail(strformat("'%s' is %s, expected a regular file", path.c_str(), what));
}

// A FILE* that closes itself. Reads and writes are checked and report the path and the byte offset.
class File {
public:
    File(const std::string& path, const char* mode) : path_(path) {
        if (mode[0] == 'r') require_regular_file(path);
        f_ = fopen(path.c_str(), mode);
        if (!f_) fail(strformat("cannot open '%s' (mode %s): %s", path.c_str(), mode, strerror(errno)));
    }
    ~File() { if (f_) fclose(f_); }
    File(const File&) = delete;
    File& operator=(const File&) = delete;

    const std::string& path() const { return path_; }

    int64_t size() {
        int64_t here = tell();
        seek(0, SEEK_END);
        int64_t end = tell();
        seek(here, SEEK_SET);
        return end;
    }
    int64_t tell() { return (int64_t)ftello(f_); }
    void seek(int64_t offset, int whence = SEEK_SET) {
        if (fseeko(f_, (off_t)offset, whence) != 0)
            fail(strformat("cannot seek to byte %lld in '%s': %s", (long long)offset, path_.c_str(), strerror(errno)));
    }
    // Reads exactly `count` items or fails naming the file and the offset where the data ran out.
    template <typename T>
    void read(T* out, size_t count, const char* what = "data") {
        int64_t at = tell();
        size_t got = fread(out, sizeof(T), count, f_);
        if (got != count)
            fail(strformat("'%s' is truncated: expected %zu bytes of %s at byte offset %lld, found %zu",
                           path_.c_str(), count * sizeof(T), what, (long long)at, got * sizeof(T)));
    }
    template <typename T>
    void write(const T* data, size_t count) {
        if (count && fwrite(data, sizeof(T), count, f_) != count)
            fail(strformat("cannot write %zu bytes to '%s': %s", count * sizeof(T), path_.c_str(), strerror(errno)));
    }
    void flush() {
        if (fflush(f_) != 0) fail(strformat("cannot write to '%s': %s", path_.c_str(), strerror(errno)));
    }
    // Flushes and asks the disk to keep what was written (fsync).
    void sync() {
        flush();
        if (fsync(fileno(f_)) != 0) fail(strformat("cannot sync '%s': %s", path_.c_str(), strerror(errno)));
    }
    // Cuts the file back to its first `size` bytes and writes on from there, clearing the error a
    // failed write left (a record half written when the disk filled up goes); false where the file
    // cannot be cut (a device).
    bool truncate(int64_t size) {
        clearerr(f_);
        return ftruncate(fileno(f_), (off_t)size) == 0 && fseeko(f_, (off_t)size, SEEK_SET) == 0;
    }
    void close() {
        FILE* f = f_;
        f_ = nullptr;
        if (f && fclose(f) != 0) fail(strformat("cannot close '%s': %s", path_.c_str(), strerror(errno)));
    }

private:
    std::string path_;
    FILE* f_ = nullptr;
};

// fsyncs a directory, so that a rename or a new file in it survives a power loss.
inline void fsync_dir(const std::string& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) fail(strformat("cannot open directory '%s' to sync it: %s", dir.c_str(), strerror(errno)));
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) fail(strformat("cannot sync directory '%s': %s", dir.c_str(), strerror(err)));
}
// The directory a path is in ("." for a bare name).
inline std::string parent_dir(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// Writes a file whole or not at all. Write through file(), then commit(); if the object is destroyed
// without commit() (an exception on the way), the temporary is removed and the target is untouched.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path)
        : path_(path), tmp_path_(path + ".tmp." + std::to_string(getpid())), file_(tmp_path_, "wb") {}
    ~AtomicFile() {
        if (!committed_) remove(tmp_path_.c_str());
    }
    File& file() { return file_; }
    void commit() {
        file_.sync();
        file_.close();
        if (rename(tmp_path_.c_str(), path_.c_str()) != 0)
            fail(strformat("cannot rename '%s' to '%s': %s", tmp_path_.c_str(), path_.c_str(), strerror(errno)));
        committed_ = true;
        fsync_dir(parent_dir(path_));
    }

private:
    std::string path_, tmp_path_;
    File file_;
    bool committed_ = false;
};

// The temporaries that AtomicFile writers killed before commit() left in `dir` ("<name>.tmp.<pid>"
// whose process is gone) are removed; one whose process still runs (another run writing into the
// same directory) is left alone. Returns a line for each, for the log.
inline std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
    std::vector<std::string> report;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        const size_t at = name.rfind(".tmp.");
        if (at == std::string::npos || at + 5 == name.size() ||
            name.find_first_not_of("0123456789", at + 5) != std::string::npos || !entry.is_regular_file(ec))
            continue;
        const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
        const std::string path = entry.path().string();
        if (pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM)) {
            report.push_back(strformat("'%s' belongs to process %ld, which still runs: left alone", path.c_str(), pid));
            continue;
        }
        const double mb = (double)entry.file_size(ec) / 1e6;
        if (std::filesystem::remove(entry.path(), ec))
            report.push_back(strformat("removed '%s' (%.1f MB), left by process %ld, which was killed while writing it",
                                       path.c_str(), mb, pid));
        else
            report.push_back(strformat("cannot remove the stale temporary '%s': %s", path.c_str(), ec.message().c_str()));
    }
    return report;
}

inline void write_text_file_atomic(const std::string& path, const std::string& text) {
    AtomicFile out(path);
    out.file().write(text.data(), text.size());
    out.commit();
}

inline std::string read_text_file(const std::string& path) {
    File f(path, "rb");
    std::string text(f.size(), '\0');
    f.read(text.data(), text.size(), "text");
    return text;
}

// Creates a directory and its parents (like mkdir -p); fails naming the path.
inline void make_dirs(const std::string& path) {
    for (size_t i = 1; i <= path.size(); i++) {
        if (i < path.size() && path[i] != '/') continue;
        std::string partial = path.substr(0, i);
        if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
            fail(strformat("cannot create directory '%s': %s", partial.c_str(), strerror(errno)));
    }
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        fail(strformat("'%s' exists but is not a directory", path.c_str()));
}

}  // namespace llmc
