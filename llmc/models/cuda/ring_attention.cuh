// models/cuda/ring_attention.cuh: causal attention around the context group's ring on the GPU (context
// parallelism: each rank holds 2 of the 2 cp chunks of every sequence, dist/context_parallel.h), the
// CUDA model's counterpart of cpu/ring_attention.h. The model owns the buffers (its activation
// layout's ring_* and pair_* slices, RingBuffers) and the stream; this class runs the ring: which
// pairs of chunks carry causal work, the blocks' hops between ranks overlapped with the pairs'
// kernels (kernels/attention.cuh's *_pair), and the log-sum-exp merge.
#pragma once

#include <cstddef>

#include "llmc/dist/comm.h"
#include "llmc/dist/context_parallel.h"
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/cuda_common.cuh"

namespace llmc {

// The ring's device buffers, slices of the model's activation buffer (models/cuda/activations.cuh):
// the key/value blocks arriving (two, alternating), one pair's output and lse, the fp32 running
// output (forward) or dq (backward), the fp32 dk, dv accumulators that travel with their blocks (two),
// and backward's row sums D.
struct RingBuffers {
    floatX* kv;
    floatX* pair_out;
    float* pair_lse;
    float* acc;
    float* dkv;
    float* rowsum;
};

class CudaRingAttention {
public:
    // `cp`: the context group on device buffers; `split`: this rank's chunks of the batch under way.
    CudaRingAttention(Communicator& cp, const ContextSplit& split) : comm_(cp), split_(split) {}

    // Milliseconds this rank waited on the ring's messages since the last call.
    double take_wait_ms() {
        const double ms = wait_ms_;
        wait_ms_ = 0;
        return ms;
    }

    // Attention of this rank's B x T rows of qkv (NH query heads and KVH kv heads of HS) into out, lse
    // the final log-sum-exp:
    // in cp steps each rank runs its query chunks against the key/value block in hand (its own, then
    // its predecessors') while that block is already on its way to the next rank and the previous
    // rank's is arriving; each pair's out and lse are merged into the fp32 running result through the
    // log-sum-exp. The keys and values travel as whole qkv rows (the pair kernels read them in qkv's
    // layout; a grouped model's rows carry its KVH kv heads, not one per query head).
    void forward(floatX* out, float* lse, const floatX* qkv, const RingBuffers& r, int B, int T, int NH, int KVH,
                 int HS, cudaStream_t s) {
        const size_t C = (size_t)NH * HS, width = (size_t)(NH + 2 * KVH) * HS, S = T / 2, block = (size_t)B * T * width;
        const AttentionRows rows{(int)S, T, T};
        int merged[2] = {0, 0};  // pairs merged so far, per query half
        for (int step = 0; step < split_.size; step++) {
            const floatX* held = block_at(r, qkv, step, block);
            CommHandle sent, arrived;
            if (step < split_.size - 1) pass(held, incoming(r, step, block), block * sizeof(floatX), sent, arrived, s);
            for_each_pair(source(step), [&](int q_half, int k_half, bool causal) {
                const size_t q = q_half * S, k = k_half * S;
                attention_forward_pair(r.pair_out + q * C, r.pair_lse + q, qkv + q * width, held + k * width, B,
                                       rows, causal, NH, KVH, HS, s);
                attention_merge(r.acc + q * C, lse + q, r.pair_out + q * C, r.pair_lse + q, merged[q_half]++ == 0, B,
                                (int)S, T, NH, HS, s);
            });
            wait(sent);
            wait(arrived);
        }
        attention_merge_finish(out, r.acc, (size_t)B * T * C, s);
    }

    // Its backward into dqkv, from dout and the forward's out and lse: the blocks go round again, each
    // pair's gradients recomputed from the final lse; dq sums in r.acc, and alongside each block
    // travels its fp32 dk, dv accumulator, to which every rank adds its queries' share before passing
    // it on, so after cp hops it is home, whole. The accumulator's hop waits for the block's backward
    // (its content), so only the key/value transfer is hidden.
    void backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                  const RingBuffers& r, int B, int T, int NH, int KVH, int HS, cudaStream_t s) {
        const size_t C = (size_t)NH * HS, width = (size_t)(NH + 2 * KVH) * HS, S = T / 2;
        const size_t block = (size_t)B * T * width, kv = 2 * (size_t)KVH * HS, grads = (size_t)B * T * kv;
        const AttentionRows rows{(int)S, T, T};
        float* D = r.rowsum;  // rowsum(dout * out) of the query rows, in lse's layout
        float* dkv[2] = {r.dkv, r.dkv + grads};
        attention_backward_rowdot(D, dout, out, B, T, NH, HS, s);
        CUDA_CHECK(cudaMemsetAsync(r.acc, 0, (size_t)B * T * C * sizeof(float), s));
        CUDA_CHECK(cudaMemsetAsync(dkv[0], 0, grads * sizeof(float), s));
        for (int step = 0; step < split_.size; step++) {
            const floatX* held = block_at(r, qkv, step, block);
            float* dkv_held = dkv[step % 2];
            CommHandle sent, arrived;
            if (step < split_.size - 1) pass(held, incoming(r, step, block), block * sizeof(floatX), sent, arrived, s);
            for_each_pair(source(step), [&](int q_half, int k_half, bool causal) {
                const size_t q = q_half * S, k = k_half * S;
                attention_backward_pair(r.acc + q * C, dkv_held + k * kv, dout + q * C, qkv + q * width,
                                        held + k * width, lse + q, D + q, B, rows, causal, NH, KVH, HS, s);
            });
            wait(sent);
            wait(arrived);
            // The accumulator goes where its block goes next; after the last step, home.
            pass(dkv_held, dkv[(step + 1) % 2], grads * sizeof(float), sent, arrived, s);
            wait(sent);
            wait(arrived);
        }
        attention_backward_pair_finish(dqkv, r.acc, dkv[split_.size % 2], B, T, NH, KVH, HS, s);
    }

private:
    // Calls fn(query half, key half, causal) for every pair of this rank's two query chunks with the
    // two key chunks of `source` (the rank whose keys and values are in hand) that carries causal work.
    template <typename Fn>
    void for_each_pair(int source, Fn fn) const {
        for (int q_half = 0; q_half < 2; q_half++)
            for (int k_half = 0; k_half < 2; k_half++) {
                const BlockWork work =
                    block_work(split_.chunk_of(q_half), ContextSplit::chunk_of(source, split_.size, k_half));
                if (work != BlockWork::None) fn(q_half, k_half, work == BlockWork::Diagonal);
            }
    }
    // The rank whose keys and values this rank holds at ring step `step`: its own, then its predecessors'.
    int source(int step) const { return (split_.rank - step + split_.size) % split_.size; }
    // The block in hand at `step` (whole qkv rows of B x T): at step 0 the layer's own qkv, then what
    // arrived into the ring buffers, which alternate when there are two.
    static const floatX* block_at(const RingBuffers& r, const floatX* qkv, int step, size_t block) {
        return step == 0 ? qkv : r.kv + (size_t)((step - 1) % 2) * block;
    }
    static floatX* incoming(const RingBuffers& r, int step, size_t block) { return r.kv + (size_t)(step % 2) * block; }
    // Sends `bytes` at `held` to the next rank of the ring and receives the previous rank's into
    // `incoming`, once the compute issued so far on `s` is done with both.
    void pass(const void* held, void* incoming, size_t bytes, CommHandle& sent, CommHandle& arrived, cudaStream_t s) {
        CUDA_CHECK(cudaEventRecord(ready_.get(), s));
        comm_.order_after(ready_.get());
        sent = comm_.send(held, bytes, (split_.rank + 1) % split_.size);
        arrived = comm_.recv(incoming, bytes, (split_.rank + split_.size - 1) % split_.size);
    }
    void wait(CommHandle& h) {
        h.wait();
        wait_ms_ += h.wait_ms();
    }

    Communicator& comm_;
    const ContextSplit& split_;  // the model's: its positions follow the batch under way
    CudaEvent ready_;            // recorded before a hop that reads or writes what compute did
    double wait_ms_ = 0;
};

}  // namespace llmc
