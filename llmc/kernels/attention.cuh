// attention.cuh: causal self-attention, forward and backward, FlashAttention-2 style on bf16 tensor
// cores (mma.sync m16n8k16, fp32 accumulation).
//
// The idea: never hold the T x T score matrix. The forward streams 64-key tiles of K and V through
// shared memory and keeps, per query row, a running maximum and sum of exponentials (online
// softmax), so each output row is finished in registers; it saves only the row's log-sum-exp (lse).
// The backward recomputes the probabilities P = exp(S - lse) tile by tile in two kernels, each of
// which owns what it writes: one a tile of keys (dK, dV summed over the query tiles that see it),
// one a tile of queries (dQ summed over its key tiles). Every gradient is then a fixed-order sum in
// one warp's registers: deterministic without atomics, at the price of computing S and dP twice.
//
// Inside a block each warp owns 16 rows (queries in the forward and dQ kernels, keys in the dK/dV
// kernel) and never needs another warp's numbers: the row-wise softmax statistics live in the four
// threads of a quad, and the accumulator of one mma is, element for element, the A operand of the
// next (S -> P -> P V), so P never leaves registers.
//
// Grouped-query attention (a Llama's kv heads; AttentionHeads, attention_tiles.cuh): each query head
// reads the k and v of its group's kv head where they lie in the qkv row, which is all the forward and
// dQ kernels change; the dK/dV kernel owns a tile of one kv head's keys and walks the query tiles of
// each query head of the group in turn, so dK and dV are summed over the group in its registers
// (fp32, in head order) and stored once. Nothing is copied G times, and the ring carries only kv heads.
// A Llama's RoPE backward rides on the stores of dQ and dK (attention_backward's `rope`).
//
// Ring pairs (context parallelism, --cp N). Each sequence is cut into 2N equal chunks and a rank
// holds chunks i and 2N-1-i; its attention is a sum over (query chunk, key chunk) pairs while K and V
// travel around the ring. The same three kernels compute one pair: queries from one qkv buffer and
// keys/values from another (AttentionRows: T rows of each, the two chunks being equal, inside
// buffers of q_rows and kv_rows rows per sequence), and a template flag CAUSAL: true for the whole
// sequence and for the pair of a chunk with itself, false for a key chunk before the query chunk
// (every key visible, only the padding past T masked). The whole-sequence functions are the
// CAUSAL = true instances with both buffers the same and q_rows = kv_rows = T: their arithmetic, and
// so their results, are unchanged, and the flag costs nothing at run time: it is resolved at compile
// time, and what remains is the row strides in the per-block address arithmetic (ptxas's registers
// and spills before and after: dev/cuda/NOTES.md, "Context parallelism's ring pairs").
//   forward:  attention_forward_pair writes the pair's bf16 out and fp32 lse; attention_merge folds
//             them into a running fp32 (acc, lse) through the log-sum-exp; attention_merge_finish
//             rounds acc to out once at the end.
//   backward: attention_backward_rowdot computes D once from the final out; attention_backward_pair
//             recomputes each pair's probabilities from the FINAL lse (so the pairs' gradients add
//             up to the whole softmax's) and adds dQ to an fp32 accumulator of the query rows and
//             dK, dV to one of the key rows (they belong to another rank's chunk and travel back);
//             attention_backward_pair_finish rounds the sums into dqkv. The sums are fp32 because a
//             bf16 sum over up to 2N pairs would round at every pair (dev/cuda/attention_backward.cu
//             measures the difference), and each element has one owner thread: no atomics.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "llmc/kernels/attention_hopper.cuh"
#include "llmc/kernels/attention_hopper_tma.cuh"
#include "llmc/kernels/attention_tiles.cuh"
#include "llmc/kernels/cuda_common.cuh"
#include "llmc/utils.h"

namespace llmc {

namespace attention_detail {

// ---- forward ----
// Grid (B*NH, query tiles); a block of WARPS warps owns 16*WARPS query rows of one head and loops
// over the key tiles up to its diagonal (CAUSAL) or over all of them (a ring pair whose key chunk
// precedes the query chunk), the next tile copied in while this one is used.

template <int HS>
constexpr int forward_warps() {
    return HS <= 64 ? 8 : 4;
}
template <int HS>
constexpr size_t forward_smem_bytes() {
    return (size_t)(16 * forward_warps<HS>() + 4 * KEY_TILE) * tile_stride<HS>() * sizeof(floatX);
}

template <int HS, int WARPS, bool CAUSAL>
__global__ void __launch_bounds__(WARPS * 32, HS <= 64 ? 2 : 1)
    attention_forward_kernel(floatX* out, float* lse, const floatX* q_qkv, const floatX* kv_qkv, AttentionRows rows,
                             AttentionHeads heads, float scale_log2, float* amax) {
    constexpr int BM = 16 * WARPS, BN = KEY_TILE, STRIDE = tile_stride<HS>(), THREADS = WARPS * 32;
    floatX* q_s = dynamic_shared_memory<floatX>();  // [BM][STRIDE]
    floatX* k_s = q_s + BM * STRIDE;                          // [2][BN][STRIDE]
    floatX* v_s = k_s + 2 * BN * STRIDE;                      // [2][BN][STRIDE]

    const int NH = heads.NH, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;  // the longest (last) query tiles start first
    const int T = rows.T, C = NH * HS;
    const size_t ld = heads.qkv_width(HS);
    const floatX* q_head = q_qkv + (size_t)b * rows.q_rows * ld + h * HS;
    const floatX* k_head = kv_qkv + (size_t)b * rows.kv_rows * ld + heads.k_col(h, HS);
    const floatX* v_head = kv_qkv + (size_t)b * rows.kv_rows * ld + heads.v_col(h, HS);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_first = q0 + 16 * warp;  // this warp's rows: row_first .. row_first + 15
    const bool warp_active = row_first < T;
    // causal: keys past the last query row below T are never needed
    const int num_tiles = ceil_div(CAUSAL ? min(q0 + BM, T) : T, BN);

    load_rows_async<BM, HS, THREADS>(q_s, q_head, ld, q0, T);
    load_rows_async<BN, HS, THREADS>(k_s, k_head, ld, 0, T);
    load_rows_async<BN, HS, THREADS>(v_s, v_head, ld, 0, T);
    cp_async_commit();

    uint32_t q_frag[HS / 16][4];
    float o[HS / 8][4] = {};
    // per thread, rows lane/4 and lane/4 + 8: running max (in units of log2, scores scaled) and this
    // thread's share of the running sum of 2^(score - max)
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

    for (int tile = 0; tile < num_tiles; tile++) {
        const int buf = tile % 2;
        if (tile + 1 < num_tiles) {
            load_rows_async<BN, HS, THREADS>(k_s + (buf ^ 1) * BN * STRIDE, k_head, ld, (tile + 1) * BN, T);
            load_rows_async<BN, HS, THREADS>(v_s + (buf ^ 1) * BN * STRIDE, v_head, ld, (tile + 1) * BN, T);
        }
        cp_async_commit();
        cp_async_wait<1>();  // everything but the tile just requested has landed
        __syncthreads();
        if (tile == 0) load_a_rows<HS, STRIDE>(q_frag, q_s, 16 * warp, lane);

        const int key0 = tile * BN;
        // Tile 0 (key 0) is seen by every row, so row_max is finite from then on.
        if (warp_active && (!CAUSAL || key0 <= row_first + 15)) {
            float s[BN / 8][4] = {};
            mma_a_bt<BN, HS, STRIDE>(s, q_frag, k_s + buf * BN * STRIDE, lane);
            // causal: the tile crosses this warp's diagonal; all keys: the tile runs past the last key
            if (CAUSAL ? key0 + BN - 1 > row_first : key0 + BN > T) {
#pragma unroll
                for (int n = 0; n < BN / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = key0 + n * 8 + 2 * (lane % 4) + e % 2;
                        const int row = row_first + lane / 4 + 8 * (e / 2);
                        if (key > (CAUSAL ? row : T - 1)) s[n][e] = -INFINITY;
                    }
            }
            float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < BN / 8; n++) {
                tile_max[0] = fmaxf(tile_max[0], fmaxf(s[n][0], s[n][1]));
                tile_max[1] = fmaxf(tile_max[1], fmaxf(s[n][2], s[n][3]));
            }
            float rescale[2], max_used[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                // the four threads of a quad hold one row between them
                tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
                tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
                const float new_max = fmaxf(row_max[r], tile_max[r] * scale_log2);
                // a row with nothing unmasked yet must not compute -inf - -inf
                max_used[r] = new_max == -INFINITY ? 0.0f : new_max;
                rescale[r] = fast_exp2(row_max[r] - max_used[r]);
                row_max[r] = new_max;
                row_sum[r] *= rescale[r];
            }
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[n][e] = fast_exp2(fmaf(s[n][e], scale_log2, -max_used[e / 2]));
                    row_sum[e / 2] += s[n][e];
                }
#pragma unroll
            for (int n = 0; n < HS / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[n][e] *= rescale[e / 2];
            uint32_t p_frag[BN / 16][4];
            acc_to_a<BN>(p_frag, s);
            mma_a_b<HS, BN, STRIDE>(o, p_frag, v_s + buf * BN * STRIDE, lane);
        }
        __syncthreads();  // the next iteration refills buffer `buf` with tile + 2
    }

    if (!warp_active) return;
    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
        inv_sum[r] = 1.0f / row_sum[r];  // >= 1: the row's maximum contributes 2^0
        const int row = row_first + lane / 4 + 8 * r;
        if (lane % 4 == 0 && row < T) lse[(size_t)bh * rows.q_rows + row] = row_max[r] * LN2 + logf(row_sum[r]);
    }
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] *= inv_sum[e / 2];
    const float largest = write_rows<HS>(out + (size_t)b * rows.q_rows * C + h * HS, C, o, 1.0f, row_first, T, lane);
    if (amax) warp_amax_into(amax, largest);  // FP8's current scaling: the attention projection's input
}

// ---- backward ----

// D[b, h, t] = sum over the head's columns of dout * out: the softmax backward's row term
// sum_j P_ij dP_ij, since dP = dout V^T and out = P V. One thread per row, in lse's layout.
template <int HS>
__global__ void attention_backward_rowdot_kernel(float* D, const floatX* dout, const floatX* out, int T, int NH,
                                                 size_t rows) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows) return;
    const int t = (int)(idx % T);
    const size_t bh = idx / T;
    const int h = (int)(bh % NH);
    const size_t b = bh / NH;
    const size_t C = (size_t)NH * HS;
    const size_t offset = (b * T + t) * C + h * HS;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < HS; c += 8) {
        const x128 d = load128(dout + offset + c), o = load128(out + offset + c);
#pragma unroll
        for (int i = 0; i < 8; i++) sum += (float)d[i] * (float)o[i];
    }
    D[idx] = sum;
}

// dQ: grid (B*NH, query tiles); each warp owns 16 query rows (Q and dout rows as A operands in
// registers) and walks the key tiles up to its diagonal (CAUSAL) or all of them: S = Q K^T,
// P = 2^(S scale log2e - lse log2e), dP = dout V^T, dS = P (dP - D), dQ += dS K. dQ is scaled by
// 1/sqrt(HS) once at the end, and written (GradT floatX) or added to an fp32 sum (GradT float).

constexpr int DQ_WARPS = 4;
template <int HS>
constexpr size_t dq_smem_bytes() {
    return (size_t)(2 * 16 * DQ_WARPS + 4 * KEY_TILE) * tile_stride<HS>() * sizeof(floatX);
}

// Three blocks per SM for HS <= 64 (12 warps rather than 8 to hide latency): capped at 168
// registers it still needs no spills (ptxas -v).
template <int HS, int WARPS, bool CAUSAL, typename GradT>
__global__ void __launch_bounds__(WARPS * 32, HS <= 64 ? 3 : 2)
    attention_backward_dq_kernel(GradT* grad_q, size_t grad_ld, const floatX* dout, const floatX* q_qkv,
                                 const floatX* kv_qkv, const float* lse, const float* D, AttentionRows rows, AttentionHeads heads,
                                 float scale_log2, float scale, float* amax, const float* rope) {
    constexpr int BM = 16 * WARPS, BN = KEY_TILE, STRIDE = tile_stride<HS>(), THREADS = WARPS * 32;
    floatX* q_s = dynamic_shared_memory<floatX>();  // [BM][STRIDE]
    floatX* do_s = q_s + BM * STRIDE;                         // [BM][STRIDE]
    floatX* k_s = do_s + BM * STRIDE;                         // [2][BN][STRIDE]
    floatX* v_s = k_s + 2 * BN * STRIDE;                      // [2][BN][STRIDE]

    const int NH = heads.NH, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;
    const int T = rows.T, C = NH * HS;
    const size_t ld = heads.qkv_width(HS);
    const floatX* q_head = q_qkv + (size_t)b * rows.q_rows * ld + h * HS;
    const floatX* k_head = kv_qkv + (size_t)b * rows.kv_rows * ld + heads.k_col(h, HS);
    const floatX* v_head = kv_qkv + (size_t)b * rows.kv_rows * ld + heads.v_col(h, HS);
    const floatX* do_head = dout + (size_t)b * rows.q_rows * C + h * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_first = q0 + 16 * warp;
    const bool warp_active = row_first < T;
    const int num_tiles = ceil_div(CAUSAL ? min(q0 + BM, T) : T, BN);

    load_rows_async<BM, HS, THREADS>(q_s, q_head, ld, q0, T);
    load_rows_async<BM, HS, THREADS>(do_s, do_head, C, q0, T);
    load_rows_async<BN, HS, THREADS>(k_s, k_head, ld, 0, T);
    load_rows_async<BN, HS, THREADS>(v_s, v_head, ld, 0, T);
    cp_async_commit();

    // lse in log2 units and D for this thread's rows lane/4 and lane/4 + 8 (zero past T: finite)
    float lse2[2], row_d[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_first + lane / 4 + 8 * r;
        lse2[r] = row < T ? lse[(size_t)bh * rows.q_rows + row] * LOG2E : 0.0f;
        row_d[r] = row < T ? D[(size_t)bh * rows.q_rows + row] : 0.0f;
    }

    uint32_t q_frag[HS / 16][4], do_frag[HS / 16][4];
    float dq[HS / 8][4] = {};

    for (int tile = 0; tile < num_tiles; tile++) {
        const int buf = tile % 2;
        if (tile + 1 < num_tiles) {
            load_rows_async<BN, HS, THREADS>(k_s + (buf ^ 1) * BN * STRIDE, k_head, ld, (tile + 1) * BN, T);
            load_rows_async<BN, HS, THREADS>(v_s + (buf ^ 1) * BN * STRIDE, v_head, ld, (tile + 1) * BN, T);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (tile == 0) {
            load_a_rows<HS, STRIDE>(q_frag, q_s, 16 * warp, lane);
            load_a_rows<HS, STRIDE>(do_frag, do_s, 16 * warp, lane);
        }

        const int key0 = tile * BN;
        if (warp_active && (!CAUSAL || key0 <= row_first + 15)) {
            const floatX* k_tile = k_s + buf * BN * STRIDE;
            float s[BN / 8][4] = {};
            mma_a_bt<BN, HS, STRIDE>(s, q_frag, k_tile, lane);
            // causal: the tile crosses this warp's diagonal; all keys: the tile runs past the last key
            const bool needs_mask = CAUSAL ? key0 + BN - 1 > row_first : key0 + BN > T;
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float p = fast_exp2(fmaf(s[n][e], scale_log2, -lse2[e / 2]));
                    const int key = key0 + n * 8 + 2 * (lane % 4) + e % 2;
                    const int row = row_first + lane / 4 + 8 * (e / 2);
                    s[n][e] = needs_mask && key > (CAUSAL ? row : T - 1) ? 0.0f : p;
                }
            float dp[BN / 8][4] = {};
            mma_a_bt<BN, HS, STRIDE>(dp, do_frag, v_s + buf * BN * STRIDE, lane);
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] *= dp[n][e] - row_d[e / 2];
            uint32_t ds_frag[BN / 16][4];
            acc_to_a<BN>(ds_frag, s);
            mma_a_b<HS, BN, STRIDE>(dq, ds_frag, k_tile, lane);
        }
        __syncthreads();
    }

    if (!warp_active) return;
    const float largest =
        write_rows<HS>(grad_q + (size_t)b * rows.q_rows * grad_ld + h * HS, grad_ld, dq, scale, row_first, T, lane, rope);
    if constexpr (std::is_same_v<GradT, floatX>)  // bf16 gradients: FP8's current scaling measures them
        if (amax) warp_amax_into(amax, largest);
}

// dK, dV: grid (B*KVH, key tiles); each warp owns 16 keys of one kv head (K and V rows as A operands
// in registers) and, for each query head of the kv head's group in turn, walks the query tiles from
// its diagonal (CAUSAL; from 0 otherwise) to T, working with
// transposes so that its keys stay the rows: S^T = K Q^T, P^T, dV += P^T dout, dP^T = V dout^T,
// dS^T = P^T (dP^T - D), dK += dS^T Q. dK and dV, summed over the group in fp32, are written (GradT
// floatX) or added (GradT float) at grad_k and grad_k + KVH HS of each key row.

constexpr int DKV_WARPS = 4;
template <int HS>
constexpr int dkv_query_tile() {
    return HS <= 64 ? 64 : 32;  // fewer score registers where dK and dV take 128 each
}
template <int HS>
constexpr size_t dkv_smem_bytes() {
    constexpr int BQ = dkv_query_tile<HS>();
    return (size_t)(2 * 16 * DKV_WARPS + 4 * BQ) * tile_stride<HS>() * sizeof(floatX) + 4 * BQ * sizeof(float);
}

template <int HS, int WARPS, int BQ, bool CAUSAL, typename GradT>
__global__ void __launch_bounds__(WARPS * 32, 2)
    attention_backward_dkv_kernel(GradT* grad_k, size_t grad_ld, const floatX* dout, const floatX* q_qkv,
                                  const floatX* kv_qkv, const float* lse, const float* D, AttentionRows rows, AttentionHeads heads,
                                  float scale_log2, float scale, float* amax, const float* rope) {
    constexpr int BN = 16 * WARPS, STRIDE = tile_stride<HS>(), THREADS = WARPS * 32;
    floatX* k_s = dynamic_shared_memory<floatX>();  // [BN][STRIDE]
    floatX* v_s = k_s + BN * STRIDE;                          // [BN][STRIDE]
    floatX* q_s = v_s + BN * STRIDE;                          // [2][BQ][STRIDE]
    floatX* do_s = q_s + 2 * BQ * STRIDE;                     // [2][BQ][STRIDE]
    // 16-byte aligned: every bf16 tile above is a multiple of 16 bytes
    float* lse_s = reinterpret_cast<float*>(do_s + 2 * BQ * STRIDE);  // [2][BQ]
    float* d_s = lse_s + 2 * BQ;                                      // [2][BQ]

    // the block's kv head j of sequence b, and the G query heads that read it, in order
    const int NH = heads.NH, G = heads.group(), b = blockIdx.x / heads.KVH, j = blockIdx.x % heads.KVH;
    const int kv0 = blockIdx.y * BN;  // the first key tiles, seen by the most queries, start first
    const int T = rows.T, C = NH * HS;
    const size_t ld = heads.qkv_width(HS);
    const floatX* k_head = kv_qkv + (size_t)b * rows.kv_rows * ld + (NH + j) * HS;
    const floatX* v_head = k_head + heads.KVH * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int key_first = kv0 + 16 * warp;  // this warp's keys: key_first .. key_first + 15
    const bool warp_active = key_first < T;
    // causal: the query tiles start at kv0, earlier ones see no key here
    const int q_begin = CAUSAL ? kv0 : 0;
    const int num_tiles = ceil_div(T - q_begin, BQ);
    // Step i is query tile i % num_tiles of the group's query head i / num_tiles: one pipeline
    // through the group, and dK, dV summed in this order.
    const int num_steps = G * num_tiles;
    auto load_step = [&](int step, int buf) {
        const QueryHead qh(q_qkv, dout, lse, D, b, j * G + step / num_tiles, rows, heads, HS);
        const int q0 = q_begin + step % num_tiles * BQ;
        load_rows_async<BQ, HS, THREADS>(q_s + buf * BQ * STRIDE, qh.q, ld, q0, T);
        load_rows_async<BQ, HS, THREADS>(do_s + buf * BQ * STRIDE, qh.dout, C, q0, T);
        load_floats_async<BQ, THREADS>(lse_s + buf * BQ, qh.lse, q0, T);
        load_floats_async<BQ, THREADS>(d_s + buf * BQ, qh.D, q0, T);
    };

    load_rows_async<BN, HS, THREADS>(k_s, k_head, ld, kv0, T);
    load_rows_async<BN, HS, THREADS>(v_s, v_head, ld, kv0, T);
    load_step(0, 0);
    cp_async_commit();

    uint32_t k_frag[HS / 16][4], v_frag[HS / 16][4];
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};

    for (int step = 0; step < num_steps; step++) {
        const int buf = step % 2;
        const int q0 = q_begin + step % num_tiles * BQ;
        if (step + 1 < num_steps) load_step(step + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (step == 0) {
            load_a_rows<HS, STRIDE>(k_frag, k_s, 16 * warp, lane);
            load_a_rows<HS, STRIDE>(v_frag, v_s, 16 * warp, lane);
        }

        if (warp_active && (!CAUSAL || q0 + BQ - 1 >= key_first)) {
            const floatX* q_tile = q_s + buf * BQ * STRIDE;
            const floatX* do_tile = do_s + buf * BQ * STRIDE;
            const float* lse_tile = lse_s + buf * BQ;
            const float* d_tile = d_s + buf * BQ;
            // some query of the tile precedes one of the warp's keys (causal), or lies past T
            const bool needs_mask = (CAUSAL && q0 < key_first + 15) || q0 + BQ > T;
            float pt[BQ / 8][4] = {};  // rows: keys, columns: queries
            mma_a_bt<BQ, HS, STRIDE>(pt, k_frag, q_tile, lane);
#pragma unroll
            for (int n = 0; n < BQ / 8; n++) {
                const int col = n * 8 + 2 * (lane % 4);
                const float2 lse_pair = *reinterpret_cast<const float2*>(lse_tile + col);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float lse_q = e % 2 ? lse_pair.y : lse_pair.x;
                    const float p = fast_exp2(fmaf(pt[n][e], scale_log2, -lse_q * LOG2E));
                    const int query = q0 + col + e % 2;
                    const int key = key_first + lane / 4 + 8 * (e / 2);
                    pt[n][e] = needs_mask && ((CAUSAL && query < key) || query >= T) ? 0.0f : p;
                }
            }
            uint32_t p_frag[BQ / 16][4];
            acc_to_a<BQ>(p_frag, pt);
            mma_a_b<HS, BQ, STRIDE>(dv, p_frag, do_tile, lane);

            float dpt[BQ / 8][4] = {};
            mma_a_bt<BQ, HS, STRIDE>(dpt, v_frag, do_tile, lane);
#pragma unroll
            for (int n = 0; n < BQ / 8; n++) {
                const float2 d_pair = *reinterpret_cast<const float2*>(d_tile + n * 8 + 2 * (lane % 4));
#pragma unroll
                for (int e = 0; e < 4; e++) pt[n][e] *= dpt[n][e] - (e % 2 ? d_pair.y : d_pair.x);
            }
            uint32_t ds_frag[BQ / 16][4];
            acc_to_a<BQ>(ds_frag, pt);
            mma_a_b<HS, BQ, STRIDE>(dk, ds_frag, q_tile, lane);
        }
        __syncthreads();
    }

    if (!warp_active) return;
    GradT* dk_head = grad_k + (size_t)b * rows.kv_rows * grad_ld + j * HS;
    const float largest = fmaxf(write_rows<HS>(dk_head, grad_ld, dk, scale, key_first, T, lane, rope),
                                write_rows<HS>(dk_head + heads.KVH * HS, grad_ld, dv, 1.0f, key_first, T, lane));
    if constexpr (std::is_same_v<GradT, floatX>)  // as in the dq kernel
        if (amax) warp_amax_into(amax, largest);
}

// ---- ring pairs: merging the forward's partial results ----
// A ring pair's out and lse cover one query chunk against one key chunk. Over the union of two key
// sets the softmax normaliser is the sum of the two, so lse = log(e^lse_a + e^lse_b), and the output
// is the two outputs weighted by their share of it: out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse).
// The running sum (acc, acc_lse) is fp32; out is rounded to bf16 once, at the end.

// One thread per query row (b, h, t), in lse's layout: folds the pair's (out, lse) into (acc, acc_lse),
// or, for the first pair of the rows, copies it there.
template <int HS>
__global__ void attention_merge_kernel(float* acc, float* acc_lse, const floatX* out, const float* lse, int T,
                                       int seq_rows, int NH, size_t n, bool first) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const int t = (int)(idx % T);
    const size_t bh = idx / T;
    const int h = (int)(bh % NH);
    const size_t b = bh / NH;
    const size_t at_lse = bh * seq_rows + t;
    const size_t at = (b * seq_rows + t) * NH * HS + h * HS;
    const float pair_lse = lse[at_lse];
    float w_old = 0.0f, w_pair = 1.0f, new_lse = pair_lse;
    if (!first) {
        const float old_lse = acc_lse[at_lse];
        // log(e^a + e^b) without overflow: both lse are finite (every query row sees a key)
        new_lse = fmaxf(old_lse, pair_lse) + log1pf(expf(-fabsf(old_lse - pair_lse)));
        w_old = expf(old_lse - new_lse);
        w_pair = expf(pair_lse - new_lse);
    }
#pragma unroll
    for (int c = 0; c < HS; c += 8) {
        const x128 o = load128(out + at + c);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[at + c + i] = (first ? 0.0f : acc[at + c + i] * w_old) + (float)o[i] * w_pair;
    }
    acc_lse[at_lse] = new_lse;
}

// dst[i] = src[i] rounded to bf16: the merged output, or a gradient summed over the pairs.
__global__ void attention_round_kernel(floatX* dst, const float* src, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (floatX)src[i];
}

// dqkv (rows, C + KV) bf16 from the fp32 sums of a ring's pairs: dq (rows, C) and dk|dv (rows, KV).
__global__ void attention_gather_grads_kernel(floatX* dqkv, const float* dq, const float* dkv, size_t rows, int C,
                                              int KV) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * (C + KV)) return;
    const size_t row = i / (C + KV);
    const int c = (int)(i % (C + KV));
    dqkv[i] = (floatX)(c < C ? dq[row * C + c] : dkv[row * KV + c - C]);
}

// ---- launchers ----

inline void check_attention_shape(const char* who, int B, int T, int NH, int HS, int KVH = -1) {
    if (KVH == -1) KVH = NH;  // the calls about query heads only (out, lse)
    if (KVH < 1 || NH % KVH != 0)
        fail(strformat("%s: %d kv heads for %d heads; expected a divisor of the heads", who, KVH, NH));
    if (HS != 32 && HS != 64 && HS != 128)
        fail(strformat("%s: head size %d is not supported (expected 32, 64 or 128)", who, HS));
    if (B < 1 || NH < 1 || T < 1) fail(strformat("%s: B=%d, T=%d, NH=%d must all be >= 1", who, B, T, NH));
    if (T > MAX_T) fail(strformat("%s: T=%d exceeds the largest supported sequence length %d", who, T, MAX_T));
    if ((long long)B * NH > 2147483647LL)
        fail(strformat("%s: B*NH = %lld exceeds the grid limit 2^31-1", who, (long long)B * NH));
}

// The shape checks of a ring pair: those of T rows, and buffers that hold at least T rows per sequence.
inline void check_pair_shape(const char* who, int B, const AttentionRows& rows, int NH, int HS, int KVH = -1) {
    check_attention_shape(who, B, rows.T, NH, HS, KVH);
    if (rows.q_rows < rows.T || rows.kv_rows < rows.T)
        fail(strformat("%s: buffers of %d query rows and %d key rows per sequence cannot hold a pair of %d rows", who,
                       rows.q_rows, rows.kv_rows, rows.T));
}

// The forward of head size HS on its kernel: attention_hopper.cuh's wgmma kernels or
// attention_hopper_tma.cuh's where set_attention_kernels (and, under Auto, the tuned table) picks
// them (head size 64 only: attention_forward_version), else the mma.sync kernel above.
template <int HS, bool CAUSAL>
inline void attention_forward_launch(floatX* out, float* lse, const floatX* q_qkv, const floatX* kv_qkv, int B,
                                     const AttentionRows& rows, const AttentionHeads& heads, cudaStream_t stream,
                                     float* amax = nullptr) {
    if constexpr (HS == HOPPER_HS) {
        switch (attention_forward_version(HS, rows.T)) {
            case 3:
                return attention_forward_wgmma_launch<CAUSAL, 128>(out, lse, q_qkv, kv_qkv, B, rows, heads, stream, amax);
            case 4:
                return attention_forward_wgmma_launch<CAUSAL, 64>(out, lse, q_qkv, kv_qkv, B, rows, heads, stream, amax);
            case 5:
                return attention_forward_tma_launch<CAUSAL, 2>(out, lse, q_qkv, kv_qkv, B, rows, heads, stream, amax);
            case 6:
                return attention_forward_tma_launch<CAUSAL, 3>(out, lse, q_qkv, kv_qkv, B, rows, heads, stream, amax);
            default: break;  // 2: the mma.sync kernel below
        }
    }
    constexpr int WARPS = forward_warps<HS>();
    constexpr size_t smem = forward_smem_bytes<HS>();
    auto kernel = attention_forward_kernel<HS, WARPS, CAUSAL>;
    set_smem_limit(kernel, smem, "attention_forward", HS);
    const dim3 grid(B * heads.NH, ceil_div(rows.T, 16 * WARPS));
    const float scale_log2 = LOG2E / sqrtf((float)HS);
    LLMC_LAUNCH(kernel, grid, WARPS * 32, smem, stream)(out, lse, q_qkv, kv_qkv, rows, heads, scale_log2, amax);
    CUDA_CHECK_LAUNCH();
}

template <int HS>
inline void attention_rowdot_launch(float* D, const floatX* dout, const floatX* out, int B, int T, int NH,
                                    cudaStream_t stream) {
    const size_t rows = (size_t)B * NH * T;
    constexpr int ROWDOT_THREADS = 256;
    LLMC_LAUNCH(attention_backward_rowdot_kernel<HS>, (unsigned)ceil_div(rows, (size_t)ROWDOT_THREADS), ROWDOT_THREADS, 0, stream)(D, dout, out, T, NH, rows);
    CUDA_CHECK_LAUNCH();
}

// The dK/dV and dQ kernels for the rows: gradients written as bf16 (GradT floatX) or added to fp32
// (GradT float); dq at grad_q, dk and dv at grad_k and grad_k + KVH HS of each row, grad_ld apart.
template <int HS, bool CAUSAL, typename GradT>
inline void attention_backward_launch(GradT* grad_q, GradT* grad_k, size_t grad_q_ld, size_t grad_k_ld,
                                      const floatX* dout, const floatX* q_qkv, const floatX* kv_qkv, const float* lse,
                                      const float* D, int B, const AttentionRows& rows, const AttentionHeads& heads,
                                      cudaStream_t stream, float* amax = nullptr, const float* rope = nullptr) {
    if constexpr (HS == HOPPER_HS)
        if (attention_on_wgmma(HS)) {  // the backward follows the forward's choice of kernels
            // Tma, and Auto: the TMA-fed backward was the faster on an H200 (2026-11-28, forward and
            // backward at B 8 T 1024: 0.270 ms against 0.279; B 2 T 4096: 0.702 against 0.796)
            if (attention_kernels_setting() != AttentionKernels::Wgmma)
                return attention_backward_tma_launch<CAUSAL>(grad_q, grad_k, grad_q_ld, grad_k_ld, dout, q_qkv,
                                                             kv_qkv, lse, D, B, rows, heads, stream, amax, rope);
            return attention_backward_wgmma_launch<CAUSAL>(grad_q, grad_k, grad_q_ld, grad_k_ld, dout, q_qkv, kv_qkv,
                                                           lse, D, B, rows, heads, stream, amax, rope);
        }
    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = scale * LOG2E;

    constexpr int BQ = dkv_query_tile<HS>();
    constexpr size_t dkv_smem = dkv_smem_bytes<HS>();
    auto dkv_kernel = attention_backward_dkv_kernel<HS, DKV_WARPS, BQ, CAUSAL, GradT>;
    set_smem_limit(dkv_kernel, dkv_smem, "attention_backward", HS);
    const dim3 dkv_grid(B * heads.KVH, ceil_div(rows.T, 16 * DKV_WARPS));
    LLMC_LAUNCH(dkv_kernel, dkv_grid, DKV_WARPS * 32, dkv_smem, stream)(grad_k, grad_k_ld, dout, q_qkv, kv_qkv, lse, D, rows, heads, scale_log2, scale, amax, rope);
    CUDA_CHECK_LAUNCH();

    constexpr size_t dq_smem = dq_smem_bytes<HS>();
    auto dq_kernel = attention_backward_dq_kernel<HS, DQ_WARPS, CAUSAL, GradT>;
    set_smem_limit(dq_kernel, dq_smem, "attention_backward", HS);
    const dim3 dq_grid(B * heads.NH, ceil_div(rows.T, 16 * DQ_WARPS));
    LLMC_LAUNCH(dq_kernel, dq_grid, DQ_WARPS * 32, dq_smem, stream)(grad_q, grad_q_ld, dout, q_qkv, kv_qkv, lse, D, rows, heads, scale_log2, scale, amax, rope);
    CUDA_CHECK_LAUNCH();
}

// Calls f.template operator()<HS>() for the head size (32, 64 or 128, checked before).
template <typename F>
inline void with_head_size(int HS, F&& f) {
    switch (HS) {
        case 32: f.template operator()<32>(); break;
        case 64: f.template operator()<64>(); break;
        default: f.template operator()<128>(); break;
    }
}

inline unsigned blocks_for(size_t n, int threads) { return (unsigned)ceil_div(n, (size_t)threads); }

}  // namespace attention_detail

// qkv (B, T, (NH + 2 KVH) HS) rows [q | k | v] (AttentionHeads): query head h's q at column h HS, its
// k and v those of kv head h / (NH / KVH), at (NH + h / G) HS and (NH + KVH + h / G) HS; KVH = NH for
// multi-head attention. out (B, T, C = NH HS): head h at columns h HS. lse (B, NH, T) fp32: the
// natural-log log-sum-exp of the scaled scores (scale 1/sqrt(HS)) of each query row over its causal
// keys 0..t. HS is 32, 64 or 128. With `amax`, out's largest |value| joins *amax (FP8's current
// scaling).
inline void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int KVH, int HS,
                              cudaStream_t stream, float* amax = nullptr) {
    using namespace attention_detail;
    check_attention_shape("attention_forward", B, T, NH, HS, KVH);
    const AttentionRows rows{T, T, T};
    with_head_size(HS, [&]<int H>() {
        attention_forward_launch<H, true>(out, lse, qkv, qkv, B, rows, AttentionHeads{NH, KVH}, stream, amax);
    });
}

// Floats of device scratch attention_backward needs: D = rowsum(dout * out), one per (b, h, t).
inline size_t attention_backward_scratch_floats(int B, int T, int NH) { return (size_t)B * NH * T; }

// D (B, NH, T) = the row sums of dout * out per head, in lse's layout: the first step of
// attention_backward, and what every ring pair's backward needs of the final out.
inline void attention_backward_rowdot(float* D, const floatX* dout, const floatX* out, int B, int T, int NH, int HS,
                                      cudaStream_t stream) {
    using namespace attention_detail;
    check_attention_shape("attention_backward_rowdot", B, T, NH, HS);
    with_head_size(HS, [&]<int H>() { attention_rowdot_launch<H>(D, dout, out, B, T, NH, stream); });
}

// dqkv (B, T, (NH + 2 KVH) HS), qkv's layout, is fully overwritten (dq of every query head, dk and dv
// of every kv head: the sums over its group's query heads, in head order, in fp32, rounded once). out
// and lse are the forward's. scratch: attention_backward_scratch_floats(B, T, NH) floats.
// Deterministic: no atomics in the gradients. With `amax`, dqkv's largest |value| joins *amax (FP8's
// current scaling). With `rope` (RoPE's cos/sin table of the T positions, kernels/rope.cuh: qkv's q
// and k are the rotated ones) dq and dk are rotated back before they are stored, so that dqkv is the
// gradient of the unrotated qkv: RoPE's backward, fused (and `amax` measures that).
inline void attention_backward(floatX* dqkv, float* scratch, const floatX* dout, const floatX* qkv,
                               const floatX* out, const float* lse, int B, int T, int NH, int KVH, int HS,
                               cudaStream_t stream, float* amax = nullptr, const float* rope = nullptr) {
    using namespace attention_detail;
    check_attention_shape("attention_backward", B, T, NH, HS, KVH);
    const AttentionRows rows{T, T, T};
    const AttentionHeads heads{NH, KVH};
    const size_t ld = heads.qkv_width(HS);
    with_head_size(HS, [&]<int H>() {
        attention_rowdot_launch<H>(scratch, dout, out, B, T, NH, stream);
        attention_backward_launch<H, true>(dqkv, dqkv + NH * H, ld, ld, dout, qkv, qkv, lse, scratch, B, rows, heads,
                                           stream, amax, rope);
    });
}

// ---- ring pairs (context parallelism) ----

// One ring pair's forward: the T query rows at q_qkv against the T key rows at kv_qkv (qkv layout
// both; kv_qkv may equal q_qkv), every key (causal false) or keys up to the query's own position
// (causal true: the pair of a chunk with itself). out and lse are the pair's, in the query side's
// layout (rows.q_rows rows per sequence); attention_merge folds them into the running result.
inline void attention_forward_pair(floatX* out, float* lse, const floatX* q_qkv, const floatX* kv_qkv, int B,
                                   const AttentionRows& rows, bool causal, int NH, int KVH, int HS,
                                   cudaStream_t stream) {
    using namespace attention_detail;
    check_pair_shape("attention_forward_pair", B, rows, NH, HS, KVH);
    const AttentionHeads heads{NH, KVH};
    with_head_size(HS, [&]<int H>() {
        if (causal) attention_forward_launch<H, true>(out, lse, q_qkv, kv_qkv, B, rows, heads, stream);
        else attention_forward_launch<H, false>(out, lse, q_qkv, kv_qkv, B, rows, heads, stream);
    });
}

// Folds a pair's (out, lse) of T query rows (seq_rows rows per sequence in every buffer) into the
// running fp32 (acc, acc_lse), in out's and lse's layouts; `first`: the rows' first pair, copied.
// After the last pair acc_lse is the final lse, and attention_merge_finish rounds acc to out.
inline void attention_merge(float* acc, float* acc_lse, const floatX* out, const float* lse, bool first, int B, int T,
                            int seq_rows, int NH, int HS, cudaStream_t stream) {
    using namespace attention_detail;
    check_pair_shape("attention_merge", B, AttentionRows{T, seq_rows, seq_rows}, NH, HS);
    const size_t n = (size_t)B * NH * T;
    constexpr int THREADS = 256;
    with_head_size(HS, [&]<int H>() {
        LLMC_LAUNCH(attention_merge_kernel<H>, blocks_for(n, THREADS), THREADS, 0, stream)(acc, acc_lse, out, lse, T, seq_rows, NH, n, first);
        CUDA_CHECK_LAUNCH();
    });
}

// out = acc rounded to bf16, n elements (B * rows * C): the merged forward output.
inline void attention_merge_finish(floatX* out, const float* acc, size_t n, cudaStream_t stream) {
    using namespace attention_detail;
    constexpr int THREADS = 256;
    LLMC_LAUNCH(attention_round_kernel, blocks_for(n, THREADS), THREADS, 0, stream)(out, acc, n);
    CUDA_CHECK_LAUNCH();
}

// One ring pair's backward: adds the pair's dq to dq_acc (fp32, the query side's rows, C = NH HS
// columns) and its dk, dv to dkv_acc (fp32, the key side's rows, 2 KVH HS columns: dk, then dv). dout, lse and D are the
// query rows' final ones (the merged out's D, from attention_backward_rowdot), so each pair's
// probabilities are exp(s - lse) of the whole softmax and the pairs' gradients add up. The caller
// zeroes the accumulators; the sums are fp32 in launch order: deterministic, no atomics.
inline void attention_backward_pair(float* dq_acc, float* dkv_acc, const floatX* dout, const floatX* q_qkv,
                                    const floatX* kv_qkv, const float* lse, const float* D, int B,
                                    const AttentionRows& rows, bool causal, int NH, int KVH, int HS,
                                    cudaStream_t stream) {
    using namespace attention_detail;
    check_pair_shape("attention_backward_pair", B, rows, NH, HS, KVH);
    const AttentionHeads heads{NH, KVH};
    const size_t C = (size_t)NH * HS, kv = 2 * (size_t)KVH * HS;
    with_head_size(HS, [&]<int H>() {
        if (causal)
            attention_backward_launch<H, true>(dq_acc, dkv_acc, C, kv, dout, q_qkv, kv_qkv, lse, D, B, rows, heads, stream);
        else
            attention_backward_launch<H, false>(dq_acc, dkv_acc, C, kv, dout, q_qkv, kv_qkv, lse, D, B, rows, heads, stream);
    });
}

// dqkv (B, T, (NH + 2 KVH) HS) bf16 from a rank's summed dq_acc (B, T, NH HS) and dkv_acc (B, T,
// 2 KVH HS).
inline void attention_backward_pair_finish(floatX* dqkv, const float* dq_acc, const float* dkv_acc, int B, int T,
                                           int NH, int KVH, int HS, cudaStream_t stream) {
    using namespace attention_detail;
    check_attention_shape("attention_backward_pair_finish", B, T, NH, HS, KVH);
    const size_t rows = (size_t)B * T;
    constexpr int THREADS = 256;
    LLMC_LAUNCH(attention_gather_grads_kernel, blocks_for(rows * (NH + 2 * KVH) * HS, THREADS), THREADS, 0, stream)(dqkv, dq_acc, dkv_acc, rows, NH * HS, 2 * KVH * HS);
    CUDA_CHECK_LAUNCH();
}

}  // namespace llmc
