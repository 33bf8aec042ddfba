// dist/expert_parallel.h: expert parallelism's token exchange (issue 27): the ranks of an expert
// group each hold a block of E / ep consecutive experts of every mixture-of-experts block (rank q
// experts [q E/ep, (q + 1) E/ep)), and each rank's tokens travel to their experts' ranks and back.
//
// The idea: a rank routes its own tokens (cpu/moe.h: routing, capacity and the losses over its own
// rows, exactly as without expert parallelism) and numbers its assignments expert-major, so the rows
// bound for each rank are already one contiguous block. The counts go first (an all-to-all of E/ep
// integers per pair), so each rank knows how many rows it gets from whom for each of its experts;
// then the rows themselves (all_to_all_v), which land source-major and are reordered expert-major
// (each expert's rows from rank 0, then rank 1, ...), so every expert's batch is contiguous and
// runs as two plain matmuls. The outputs go back the same way reversed, and the backward sends the
// outputs' gradients out and the inputs' gradients back along the same routes. A row is the same
// computation wherever it runs (the experts' products are row by row), so the model's outputs do
// not depend on ep; only the weight gradients' sums over rows are added in another order.
#pragma once

#include <cstring>
#include <vector>

#include "llmc/dist/comm.h"
#include "llmc/utils.h"

namespace llmc {

// One block's exchange for one micro-batch: the routes its forward found, kept for its backward.
class ExpertExchange {
public:
    // Exchanges the counts (a collective over the expert group `ep`): `begin` is the rank's
    // expert-major numbering of its assignments (MoeRouting::begin, experts + 1 entries).
    void plan(Communicator& ep, const std::vector<int>& begin, int experts) {
        ranks_ = ep.world_size();
        if (experts % ranks_ != 0)
            fail(strformat("ExpertExchange: %d experts cannot be split over %d expert-parallel ranks", experts, ranks_));
        local_ = experts / ranks_;
        std::vector<int> counts_out(experts);
        for (int e = 0; e < experts; e++) counts_out[e] = begin[e + 1] - begin[e];
        counts_in_.assign((size_t)ranks_ * local_, 0);
        const std::vector<size_t> per_rank(ranks_, local_);
        // integers travel as 4-byte words: an all-to-all moves bits
        wait(ep.all_to_all_v(counts_out.data(), per_rank.data(), counts_in_.data(), per_rank.data(), CommDtype::F32));
        rows_out_.assign(ranks_, 0);
        rows_in_.assign(ranks_, 0);
        for (int q = 0; q < ranks_; q++) {
            rows_out_[q] = begin[(q + 1) * local_] - begin[q * local_];
            for (int j = 0; j < local_; j++) rows_in_[q] += counts_in_[(size_t)q * local_ + j];
        }
        local_begin_.assign(local_ + 1, 0);
        for (int j = 0; j < local_; j++) {
            local_begin_[j + 1] = local_begin_[j];
            for (int s = 0; s < ranks_; s++) local_begin_[j + 1] += counts_in_[(size_t)s * local_ + j];
        }
    }

    // This rank's experts' batches of received rows: expert j's are [local_begin()[j], [j + 1]).
    const std::vector<int>& local_begin() const { return local_begin_; }
    int local_experts() const { return local_; }
    // Rows this rank sends to each rank of the group (its assignments to that rank's experts), and
    // rows it receives from each.
    const std::vector<int>& rows_out() const { return rows_out_; }
    const std::vector<int>& rows_in() const { return rows_in_; }

    // The received rows' blocks, one per (source rank, local expert): copy(source_row, expert_row,
    // rows) for each, where source_row counts in the order they arrive (rank 0's rows for expert 0,
    // 1, ..., then rank 1's) and expert_row in the order the experts run (expert 0's from rank 0, 1,
    // ..., then expert 1's).
    template <typename Copy>
    void for_each_block(Copy copy) const {
        size_t source_at = 0;
        std::vector<int> expert_at(local_begin_.begin(), local_begin_.end() - 1);
        for (int s = 0; s < ranks_; s++)
            for (int j = 0; j < local_; j++) {
                const size_t rows = counts_in_[(size_t)s * local_ + j];
                if (rows) copy(source_at, (size_t)expert_at[j], rows);
                source_at += rows;
                expert_at[j] += (int)rows;
            }
    }

    // Sends `mine` (this rank's assignments' rows of `width`, expert-major) to their experts' ranks;
    // `theirs` becomes the rows of this rank's experts from every rank, expert-major.
    void dispatch(Communicator& ep, const float* mine, std::vector<float>& theirs, int width) {
        staging_.resize((size_t)local_begin_[local_] * width);
        theirs.resize(staging_.size());
        exchange(ep, mine, rows_out_, staging_.data(), rows_in_, width);
        reorder(staging_.data(), theirs.data(), width, true);
    }
    // The reverse of dispatch: `theirs` (rows of this rank's experts, expert-major) back to the ranks
    // whose tokens they are, into `mine` (this rank's assignments, expert-major).
    void give_back(Communicator& ep, const float* theirs, float* mine, int width) {
        staging_.resize((size_t)local_begin_[local_] * width);
        reorder(theirs, staging_.data(), width, false);
        exchange(ep, staging_.data(), rows_in_, mine, rows_out_, width);
    }

private:
    static void wait(CommHandle h) { h.wait(); }
    void exchange(Communicator& ep, const float* send, const std::vector<int>& rows_send, float* recv,
                  const std::vector<int>& rows_recv, int width) {
        std::vector<size_t> send_counts(ranks_), recv_counts(ranks_);
        for (int q = 0; q < ranks_; q++)
            send_counts[q] = (size_t)rows_send[q] * width, recv_counts[q] = (size_t)rows_recv[q] * width;
        wait(ep.all_to_all_v(send, send_counts.data(), recv, recv_counts.data(), CommDtype::F32));
    }
    // Between the source-major order rows arrive in and the expert-major order the experts run in.
    void reorder(const float* from, float* to, int width, bool to_expert_major) const {
        for_each_block([&](size_t source_row, size_t expert_row, size_t rows) {
            const size_t a = source_row * width, b = expert_row * width, n = rows * width;
            if (to_expert_major) std::memcpy(to + b, from + a, n * sizeof(float));
            else std::memcpy(to + a, from + b, n * sizeof(float));
        });
    }

    int ranks_ = 1, local_ = 0;
    std::vector<int> counts_in_;   // [source rank][local expert]: rows received
    std::vector<int> rows_out_, rows_in_;  // per rank: rows sent to it, rows received from it
    std::vector<int> local_begin_;  // the received rows' expert-major numbering, local experts + 1
    std::vector<float> staging_;    // rows in source-major order
};

}  // namespace llmc
