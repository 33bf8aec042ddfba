// Tests of the attention forward's tuned choice (llmc/kernels/attention_tuning.h): which row of the
// table a card and a sequence length get, and the committed table's shape.
#include <catch2/catch.hpp>

#include <cstring>

#include "llmc/kernels/attention_tuning.h"

using namespace llmc;

TEST_CASE("the tuned attention forward: the device's row with the largest T not above the asked one") {
    const AttentionTuned table[] = {
        {"NVIDIA H100 80GB HBM3", 1024, 5}, {"NVIDIA H100 80GB HBM3", 4096, 6}, {"NVIDIA H100 80GB HBM3", 2048, 3},
        {"NVIDIA H200", 1024, 4},
    };
    const size_t n = sizeof(table) / sizeof(table[0]);
    const char* h100 = "NVIDIA H100 80GB HBM3";
    CHECK(tuned_forward_version(table, n, h100, 1024, 2) == 5);
    CHECK(tuned_forward_version(table, n, h100, 2047, 2) == 5);
    CHECK(tuned_forward_version(table, n, h100, 2048, 2) == 3);  // rows need not be in order
    CHECK(tuned_forward_version(table, n, h100, 3000, 2) == 3);
    CHECK(tuned_forward_version(table, n, h100, 65536, 2) == 6);
    CHECK(tuned_forward_version(table, n, h100, 64, 2) == 5);  // shorter than every row: the shortest
    CHECK(tuned_forward_version(table, n, "NVIDIA H200", 8192, 2) == 4);
    CHECK(tuned_forward_version(table, n, "NVIDIA H100 PCIe", 1024, 2) == 2);  // a card not tuned
    CHECK(tuned_forward_version(table, n, "NVIDIA H100", 1024, 2) == 2);       // names match whole
}

TEST_CASE("the committed attention table: known versions, and a placeholder matches no device") {
    for (const AttentionTuned& r : ATTENTION_TUNED) {
        INFO("device '" << r.device << "' T " << r.T);
        CHECK(r.version >= 2);
        CHECK(r.version <= 6);
        if (r.device[0] != '\0') CHECK(r.T > 0);
    }
    CHECK(tuned_forward_version("", 1024, 7) == 7);  // the placeholder's empty name is never a device
}
