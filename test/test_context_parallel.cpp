// Context parallelism without MPI: the split's bookkeeping (dist/context_parallel.h) and the
// blockwise attention ops with their log-sum-exp merge (cpu/ops.h), the block pairs of every rank
// run one after another in one process, against the plain attention. (The ring itself, with its
// messages, runs under mpirun: test/mpi/test_cp.cpp.)
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "llmc/cpu/ops.h"
#include "llmc/dist/context_parallel.h"
#include "llmc/numerics/rng.h"
#include "test/rel_error.h"

using namespace llmc;

TEST_CASE("a context split gives every position to one rank, and every rank the same attention work",
          "[context_parallel]") {
    for (int N : {1, 2, 4}) {
        const int T = 8 * N;
        std::vector<int> owner(T, -1);
        std::vector<double> work(N, 0.0);
        for (int r = 0; r < N; r++) {
            const ContextSplit split{N, r, T};
            for (int j = 0; j < split.local_len(); j++) {
                const int p = split.global_position(j);
                REQUIRE(owner[p] == -1);
                owner[p] = r;
                CHECK(split.owner_of(p) == r);
                CHECK(split.local_index_at_owner(p) == j);
            }
            for (int q = 0; q < 2 && N > 1; q++)
                for (int k = 0; k < 2 * N; k++) {
                    const BlockWork w = block_work(split.chunk_of(q), k);
                    work[r] += w == BlockWork::Full ? 1.0 : w == BlockWork::Diagonal ? 0.5 : 0.0;
                }
        }
        for (int p = 0; p < T; p++) CHECK(owner[p] >= 0);
        for (int r = 1; r < N; r++) CHECK(work[r] == work[0]);
    }
    // Rank 1 of 2 holds chunks 1 and 2 of 4: positions 4-7 and 8-11 of 16.
    const ContextSplit split{2, 1, 16};
    CHECK(split.global_position(0) == 4);
    CHECK(split.global_position(4) == 8);
    CHECK(ContextSplit::split_problem(30, 2).find("-t (seq_len) divisible by 2 x cp = 4") != std::string::npos);
    CHECK(ContextSplit::split_problem(32, 2).empty());
}

TEST_CASE("merging partial results by their log-sum-exp is the softmax over the union", "[context_parallel]") {
    // Two keys of scores 1 and 3 and values 10 and 20: each alone, then merged.
    const LseMerge m = merge_lse(1.0f, 3.0f);
    const double p1 = std::exp(1.0) / (std::exp(1.0) + std::exp(3.0));
    CHECK(m.lse == Approx(std::log(std::exp(1.0) + std::exp(3.0))));
    CHECK(m.w_old * 10 + m.w_new * 20 == Approx(p1 * 10 + (1 - p1) * 20));
    const float none = -std::numeric_limits<float>::infinity();
    CHECK(merge_lse(none, 2.0f).w_new == 1.0f);
    CHECK(merge_lse(none, 2.0f).w_old == 0.0f);
}

TEST_CASE("blockwise attention over the causal block pairs equals plain attention, forward and backward",
          "[context_parallel]") {
    const int B = 2, C = 12, NH = 3, hs = C / NH;
    for (int N : {2, 4}) {
        const int T = 4 * N, S = T / (2 * N);
        Rng rng(N);
        std::vector<float> qkv((size_t)B * T * 3 * C), dout((size_t)B * T * C);
        for (float& x : qkv) x = 2 * rng.uniform() - 1;
        for (float& x : dout) x = 2 * rng.uniform() - 1;
        std::vector<float> out(dout.size()), att((size_t)B * NH * T * T), dqkv(qkv.size());
        cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
        cpu::attention_backward(dqkv.data(), dout.data(), att.data(), qkv.data(), B, T, C, NH);

        // Every rank's block pairs, straight on the whole tensors: chunk c's rows start at c * S.
        std::vector<float> block_out(out.size(), 0.0f), lse((size_t)B * NH * T, -INFINITY), rowsum(lse.size());
        std::vector<float> block_dqkv(qkv.size(), 0.0f);
        auto for_each_pair = [&](auto fn) {
            for (int r = 0; r < N; r++)
                for (int q = 0; q < 2; q++)
                    for (int k = 0; k < 2 * N; k++) {
                        const int qc = ContextSplit::chunk_of(r, N, q);
                        const BlockWork w = block_work(qc, k);
                        if (w == BlockWork::None) continue;
                        const size_t row = 3 * (size_t)C, batch = (size_t)T * row;
                        const float* base = qkv.data();
                        const float* keys = base + k * S * row + C;
                        fn(qc, k, cpu::AttentionBlock{{base + qc * S * row, row, batch}, {keys, row, batch},
                                                      {keys + C, row, batch}, B, NH, hs, S, w == BlockWork::Diagonal});
                    }
        };
        for_each_pair([&](int qc, int, const cpu::AttentionBlock& blk) {
            cpu::attention_block_forward({block_out.data() + qc * S * C, (size_t)C, (size_t)T * C}, lse.data() + qc * S,
                                         T, blk);
        });
        cpu::attention_rowsum(rowsum.data(), dout.data(), block_out.data(), B, T, C, NH);
        for_each_pair([&](int qc, int k, const cpu::AttentionBlock& blk) {
            const size_t row = 3 * (size_t)C, batch = (size_t)T * row;
            float* d = block_dqkv.data();
            cpu::attention_block_backward({d + qc * S * row, row, batch}, {d + k * S * row + C, row, batch},
                                          {d + k * S * row + 2 * C, row, batch},
                                          {dout.data() + qc * S * C, (size_t)C, (size_t)T * C}, lse.data() + qc * S,
                                          rowsum.data() + qc * S, T, blk);
        });
        CHECK(rel_error(block_out.data(), out.data(), out.size()) <= 1e-5);
        CHECK(rel_error(block_dqkv.data(), dqkv.data(), dqkv.size()) <= 1e-5);
    }
}
