// test_hellaswag.cpp: the HellaSwag evaluation: llm.c's evaluation file read and checked
// (data/eval_loader.h), its rows laid out, and the accuracy (training/hellaswag.h) of the tiny
// fixture model agreeing item by item with the float64 PyTorch reference (dev/ref/hellaswag_ref.py).
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/data/eval_loader.h"
#include "llmc/models/cpu_model.h"
#include "llmc/models/model_file.h"
#include "llmc/training/hellaswag.h"
#include "llmc/utils.h"

using namespace llmc;
using Catch::Contains;

namespace {

const char* MODEL_PATH = "test/fixtures/gpt2_tiny_model.bin";
const char* ITEMS_PATH = "test/fixtures/hellaswag_tiny.bin";      // hellaswag_ref.py --fixture
const char* REF_PATH = "test/fixtures/hellaswag_tiny_ref.json";

struct Item {
    int label;
    std::vector<int> context;
    std::vector<std::vector<int>> endings;
};

// An evaluation file in llm.c's layout, written the way dev/data/hellaswag.py writes one; `edit`
// may then spoil its words (the uint16s after the header) or its header before it is written.
std::string write_items(const std::string& name, const std::vector<Item>& items,
                        const std::function<void(std::vector<int32_t>&, std::vector<uint16_t>&)>& edit = nullptr) {
    std::vector<uint16_t> words;
    int longest = 0;
    for (size_t i = 0; i < items.size(); i++) {
        const size_t start = words.size();
        words.insert(words.end(), {EVAL_DELIMITER, 0, (uint16_t)i, (uint16_t)items[i].label,
                                   (uint16_t)items[i].endings.size(), (uint16_t)items[i].context.size()});
        words.insert(words.end(), items[i].context.begin(), items[i].context.end());
        for (const std::vector<int>& e : items[i].endings) {
            words.push_back((uint16_t)e.size());
            words.insert(words.end(), e.begin(), e.end());
        }
        words[start + 1] = (uint16_t)(2 * (words.size() - start));
        longest = std::max(longest, 2 * (int)(words.size() - start));
    }
    std::vector<int32_t> header(LLMC_HEADER_INTS, 0);
    header[0] = EVAL_FILE_MAGIC, header[1] = EVAL_FILE_VERSION, header[2] = (int)items.size(), header[3] = longest;
    if (edit) edit(header, words);
    const std::string path = std::filesystem::temp_directory_path().string() + "/llmc_hellaswag_" +
                             std::to_string(getpid()) + "_" + name;
    File f(path, "wb");
    f.write(header.data(), header.size());
    f.write(words.data(), words.size());
    f.close();
    return path;
}

std::vector<Item> small_items() {
    return {{2, {5, 6, 7}, {{8}, {9, 10}, {11, 12, 13}, {14}}}, {0, {20, 21}, {{22, 23}, {24}, {25}, {26, 27}}}};
}

}  // namespace

TEST_CASE("the evaluation file's rows: context then ending, the ending's positions scored, padding unscored",
          "[hellaswag]") {
    const std::string path = write_items("rows.bin", small_items());
    const EvalSet set(path, 50, 8, "--eval-hellaswag");
    REQUIRE(set.items() == 2);
    CHECK(set.rows() == 8);
    CHECK(set.item(0).label == 2);
    CHECK(set.longest_row() == 5);  // item 0's ending 2: 3 + 3 - 1
    CHECK(set.forwards(3) == 3);
    const int B = 3, T = 8;
    std::vector<int> inputs(B * T), targets(B * T);
    std::vector<RowSpan> spans(B);
    // Forward 0: item 0's endings 0-2. Ending 2's row: inputs 5 6 7 11 12, targets 6 7 11 12 13.
    set.fill_forward(0, B, T, inputs.data(), targets.data(), spans.data());
    CHECK(std::vector<int>(inputs.begin() + 2 * T, inputs.begin() + 3 * T) == std::vector<int>{5, 6, 7, 11, 12, 0, 0, 0});
    CHECK(std::vector<int>(targets.begin() + 2 * T, targets.begin() + 3 * T) ==
          std::vector<int>{6, 7, 11, 12, 13, 0, 0, 0});
    CHECK((spans[2].first == 2 && spans[2].count == 3));
    CHECK((spans[0].first == 2 && spans[0].count == 1));  // a one-token ending: the context's last position
    // Forward 2: item 1's endings 2-3, then a padding row of zeros.
    set.fill_forward(2, B, T, inputs.data(), targets.data(), spans.data());
    CHECK(std::vector<int>(inputs.begin(), inputs.begin() + 2) == std::vector<int>{20, 21});
    CHECK(spans[2].count == 0);
    CHECK(std::all_of(inputs.begin() + 2 * T, inputs.end(), [](int t) { return t == 0; }));
    // A forward past the last (a data-parallel rank with nothing left): all padding.
    set.fill_forward(7, B, T, inputs.data(), targets.data(), spans.data());
    CHECK(std::all_of(spans.begin(), spans.end(), [](const RowSpan& s) { return s.count == 0; }));
    std::filesystem::remove(path);
}

TEST_CASE("a corrupt or truncated evaluation file is an error naming the file, the item and what was expected",
          "[hellaswag]") {
    using Edit = std::function<void(std::vector<int32_t>&, std::vector<uint16_t>&)>;
    const std::vector<std::pair<Edit, std::string>> cases = {
        {[](auto& h, auto&) { h[0] = 20240520; }, "is not a multiple-choice evaluation file: magic number "
                                                   "20240520 at byte offset 0 (a token shard's), expected 20240522 "
                                                   "(make one with dev/data/hellaswag.py)"},
        {[](auto& h, auto&) { h[1] = 2; }, "unsupported multiple-choice evaluation file version 2"},
        {[](auto& h, auto&) { h[2] = 0; }, "the header says 0 items"},
        {[](auto&, auto& w) { w[0] = 7; }, "item 0 (byte offset 1024) does not start with the delimiter 65535 but with 7"},
        {[](auto&, auto& w) { w.resize(w.size() - 3); }, "item 1 (byte offset 1064) is truncated: it says it is 36 bytes long, the file has 30 left"},
        {[](auto& h, auto&) { h[2] = 3; }, "item 2 (byte offset 1100) is truncated: 0 bytes left"},
        {[](auto& h, auto&) { h[2] = 1; }, "bytes follow the last of its 1 items"},
        {[](auto&, auto& w) { w[22] = 0; }, "item 1 (byte offset 1064) has index 0: expected 1"},
        {[](auto&, auto& w) { w[3] = 4; }, "item 0 (byte offset 1024) has label 4: expected 0 to 3"},
        {[](auto&, auto& w) { w[4] = 3; }, "has 3 endings: expected 4"},
        {[](auto&, auto& w) { w[6] = 50; }, "item 0 (byte offset 1024) has token 50 in its context: not below the "
                                             "model's vocab_size 50"},
        {[](auto&, auto& w) { w[9] = 0; }, "item 0 (byte offset 1024) has an empty ending 0"},
        {[](auto& h, auto&) { h[3] = 20; }, "item 0 (byte offset 1024) is 40 bytes long, longer than the header's longest item (20 bytes)"},
    };
    for (const auto& [edit, message] : cases) {
        const std::string path = write_items("bad.bin", small_items(), edit);
        INFO(message);
        REQUIRE_THROWS_WITH(EvalSet(path, 50, 8, "--eval-hellaswag"), Contains(path) && Contains(message));
        std::filesystem::remove(path);
    }
    // A file cut in the middle of a token.
    const std::string odd = write_items("odd.bin", small_items());
    std::filesystem::resize_file(odd, std::filesystem::file_size(odd) - 1);
    REQUIRE_THROWS_WITH(EvalSet(odd, 50, 8, "--eval-hellaswag"),
                        Contains(odd) && Contains("its 75 bytes after the header are not a whole number of uint16"));
    std::filesystem::remove(odd);
    // A row longer than T: the error names the option, the row and the -t the file needs.
    const std::string path = write_items("long.bin", small_items());
    REQUIRE_THROWS_WITH(EvalSet(path, 50, 4, "--eval-hellaswag"),
                        Contains("--eval-hellaswag '" + path + "': item 0's ending 2 needs 5 positions") &&
                            Contains("more than -t (seq_len) 4; the file's longest row needs -t 5 or more"));
    std::filesystem::remove(path);
}

TEST_CASE("HellaSwag on the tiny model agrees item by item with PyTorch's float64 reference", "[hellaswag]") {
    const nlohmann::json ref = nlohmann::json::parse(read_text_file(REF_PATH));
    const ModelConfig config = read_model_header(MODEL_PATH);
    CPUModel model(config, 8, 32);
    model.load(MODEL_PATH);
    const EvalSet set(ITEMS_PATH, config.vocab_size, 32, "--eval-hellaswag");
    REQUIRE(set.items() == ref["items"].get<int>());
    HellaswagResult first;
    // The rows' layout depends on B alone: 4 rows a forward (one item each), 3 (items straddle
    // forwards) and 8 give the same scores.
    for (int B : {4, 3, 8}) {
        INFO("B = " << B);
        const HellaswagResult r = hellaswag_accuracy(model, set, local_communicator(), B, 32);
        CHECK(r.items == set.items());
        CHECK(r.correct == ref["correct"].get<int>());
        for (int i = 0; i < set.items(); i++) {
            const nlohmann::json& item = ref["items_scored"][i];
            INFO("item " << i);
            CHECK(r.predictions[i] == item["prediction"].get<int>());
            for (int e = 0; e < EVAL_ENDINGS; e++)
                CHECK(std::abs(r.ending_losses[4 * i + e] - item["losses"][e].get<double>()) < 1e-4);
        }
        if (B == 4) first = r;
        for (size_t row = 0; row < r.ending_losses.size(); row++)
            CHECK(std::abs(r.ending_losses[row] - first.ending_losses[row]) < 1e-6);
    }
    CHECK(first.accuracy() == Approx(ref["correct"].get<double>() / ref["items"].get<double>()));
}
