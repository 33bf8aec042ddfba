// cpu/ring_attention.h: causal self-attention over a context-parallel group (--cp), the CPU model's
// ring attention. Each of the group's N ranks holds two chunks of every sequence (context_parallel.h
// says which) with their queries, keys and values; the keys and values travel around the ring.
//
// Forward: in N steps each rank attends its queries to the key/value block in hand, while that block
// is already on its way to the next rank and the previous rank's block is arriving (send and recv are
// asynchronous, so the transfer hides behind the block's attention). Only the block pairs that carry
// causal work are computed; each is folded into the output through its log-sum-exp.
// Backward: the blocks go round again; alongside each travels its dK/dV accumulator, to which every
// rank adds its queries' share before passing it on, so after N hops it is back at its owner, whole.
// The accumulator is kept by key chunk (the first chunk's rows of every sequence, then the
// second's), and a rank works through the block's key chunks one after the other, so the first
// chunk's accumulator is on its way while the second chunk's pairs are computed; only the second's
// hop waits.
//
// Buffers, owned by the caller: `ring` holds 4 blocks of B x T x 2C floats (keys and values of T
// local rows, side by side: two for the blocks in flight, two for their gradients), `rowsum` B x NH
// x T floats, `lse` (kept from forward to backward) B x NH x T.
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>

#include "llmc/cpu/ops.h"
#include "llmc/dist/comm.h"
#include "llmc/dist/context_parallel.h"

namespace llmc {
namespace cpu {

class RingAttention {
public:
    explicit RingAttention(Communicator& group) : comm_(group), size_(group.world_size()), rank_(group.rank()) {}

    // Floats of the ring buffer for B sequences of T local rows of C channels (per q, k and v).
    static size_t ring_floats(int B, int T, int C) { return 4 * block_floats(B, T, C); }

    // out (B x T x C) = attention of this rank's rows of qkv (B x T x 3C) over every earlier position
    // of the group's sequences; lse (B x NH x T) kept for backward.
    void forward(float* out, float* lse, const float* qkv, float* ring, int B, int T, int C, int NH) {
        float* kv[2] = {ring, ring + block_floats(B, T, C)};
        pack_keys_values(kv[0], qkv, B * T, C);
        std::fill(out, out + (size_t)B * T * C, 0.0f);
        std::fill(lse, lse + (size_t)B * NH * T, -std::numeric_limits<float>::infinity());
        for (int step = 0; step < size_; step++) {
            float* held = kv[step % 2];
            CommHandle sent, arrived;
            if (step < size_ - 1) pass_on(held, kv[(step + 1) % 2], B, T, C, sent, arrived);
            for (int k_half = 0; k_half < 2; k_half++)
                for_each_block(held, qkv, B, T, C, NH, source_of(step), k_half,
                               [&](int q_half, const AttentionBlock& blk) {
                    const size_t row0 = (size_t)q_half * blk.rows;
                    attention_block_forward(Rows{out + row0 * C, (size_t)C, (size_t)T * C}, lse + row0, T, blk);
                });
            wait(sent);
            wait(arrived);
        }
    }

    // dqkv (overwritten) from dout, the forward's out and lse, and qkv. rowsum is scratch.
    void backward(float* dqkv, const float* dout, const float* out, const float* lse, const float* qkv, float* ring,
                  float* rowsum, int B, int T, int C, int NH) {
        const size_t block = block_floats(B, T, C);
        float* kv[2] = {ring, ring + block};
        float* dkv[2] = {ring + 2 * block, ring + 3 * block};
        pack_keys_values(kv[0], qkv, B * T, C);
        std::fill(dkv[0], dkv[0] + block, 0.0f);
        std::fill(dqkv, dqkv + (size_t)B * T * 3 * C, 0.0f);
        attention_rowsum(rowsum, dout, out, B, T, C, NH);
        const size_t S = T / 2, chunk_grads = (size_t)B * S * 2 * C;  // one key chunk's accumulator
        for (int step = 0; step < size_; step++) {
            float *held = kv[step % 2], *grads = dkv[step % 2], *next_grads = dkv[(step + 1) % 2];
            CommHandle sent, arrived, grads_sent[2], grads_arrived[2];
            if (step < size_ - 1) pass_on(held, kv[(step + 1) % 2], B, T, C, sent, arrived);
            for (int k_half = 0; k_half < 2; k_half++) {
                float* dk_rows = grads + k_half * chunk_grads;  // B sequences of S rows
                for_each_block(held, qkv, B, T, C, NH, source_of(step), k_half,
                               [&](int q_half, const AttentionBlock& blk) {
                    const size_t row0 = (size_t)q_half * blk.rows;
                    const Rows dk{dk_rows, 2 * (size_t)C, S * 2 * C}, dv{dk.at + C, dk.row, dk.batch};
                    attention_block_backward(Rows{dqkv + row0 * 3 * C, 3 * (size_t)C, (size_t)T * 3 * C}, dk, dv,
                                             ConstRows{dout + row0 * C, (size_t)C, (size_t)T * C}, lse + row0,
                                             rowsum + row0, T, blk);
                });
                // This key chunk's accumulator goes where its block goes next; after the last step, home.
                pass_on(dk_rows, next_grads + k_half * chunk_grads, chunk_grads, grads_sent[k_half],
                        grads_arrived[k_half]);
            }
            for (CommHandle* h :
                 {&sent, &arrived, &grads_sent[0], &grads_arrived[0], &grads_sent[1], &grads_arrived[1]})
                wait(*h);
        }
        unpack_key_value_grads(dqkv, dkv[size_ % 2], B, T, C);
    }

    // Milliseconds spent waiting on the ring since the last call.
    double take_wait_ms() {
        const double ms = wait_ms_;
        wait_ms_ = 0;
        return ms;
    }

private:
    static size_t block_floats(int B, int T, int C) { return (size_t)B * T * 2 * C; }
    // The rank whose keys and values this rank holds at `step`: its own, then its predecessors'.
    int source_of(int step) const { return (rank_ - step + size_) % size_; }

    // Sends the block in hand to the next rank and receives the previous rank's into `incoming`.
    void pass_on(const float* held, float* incoming, int B, int T, int C, CommHandle& sent, CommHandle& arrived) {
        pass_on(held, incoming, block_floats(B, T, C), sent, arrived);
    }
    void pass_on(const float* held, float* incoming, size_t floats, CommHandle& sent, CommHandle& arrived) {
        sent = comm_.send(held, floats * sizeof(float), (rank_ + 1) % size_);
        arrived = comm_.recv(incoming, floats * sizeof(float), (rank_ + size_ - 1) % size_);
    }
    void wait(CommHandle& h) {
        h.wait();
        wait_ms_ += h.wait_ms();
    }

    // Calls fn(query half, block) for every pair of this rank's query chunks with key chunk k_half of
    // `source`'s keys and values (in `held`) that carries causal work. For a given query chunk the
    // key chunks come in the same order whether the caller loops over them outside (as here) or
    // inside, so the results do not depend on it.
    template <typename Fn>
    void for_each_block(const float* held, const float* qkv, int B, int T, int C, int NH, int source, int k_half,
                        Fn fn) const {
        const int S = T / 2;
        const float* k = held + (size_t)k_half * S * 2 * C;
        for (int q_half = 0; q_half < 2; q_half++) {
            const BlockWork work = block_work(ContextSplit::chunk_of(rank_, size_, q_half),
                                              ContextSplit::chunk_of(source, size_, k_half));
            if (work == BlockWork::None) continue;
            const AttentionBlock blk{ConstRows{qkv + (size_t)q_half * S * 3 * C, 3 * (size_t)C, (size_t)T * 3 * C},
                                     ConstRows{k, 2 * (size_t)C, (size_t)T * 2 * C},
                                     ConstRows{k + C, 2 * (size_t)C, (size_t)T * 2 * C},
                                     B, NH, C / NH, S, work == BlockWork::Diagonal};
            fn(q_half, blk);
        }
    }

    // kv row r = [k | v] of qkv row r = [q | k | v].
    static void pack_keys_values(float* kv, const float* qkv, int rows, int C) {
#pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++)
            std::memcpy(kv + (size_t)r * 2 * C, qkv + (size_t)r * 3 * C + C, 2 * C * sizeof(float));
    }
    // The dK/dV accumulator is kept by key chunk: row s of chunk h of sequence b at (h B + b) S + s.
    static void unpack_key_value_grads(float* dqkv, const float* dkv, int B, int T, int C) {
        const int S = T / 2;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < B * T; r++) {
            const int b = r / T, h = r % T / S, s = r % S;
            const float* grads = dkv + ((size_t)(h * B + b) * S + s) * 2 * C;
            std::memcpy(dqkv + (size_t)r * 3 * C + C, grads, 2 * C * sizeof(float));
        }
    }

    Communicator& comm_;
    int size_, rank_;
    double wait_ms_ = 0;
};

}  // namespace cpu
}  // namespace llmc
