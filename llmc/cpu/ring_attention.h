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
// Grouped-query attention (a Llama's kv heads): only the key/value heads travel, and each serves its
// group of query heads (cpu/ops.h's AttentionBlock::group).
//
// Buffers, owned by the caller: `ring` holds 4 blocks of B x T x 2 KC floats (keys and values of T
// local rows, KC = KVH x HS channels each, side by side: two for the blocks in flight, two for their
// gradients), `rowsum` B x NH x T floats, `lse` (kept from forward to backward) B x NH x T.
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

    // Floats of the ring buffer for B sequences of T local rows with KC key (and as many value)
    // channels: the kv heads' (KVH x HS; a GPT-2's C).
    static size_t ring_floats(int B, int T, int KC) { return 4 * block_floats(B, T, KC); }

    // out (B x T x NH HS) = attention of this rank's rows of qkv (B x T rows of NH query heads, then KVH
    // key and KVH value heads, of HS each) over every earlier position of the group's sequences;
    // lse (B x NH x T) kept for backward. Only the KVH key/value heads travel.
    void forward(float* out, float* lse, const float* qkv, float* ring, int B, int T, int NH, int KVH, int HS) {
        const Widths w{NH, KVH, HS};
        float* kv[2] = {ring, ring + block_floats(B, T, w.kv())};
        pack_keys_values(kv[0], qkv, B * T, w);
        std::fill(out, out + (size_t)B * T * w.q(), 0.0f);
        std::fill(lse, lse + (size_t)B * NH * T, -std::numeric_limits<float>::infinity());
        for (int step = 0; step < size_; step++) {
            float* held = kv[step % 2];
            CommHandle sent, arrived;
            if (step < size_ - 1) pass_on(held, kv[(step + 1) % 2], block_floats(B, T, w.kv()), sent, arrived);
            for (int k_half = 0; k_half < 2; k_half++)
                for_each_block(held, qkv, B, T, w, source_of(step), k_half, [&](int q_half, const AttentionBlock& blk) {
                    const size_t row0 = (size_t)q_half * blk.rows;
                    attention_block_forward(Rows{out + row0 * w.q(), w.q(), (size_t)T * w.q()}, lse + row0, T, blk);
                });
            wait(sent);
            wait(arrived);
        }
    }

    // dqkv (overwritten) from dout, the forward's out and lse, and qkv. rowsum is scratch.
    void backward(float* dqkv, const float* dout, const float* out, const float* lse, const float* qkv, float* ring,
                  float* rowsum, int B, int T, int NH, int KVH, int HS) {
        const Widths w{NH, KVH, HS};
        const size_t block = block_floats(B, T, w.kv());
        float* kv[2] = {ring, ring + block};
        float* dkv[2] = {ring + 2 * block, ring + 3 * block};
        pack_keys_values(kv[0], qkv, B * T, w);
        std::fill(dkv[0], dkv[0] + block, 0.0f);
        std::fill(dqkv, dqkv + (size_t)B * T * w.row(), 0.0f);
        attention_rowsum(rowsum, dout, out, B, T, (int)w.q(), NH);
        const size_t S = T / 2, chunk_grads = (size_t)B * S * 2 * w.kv();  // one key chunk's accumulator
        for (int step = 0; step < size_; step++) {
            float *held = kv[step % 2], *grads = dkv[step % 2], *next_grads = dkv[(step + 1) % 2];
            CommHandle sent, arrived, grads_sent[2], grads_arrived[2];
            if (step < size_ - 1) pass_on(held, kv[(step + 1) % 2], block, sent, arrived);
            for (int k_half = 0; k_half < 2; k_half++) {
                float* dk_rows = grads + k_half * chunk_grads;  // B sequences of S rows
                for_each_block(held, qkv, B, T, w, source_of(step), k_half, [&](int q_half, const AttentionBlock& blk) {
                    const size_t row0 = (size_t)q_half * blk.rows;
                    const Rows dk{dk_rows, 2 * w.kv(), S * 2 * w.kv()}, dv{dk.at + w.kv(), dk.row, dk.batch};
                    attention_block_backward(Rows{dqkv + row0 * w.row(), w.row(), (size_t)T * w.row()}, dk, dv,
                                             ConstRows{dout + row0 * w.q(), w.q(), (size_t)T * w.q()}, lse + row0,
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
        unpack_key_value_grads(dqkv, dkv[size_ % 2], B, T, w);
    }

    // Milliseconds spent waiting on the ring since the last call.
    double take_wait_ms() {
        const double ms = wait_ms_;
        wait_ms_ = 0;
        return ms;
    }

private:
    // A qkv row's widths: NH query heads, then KVH key and KVH value heads, HS channels each.
    struct Widths {
        int NH, KVH, HS;
        size_t q() const { return (size_t)NH * HS; }
        size_t kv() const { return (size_t)KVH * HS; }
        size_t row() const { return q() + 2 * kv(); }
    };
    // A block of B x T rows of keys and values side by side, KC channels each.
    static size_t block_floats(int B, int T, size_t KC) { return (size_t)B * T * 2 * KC; }
    // The rank whose keys and values this rank holds at `step`: its own, then its predecessors'.
    int source_of(int step) const { return (rank_ - step + size_) % size_; }

    // Sends `floats` at `held` to the next rank and receives the previous rank's into `incoming`.
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
    void for_each_block(const float* held, const float* qkv, int B, int T, const Widths& w, int source, int k_half,
                        Fn fn) const {
        const int S = T / 2;
        const size_t kv_row = 2 * w.kv();
        const float* k = held + (size_t)k_half * S * kv_row;
        for (int q_half = 0; q_half < 2; q_half++) {
            const BlockWork work = block_work(ContextSplit::chunk_of(rank_, size_, q_half),
                                              ContextSplit::chunk_of(source, size_, k_half));
            if (work == BlockWork::None) continue;
            const AttentionBlock blk{ConstRows{qkv + (size_t)q_half * S * w.row(), w.row(), (size_t)T * w.row()},
                                     ConstRows{k, kv_row, (size_t)T * kv_row},
                                     ConstRows{k + w.kv(), kv_row, (size_t)T * kv_row},
                                     B, w.NH, w.HS, S, work == BlockWork::Diagonal, w.NH / w.KVH};
            fn(q_half, blk);
        }
    }

    // kv row r = [k | v] of qkv row r = [q | k | v].
    static void pack_keys_values(float* kv, const float* qkv, int rows, const Widths& w) {
#pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++)
            std::memcpy(kv + (size_t)r * 2 * w.kv(), qkv + (size_t)r * w.row() + w.q(), 2 * w.kv() * sizeof(float));
    }
    // The dK/dV accumulator is kept by key chunk: row s of chunk h of sequence b at (h B + b) S + s.
    static void unpack_key_value_grads(float* dqkv, const float* dkv, int B, int T, const Widths& w) {
        const int S = T / 2;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < B * T; r++) {
            const int b = r / T, h = r % T / S, s = r % S;
            const float* grads = dkv + ((size_t)(h * B + b) * S + s) * 2 * w.kv();
            std::memcpy(dqkv + (size_t)r * w.row() + w.q(), grads, 2 * w.kv() * sizeof(float));
        }
    }

    Communicator& comm_;
    int size_, rank_;
    double wait_ms_ = 0;
};

}  // namespace cpu
}  // namespace llmc
