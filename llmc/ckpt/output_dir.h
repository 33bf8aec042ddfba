// ckpt/output_dir.h: an output directory belongs to one run at a time.
//
// A run of several weeks is restarted many times, and each restart must continue that run: never
// another run's checkpoints that happen to sit in the same directory. So every run has an identity,
// a random run id, recorded in each checkpoint's manifest, and the output directory says whose
// checkpoints it holds:
//   run.json   {"run_id": "..."}: the run whose checkpoints ckpt_<step>/ are
//   .lock      held (flock) by rank 0 while a run uses the directory; it says which process and host
// A run is one of three kinds:
//   fresh (neither -y nor --resume-from)  a new run id. Refused where the directory holds another
//                                         run's checkpoints, unless --overwrite 1, which removes them.
//   -y 1                                  the directory's own run: its run id, its newest checkpoint.
//   --resume-from DIR                     the run that wrote DIR (DIR's directory's run.json, or DIR's
//                                         manifest). Refused where the output directory holds another
//                                         run's checkpoints, unless --overwrite 1.
// Resume skips a checkpoint whose manifest names another run (checkpoint.h), and the local tier of
// each run has a directory of its own, so a run neither continues nor prunes another's history.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/ckpt/checkpoint.h"
#include "llmc/config.h"
#include "llmc/dist/comm.h"
#include "llmc/utils.h"

namespace llmc {

inline constexpr const char* RUN_FILE = "run.json";
inline constexpr const char* LOCK_FILE = ".lock";

namespace detail {

// 16 hex digits from the system's entropy and the clock.
inline std::string new_run_id() {
    std::random_device entropy;
    const uint64_t now = (uint64_t)std::chrono::system_clock::now().time_since_epoch().count();
    const uint64_t id = ((uint64_t)entropy() << 32 ^ entropy()) ^ now * 0x9e3779b97f4a7c15ull;
    return strformat("%016llx", (unsigned long long)id);
}

// The run id a run.json names; "" where there is none.
inline std::string read_run_id(const std::string& dir) {
    const std::string path = dir + "/" + RUN_FILE;
    if (!std::filesystem::exists(path)) return "";
    try {
        const nlohmann::json j = nlohmann::json::parse(read_text_file(path));
        if (j.is_object() && j.contains("run_id") && j["run_id"].is_string() && !j["run_id"].get<std::string>().empty())
            return j["run_id"].get<std::string>();
    } catch (const nlohmann::json::exception&) {
    }
    fail(strformat("'%s' is not a run file: expected {\"run_id\": \"<id>\"} (written by llmc; remove it only with the "
                   "directory's checkpoints)",
                   path.c_str()));
}

inline std::string describe_run(const std::string& run_id) {
    return run_id.empty() ? "a run without a run id" : "run " + run_id;
}

// steps: checkpoint_steps_in's, not empty.
inline std::string describe_checkpoints(const std::vector<int>& steps, const std::string& run_id) {
    const std::string what = steps.size() == 1 ? checkpoint_dir_name(steps[0])
                                               : checkpoint_dir_name(steps.front()) + " ... " +
                                                     checkpoint_dir_name(steps.back());
    return strformat("%zu checkpoint(s), %s, of %s", steps.size(), what.c_str(), describe_run(run_id).c_str());
}

// Holds dir/.lock for the life of the process (the kernel lets go when it ends, however it ends),
// or fails naming the process that holds it. A run relaunched at once after a kill may find the
// killed one still exiting: the lock is tried for LOCK_WAIT_S before that counts as another run.
// Returns the lock's descriptor (-1: a filesystem without flock, with a warning).
inline constexpr double LOCK_WAIT_S = 5.0;
inline int lock_output_dir(const std::string& dir) {
    const std::string path = dir + "/" + LOCK_FILE;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail(strformat("cannot open the lock file '%s': %s", path.c_str(), strerror(errno)));
    const auto give_up = deadline_after(LOCK_WAIT_S);
    int err = 0;  // flock's errno, 0 once the lock is held
    while ((err = ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno) == EWOULDBLOCK &&
           std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (err != 0) {
        if (err == EWOULDBLOCK) {
            char holder[256] = {0};
            const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
            ::close(fd);
            std::string who = n > 0 ? std::string(holder, (size_t)n) : "another process";
            while (!who.empty() && who.back() == '\n') who.pop_back();
            fail(strformat("output directory '%s' is in use by another run (%s): wait for it to end, or choose "
                           "another -o",
                           dir.c_str(), who.c_str()));
        }
        printf("output: warning: cannot lock '%s' (%s): make sure no other run writes to '%s'\n", path.c_str(),
               strerror(err), dir.c_str());
        ::close(fd);
        return -1;
    }
    return fd;  // open until the process ends: the lock is its own
}

// Writes into the lock file who holds it, for the message of a run that finds it taken.
inline void note_lock_holder(int fd, const std::string& dir) {
    if (fd < 0) return;
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    const std::time_t now = std::time(nullptr);
    char when[64];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
    const std::string who = strformat("process %d on %s since %s\n", (int)getpid(), host, when);
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) != (ssize_t)who.size())
        printf("output: warning: cannot write '%s/%s': %s\n", dir.c_str(), LOCK_FILE, strerror(errno));
}

// The run id in a checkpoint's manifest; "" where it has none or cannot be read (an incomplete
// checkpoint: the resume skips it and says why).
inline std::string run_id_in_manifest(const std::string& checkpoint_dir) {
    return manifest_field(checkpoint_dir, "run_id", std::string());
}

// The run that --resume-from DIR continues: DIR's directory's run.json, else DIR's manifest.
inline std::string run_id_of_checkpoint(const std::string& resume_from) {
    const std::filesystem::path p = resume_from_path(resume_from);
    if (!std::filesystem::is_directory(p))
        fail(strformat("--resume-from '%s': no such checkpoint directory", resume_from.c_str()));
    const std::string id = read_run_id(resume_from_root(resume_from));
    return id.empty() ? run_id_in_manifest(p.string()) : id;
}

// The run -y 1 continues: the directory's run.json, else (checkpoints copied into a directory of
// their own) the newest checkpoint's manifest that names one.
inline std::string run_id_to_continue(const std::string& dir, const std::string& owner, const std::vector<int>& steps) {
    if (!owner.empty()) return owner;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
        const std::string id = run_id_in_manifest(dir + "/" + checkpoint_dir_name(*it));
        if (!id.empty()) return id;
    }
    return "";
}

// Rank 0's part of claim_output_dir: returns the run id.
inline std::string claim_on_rank0(const RunConfig& cfg) {
    make_dirs(cfg.output_dir);
    const int lock = lock_output_dir(cfg.output_dir);
    for (const std::string& line : remove_stale_temporaries(cfg.output_dir)) printf("output: %s\n", line.c_str());
    const std::string owner = read_run_id(cfg.output_dir);
    const std::vector<int> checkpoints = checkpoint_steps_in(cfg.output_dir);
    std::string run_id;
    bool continues = false;  // this run is the one whose checkpoints the directory holds
    if (!cfg.resume_from.empty()) {
        run_id = run_id_of_checkpoint(cfg.resume_from);
        std::error_code ec;
        continues = (!owner.empty() && run_id == owner) ||
                    std::filesystem::equivalent(resume_from_root(cfg.resume_from), cfg.output_dir, ec);
    } else if (cfg.resume) {
        run_id = run_id_to_continue(cfg.output_dir, owner, checkpoints);
        continues = true;
    }
    if (!continues && !checkpoints.empty()) {
        const std::string held = describe_checkpoints(checkpoints, owner);
        if (!cfg.overwrite) {
            if (cfg.resume_from.empty())
                fail(strformat("output directory '%s' holds another run's checkpoints (%s): continue that run with "
                               "-y 1, choose another -o, or pass --overwrite 1 to delete them and start afresh",
                               cfg.output_dir.c_str(), held.c_str()));
            fail(strformat("--resume-from '%s' continues %s, but output directory '%s' holds another run's "
                           "checkpoints (%s): use the checkpoint's own directory as -o, choose another -o, or pass "
                           "--overwrite 1 to delete them",
                           cfg.resume_from.c_str(), describe_run(run_id).c_str(), cfg.output_dir.c_str(), held.c_str()));
        }
        for (int step : checkpoints) remove_tree(cfg.output_dir + "/" + checkpoint_dir_name(step));
        printf("output: --overwrite 1: removed %s from '%s'\n", held.c_str(), cfg.output_dir.c_str());
    }
    if (run_id.empty()) run_id = new_run_id();
    if (run_id != owner)
        write_text_file_atomic(cfg.output_dir + "/" + RUN_FILE, nlohmann::json{{"run_id", run_id}}.dump() + "\n");
    note_lock_holder(lock, cfg.output_dir);
    return run_id;
}

}  // namespace detail

// A resumed run keeps the total batch of the run it continues: without -d it takes
// total_batch_tokens from that run's config.json (the output directory's, or --resume-from's
// directory's), so that resuming on another number of ranks needs no -d. Before resolve_run_config.
// Returns the config.json it took it from ("": none).
inline std::string inherit_total_batch(RunConfig& cfg) {
    if ((!cfg.resume && cfg.resume_from.empty()) || cfg.given.count("total_batch_tokens")) return "";
    const std::string dir = cfg.resume_from.empty() ? cfg.output_dir : resume_from_root(cfg.resume_from);
    if (checkpoint_steps_in(dir).empty()) return "";  // nothing to continue
    const std::string path = dir + "/config.json";
    try {
        const nlohmann::json j = nlohmann::json::parse(read_text_file(path));
        if (!j.contains("total_batch_tokens") || !j["total_batch_tokens"].is_number_integer()) return "";
        cfg.total_batch_tokens = j["total_batch_tokens"].get<int>();
        cfg.given.insert("total_batch_tokens");
        return path;
    } catch (const std::exception&) {
        return "";  // no config.json (nothing to resume, or a checkpoint copied alone): the default stands
    }
}

// Makes and locks the output directory, settles which run this is (the header) and sets
// cfg.run_id. Collective over `world`: rank 0 decides, and a refusal fails on every rank alike.
inline void claim_output_dir(RunConfig& cfg, Communicator& world) {
    std::string verdict;  // "ok <run id>" or "error <message>"
    if (world.rank() == 0) {
        try {
            verdict = "ok " + detail::claim_on_rank0(cfg);
        } catch (const std::exception& e) {
            verdict = std::string("error ") + e.what();
        }
    }
    verdict = all_gather_strings(world, verdict)[0];
    if (verdict.rfind("error ", 0) == 0) fail(verdict.substr(6));
    cfg.run_id = verdict.substr(3);
}

}  // namespace llmc
