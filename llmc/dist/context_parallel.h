// context_parallel.h: the bookkeeping of context parallelism (--cp): which positions of a sequence
// each rank of a context group holds, which (query chunk, key chunk) pairs of causal attention carry
// work, and how two partial attention results over disjoint key sets merge through their
// log-sum-exp. Pure arithmetic, no communicator and no CUDA, so the CPU model's ring attention
// (cpu/ring_attention.h) and a CUDA one can share it.
//
// The idea: cut each sequence of T positions into 2N chunks of S = T/(2N) and give rank i chunks i
// and 2N-1-i. Under a causal mask, query chunk a attends to key chunks c <= a, so an early chunk is
// cheap and a late one dear; pairing the i-th from the front with the i-th from the back gives
// every rank the same work: 2N-1 full blocks and 2 half (diagonal) ones.
//
// The merge: a partial result over key set K is the softmax-weighted mean o_K of the values and the
// log of the softmax's normaliser, lse_K = log sum_{k in K} exp(s_k). Over K1 u K2 the normaliser is
// the sum of the two, so lse = log(exp(lse_1) + exp(lse_2)) and o = o_1 exp(lse_1 - lse) +
// o_2 exp(lse_2 - lse), in any order: a rank can fold in blocks as they arrive around the ring.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "llmc/utils.h"

namespace llmc {

// How much of a (query chunk, key chunk) block causal attention uses.
enum class BlockWork { None, Diagonal, Full };

struct ContextSplit {
    int size = 1, rank = 0;  // the context group, and this rank in it
    int T = 1;               // the sequence length being split

    // Why T does not cut into 2 * size equal chunks ("" where it does; with one rank, anything goes).
    static std::string split_problem(int T, int size) {
        if (size == 1 || T % (2 * size) == 0) return "";
        return strformat("--cp %d needs -t (seq_len) divisible by 2 x cp = %d (each rank holds 2 of the %d equal "
                         "chunks of a sequence), got -t %d", size, 2 * size, 2 * size, T);
    }
    static void check(int T, int size, const char* who) {
        if (const std::string problem = split_problem(T, size); !problem.empty())
            fail(strformat("%s: %s", who, problem.c_str()));
    }

    int chunk_len() const { return T / (2 * size); }
    int local_len() const { return size == 1 ? T : 2 * chunk_len(); }  // positions per rank and sequence
    // The global chunk held as this rank's first (half 0) or second (half 1) local chunk.
    static int chunk_of(int rank, int size, int half) { return half == 0 ? rank : 2 * size - 1 - rank; }
    int chunk_of(int half) const { return chunk_of(rank, size, half); }
    // The global position of local position j of a sequence.
    int global_position(int j) const {
        if (size == 1) return j;
        const int S = chunk_len();
        return chunk_of(j / S) * S + j % S;
    }
    // The rank that holds global position p, and p's local index there.
    int owner_of(int p) const {
        const int c = p / chunk_len();
        return size == 1 ? 0 : c < size ? c : 2 * size - 1 - c;
    }
    int local_index_at_owner(int p) const {
        const int S = chunk_len();
        return size == 1 ? p : (p / S < size ? 0 : S) + p % S;
    }
    // Sampling pads a prompt to a multiple of this: the split cuts each sequence into 2 x size chunks,
    // and sequence parallelism a rank's rows into rows_unit blocks (tp; 1 without it).
    int padding_unit(int rows_unit) const { return size == 1 ? rows_unit : size * std::lcm(2, rows_unit); }
    // The global positions of this rank's local_len() rows of a sequence, into `positions`, and the
    // values at them of `sequences` sequences of T (tokens, targets) into `mine`: `sequences` x
    // local_len() values (mine may be null: the positions only).
    void gather_local(const int* whole, int sequences, std::vector<int>& positions, std::vector<int>* mine) const {
        const int Tl = local_len();
        positions.resize(Tl);
        for (int j = 0; j < Tl; j++) positions[j] = global_position(j);
        if (!mine) return;
        mine->resize((size_t)sequences * Tl);
        for (int s = 0; s < sequences; s++)
            for (int j = 0; j < Tl; j++) (*mine)[(size_t)s * Tl + j] = whole[(size_t)s * T + positions[j]];
    }
    // The inverse, over the whole group: every rank's `sequences` x local_len() values, gathered rank
    // after rank into `gathered`, put back at their global positions of `whole` (sequences x T).
    void place_gathered(const float* gathered, int sequences, float* whole) const {
        const int Tl = local_len();
        for (int q = 0; q < size; q++) {
            const ContextSplit owner{size, q, T};
            const float* from = gathered + (size_t)q * sequences * Tl;
            for (int s = 0; s < sequences; s++)
                for (int j = 0; j < Tl; j++) whole[(size_t)s * T + owner.global_position(j)] = from[(size_t)s * Tl + j];
        }
    }
};

// A batch's tokens at this rank's positions: T of them per sequence.
struct LocalBatch {
    const int *inputs, *targets;
    int T;
};

// Where a model's pass starts: its batch cut to this rank's positions, and the buffers that hold the
// cut (both models keep one).
class LocalBatcher {
public:
    // The batch as it is without context parallelism; with it, this rank's 2 chunks of each of the
    // `sequences` sequences of T tokens, gathered (targets may be null), and positions() set to
    // their global positions. `split` is set to split T.
    LocalBatch take(ContextSplit& split, const int* inputs, const int* targets, int sequences, int T) {
        split.T = T;
        if (split.size == 1) return {inputs, targets, T};
        split.gather_local(inputs, sequences, positions_, &inputs_);
        if (targets) split.gather_local(targets, sequences, positions_, &targets_);
        return {inputs_.data(), targets ? targets_.data() : nullptr, split.local_len()};
    }
    // The global position of each of this rank's rows of a sequence, as the last take() set them.
    const std::vector<int>& positions() const { return positions_; }

private:
    std::vector<int> positions_, inputs_, targets_;
};

// Causal attention's use of the block of query chunk q against key chunk k.
inline BlockWork block_work(int q_chunk, int k_chunk) {
    if (k_chunk > q_chunk) return BlockWork::None;
    return k_chunk == q_chunk ? BlockWork::Diagonal : BlockWork::Full;
}

// The weights of a merge of two partial results (see the header): out = w_old * out_old + w_new *
// out_new and the merged log-sum-exp. A side with lse -inf (no keys yet) weighs 0.
struct LseMerge {
    float w_old, w_new, lse;
};
inline LseMerge merge_lse(float lse_old, float lse_new) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    if (lse_old == neg_inf) return {0.0f, 1.0f, lse_new};
    if (lse_new == neg_inf) return {1.0f, 0.0f, lse_old};
    const float mx = std::max(lse_old, lse_new);
    const float lse = mx + std::log(std::exp(lse_old - mx) + std::exp(lse_new - mx));
    return {std::exp(lse_old - lse), std::exp(lse_new - lse), lse};
}

// Bytes one rank sends around the ring per attention layer and micro-batch of B sequences with
// `channels` channels of keys (as many of values) held by this rank: the forward passes its K and V
// blocks on N-1 times, the backward the K and V blocks again N-1 times and the dK and dV
// accumulators N times. fp32 on the CPU model (element_bytes 4).
inline double ring_bytes_per_layer(int B, int T, int cp, int channels, int element_bytes) {
    if (cp == 1) return 0;
    const double block = (double)B * (T / cp) * 2 * channels * element_bytes;
    return block * ((cp - 1) + (cp - 1) + cp);
}

}  // namespace llmc
