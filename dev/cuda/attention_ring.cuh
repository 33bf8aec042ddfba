// dev/cuda/attention_ring.cuh: context parallelism's ring attention (--cp N), every rank simulated on
// the one GPU, from llmc/kernels/attention.cuh's ring-pair functions. attention_forward.cu and
// attention_backward.cu check it against the CPU reference of the whole sequence.
//
// The split: each sequence of T rows is cut into 2N chunks of S = T / 2N rows and rank r holds chunks
// r and 2N-1-r, as its local (B, 2S) rows (chunk r first). At ring step s = 0..N-1 rank r holds the
// K and V of rank (r - s) mod N (step 0: its own) and runs every pair of one of its query chunks with
// one of the two key chunks held that causal attention uses: a key chunk before the query chunk in
// full, the same chunk causally, a later one not at all.
//   forward:  each pair's out and lse are merged into the rank's running result as they come.
//   backward: from the merged out and lse, each pair's dQ is added to the rank's accumulator and its
//             dK, dV to the key owner's (in a real ring they travel back with the K and V).
#pragma once

#include <vector>

#include "dev/cuda/common.cuh"
#include "llmc/kernels/attention.cuh"

namespace ring {

using llmc::floatX;

struct Split {
    int cp, T, S;  // ranks, sequence length, chunk length
    Split(int cp_, int T_) : cp(cp_), T(T_), S(T_ / (2 * cp_)) {
        if (T % (2 * cp) != 0) llmc::fail(llmc::strformat("ring: T %d does not cut into 2 x %d chunks", T, cp));
    }
    int local_rows() const { return 2 * S; }
    // The global chunk held as `rank`'s first (half 0) or second (half 1) local chunk.
    int chunk(int rank, int half) const { return half == 0 ? rank : 2 * cp - 1 - rank; }
};

// The workbenches' ring shapes: emulated, the first four (the last is GPT-2 124M's T, GPU only).
// KVH < NH: grouped-query attention (a Llama's), the ring carrying only the kv heads.
struct Shape {
    int B, T, NH, KVH, HS, cp;
};
inline constexpr Shape SHAPES[] = {
    {2, 148, 2, 1, 64, 2},     // chunks of 37 rows: one partial tile per pair; 2 query heads on one kv head
    {1, 296, 2, 2, 64, 4},
    {2, 280, 1, 1, 32, 2},     // chunks of 70: two tiles, the other head sizes
    {1, 160, 2, 1, 128, 2},
    {2, 1024, 12, 12, 64, 4},  // chunks of 128
};

// One (query chunk, key chunk) pair of the ring, in the order a rank runs them.
struct Pair {
    int rank, q_half;      // the queries: a local chunk of this rank
    int kv_rank, kv_half;  // the keys and values: a local chunk of the rank they came from
    bool causal;           // the same chunk: causal; else every key (the key chunk is earlier)
};

// Every pair that carries work, step by step; within a rank the order is the ring's.
inline std::vector<Pair> pairs(const Split& split) {
    std::vector<Pair> out;
    for (int step = 0; step < split.cp; step++)
        for (int rank = 0; rank < split.cp; rank++) {
            const int kv_rank = (rank - step + split.cp) % split.cp;
            for (int q_half = 0; q_half < 2; q_half++)
                for (int kv_half = 0; kv_half < 2; kv_half++) {
                    const int q_chunk = split.chunk(rank, q_half), kv_chunk = split.chunk(kv_rank, kv_half);
                    if (kv_chunk <= q_chunk) out.push_back({rank, q_half, kv_rank, kv_half, kv_chunk == q_chunk});
                }
        }
    return out;
}

// Rank `rank`'s local rows of a (sequences, T, width) host tensor, and back. lse's (B, NH, T)
// layout is B * NH sequences of width 1.
inline std::vector<float> to_local(const std::vector<float>& global, size_t sequences, size_t width,
                                   const Split& split, int rank) {
    std::vector<float> local(sequences * split.local_rows() * width);
    for (size_t b = 0; b < sequences; b++)
        for (int j = 0; j < split.local_rows(); j++) {
            const int t = split.chunk(rank, j / split.S) * split.S + j % split.S;
            std::copy_n(&global[(b * split.T + t) * width], width, &local[(b * split.local_rows() + j) * width]);
        }
    return local;
}
inline void from_local(std::vector<float>& global, const std::vector<float>& local, size_t sequences, size_t width,
                       const Split& split, int rank) {
    for (size_t b = 0; b < sequences; b++)
        for (int j = 0; j < split.local_rows(); j++) {
            const int t = split.chunk(rank, j / split.S) * split.S + j % split.S;
            std::copy_n(&local[(b * split.local_rows() + j) * width], width, &global[(b * split.T + t) * width]);
        }
}

// The ranks' local tensors on the device: per rank, (B, 2S, width) in bf16 or fp32.
template <typename T>
using PerRank = std::vector<bench::DeviceBuffer<T>>;

// qkv (B, T, (NH + 2 KVH) HS) to every rank's local qkv.
inline PerRank<floatX> scatter_bf16(const std::vector<float>& global, size_t sequences, size_t width,
                                    const Split& split) {
    PerRank<floatX> out;
    for (int r = 0; r < split.cp; r++) out.push_back(bench::to_device_bf16(to_local(global, sequences, width, split, r)));
    return out;
}
// The ranks' local tensors gathered into the global host layout.
template <typename T>
inline std::vector<float> gather(const PerRank<T>& local, size_t sequences, size_t width, const Split& split) {
    std::vector<float> global(sequences * split.T * width);
    for (int r = 0; r < split.cp; r++)
        from_local(global, bench::to_host(local[r].get(), sequences * split.local_rows() * width), sequences, width,
                   split, r);
    return global;
}

template <typename T>
inline PerRank<T> allocate(const Split& split, size_t n_per_rank, const char* what) {
    PerRank<T> out;
    for (int r = 0; r < split.cp; r++) out.emplace_back(n_per_rank, what);
    return out;
}

// The forward ring: every rank's merged out (bf16) and lse (the final one), from the ranks' qkv.
struct Forward {
    Split split;
    int B, NH, KVH, HS;
    PerRank<floatX> pair_out;  // the latest pair's out and lse, per rank
    PerRank<float> pair_lse;
    PerRank<float> acc;  // the merged out so far, fp32 (the merged lse is the caller's lse)

    Forward(const Split& split_, int B_, int NH_, int KVH_, int HS_)
        : split(split_), B(B_), NH(NH_), KVH(KVH_), HS(HS_),
          pair_out(allocate<floatX>(split, rows() * NH * HS, "pair out")),
          pair_lse(allocate<float>(split, (size_t)B * NH * split.local_rows(), "pair lse")),
          acc(allocate<float>(split, rows() * NH * HS, "merged out (fp32)")) {}
    size_t rows() const { return (size_t)B * split.local_rows(); }

    void run(PerRank<floatX>& out, PerRank<float>& lse, const PerRank<floatX>& qkv) {
        const size_t C = (size_t)NH * HS, width = (size_t)(NH + 2 * KVH) * HS, S = split.S;
        const llmc::AttentionRows pair_rows{split.S, split.local_rows(), split.local_rows()};
        std::vector<int> merged(2 * split.cp, 0);  // pairs merged so far, per (rank, query half)
        for (const Pair& p : pairs(split)) {
            const size_t q = p.q_half * S, kv = p.kv_half * S;
            llmc::attention_forward_pair(pair_out[p.rank].get() + q * C, pair_lse[p.rank].get() + q,
                                         qkv[p.rank].get() + q * width, qkv[p.kv_rank].get() + kv * width, B,
                                         pair_rows, p.causal, NH, KVH, HS, 0);
            int& count = merged[2 * p.rank + p.q_half];
            llmc::attention_merge(acc[p.rank].get() + q * C, lse[p.rank].get() + q, pair_out[p.rank].get() + q * C,
                                  pair_lse[p.rank].get() + q, count == 0, B, split.S, split.local_rows(), NH, HS, 0);
            count++;
        }
        for (int r = 0; r < split.cp; r++) llmc::attention_merge_finish(out[r].get(), acc[r].get(), rows() * C, 0);
    }
};

// The backward ring: every rank's dqkv (bf16) from its dout and the forward ring's out and lse.
struct Backward {
    Split split;
    int B, NH, KVH, HS;
    PerRank<float> D;    // rowsum(dout * out) of the rank's query rows
    PerRank<float> dq;   // the rank's dq summed over its pairs, fp32 (B, 2S, NH HS)
    PerRank<float> dkv;  // the rank's dk, dv summed over every rank's pairs with its keys, fp32 (B, 2S, 2 KVH HS)

    Backward(const Split& split_, int B_, int NH_, int KVH_, int HS_)
        : split(split_), B(B_), NH(NH_), KVH(KVH_), HS(HS_),
          D(allocate<float>(split, (size_t)B * NH * split.local_rows(), "D")),
          dq(allocate<float>(split, rows() * NH * HS, "dq (fp32)")),
          dkv(allocate<float>(split, rows() * 2 * KVH * HS, "dk, dv (fp32)")) {}
    size_t rows() const { return (size_t)B * split.local_rows(); }

    // round_to_bf16: the sums rounded to bf16 after every pair, to measure what summing the pairs
    // in bf16 instead of fp32 would cost (slow: a host round trip per pair).
    void run(PerRank<floatX>& dqkv, const PerRank<floatX>& dout, const PerRank<floatX>& qkv,
             const PerRank<floatX>& out, const PerRank<float>& lse, bool round_to_bf16 = false) {
        const size_t C = (size_t)NH * HS, width = (size_t)(NH + 2 * KVH) * HS, kvw = 2 * (size_t)KVH * HS;
        const size_t S = split.S;
        const llmc::AttentionRows pair_rows{split.S, split.local_rows(), split.local_rows()};
        for (int r = 0; r < split.cp; r++) {
            llmc::attention_backward_rowdot(D[r].get(), dout[r].get(), out[r].get(), B, split.local_rows(), NH, HS, 0);
            CUDA_CHECK(cudaMemsetAsync(dq[r].get(), 0, rows() * C * sizeof(float), 0));
            CUDA_CHECK(cudaMemsetAsync(dkv[r].get(), 0, rows() * kvw * sizeof(float), 0));
        }
        for (const Pair& p : pairs(split)) {
            const size_t q = p.q_half * S, kv = p.kv_half * S;
            llmc::attention_backward_pair(dq[p.rank].get() + q * C, dkv[p.kv_rank].get() + kv * kvw,
                                          dout[p.rank].get() + q * C, qkv[p.rank].get() + q * width,
                                          qkv[p.kv_rank].get() + kv * width, lse[p.rank].get() + q,
                                          D[p.rank].get() + q, B, pair_rows, p.causal, NH, KVH, HS, 0);
            if (round_to_bf16) {
                round_in_place(dq[p.rank].get(), rows() * C);
                round_in_place(dkv[p.kv_rank].get(), rows() * kvw);
            }
        }
        for (int r = 0; r < split.cp; r++)
            llmc::attention_backward_pair_finish(dqkv[r].get(), dq[r].get(), dkv[r].get(), B, split.local_rows(), NH,
                                                 KVH, HS, 0);
    }

    static void round_in_place(float* d, size_t n) {
        std::vector<float> h = bench::to_host(d, n);
        for (float& x : h) x = bench::bf16_round(x);
        bench::upload(d, h);
    }
};

}  // namespace ring
