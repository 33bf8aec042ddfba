// data/eval_loader.h: llm.c's multiple-choice evaluation file (HellaSwag), read and checked once,
// and its items laid out as rows of B x T forwards.
//
// The file (llm.c's dev/data write_evalfile layout): a header of 256 int32, [0] 20240522, [1] 1,
// [2] the item count, [3] the longest item in bytes; then per item a run of uint16: 65535 (the
// delimiter), the run's length in bytes (delimiter included), the item's index (its position), the
// label (the right ending, 0-3), the ending count (4), the context's length and tokens, then per
// ending its length and tokens.
//
// The idea: each (item, ending) pair is one row of T positions, context then ending, scored by the
// mean cross-entropy of the ending's tokens given what precedes them. Row r is item r / 4's ending
// r % 4 and forward k holds rows [kB, (k+1)B): the layout depends on the file and B alone, never on
// how many ranks share the forwards, so every mesh scores every row the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/data/llmc_header.h"
#include "llmc/utils.h"

namespace llmc {

constexpr int EVAL_FILE_VERSION = 1;
constexpr int EVAL_ENDINGS = 4;          // HellaSwag's; llm.c's reader assumes it too
constexpr uint16_t EVAL_DELIMITER = 65535;

struct EvalItem {
    int label = 0;  // the right ending
    std::vector<int> context;
    std::vector<int> endings[EVAL_ENDINGS];
    // Positions the row of ending e takes: the context and the ending, less the last token, which
    // predicts nothing scored.
    int row_positions(int e) const { return (int)(context.size() + endings[e].size()) - 1; }
};

// The positions of a row whose targets are ending tokens: [first, first + count); count 0 for a
// padding row, which scores nothing.
struct RowSpan {
    int first = 0, count = 0;
};

class EvalSet {
public:
    // Reads `path` and checks every item (delimiter, length, index, label, four non-empty endings, a
    // non-empty context, tokens below vocab_size) and that every row fits T positions. `who` names
    // the option the file came from, for the errors.
    EvalSet(const std::string& path, int vocab_size, int T, const std::string& who) : path_(path) {
        File f(path, "rb");
        const int64_t file_bytes = f.size();
        const LlmcHeader header = read_llmc_header(f, EVAL_FILE_MAGIC, " (make one with dev/data/hellaswag.py)");
        if (header[1] != EVAL_FILE_VERSION) fail_llmc_version(f, EVAL_FILE_MAGIC, header[1], "1");
        const int items = header[2], longest_bytes = header[3];
        if (items < 1 || longest_bytes < 1)
            fail(strformat("'%s': the header says %d items, the longest of %d bytes (byte offsets 8 and 12); expected "
                           "at least one item of a positive length", path.c_str(), items, longest_bytes));
        const int64_t body_bytes = file_bytes - LLMC_HEADER_BYTES;
        if (body_bytes % 2 != 0)
            fail(strformat("'%s': its %lld bytes after the header are not a whole number of uint16 tokens",
                           path.c_str(), (long long)body_bytes));
        body_.resize((size_t)body_bytes / 2);
        f.read(body_.data(), body_.size(), "evaluation items");
        items_.resize(items);
        size_t at = 0;  // in uint16s from the end of the header
        for (int i = 0; i < items; i++) at = parse_item(i, at, longest_bytes, vocab_size);
        if (at != body_.size())
            fail(strformat("'%s': %zu bytes follow the last of its %d items (byte offset %lld); the header's item "
                           "count does not describe the file", path.c_str(), (body_.size() - at) * 2, items,
                           (long long)byte_offset(at)));
        body_.clear();
        body_.shrink_to_fit();
        check_fits(T, who);
    }

    const std::string& path() const { return path_; }
    int items() const { return (int)items_.size(); }
    const EvalItem& item(int i) const { return items_[i]; }
    int rows() const { return items() * EVAL_ENDINGS; }
    // Forwards of B rows that hold every row; the last one's spare rows are padding.
    int forwards(int B) const { return (rows() + B - 1) / B; }
    // The longest row's positions: the smallest T that holds every row.
    int longest_row() const {
        int longest = 0;
        for (const EvalItem& it : items_)
            for (int e = 0; e < EVAL_ENDINGS; e++) longest = std::max(longest, it.row_positions(e));
        return longest;
    }

    // Forward k's B x T inputs and targets, and which positions of each row are scored. A row's
    // inputs are its context and ending (less the last token), its targets the same shifted by one;
    // positions past the row, and whole rows past the last, are token 0 and unscored. k may be past
    // the last forward (a rank with nothing left): then every row is padding.
    void fill_forward(int k, int B, int T, int* inputs, int* targets, RowSpan* spans) const {
        std::fill(inputs, inputs + (size_t)B * T, 0);
        std::fill(targets, targets + (size_t)B * T, 0);
        for (int b = 0; b < B; b++) {
            const long row = (long)k * B + b;
            spans[b] = RowSpan{};
            if (row >= rows()) continue;
            const EvalItem& it = items_[row / EVAL_ENDINGS];
            const std::vector<int>& ending = it.endings[row % EVAL_ENDINGS];
            const int n = (int)it.context.size();
            int* in = inputs + (size_t)b * T;
            int* tg = targets + (size_t)b * T;
            auto token = [&](int p) { return p < n ? it.context[p] : ending[p - n]; };
            const int positions = it.row_positions(row % EVAL_ENDINGS);
            for (int p = 0; p < positions; p++) {
                in[p] = token(p);
                tg[p] = token(p + 1);
            }
            spans[b] = RowSpan{n - 1, (int)ending.size()};
        }
    }

private:
    int64_t byte_offset(size_t at) const { return LLMC_HEADER_BYTES + 2 * (int64_t)at; }

    // Item i, which starts at uint16 `at`; returns where the next one starts.
    size_t parse_item(int i, size_t at, int longest_bytes, int vocab_size) {
        auto bad = [&](const std::string& what) {
            fail(strformat("'%s': item %d (byte offset %lld) %s", path_.c_str(), i, (long long)byte_offset(at),
                           what.c_str()));
        };
        const size_t left = body_.size() - at;
        if (left < 6) bad(strformat("is truncated: %zu bytes left, an item takes at least 12", left * 2));
        const uint16_t* w = body_.data() + at;
        if (w[0] != EVAL_DELIMITER) bad(strformat("does not start with the delimiter 65535 but with %d", w[0]));
        const int bytes = w[1];
        if (bytes % 2 != 0 || bytes < 12)
            bad(strformat("says it is %d bytes long: expected an even count of at least 12", bytes));
        if ((size_t)bytes / 2 > left)
            bad(strformat("is truncated: it says it is %d bytes long, the file has %zu left", bytes, left * 2));
        if (bytes > longest_bytes)
            bad(strformat("is %d bytes long, longer than the header's longest item (%d bytes)", bytes, longest_bytes));
        if (w[2] != i) bad(strformat("has index %d: expected %d (items are numbered in file order)", w[2], i));
        if (w[3] >= EVAL_ENDINGS) bad(strformat("has label %d: expected 0 to %d", w[3], EVAL_ENDINGS - 1));
        if (w[4] != EVAL_ENDINGS) bad(strformat("has %d endings: expected %d", w[4], EVAL_ENDINGS));
        EvalItem& it = items_[i];
        it.label = w[3];
        const size_t end = (size_t)bytes / 2;
        size_t p = 5;  // the context's length, then the endings', each before its tokens
        auto take = [&](std::vector<int>& tokens, const char* what) {
            if (p >= end) bad(strformat("ends before its %s's length (%d bytes long)", what, bytes));
            const int n = w[p++];
            if (n < 1) bad(strformat("has an empty %s", what));
            if (p + n > end)
                bad(strformat("has a %s of %d tokens that runs past the item's end (%d bytes long)", what, n, bytes));
            for (int t = 0; t < n; t++) {
                if (w[p + t] >= vocab_size)
                    bad(strformat("has token %d in its %s: not below the model's vocab_size %d", w[p + t], what,
                                  vocab_size));
                tokens.push_back(w[p + t]);
            }
            p += n;
        };
        take(it.context, "context");
        static const char* names[EVAL_ENDINGS] = {"ending 0", "ending 1", "ending 2", "ending 3"};
        for (int e = 0; e < EVAL_ENDINGS; e++) take(it.endings[e], names[e]);
        if (p != end) bad(strformat("says it is %d bytes long, but its tokens end after %zu", bytes, p * 2));
        return at + end;
    }

    // Every row must fit T positions: the error names the longest row and the T it needs.
    void check_fits(int T, const std::string& who) const {
        for (int i = 0; i < items(); i++)
            for (int e = 0; e < EVAL_ENDINGS; e++)
                if (items_[i].row_positions(e) > T) {
                    const int need = longest_row();
                    fail(strformat("%s '%s': item %d's ending %d needs %d positions (its context and ending, less "
                                   "one), more than -t (seq_len) %d; the file's longest row needs -t %d or more",
                                   who.c_str(), path_.c_str(), i, e, items_[i].row_positions(e), T, need));
                }
    }

    std::string path_;
    std::vector<EvalItem> items_;
    std::vector<uint16_t> body_;  // the items as read, until parsed
};

}  // namespace llmc
