// training/hellaswag.h: HellaSwag accuracy as llm.c reports it (its "acc_norm"), on any mesh.
//
// Each item's four endings are scored by the mean cross-entropy of the ending's tokens given the
// context; the prediction is the ending with the lowest mean (the first of equals), and the
// accuracy is the share of items whose prediction is the label. The rows are data/eval_loader.h's:
// forward k holds rows [kB, (k+1)B), and data-parallel rank r runs forwards r, r + dp, ... Every
// rank makes as many passes as the busiest (evaluation is collective under ZeRO-3, tp, pp and cp; a
// rank past the last forward scores padding, unused), the rows' means are gathered, and every rank
// counts the same items from the same bits. The count thus depends on the mesh only where the
// per-position losses do: tensor parallelism's cross-entropy and ring attention round them a
// little differently, which can flip only an item whose two best endings tie to within that.
#pragma once

#include <vector>

#include "llmc/data/eval_loader.h"
#include "llmc/dist/comm.h"
#include "llmc/model.h"

namespace llmc {

struct HellaswagResult {
    int correct = 0, items = 0;
    std::vector<double> ending_losses;  // item i's ending e at 4i + e: the mean loss of its tokens
    std::vector<int> predictions;       // per item, the ending of the lowest mean loss
    double accuracy() const { return items ? (double)correct / items : 0.0; }
};

// The mean of a row's scored losses, summed in position order in double.
inline double row_mean_loss(const float* losses, const RowSpan& span) {
    double sum = 0.0;
    for (int p = span.first; p < span.first + span.count; p++) sum += losses[p];
    return sum / span.count;
}

// Collective over dp (and, inside the model, the ranks it is cut over).
inline HellaswagResult hellaswag_accuracy(Model& model, const EvalSet& set, Communicator& dp, int B, int T) {
    const int ranks = dp.world_size(), forwards = set.forwards(B), passes = (forwards + ranks - 1) / ranks;
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    std::vector<float> losses((size_t)B * T);
    std::vector<RowSpan> spans(B);
    std::vector<double> mine((size_t)passes * B, 0.0);  // pass p's row b at p * B + b
    for (int pass = 0; pass < passes; pass++) {
        set.fill_forward(pass * ranks + dp.rank(), B, T, inputs.data(), targets.data(), spans.data());
        model.evaluate_rows(inputs.data(), targets.data(), B, T, losses.data());
        for (int b = 0; b < B; b++)
            if (spans[b].count > 0) mine[(size_t)pass * B + b] = row_mean_loss(losses.data() + (size_t)b * T, spans[b]);
    }
    const std::vector<double> all = all_gather_doubles(dp, mine);  // rank r's pass p at (r * passes + p) * B
    HellaswagResult result;
    result.items = set.items();
    result.ending_losses.resize(set.rows());
    for (int row = 0; row < set.rows(); row++) {
        const int k = row / B;
        result.ending_losses[row] = all[((size_t)(k % ranks) * passes + k / ranks) * B + row % B];
    }
    for (int i = 0; i < set.items(); i++) {
        const double* l = &result.ending_losses[(size_t)i * EVAL_ENDINGS];
        int best = 0;
        for (int e = 1; e < EVAL_ENDINGS; e++)
            if (l[e] < l[best]) best = e;
        result.predictions.push_back(best);
        result.correct += best == set.item(i).label;
    }
    return result;
}

}  // namespace llmc
