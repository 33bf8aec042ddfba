// dist/config_check.h: at start-up the ranks prove that they run the same configuration and the
// same binary.
//
// Every rank parses its own command line (and --config file), so an MPMD launch, a mistyped host
// file or a stale binary on one node gives ranks that train with different seeds or shapes and
// never notice; the collectives only check sizes. The one idea: each rank hashes its resolved
// config.json and its own executable, and one small all-gather compares the hashes; only when they
// differ are the whole configurations gathered, so the error can name the ranks and the fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/ckpt/crc32c.h"
#include "llmc/config.h"
#include "llmc/dist/comm.h"
#include "llmc/utils.h"

namespace llmc {

// CRC32C of this process's executable (Linux's /proc/self/exe); 0 where it cannot be read.
inline uint32_t executable_crc32c() {
    FILE* f = fopen("/proc/self/exe", "rb");
    if (!f) return 0;
    std::vector<char> chunk(1 << 20);
    uint32_t crc = 0;
    for (size_t got; (got = fread(chunk.data(), 1, chunk.size(), f)) > 0;) crc = crc32c(crc, chunk.data(), got);
    fclose(f);
    return crc;
}

// The top-level fields (and "resolved.<field>") in which two configurations differ, with both values.
inline std::string config_differences(const nlohmann::json& a, const nlohmann::json& b, const std::string& prefix = "") {
    std::string out;
    for (auto& [key, value] : a.items()) {
        const nlohmann::json other = b.contains(key) ? b.at(key) : nlohmann::json();
        if (value == other) continue;
        if (value.is_object() && other.is_object()) {
            out += config_differences(value, other, prefix + key + ".");
            continue;
        }
        out += strformat("%s%s%s (%s vs %s)", out.empty() ? "" : ", ", prefix.c_str(), key.c_str(),
                         value.dump().c_str(), other.dump().c_str());
    }
    return out;
}

// Collective over `world`: fails on every rank, naming each rank that differs from rank 0 and how,
// unless all ranks resolved the same configuration and run the same executable.
inline void check_ranks_agree(const RunConfig& cfg, Communicator& world) {
    if (world.world_size() == 1) return;
    const std::string config = run_config_json(cfg).dump();
    const uint32_t exe = executable_crc32c();
    const std::string mine = strformat("%08x %08x", crc32c(0, config.data(), config.size()), exe);
    const std::vector<std::string> hashes = all_gather_strings(world, mine);
    bool same = true;
    for (const std::string& h : hashes) same &= h == hashes[0];
    if (same) return;
    const std::vector<std::string> configs = all_gather_strings(world, config);
    const std::vector<std::string> exes = all_gather_strings(world, strformat("%08x", exe));
    const nlohmann::json reference = nlohmann::json::parse(configs[0]);
    std::string report;
    for (int r = 1; r < world.world_size(); r++) {
        if (hashes[r] == hashes[0]) continue;
        std::string why;
        if (configs[r] != configs[0])
            why = "config: " + config_differences(nlohmann::json::parse(configs[r]), reference);
        if (exes[r] != exes[0])
            why += strformat("%sexecutable: CRC32C %s vs %s (another build)", why.empty() ? "" : "; ", exes[r].c_str(),
                             exes[0].c_str());
        report += strformat("\n  rank %d differs from rank 0 in %s", r, why.c_str());
    }
    fail(strformat("the ranks were launched with different configurations or binaries (values: that rank's vs rank "
                   "0's):%s", report.c_str()));
}

}  // namespace llmc
